"""KV-cache creation and rollback.

After each round the target cache must hold exactly the committed tokens (all but the newest one, which is fed
at the start of the next verify forward). Chains roll back by cropping; trees first gather the accepted path's
entries next to the prefix, then crop. A cache that cannot roll back is refused up front.

``preallocate=True`` gives full-attention layers fixed buffers sized for the whole generation (as gpt-fast does):
a forward writes its new keys and values in place instead of concatenating every layer's whole cache, and a
rollback is a length change.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specviz.errors import UnsupportedModelError


class PreallocatedLayer(DynamicLayer):
    """A full-attention layer whose keys and values live in buffers of ``capacity`` positions.

    ``keys``/``values`` are views of the first ``length`` positions, so everything that reads a ``DynamicLayer``
    (mask sizes, attention, the tree-path gather) works unchanged.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, heads, _, dim = key_states.shape
        self._key_buffer = key_states.new_empty(batch, heads, self.capacity, dim)
        self._value_buffer = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        self._set_length(0)
        self.is_initialized = True

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise UnsupportedModelError(f"the KV cache holds {self.capacity} positions; this forward needs {end}")
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self._set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        if self.is_initialized:
            self._set_length(0)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            self._set_length(max(0, self.length + tokens_to_remove))


def new_cache(model: torch.nn.Module, max_length: int, model_name: str, *,
              preallocate: bool = False) -> DynamicCache:
    """An empty cache for ``model``, refused if it could not roll back within ``max_length`` tokens.

    With ``preallocate`` its full-attention layers are ``PreallocatedLayer`` buffers of ``max_length`` positions.
    """
    cache = DynamicCache(config=model.config)
    for index, layer in enumerate(cache.layers):
        kind = type(layer)
        if kind is DynamicLayer:
            if preallocate:
                cache.layers[index] = PreallocatedLayer(max_length)
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
