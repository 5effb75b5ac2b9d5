"""The one place that chooses device, dtype and attention backend.

Every loader and trainer asks here, so a model and its drafter always end up on the same device with a
compatible dtype, and the engine can see which attention backend it got (tree verification passes a 4D float
mask, which only ``sdpa`` and ``eager`` accept; ``flash_attention_2`` is for chain decoding on CUDA only).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from specviz.errors import SpecvizError

#: Attention backends that accept the engine's 4D float tree mask.
TREE_MASK_BACKENDS = frozenset({"sdpa", "eager"})


@dataclass(frozen=True)
class Runtime:
    """Where and how a model runs: ``device`` (e.g. ``"cpu"``, ``"cuda:0"``), ``dtype`` and ``attn_implementation``."""

    device: str
    dtype: torch.dtype
    attn_implementation: str

    @property
    def supports_tree_mask(self) -> bool:
        """Whether tree verification (a 4D float attention mask) works with this backend."""
        return self.attn_implementation in TREE_MASK_BACKENDS


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


def choose_attn_implementation(device: str, dtype: torch.dtype, *, need_tree_mask: bool = False) -> str:
    """flash_attention_2 on CUDA in half precision when installed and no tree mask is needed, else sdpa."""
    kind = device.split(":", 1)[0]
    if (not need_tree_mask and kind == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and flash_attn_available()):
        return "flash_attention_2"
    return "sdpa"


def choose_runtime(device: str | None = None, dtype: torch.dtype | str | None = None, *,
                   need_tree_mask: bool = False) -> Runtime:
    """Resolve device, dtype and attention backend together.

    With ``need_tree_mask`` the backend is always one that takes a 4D float mask; otherwise CUDA + flash_attn gets
    ``flash_attention_2`` (the engine then switches to SDPA for its masked tree forwards only).
    """
    resolved = choose_device(device)
    resolved_dtype = choose_dtype(resolved, dtype)
    attn = choose_attn_implementation(resolved, resolved_dtype, need_tree_mask=need_tree_mask)
    return Runtime(device=resolved, dtype=resolved_dtype, attn_implementation=attn)


#: How the target runs its forward: ``fast`` (pre-packed oneDNN linears, a preallocated KV cache) where it is
#: available, else ``hf`` (transformers' own forward and ``DynamicCache``); ``auto`` picks fast where it runs.
TARGET_FORWARDS = ("auto", "fast", "hf")


def choose_target_forward(requested: str | None, device: str, dtype: torch.dtype) -> str:
    """Resolve ``auto`` / ``fast`` / ``hf`` for a target on ``device`` in ``dtype`` (fast is CPU-only for now)."""
    from specviz.models import fast_forward

    requested = requested or "auto"
    if requested not in TARGET_FORWARDS:
        raise SpecvizError(f"target-forward must be one of {', '.join(TARGET_FORWARDS)}, got {requested!r}")
    runs = fast_forward.available(device, dtype)
    if requested == "fast" and not runs:
        raise SpecvizError(f"the fast target forward runs on CPU in float32/bfloat16 with oneDNN; not on {device} in "
                           f"{dtype}: use --target-forward hf")
    return "fast" if requested == "fast" or (requested == "auto" and runs) else "hf"
