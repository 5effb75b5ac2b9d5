"""The one place that chooses device, dtype and attention backend.

Every loader and trainer asks here, so a model and its drafter always end up on the same device with a
compatible dtype, and the engine can see which attention backend it got. Tree verification passes a 4D float mask,
which ``sdpa``, ``eager`` and ``specviz_cascade`` accept (``flash_attention_2`` serves chains only; the engine switches
it to SDPA for a tree forward). ``specviz_cascade`` (``specviz.models.cascade_attention``) runs the committed prefix
on a fused kernel that returns the log-sum-exp and the tree block densely; ``choose_cascade_kernel`` picks that
kernel: the ``flash_attn`` package when installed (CUDA, half precision), else torch's own flash or memory-efficient
kernels, and on the CPU torch's fused CPU kernel.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import torch

from specviz import settings
from specviz.errors import SpecvizError
from specviz.models import grouped_sdpa, verify_attention

#: transformers' name for cascade attention (registered by ``specviz.models.cascade_attention.register``).
CASCADE = "specviz_cascade"
#: transformers' name for the fast CPU path's SDPA, grouped-query heads passed through (``models.grouped_sdpa``).
GROUPED_SDPA = grouped_sdpa.NAME
#: transformers' name for the fast CPU path's float32 attention through the thin library (``models.verify_attention``).
VERIFY_ATTENTION = verify_attention.NAME


@dataclass(frozen=True)
class Runtime:
    """Where and how a model runs: ``device`` (e.g. ``"cpu"``, ``"cuda:0"``), ``dtype`` and ``attn_implementation``."""

    device: str
    dtype: torch.dtype
    attn_implementation: str


def choose_device(device: str | None = None) -> str:
    """Return the requested device after checking it exists, else the best available (cuda, mps, cpu)."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    kind = device.split(":", 1)[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise SpecvizError(f"device {device!r} requested but CUDA is not available on this machine")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpecvizError(f"device {device!r} requested but Apple MPS is not available on this machine")
    if kind not in {"cpu", "cuda", "mps"}:
        raise SpecvizError(f"unknown device {device!r}: use cpu, cuda, cuda:N or mps")
    return device


def choose_dtype(device: str, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """bf16 on GPUs (fp16 on MPS without bf16), fp32 on CPU, unless the caller asks for one."""
    if isinstance(dtype, str):
        named = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
        if dtype not in named:
            raise SpecvizError(f"unknown dtype {dtype!r}: use one of {', '.join(sorted(named))}")
        return named[dtype]
    if dtype is not None:
        return dtype
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if kind == "mps":
        return torch.float16
    return torch.float32


def flash_attn_available() -> bool:
    """True when the ``flash_attn`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("flash_attn") is not None


def choose_attn_implementation(device: str, dtype: torch.dtype) -> str:
    """``specviz_cascade`` on CUDA (chains and trees both get a fused kernel there), else ``sdpa`` with the 4D mask.

    The CPU keeps SDPA: its fused kernel already takes the tree mask, and the cascade's extra merge did not measure
    faster there (docs/gpu.md). Both take the engine's tree mask (``engine.attention``).
    """
    return CASCADE if device.split(":", 1)[0] == "cuda" else "sdpa"


@lru_cache(maxsize=32)  # asked once per attention layer per forward: the answer never changes in a process
def choose_cascade_kernel(device: str, dtype: torch.dtype) -> str:
    """The prefix kernel of cascade attention (names in ``specviz.models.attention_kernels.KERNELS``).

    CUDA: ``flash_attn`` (the package, fp16/bf16) when installed, else torch's flash kernel (fp16/bf16 on Ampere or
    newer), else its memory-efficient kernel (any float dtype). CPU: torch's fused CPU flash kernel where this torch has
    it. Anything else: plain torch.
    """
    kind = device.split(":", 1)[0]
    half = dtype in (torch.float16, torch.bfloat16)
    if kind == "cuda":
        if half and flash_attn_available():
            return "flash_attn"
        index = torch.device(device).index
        ampere = torch.cuda.get_device_capability(index if index is not None else torch.cuda.current_device()) >= (8, 0)
        return "torch_flash" if half and ampere else "torch_efficient"
    if kind == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return "torch_cpu_flash"
    return "math"


def choose_runtime(device: str | None = None, dtype: torch.dtype | str | None = None) -> Runtime:
    """Resolve device, dtype and attention backend together (``choose_attn_implementation``)."""
    resolved = choose_device(device)
    resolved_dtype = choose_dtype(resolved, dtype)
    attn = choose_attn_implementation(resolved, resolved_dtype)
    return Runtime(device=resolved, dtype=resolved_dtype, attn_implementation=attn)


#: How the target runs its forward (the setting's choices): ``fast`` (linears through kernels over weights packed at
#: load, a preallocated KV cache) where it is available, else ``hf`` (transformers' own forward and ``DynamicCache``);
#: ``auto`` picks fast where it runs.
TARGET_FORWARDS = settings.get("target_forward").choices


def choose_target_forward(requested: str | None, device: str, dtype: torch.dtype) -> str:
    """Resolve ``auto`` / ``fast`` / ``hf`` for a target on ``device`` in ``dtype`` (fast is CPU-only for now)."""
    from specviz.models import fast_forward

    requested = requested or "auto"
    if requested not in TARGET_FORWARDS:
        raise SpecvizError(f"target-forward must be one of {', '.join(TARGET_FORWARDS)}, got {requested!r}")
    runs = fast_forward.available(device, dtype)
    if requested == "fast" and not runs:
        raise SpecvizError(f"the fast target forward runs on CPU in float32 or bfloat16; not on {device} in {dtype}: "
                           f"use --target-forward hf")
    return "fast" if requested == "fast" or (requested == "auto" and runs) else "hf"
