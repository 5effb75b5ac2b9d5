"""The fast path's attention: a plain step's or a verify forward's few new tokens over the target's float32 cache.

A verify forward adds k + 1 query rows (a chain) or a tree's nodes on top of the committed prefix. torch's fused
CPU attention costs several times what reading the cache costs at these sizes, and at five rows about twice one
row's (BENCHMARKS.md, "Verify cost"), so the thin library (``thin_kernel.c``) attends them itself:
``specviz::verify_attention`` gives each row its own list of visible positions, the committed prefix and then the
row's visible new tokens (a chain's earlier tokens, a tree node's ancestors), reads each key and value from memory
once per row for all the query heads of its key/value group, and sums in float32. A row's result depends only on
its own positions' keys and values, in their order: the verify row of the newest committed token gets exactly what
a one-token step would (tested bit for bit), and so does every chain row.

Registered with transformers' ``AttentionInterface`` as ``specviz_verify_attention`` (masks built as for
``sdpa``); ``specviz.models.fast_forward`` switches the fast copy of a float32 CPU target to it where the library
built. A call the kernel does not take (a long prefill, another dtype, a batch, dropout, a mask that is not a
shared prefix plus a block of new tokens, soft caps and the like) runs ``specviz_grouped_sdpa`` as before.
"""

from __future__ import annotations

import torch

from specviz.errors import SpecvizError
from specviz.models import grouped_sdpa, thin_kernel

OP = "specviz::verify_attention"
#: The ``attn_implementation`` name.
NAME = "specviz_verify_attention"
#: The most new tokens a call attends through the kernel (a prefill of more runs torch's fused kernel, which is
#: faster there).
MAX_ROWS = 64
#: Keyword arguments that change the maths (``grouped_sdpa``'s list): with one set, SDPA runs.
_SPECIAL = ("softcap", "position_bias", "sinks", "s_aux")


def usable(dtype: torch.dtype, device: torch.device | str, head_dim: int) -> str | None:
    """Why the kernel cannot attend over a target cache of ``dtype`` on ``device`` (None when it can): float32 CPU
    caches whose head size is a multiple of the machine's vector width, where the thin library built."""
    kernel = thin_kernel.load()
    if kernel is None:
        return f"the thin kernel did not build here: {thin_kernel.unavailable_reason()}"
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        return f"it reads float32 caches on the CPU, not {dtype} on {device}"
    if head_dim % kernel.lanes:
        return f"head size {head_dim} is not a multiple of {kernel.lanes}"
    return None


