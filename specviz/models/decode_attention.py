"""Decode attention as a torch operator: ``specviz::decode_attention``, one query per row against a bfloat16 cache.

A decoding step of many answers at once (``specviz.training.slot_decoder``) attends each row's one new query to that
row's cached keys and values; its prefill attends each prompt position to the cache up to that position. Through
torch's batched products on a CPU most of a step's time went to copying slices of the cache buffer and to scores kept
in bfloat16, and torch's fused attention is slow in bfloat16 (docs/training-data.md). The thin library's kernel
(``thin_kernel.c``) reads each row's keys and values once, up to the row's own length, scores every query head of a
key/value group against each key as it is read, and sums in float32. As an operator it is checked (one-line
``SpecvizError`` before a raw pointer reaches C), named in ``torch.profiler`` and traced by ``torch.compile``
(``register_fake``). ``usable`` says whether a given cache can take it; elsewhere callers keep torch's own attention.
"""

from __future__ import annotations

import torch

from specviz.errors import SpecvizError
from specviz.models import thin_kernel

OP = "specviz::decode_attention"


def usable(dtype: torch.dtype, device: torch.device | str, head_dim: int) -> str | None:
    """Why the kernel cannot attend over a cache of ``dtype`` on ``device`` (None when it can): it reads bfloat16 CPU
    caches whose head size is a multiple of twice the machine's vector width, where the thin library built."""
    kernel = thin_kernel.load()
    if kernel is None:
        return f"the thin kernel did not build here: {thin_kernel.unavailable_reason()}"
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return f"it reads bfloat16 caches on the CPU, not {dtype} on {device}"
    if head_dim % (2 * kernel.lanes):
        return f"head size {head_dim} is not a multiple of {2 * kernel.lanes}"
    return None


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float,
           slots: torch.Tensor | None = None) -> torch.Tensor:
    """Row r's query heads ``q[r]`` ``[kv_heads, group, dim]`` (float32) against slot ``slots[r]`` (default: r) of
    ``keys`` / ``values`` ``[slots, kv_heads, capacity, dim]`` (bfloat16) at positions ``0 .. lengths[r]``; returns
    ``[rows, kv_heads, group, dim]`` float32 (softmax(q·k * scale) · v per query head)."""
    return torch.ops.specviz.decode_attention(q, keys, values, lengths, slots, scale)


def _check(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
           slots: torch.Tensor | None) -> None:
    """One line per mistake the raw pointers could not see (fake tensors too, so ``torch.compile`` sees it)."""
    for name, tensor in (("q", q), ("keys", keys), ("values", values), ("lengths", lengths), ("slots", slots)):
        if tensor is None:
            continue
        if tensor.device.type != "cpu":
            raise SpecvizError(f"{OP}: {name} is on {tensor.device}; the kernel runs on the CPU")
        if not tensor.is_contiguous():
            raise SpecvizError(f"{OP}: {name} must be contiguous")
    if q.dtype != torch.float32 or q.dim() != 4:
        raise SpecvizError(f"{OP}: q must be float32 [rows, kv_heads, group, dim], got {q.dtype} {tuple(q.shape)}")
    rows, kv_heads, _, dim = q.shape
    for name, tensor in (("keys", keys), ("values", values)):
        if (tensor.dtype != torch.bfloat16 or tensor.dim() != 4 or (slots is None and tensor.shape[0] < rows)
                or tensor.shape[1] != kv_heads or tensor.shape[3] != dim):
            raise SpecvizError(f"{OP}: {name} must be bfloat16 [slots, {kv_heads}, capacity, {dim}], got "
                               f"{tensor.dtype} {tuple(tensor.shape)}")
    if keys.shape != values.shape:
        raise SpecvizError(f"{OP}: keys {tuple(keys.shape)} and values {tuple(values.shape)} differ in shape")
    for name, tensor in (("lengths", lengths), ("slots", slots)):
        if tensor is not None and (tensor.dtype != torch.int64 or tuple(tensor.shape) != (rows,)):
            raise SpecvizError(f"{OP}: {name} must be int64 of shape ({rows},), got {tensor.dtype} "
                               f"{tuple(tensor.shape)}")


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                      slots: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The operator's implementation: checks, then one call into the thin library."""
    _check(q, keys, values, lengths, slots)
    kernel = thin_kernel.load()
    if kernel is None:
        raise SpecvizError(f"{OP}: the thin kernel did not build here: {thin_kernel.unavailable_reason()}")
    rows, kv_heads, group, dim = q.shape
    capacity = keys.shape[2]
    if dim % (2 * kernel.lanes):
        raise SpecvizError(f"{OP}: head size {dim} is not a multiple of {2 * kernel.lanes} (twice the kernel's lanes)")
    for name, tensor, bound in (("lengths", lengths, capacity), ("slots", slots, keys.shape[0])):
        if rows and tensor is not None and not (0 <= int(tensor.min()) and int(tensor.max()) < bound):
            raise SpecvizError(f"{OP}: {name} must lie in [0, {bound}), got {int(tensor.min())}..{int(tensor.max())}")
    out = torch.empty_like(q)
    if rows:
        kernel.decode_attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), lengths.data_ptr(),
                                None if slots is None else slots.data_ptr(), out.data_ptr(), rows, kv_heads, group,
                                dim, capacity, float(scale))
    return out


def _decode_attention_shape(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                            slots: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The fake kernel ``torch.compile`` (and the meta device) runs: the shape checks, an output like ``q``."""
    _check(q, keys, values, lengths, slots)
    return torch.empty_like(q)


_LIBRARY = torch.library.Library(OP.split("::")[0], "FRAGMENT")
_LIBRARY.define(f"{OP.split('::')[1]}(Tensor q, Tensor keys, Tensor values, Tensor lengths, Tensor? slots, "
                "float scale) -> Tensor")
_LIBRARY.impl(OP.split("::")[1], _decode_attention, "CompositeExplicitAutograd")
torch.library.register_fake(OP, _decode_attention_shape, lib=_LIBRARY)
