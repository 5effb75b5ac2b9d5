"""Which attention kernel a forward may use.

Flash-attention kernels take no arbitrary mask, so they serve chains (plain causal attention on top of the cache)
but not trees. For a tree forward the model's attention implementation is switched to SDPA (which takes the 4D
mask, and on CUDA still runs a fused kernel) for that one call. The switch is a config attribute that every layer
reads at call time; nothing in the model is rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

MASK_CAPABLE = {"sdpa", "eager"}


@contextmanager
def mask_capable_attention(model: torch.nn.Module) -> Iterator[None]:
    """Within this block ``model`` accepts a 4D attention mask."""
    config = model.config
    current = getattr(config, "_attn_implementation", None)
    if current is None or current in MASK_CAPABLE:
        yield
        return
    config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        config._attn_implementation = current
