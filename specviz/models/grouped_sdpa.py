"""transformers' SDPA attention, except that grouped-query heads reach torch's kernel as they are.

For a masked forward of more than one token (every verify of a chain or a tree on top of the cache), transformers'
``sdpa_attention_forward`` on the CPU expands each key/value head to its query heads with ``repeat_kv``: a copy of
the layer's whole cache, every layer, every forward, which grows with the context and made a 2-token verify cost
far more than a 1-token one. torch's SDPA takes grouped heads itself (``enable_gqa=True``, the same arithmetic,
bit for bit: tested), so this backend passes them through. One-token forwards go the same way; transformers folds
the grouped heads into query rows there instead, which sums in another order (float tolerance, tested). Anything
else (the prefill's causal flag, dropout, soft caps, sinks, position biases, ungrouped heads) goes to
transformers' own function unchanged. torch's fused CPU kernel takes grouped heads from torch 2.9 (older ones fall
back to plain maths), so ``fast_forward`` switches to this backend only there (``supported``).

Registered with transformers' ``AttentionInterface`` as ``specviz_grouped_sdpa`` (masks built as for ``sdpa``); the
fast target path (``specviz.models.fast_forward``) switches its copy of the model to it. A leaf module: it imports
nothing of specviz.
"""

from __future__ import annotations

import torch

#: The ``attn_implementation`` name (``specviz.models.device.GROUPED_SDPA`` is this).
NAME = "specviz_grouped_sdpa"
#: The first torch whose fused CPU attention kernel takes grouped-query heads as they are.
MIN_TORCH = "2.9"
#: Keyword arguments that change the maths; when one is set, transformers' own function runs.
_SPECIAL = ("softcap", "position_bias", "sinks", "s_aux")


def supported() -> bool:
    """Whether this torch runs grouped heads through its fused kernel (else the backend would be slower)."""
    from transformers.utils.import_utils import is_torch_greater_or_equal

    return is_torch_greater_or_equal(MIN_TORCH, accept_dev=True)


def register() -> None:
    """Make ``specviz_grouped_sdpa`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``[B, H, q, D]`` queries, ``[B, Hkv, kv, D]`` keys and values (the cache
    included) -> ``([B, q, H, D], None)``."""
    grouped = query.shape[1] != key.shape[1]
    plain = attention_mask is not None or query.shape[2] == 1  # masked, or one token: no causal flag to honour
    if not grouped or not plain or dropout or any(kwargs.get(name) is not None for name in _SPECIAL):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None
