"""Will it fit? Estimate a model's weight memory before loading and compare it with what is free.

A 7B model on a 24 GB laptop should be a one-line error, not an OOM kill minutes later.
"""

from __future__ import annotations

import math
import os

import torch

from specviz.errors import SpecvizError

MEMORY_LIMIT_ENV = "SPECVIZ_MAX_MEMORY_GB"
#: Activations, KV cache and allocator slack on top of the weights.
OVERHEAD = 1.25


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of a torch dtype."""
    return torch.empty((), dtype=dtype).element_size()


def params_from_config(config) -> int:
    """Parameter count of the causal LM a config describes, by building it on the meta device (no memory used)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def stored_numel(shapes: dict[str, list[int]]) -> int:
    """Number of elements of tensors by shape (``safetensors_check.stored_shapes``)."""
    return sum(math.prod(shape) for shape in shapes.values())


def available_bytes(device: str) -> int:
    """Free memory on ``device``: GPU free memory for CUDA, MemAvailable for CPU/MPS (unified memory)."""
    override = os.environ.get(MEMORY_LIMIT_ENV)
    if override:
        return int(float(override) * 1024**3)
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return 1 << 62  # unknown: do not block loading


def check_fits(name: str, numel: int, dtype: torch.dtype, device: str, *, extra_bytes: int = 0) -> int:
    """Raise a one-line error when ``numel`` parameters in ``dtype`` (plus overhead) exceed free memory."""
    need = int(numel * dtype_bytes(dtype) * OVERHEAD) + extra_bytes
    have = available_bytes(device)
    if need > have:
        raise SpecvizError(f"model {name!r} needs about {need / 1024**3:.1f} GiB ({numel / 1e6:.0f}M parameters in "
                           f"{str(dtype).replace('torch.', '')}) but only {have / 1024**3:.1f} GiB is free on {device}")
    return need
