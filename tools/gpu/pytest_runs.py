"""Run a subset of the repository's tests in a subprocess on another device, dtype or attention backend.

The lossless tests build their tiny models through ``tests/tiny.py``, which reads ``SPECVIZ_TEST_DEVICE``,
``SPECVIZ_TEST_DTYPE`` and ``SPECVIZ_TEST_ATTENTION``; so the same tests that prove losslessness on the CPU prove it
on a GPU with the cascade kernels. Counts come from pytest's JUnit XML file, not from scraping its output.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"


@dataclass(frozen=True)
class TestRun:
    """One pytest invocation: ``targets`` (files or node ids under tests/), an optional ``-k`` selection and the
    environment that picks device, dtype and attention."""

    name: str
    targets: tuple[str, ...]
    env: dict = field(default_factory=dict)
    select: str | None = None
    timeout_s: float = 240.0
    note: str = ""
    workers: int = 1  # > 1: that many pytest processes (pytest-xdist), where it is installed


def run(spec: TestRun, out: Path) -> dict:
    """Run ``spec``; ``{"name", "env", "select", "status", "passed", "failed", "errors", "skipped", "seconds",
    "failures": [test ids], "tail"}``. Never raises: a missing tests folder or a timeout is a status."""
    result = {"name": spec.name, "env": spec.env, "select": spec.select, "note": spec.note, "passed": 0,
              "failed": 0, "errors": 0, "skipped": 0, "failures": [], "tail": ""}
    if not TESTS.is_dir():
        return {**result, "status": "skipped", "seconds": 0.0, "tail": f"no tests folder at {TESTS}"}
    report = out / f"pytest-{spec.name}.xml"
    # ``-o addopts=``: the project's own (two xdist workers) would override ``workers`` and need xdist installed
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               *(str(TESTS / target) for target in spec.targets)]
    if spec.select:
        command += ["-k", spec.select]
    if spec.workers > 1 and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(spec.workers)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=TESTS.parent, env={**os.environ, **spec.env}, capture_output=True,
                              text=True, timeout=spec.timeout_s)
        status, tail = None, (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired as error:
        status, tail = "timeout", str(error.stdout or "")[-2000:]
    seconds = round(time.perf_counter() - started, 1)
    counts = junit_counts(report)
    status = status or ("passed" if counts["failed"] == counts["errors"] == 0 and counts["passed"] else "failed")
    return {**result, **counts, "status": status, "seconds": seconds, "tail": tail}


def junit_counts(path: Path) -> dict:
    """passed / failed / errors / skipped and the failing test ids from a JUnit XML report (zeros if absent)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return counts
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if "failure" in kinds:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif "error" in kinds:
            counts["errors"] += 1
            counts["failures"].append(name)
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts
