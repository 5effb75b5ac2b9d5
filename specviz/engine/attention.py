"""Which attention kernel a masked forward may use, and what ran, in words.

Flash-attention kernels take no arbitrary mask, so ``flash_attention_2`` serves chains (plain causal attention on top
of the cache) but not trees: for a tree forward the model's attention implementation is switched to SDPA (which takes
the 4D mask, and on CUDA still runs a fused kernel) for that one call. The switch is a config attribute that every
layer reads at call time; nothing in the model is rebuilt.

``specviz_cascade`` (``specviz.models.cascade_attention``) takes a 4D mask whose first ``kv - q`` columns are all
visible, which is every verify forward: the committed prefix is seen by every node. The draft model's incremental
tree forwards (each frontier sees only its own ancestors among earlier fed nodes) are not of that shape; they switch
to SDPA like a flash model does. The check reads the CPU-side visibility matrix, so it costs no device sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from specviz.models import cascade_attention
from specviz.models.device import CASCADE, GROUPED_SDPA

MASK_CAPABLE = {"sdpa", "eager", GROUPED_SDPA}
#: Backends that take a 4D mask when its first ``kv - q`` columns are all visible.
SHARED_PREFIX_MASK_CAPABLE = {CASCADE}


def shares_prefix(visible: torch.Tensor) -> bool:
    """Whether a ``[q, kv]`` visibility matrix shows its first ``kv - q`` columns to every row."""
    rows, columns = visible.shape
    return bool(visible[:, : columns - rows].all())


@contextmanager
def mask_capable_attention(model: torch.nn.Module, visible: torch.Tensor | None = None) -> Iterator[None]:
    """Within this block ``model`` accepts the 4D attention mask built from ``visible`` (``[q, kv]`` bool)."""
    config = model.config
    current = getattr(config, "_attn_implementation", None)
    if (current is None or current in MASK_CAPABLE
            or (current in SHARED_PREFIX_MASK_CAPABLE and visible is not None and shares_prefix(visible))):
        yield
        return
    with attention_implementation(model, "sdpa"):
        yield


@contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Within this block ``model`` runs ``name`` attention: a config attribute every layer reads per call."""
    config = model.config
    previous, config._attn_implementation = config._attn_implementation, name
    try:
        yield
    finally:
        config._attn_implementation = previous


def describe(model: torch.nn.Module) -> dict:
    """The attention that runs for chain and tree forwards of ``model``: for the trace header and the run label."""
    parameter = next(model.parameters())
    current = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if current == CASCADE:
        return cascade_attention.describe(parameter.device, parameter.dtype)
    tree = current if current in MASK_CAPABLE else "sdpa"
    return {"implementation": current, "chain": current if current != "sdpa" else "sdpa (causal mask)",
            "tree": f"{tree} (4D tree mask)"}
