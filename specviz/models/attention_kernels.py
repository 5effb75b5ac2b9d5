"""Unmasked attention that also returns the log-sum-exp of its scores: the prefix half of cascade attention.

Cascade attention (``specviz.models.cascade_attention``) splits a verify forward's keys into the committed prefix,
which every new token sees, and the q new tokens, which follow the tree's ancestor mask. The prefix half needs no
mask, so it can run on the fastest kernel there is, as long as that kernel also returns each row's log-sum-exp:
that is what lets the two halves be merged exactly. The kernels here all compute the same thing:

    out[r] = softmax(scale * q[r] K^T) V,    lse[r] = logsumexp(scale * q[r] K^T)

Grouped-query heads: the fused torch kernels get each key/value head's query heads folded into extra rows
(``fold_groups``), exact because no mask depends on the row, and cheaper than repeating the keys; ``flash_attn``
takes grouped heads natively. Which kernel runs is chosen in ``specviz.models.device.choose_cascade_kernel``.
"""

from __future__ import annotations

import torch

#: Every kernel name, fastest first where several run: the ``flash_attn`` package (CUDA, fp16/bf16), torch's own
#: flash (CUDA, fp16/bf16) and memory-efficient (CUDA, any float) kernels, torch's fused CPU kernel, plain torch.
KERNELS = ("flash_attn", "torch_flash", "torch_efficient", "torch_cpu_flash", "math")


def fold_groups(query: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, H, q, D]`` -> ``[B, H / groups, groups * q, D]``: each key/value head's query heads as extra rows.

    transformers' ``repeat_kv`` gives query head ``h`` the key/value head ``h // groups``; folding keeps that pairing.
    """
    batch, heads, rows, dim = query.shape
    return query.reshape(batch, heads // groups, groups * rows, dim)


def unfold_groups(rows: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of ``fold_groups``, for outputs (``[B, Hkv, g*q, D]``) and lse rows (``[B, Hkv, g*q]``) alike."""
    batch, kv_heads, folded = rows.shape[:3]
    return rows.reshape(batch, kv_heads * groups, folded // groups, *rows.shape[3:])


def attend_with_lse(kernel: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of ``[B, H, q, D]`` queries over ``[B, Hkv, P, D]`` keys and values.

    Returns ``(out [B, H, q, D] in the query's dtype or float32, lse [B, H, q] in float32)``.
    """
    if kernel == "flash_attn":
        return _flash_attn(query, key, value, scale)
    groups = query.shape[1] // key.shape[1]
    rows = fold_groups(query, groups)
    if kernel == "torch_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(rows, key, value, 0.0, False, False,
                                                                      scale=scale)[:2]
    elif kernel == "torch_efficient":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(rows, key, value, None, True, 0.0, False,
                                                                          scale=scale)[:2]
        lse = lse[..., : rows.shape[2]]  # the kernel pads its lse rows to a multiple of 32
    elif kernel == "torch_cpu_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(rows, key, value, 0.0, False,
                                                                              scale=scale)
    elif kernel == "math":
        out, lse = attend_math(rows, key, value, scale)
    else:
        raise ValueError(f"unknown attention kernel {kernel!r}; known: {', '.join(KERNELS)}")
    return unfold_groups(out, groups), unfold_groups(lse.float(), groups)


def attend_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch over any leading dimensions, everything in float32 (out too); ``bias`` is an additive
    ``[..., R, P]`` mask (-inf or the dtype's min = hidden). The dense tree block of the cascade, and the prefix
    kernel where no fused one runs."""
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), value.float()), lse


def _flash_attn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``flash_attn`` package: ``[B, S, H, D]`` layout (the model's own, so the query transposes back for free),
    grouped heads native, natural-log lse ``[B, H, q]``."""
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  softmax_scale=scale, causal=False, return_attn_probs=True)
    return out.transpose(1, 2), lse.float()


def flash_attn_causal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """A chain's whole forward in one ``flash_attn`` call: causal with the mask aligned to the bottom right (each of
    the q new tokens sees the prefix and the new tokens up to itself; flash-attn >= 2.1). ``[B, H, q, D]`` in and
    ``[B, q, H, D]`` out; grouped-query heads are native there."""
    from flash_attn import flash_attn_func

    return flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scale,
                           causal=True)


def sdpa_causal_lower_right(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """A chain's whole forward in one torch SDPA call, causal from the bottom right (torch's ``causal_lower_right``
    bias, which dispatches to its flash or memory-efficient kernel where they run and materialises the mask where
    not). ``[B, H, q, D]`` in, ``[B, q, H, D]`` out."""
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(query.shape[2], key.shape[2])
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scale,
                                                           enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2)