def register() -> None:
    """Make ``specviz_verify_attention`` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    grouped_sdpa.register()
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, extras: torch.Tensor,
           counts: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """transformers' tensors as they come: ``query`` ``[1, heads, rows, dim]`` laid out as ``[rows, heads, dim]``
    (the projection's own layout, transposed), ``keys`` / ``values`` ``[1, kv_heads, length, dim]`` (a cache view:
    positions contiguous, heads at any stride). Row r's query heads see positions ``0 .. prefix - 1`` and then
    ``extras[r, :counts[r]]``; returns ``[1, rows, heads, dim]`` float32 (softmax(q·k * scale) · v per head, query
    head h reading key/value head ``h // (heads / kv_heads)``)."""
    return torch.ops.specviz.verify_attention(query, keys, values, extras, counts, prefix, scale)


class Visibility:
    """Who sees which cached position in one forward, as the kernel reads it: every row sees ``0 .. prefix - 1``,
    then ``extras[r, :counts[r]]`` (int32 ``[rows, max(1, widest)]``, ``counts`` int64 ``[rows]``)."""

    def __init__(self, extras: list[list[int]], prefix: int):
        self.prefix = prefix
        self.counts = torch.tensor([len(row) for row in extras], dtype=torch.int64)
        self.extras = torch.zeros(len(extras), max([1, *map(len, extras)]), dtype=torch.int32)
        for row, positions in enumerate(extras):
            self.extras[row, : len(positions)] = torch.tensor(positions, dtype=torch.int32)

    @classmethod
    def causal(cls, rows: int, kv: int) -> Visibility:
        """The last ``rows`` of ``kv`` positions, each seeing everything up to itself (a step, a chain, a prefill)."""
        prefix = kv - rows
        return cls([list(range(prefix, prefix + row + 1)) for row in range(rows)], prefix)

    @classmethod
    def of_mask(cls, mask: torch.Tensor, rows: int, kv: int) -> Visibility | None:
        """From transformers' ``[1, 1, rows, kv]`` mask (bool: True = attend; float: 0 = attend, its dtype's
        minimum or -inf = not), or None where it is not a shared prefix and a block of new tokens the kernel reads."""
        if tuple(mask.shape) != (1, 1, rows, kv) or kv < rows:
            return None
        grid = mask[0, 0]
        if grid.dtype == torch.bool:
            visible = grid
        elif grid.is_floating_point():
            visible = grid == 0
            if not (visible | (grid <= torch.finfo(grid.dtype).min)).all():
                return None  # a bias, not a mask
        else:
            return None
        prefix = kv - rows
        if not visible[:, :prefix].all() or not visible.any(dim=1).all():
            return None
        block = visible[:, prefix:]
        return cls([(prefix + torch.nonzero(row).flatten()).tolist() for row in block], prefix)


#: The last forward's visibility: ``(mask, rows, kv, Visibility)``. Every layer of one forward gets the same mask
#: object (built anew for each forward, by the engine or by transformers), so it is worked out once a forward;
#: holding the mask keeps its identity from being reused meanwhile.
_last: tuple | None = None


def visibility(mask: torch.Tensor | None, rows: int, kv: int) -> Visibility | None:
    """``Visibility`` of this call (None: not one the kernel takes), from the cache of the last forward's."""
    global _last
    last = _last
    if last is not None and last[0] is mask and last[1:3] == (rows, kv):
        return last[3]
    if mask is None:
        found = Visibility.causal(rows, kv) if kv >= rows else None
    else:
        found = Visibility.of_mask(mask, rows, kv)
    _last = (mask, rows, kv, found)
    return found


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``[B, H, q, D]`` queries, ``[B, Hkv, kv, D]`` keys and values (the cache
    included) -> ``([B, q, H, D], None)``; through the kernel where it takes the call, else ``grouped_sdpa``."""
    batch, heads, rows, dim = query.shape
    kv = key.shape[2]
    if (batch == 1 and rows <= MAX_ROWS and _projected(query) and not dropout and query.is_cpu
            and query.dtype == key.dtype == value.dtype == torch.float32
            and key.stride()[2:] == (dim, 1) and key.stride() == value.stride()
            and (attention_mask is not None or rows == 1 or (kwargs.get("is_causal", True)
                                                             and getattr(module, "is_causal", True)))
            and not any(kwargs.get(name) is not None for name in _SPECIAL)):
        seen = visibility(attention_mask, rows, kv)
        if seen is not None:
            return attend(query, key, value, seen.extras, seen.counts, seen.prefix,
                          dim ** -0.5 if scaling is None else scaling), None
    return grouped_sdpa.grouped_sdpa_forward(module, query, key, value, attention_mask, dropout=dropout,
                                             scaling=scaling, **kwargs)


def _check(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, extras: torch.Tensor,
           counts: torch.Tensor, prefix: int) -> None:
    """What the raw pointers cannot check, in one expression when it passes (a forward pays it per layer); the
    positions themselves are checked by the library before it reads any (``_verify_attention``)."""
    if not (query.dim() == keys.dim() == 4 and query.dtype == keys.dtype == values.dtype == torch.float32
            and query.is_cpu and keys.is_cpu and values.is_cpu and query.shape[0] == keys.shape[0] == 1
            and _projected(query) and keys.shape == values.shape and keys.stride() == values.stride()
            and query.shape[1] % keys.shape[1] == 0 and keys.shape[3] == query.shape[3]
            and keys.stride()[2:] == (query.shape[3], 1) and extras.dtype == torch.int32 and extras.dim() == 2
            and extras.is_cpu and extras.is_contiguous() and extras.shape[0] == query.shape[2]
            and counts.dtype == torch.int64 and counts.is_cpu and tuple(counts.shape) == (query.shape[2],)
            and 0 <= prefix <= keys.shape[2]):
        _explain(query, keys, values, extras, counts, prefix)


def _projected(query: torch.Tensor) -> bool:
    """Whether a 4-D query ``[1, heads, rows, dim]`` is laid out as ``[rows, heads, dim]`` (a one-row query's row
    stride is whatever its maker left)."""
    _, heads, rows, dim = query.shape
    _, head_stride, row_stride, dim_stride = query.stride()
    return dim_stride == 1 and head_stride == dim and (rows == 1 or row_stride == heads * dim)


def _explain(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, extras: torch.Tensor,
             counts: torch.Tensor, prefix: int) -> None:
    """Raise the one line saying what ``_check`` refused."""
    for name, tensor in (("query", query), ("keys", keys), ("values", values), ("extras", extras),
                         ("counts", counts)):
        if tensor.device.type != "cpu":
            raise SpecvizError(f"{OP}: {name} is on {tensor.device}; the kernel runs on the CPU")
    if query.dtype != torch.float32 or query.dim() != 4 or query.shape[0] != 1 or not _projected(query):
        raise SpecvizError(f"{OP}: query must be float32 [1, heads, rows, dim] laid out as [rows, heads, dim], got "
                           f"{query.dtype} {tuple(query.shape)} strides {query.stride()}")
    _, heads, rows, dim = query.shape
    for name, tensor in (("keys", keys), ("values", values)):
        if (tensor.dtype != torch.float32 or tensor.dim() != 4 or tensor.shape[0] != 1 or heads % tensor.shape[1]
                or tensor.shape[3] != dim or tensor.stride()[2:] != (dim, 1)):
            raise SpecvizError(f"{OP}: {name} must be float32 [1, kv_heads dividing {heads}, length, {dim}] with "
                               f"contiguous positions, got {tensor.dtype} {tuple(tensor.shape)} strides "
                               f"{tensor.stride()}")
    if keys.shape != values.shape or keys.stride() != values.stride():
        raise SpecvizError(f"{OP}: keys {tuple(keys.shape)} and values {tuple(values.shape)} differ in shape or "
                           f"layout")
    if extras.dtype != torch.int32 or extras.dim() != 2 or not extras.is_contiguous() or extras.shape[0] != rows:
        raise SpecvizError(f"{OP}: extras must be contiguous int32 [{rows}, width], got {extras.dtype} "
                           f"{tuple(extras.shape)}")
    if counts.dtype != torch.int64 or tuple(counts.shape) != (rows,):
        raise SpecvizError(f"{OP}: counts must be int64 of shape ({rows},), got {counts.dtype} "
                           f"{tuple(counts.shape)}")
    raise SpecvizError(f"{OP}: prefix must lie in [0, {keys.shape[2]}], got {prefix}")


def _verify_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, extras: torch.Tensor,
                      counts: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """The operator's implementation: checks, then one call into the thin library (which checks the positions)."""
    _check(query, keys, values, extras, counts, prefix)
    kernel = thin_kernel.load()
    if kernel is None:
        raise SpecvizError(f"{OP}: the thin kernel did not build here: {thin_kernel.unavailable_reason()}")
    _, heads, rows, dim = query.shape
    kv_heads = keys.shape[1]
    if dim % kernel.lanes:
        raise SpecvizError(f"{OP}: head size {dim} is not a multiple of {kernel.lanes} (the kernel's lanes)")
    out = query.new_empty((1, rows, heads, dim))
    if rows:
        refused = kernel.verify_attention(query.data_ptr(), keys.data_ptr(), values.data_ptr(), extras.data_ptr(),
                                          counts.data_ptr(), out.data_ptr(), rows, kv_heads, heads // kv_heads, dim,
                                          keys.stride(1), keys.shape[2], prefix, extras.shape[1], float(scale))
        if refused:
            raise SpecvizError(f"{OP}: {refused} of {rows} rows see no position, or a position outside the cache's "
                               f"{keys.shape[2]}, or count past extras' width {extras.shape[1]}")
    return out


def _verify_attention_shape(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, extras: torch.Tensor,
                            counts: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """The fake kernel ``torch.compile`` (and the meta device) runs: the shape checks, the output's shape."""
    _check(query, keys, values, extras, counts, prefix)
    _, heads, rows, dim = query.shape
    return query.new_empty((1, rows, heads, dim))


_LIBRARY = torch.library.Library(OP.split("::")[0], "FRAGMENT")
_LIBRARY.define(f"{OP.split('::')[1]}(Tensor query, Tensor keys, Tensor values, Tensor extras, Tensor counts, "
                "int prefix, float scale) -> Tensor")
_LIBRARY.impl(OP.split("::")[1], _verify_attention, "CompositeExplicitAutograd")
torch.library.register_fake(OP, _verify_attention_shape, lib=_LIBRARY)
