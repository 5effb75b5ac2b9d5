"""Cascade attention for verify forwards, registered with transformers' ``AttentionInterface`` as ``specviz_cascade``.

The target model stays unmodified: its attention layers look the function up by name at call time.

A verify forward feeds q new tokens (a chain, or the pending token plus a draft tree) on top of P cached tokens.
Every new token sees all P prefix keys; among themselves the new tokens follow the tree's ancestor mask (causal for a
chain). The softmax over the P + q keys therefore splits into two sums over disjoint key sets:

    prefix: o1, lse1 = attend(q, K[:P], V[:P])              no mask: any fused kernel that returns the lse
    tree:   o2, lse2 = attend(q, K[P:], V[P:], tree mask)   a dense q x q block, tiny next to the prefix
    merge:  lse = logaddexp(lse1, lse2);   o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2

This is the same softmax (same numerators, the denominator summed in two parts), so verification stays lossless up
to floating-point summation order. Flash kernels take no arbitrary mask, but the prefix half needs none, so trees get
a flash kernel for the long part and pay dense attention only on the q x q block.

How the function learns the split: a chain comes with no mask (transformers builds none for this backend when there
is no padding), meaning causal, aligned to the bottom right. A tree comes with the engine's 4D mask, rows for the q
new tokens over P + q keys; the split is P = kv - q and the last q columns are the tree mask. That holds only when
the first P columns are all visible: ``specviz.engine.attention`` passes a 4D mask to this backend only then (the
draft model's own incremental tree forwards do not qualify and run on SDPA), and on the CPU this function checks it
and falls back to SDPA with the full mask. Padded batches, dropout and the prefill also run through SDPA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from specviz.models.attention_kernels import (
    KERNELS,
    attend_math,
    attend_with_lse,
    flash_attn_causal,
    sdpa_causal_lower_right,
)
from specviz.models.device import CASCADE, choose_cascade_kernel

NAME = CASCADE
#: Prefix kernels whose chains run as one call rather than as a cascade: torch's CUDA kernels take the bottom-right
#: causal mask natively (``flash_attn`` chains are one call too, through the package).
CHAIN_DIRECT = frozenset({"torch_flash", "torch_efficient"})
_FORCED: ContextVar[str | None] = ContextVar("specviz_cascade_kernel", default=None)


def register() -> None:
    """Make ``specviz_cascade`` a valid ``attn_implementation`` (idempotent). Its mask function is flash-attention's:
    no mask at all unless the batch is padded, so chains reach the function with ``attention_mask=None``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, cascade_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


def kernel_for(device: torch.device | str, dtype: torch.dtype) -> str:
    """The prefix kernel cascade attention runs for tensors on ``device`` in ``dtype`` (``use_kernel`` overrides)."""
    return _FORCED.get() or choose_cascade_kernel(str(device), dtype)


@contextmanager
def use_kernel(kernel: str) -> Iterator[None]:
    """Within this block the prefix half runs on ``kernel`` (tests and the GPU check compare kernels this way)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; known: {', '.join(KERNELS)}")
    token = _FORCED.set(kernel)
    try:
        yield
    finally:
        _FORCED.reset(token)


def describe(device: torch.device | str, dtype: torch.dtype) -> dict:
    """What runs for a chain and for a tree on this backend, in words, for the trace header and the run label."""
    kernel = kernel_for(device, dtype)
    chain = ("flash_attn causal" if kernel == "flash_attn" else "torch sdpa causal_lower_right"
             if kernel in CHAIN_DIRECT else f"cascade: {kernel} prefix + causal block")
    return {"implementation": NAME, "prefix_kernel": kernel, "chain": chain,
            "tree": f"cascade: {kernel} prefix + dense ancestor-mask block, log-sum-exp merge"}


def cascade_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``[B, H, q, D]`` queries, ``[B, Hkv, kv, D]`` keys and values (the cache
    included) -> ``([B, q, H, D], None)``."""
    if kwargs.get("softcap") is not None:
        raise ValueError("specviz_cascade has no logit softcap; load this model with sdpa or eager attention")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q_len, kv_len = query.shape[2], key.shape[2]
    prefix = kv_len - q_len
    window = kwargs.get("sliding_window")
    if window and kv_len > window:
        raise ValueError(f"specviz_cascade has no sliding window; this forward reads {kv_len} keys over a "
                         f"{window}-token window")
    if attention_mask is not None and attention_mask.dim() == 2:  # a padded batch: the general path
        mask = _causal(q_len, kv_len, query.device, attention_mask)
        return _sdpa(module, query, key, value, mask, dropout, scale, **kwargs)
    if dropout or (attention_mask is not None and not _is_tree_mask(attention_mask, q_len, kv_len)):
        mask = attention_mask if attention_mask is not None or q_len == 1 else _causal(q_len, kv_len, query.device)
        return _sdpa(module, query, key, value, mask, dropout, scale, **kwargs)
    kernel = kernel_for(query.device, query.dtype)
    if attention_mask is None:  # a chain, the prefill or one token: causal from the bottom right
        if kernel == "flash_attn":
            return flash_attn_causal(query, key, value, scale), None
        if prefix == 0 or q_len == 1:  # causal from the top left is the same, or there is nothing to hide
            return _sdpa(module, query, key, value, None, dropout, scale, **kwargs)
        if kernel in CHAIN_DIRECT:
            return sdpa_causal_lower_right(query, key, value, scale), None
    tree_bias = None if attention_mask is None else attention_mask[..., prefix:]
    out = cascade(query, key, value, tree_bias, scale, kernel)
    return out.transpose(1, 2).contiguous(), None


