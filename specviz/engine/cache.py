"""KV-cache creation and rollback.

After each round the target cache must hold exactly the committed tokens (all but the newest one, which is fed
at the start of the next verify forward). Chains roll back by cropping; trees first gather the accepted path's
entries next to the prefix, then crop. A cache that cannot roll back is refused up front.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specviz.errors import UnsupportedModelError


def new_cache(model: torch.nn.Module, max_length: int, model_name: str) -> DynamicCache:
    """An empty cache for ``model``, refused if it could not roll back within ``max_length`` tokens."""
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        kind = type(layer)
        if kind is DynamicLayer:
            continue
        if kind is DynamicSlidingWindowLayer:
            window = int(getattr(layer, "sliding_window", 0) or 0)
            if window >= max_length:
                continue
            raise UnsupportedModelError(
                f"{model_name} uses a {window}-token sliding window, which cannot roll back rejected drafts "
                f"past {window} tokens; use a prompt plus max-new-tokens under {window}"
            )
        raise UnsupportedModelError(
            f"{model_name} has {kind.__name__} cache layers (recurrent or hybrid), which cannot roll back rejected "
            "drafts; speculative decoding with it is not supported"
        )
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length() if cache.layers else 0


@torch.inference_mode()
def keep_path(cache: DynamicCache, start: int, path_offsets: list[int]) -> None:
    """Keep the first ``start`` entries plus the entries at ``start + offset`` for each offset, in order.

    ``path_offsets`` must be increasing. A contiguous path (a chain) is a plain crop.
    """
    total = cache_length(cache)
    keep = start + len(path_offsets)
    contiguous = all(offset == i for i, offset in enumerate(path_offsets))
    if not contiguous:
        index = torch.tensor([start + offset for offset in path_offsets], device=cache.layers[0].keys.device)
        for layer in cache.layers:
            layer.keys[..., start:keep, :] = layer.keys.index_select(-2, index)
            layer.values[..., start:keep, :] = layer.values.index_select(-2, index)
    if total > keep:
        cache.crop(keep - total)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every entry past ``length``."""
    total = cache_length(cache)
    if total > length:
        cache.crop(length - total)
