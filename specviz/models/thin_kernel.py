"""The thin kernel's shared library: a matrix product for thin inputs (1 to a few dozen rows), and attention of
a few query rows over a cache (bfloat16 for the slot decoder, the target's own float32 one for a step or a verify),
built for this machine on first use. Torch code reaches it only through the operators ``specviz::thin_linear``
(``specviz.models.linear_ops``), ``specviz::decode_attention`` (``specviz.models.decode_attention``) and
``specviz::verify_attention`` (``specviz.models.verify_attention``), which check their arguments and are what the
profiler and ``torch.compile`` see.

A target forward in speculative decoding multiplies each weight matrix by 1 (a plain step) to k + 1 or a tree's
width (a verify) rows. On CPUs the library kernels are tuned for square-ish products and their cost grows with the
number of rows (BENCHMARKS.md, "Verify cost"). ``thin_kernel.c`` streams each weight matrix once, in 16-output
panels, while every row of the input is multiplied against it in registers, so a product's cost stays near the time
it takes to read the weights until the rows' arithmetic overtakes it. Each output is the same sum in the same order
for any number of rows, so a verify forward's linear products give each token's row bit for bit as a one-token
step's do; with the attention here (each row over its own positions, whatever the other rows see) a whole verify
row's logits are the step's, bit for bit (``specviz.models.verify_attention``).

The C source ships with specviz and is compiled on first use with the machine's C compiler (``cc``, or ``$CC``),
``-O3 -march=native -fopenmp``, into ``~/.cache/specviz/kernels`` (``SPECVIZ_KERNEL_DIR``), keyed by the source, the
flags and the compiler. It runs where it can share torch's threads: Linux on x86-64 with AVX2 and FMA, a torch on
GNU OpenMP (its libgomp loaded, which the library then uses too). Anywhere else, or with no compiler, or with
``SPECVIZ_THIN_KERNEL=0``, ``load`` returns None with the reason (``unavailable_reason``) and every product runs
through torch's own ``F.linear``. A leaf module: it imports nothing of specviz.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("thin_kernel.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC")
#: Set to 0 to run every linear product through torch's own ``F.linear``.
DISABLE_ENV = "SPECVIZ_THIN_KERNEL"
#: Where the compiled library is kept (default ``~/.cache/specviz/kernels``).
DIR_ENV = "SPECVIZ_KERNEL_DIR"
#: Outputs per panel of the packed weight layout (``linear_ops.pack``); the library says the same (checked at load).
PANEL = 16


class ThinKernel:
    """The loaded library: its products by weight dtype (float32, int8), its register-block sizes and its two
    attentions. Called only by the operators, which check the arguments these raw pointers cannot."""

    def __init__(self, library: ctypes.CDLL, path: Path):
        self.path = path
        pointer, size = ctypes.c_void_p, ctypes.c_long
        #: weight dtype -> product(x, packed, [scale,] bias, out, rows, outputs, inputs)
        self.products = {torch.float32: library.thin_linear, torch.int8: library.thin_linear_i8}
        for dtype, product in self.products.items():
            product.argtypes = [pointer] * (5 if dtype == torch.int8 else 4) + [size, size, size]
            product.restype = None
        self.max_rows = int(library.thin_max_rows())  # rows multiplied against a panel in one pass
        self.pair_rows = int(library.thin_pair_rows())  # up to this many rows, two panels are read at once
        #: decode_attention(q, keys, values, lengths, slots, out, rows, kv_heads, group, dim, capacity, scale)
        self.decode_attention = library.decode_attention_bf16
        self.decode_attention.argtypes = [pointer] * 6 + [size] * 5 + [ctypes.c_float]
        self.decode_attention.restype = None
        #: verify_attention(q, keys, values, extras, counts, out, rows, kv_heads, group, dim, head_stride, length,
        #: prefix, max_extra, scale) -> how many rows' positions it refused (none computed then)
        self.verify_attention = library.verify_attention_f32
        self.verify_attention.argtypes = [pointer] * 6 + [size] * 8 + [ctypes.c_float]
        self.verify_attention.restype = ctypes.c_long
        self.lanes = int(library.thin_lanes())  # floats per vector: attention's head size is a multiple of it
        if int(library.thin_panel()) != PANEL:
            raise AttributeError(f"its panel holds {library.thin_panel()} outputs, not {PANEL}")


_loaded: ThinKernel | None = None
_reason: str | None = None


def load() -> ThinKernel | None:
    """The kernel, compiled on first use (cached on disk), or None where it cannot run here (``unavailable_reason``
    says why). Never raises: a missing compiler or a failed build leaves torch's own kernels."""
    global _loaded, _reason
    if _loaded is None and _reason is None:
        try:
            _loaded = _build_and_load()
        except _Unavailable as why:
            _reason = str(why)
    return _loaded


def unavailable_reason() -> str | None:
    load()
    return _reason


class _Unavailable(Exception):
    pass


def _build_and_load() -> ThinKernel:
    if os.environ.get(DISABLE_ENV, "1").strip() == "0":
        raise _Unavailable(f"turned off ({DISABLE_ENV}=0)")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise _Unavailable(f"built for Linux on x86-64 only, this is {platform.system()} on {platform.machine()}")
    flags = _cpu_flags()
    if not {"avx2", "fma"} <= flags:
        raise _Unavailable("this CPU has no AVX2/FMA")
    if not _torch_uses_gnu_openmp():
        raise _Unavailable("torch does not run on GNU OpenMP here, so the kernel could not share its threads")
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise _Unavailable(f"no C compiler ({os.environ.get('CC', 'cc')}) on PATH")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), compiler.encode(),
                                     " ".join(sorted(flags)).encode()])).hexdigest()[:16]
    folder = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "specviz" / "kernels")
    path = folder / f"thin-{key}.so"
    if not path.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as scratch:
                built = Path(scratch) / path.name
                result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True,
                                        text=True, timeout=120)
                if result.returncode != 0:
                    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                    raise _Unavailable(f"{compiler} failed: {last}")
                os.replace(built, path)  # atomic: a concurrent process sees the whole library or none
        except (OSError, subprocess.SubprocessError) as error:
            raise _Unavailable(f"could not build it: {error}") from None
    try:
        return ThinKernel(ctypes.CDLL(str(path)), path)
    except (OSError, AttributeError) as error:
        raise _Unavailable(f"could not load {path}: {error}") from None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _torch_uses_gnu_openmp() -> bool:
    """torch's parallel backend is OpenMP and the libgomp it loaded is in this process (so the kernel's libgomp
    dependency resolves to it and both share one thread pool)."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        return "libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False