def cascade(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree_mask: torch.Tensor | None, scale: float,
            kernel: str) -> torch.Tensor:
    """The maths: ``[B, H, q, D]`` attention of the q new tokens over the prefix (all visible) and themselves.

    ``tree_mask``: ``[B or 1, H or 1, q, q]``, bool (True = visible) or additive float (0 = visible); None = causal.
    Returns ``[B, H, q, D]`` in the query's dtype.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups, prefix = heads // kv_heads, kv_len - q_len
    bias = _additive(tree_mask, q_len, query.device)
    # the tree block with the heads that share a key head as one dimension: views, no copies, the bias broadcast
    bias = bias[:, :, None] if bias.shape[1] == 1 else bias.reshape(bias.shape[0], kv_heads, groups, q_len, q_len)
    out, lse = attend_math(query.view(batch, kv_heads, groups, q_len, dim), key[:, :, None, prefix:],
                           value[:, :, None, prefix:], scale, bias)
    out, lse = out.view(batch, heads, q_len, dim), lse.view(batch, heads, q_len)
    if prefix:
        out_prefix, lse_prefix = attend_with_lse(kernel, query, key[:, :, :prefix], value[:, :, :prefix], scale)
        out = merge(out_prefix, lse_prefix, out, lse)
    return out.to(query.dtype)


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each set's output and log-sum-exp (float32).

    Set a's share of the softmax mass is exp(lse_a) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_a - lse_b); the result
    is the outputs weighted by their shares, in as few operations as the formula allows (they are launched per layer).
    """
    weight_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    return torch.lerp(out_b.float(), out_a.float(), weight_a)


def prefix_visible(mask: torch.Tensor, prefix: int) -> bool:
    """Whether every row of a 4D mask sees its first ``prefix`` columns (bool True, or additive 0)."""
    block = mask[..., :prefix]
    return bool(block.all()) if block.dtype == torch.bool else bool((block == 0).all())


def _is_tree_mask(mask: torch.Tensor, q_len: int, kv_len: int) -> bool:
    """A 4D mask over exactly these keys whose prefix columns are all visible (checked where that is free: CPU)."""
    if mask.dim() != 4 or mask.shape[-1] != kv_len or mask.shape[-2] != q_len or kv_len < q_len:
        return False
    return mask.device.type != "cpu" or prefix_visible(mask, kv_len - q_len)


def _additive(mask: torch.Tensor | None, q_len: int, device: torch.device) -> torch.Tensor:
    """The tree block as a float32 additive bias; None means causal."""
    if mask is None:
        return torch.full((q_len, q_len), float("-inf"), device=device).triu(1)[None, None]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))
    return mask.float()


def _causal(q_len: int, kv_len: int, device: torch.device, padding: torch.Tensor | None = None) -> torch.Tensor:
    """``[B or 1, 1, q, kv]`` bool: causal from the bottom right, and the pads of a ``[B, kv]`` padding mask hidden."""
    rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    causal = (rows >= torch.arange(kv_len, device=device)[None, :])[None, None]
    return causal if padding is None else causal & padding[:, None, None, -kv_len:].bool()


def _sdpa(module, query, key, value, mask, dropout, scale, **kwargs) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scale, **kwargs)
