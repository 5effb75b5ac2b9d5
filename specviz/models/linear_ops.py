"""The thin kernel as a torch operator: ``specviz::thin_linear``, ``x @ W.T + b`` over a weight packed once.

Why an operator and not a ctypes call from model code: torch sees it. Every argument's dtype, shape and device is
checked (one-line ``SpecvizError``) before a raw pointer reaches C; it shows in ``torch.profiler`` under its name;
and ``torch.compile`` traces through it (``register_fake`` gives the output's shape without running it), so a
compiled model keeps the kernel instead of breaking its graph. The ctypes call lives in the operator's
implementation (``_thin_linear``) and nowhere else.

``pack`` lays a float32 weight out once in the kernel's panels (float32, or for drafters int8 with one float32
scale per output); ``linear`` runs the operator on it. ``available`` says whether the library built here
(``thin_kernel.unavailable_reason`` says why not); where it did not, callers run torch's ``F.linear`` instead
(``specviz.models.linear_backend``). No autograd formula: the kernel serves inference.
"""

from dataclasses import dataclass

import torch

from specviz.errors import SpecvizError
from specviz.models import thin_kernel

OP = "specviz::thin_linear"
#: Weight formats the kernel reads: float32 (exact: the target) and int8 with per-output scales (drafters).
FORMATS = (torch.float32, torch.int8)
PANEL = thin_kernel.PANEL


@dataclass(frozen=True)
class PackedWeight:
    """A ``[out_features, in_features]`` weight in the kernel's panel layout (``values``, 1-D), with its int8
    scales (``scale``, one per output; None for float32)."""

    values: torch.Tensor
    scale: torch.Tensor | None
    out_features: int
    in_features: int


def available() -> bool:
    """Whether the thin kernel built and loaded here (else ``thin_kernel.unavailable_reason()`` says why)."""
    return thin_kernel.load() is not None


def int8_scales(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output int8 scales of a [n, k] weight: ``max |w| / 127`` per row (never zero)."""
    return weight.abs().amax(dim=1).clamp_min(1e-12) / 127


def int8_rounded(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the int8 values as float32, their per-output scales): ``round(w / s)`` clamped to ±127."""
    scale = int8_scales(weight)
    return torch.round(weight / scale[:, None]).clamp(-127, 127), scale


def pack(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> PackedWeight:
    """``weight`` ([n, k] float32 on the CPU) in the panels ``specviz::thin_linear`` reads: panel p holds outputs
    16p .. 16p + 15 for every input, 16 values per input, the last panel padded with zeros. ``dtype``: float32 (the
    same values) or int8 (``int8_rounded``)."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise SpecvizError(f"the thin kernel packs 2-D float32 CPU weights, got {weight.dtype} "
                           f"{tuple(weight.shape)} on {weight.device}")
    if dtype not in FORMATS:
        raise SpecvizError(f"the thin kernel packs float32 or int8 weights, not {dtype}")
    values, scale = weight.detach(), None
    if dtype == torch.int8:
        values, scale = int8_rounded(values)
    n, k = values.shape
    panels = -(-n // PANEL)
    padded = values.new_zeros((panels * PANEL, k), dtype=dtype)
    padded[:n] = values
    packed = padded.view(panels, PANEL, k).transpose(1, 2).contiguous().view(-1)
    return PackedWeight(packed, None if scale is None else scale.contiguous(), n, k)


def linear(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` for ``x`` [..., k] float32 on the CPU, ``weight = pack(W)``, through the operator."""
    return torch.ops.specviz.thin_linear(x, weight.values, weight.scale, bias, weight.out_features)


def _check(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
           out_features: int) -> None:
    """What the raw pointers cannot check: one line per mistake (fake tensors too, so ``torch.compile`` sees it).
    Arguments that pass cost one expression (a forward pays it per linear layer); ``_explain`` names a mistake."""
    if not (x.dtype == torch.float32 and x.is_cpu and x.ndim and packed.is_cpu and packed.ndim == 1
            and packed.is_contiguous() and out_features >= 1 and x.shape[-1] >= 1
            and packed.numel() == -(-out_features // PANEL) * PANEL * x.shape[-1]
            and (scale is None if packed.dtype == torch.float32
                 else packed.dtype == torch.int8 and _is_vector(scale, out_features))
            and (bias is None or _is_vector(bias, out_features))):
        _explain(x, packed, scale, bias, out_features)


def _is_vector(tensor: torch.Tensor | None, n: int) -> bool:
    """A contiguous float32 CPU tensor of shape (n,): a scale or a bias."""
    return (tensor is not None and tensor.dtype == torch.float32 and tensor.is_cpu and tensor.ndim == 1
            and tensor.shape[0] == n and tensor.is_contiguous())


def _explain(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
             out_features: int) -> None:
    """Raise the one line saying what ``_check`` refused."""
    for name, tensor in (("x", x), ("packed", packed), ("scale", scale), ("bias", bias)):
        if tensor is not None and tensor.device.type != "cpu":
            raise SpecvizError(f"{OP}: {name} is on {tensor.device}; the thin kernel runs on the CPU")
    if x.dtype != torch.float32 or x.dim() < 1:
        raise SpecvizError(f"{OP}: x must be float32 with at least one dimension, got {x.dtype} {tuple(x.shape)}")
    if packed.dtype not in FORMATS or packed.dim() != 1 or not packed.is_contiguous():
        raise SpecvizError(f"{OP}: packed must be a contiguous 1-D float32 or int8 tensor (linear_ops.pack), got "
                           f"{packed.dtype} {tuple(packed.shape)}")
    k = x.shape[-1]
    if out_features < 1 or k < 1 or packed.numel() != -(-out_features // PANEL) * PANEL * k:
        raise SpecvizError(f"{OP}: packed holds {packed.numel()} values, not {out_features} outputs x {k} inputs "
                           f"(x's last dimension) in panels of {PANEL}")
    if (scale is None) != (packed.dtype != torch.int8):
        raise SpecvizError(f"{OP}: int8 weights need their per-output scales and float32 weights take none; got "
                           f"{packed.dtype} weights and {'no' if scale is None else 'a'} scale")
    for name, tensor in (("scale", scale), ("bias", bias)):
        if tensor is not None and (tensor.dtype != torch.float32 or tuple(tensor.shape) != (out_features,)
                                   or not tensor.is_contiguous()):
            raise SpecvizError(f"{OP}: {name} must be contiguous float32 of shape ({out_features},), got "
                               f"{tensor.dtype} {tuple(tensor.shape)}")
    raise SpecvizError(f"{OP}: arguments refused")  # not reached: every refusal above has its line


def _thin_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
                 out_features: int) -> torch.Tensor:
    """The operator's implementation: ``x @ W.T + bias`` with ``packed``, ``scale`` = ``pack(W)``'s values and
    scales (int8), on the CPU, after ``_check``."""
    _check(x, packed, scale, bias, out_features)
    kernel = thin_kernel.load()
    if kernel is None:
        raise SpecvizError(f"{OP}: the thin kernel did not build here: {thin_kernel.unavailable_reason()}")
    k = x.shape[-1]
    rows = x.reshape(-1, k).contiguous()
    out = torch.empty(rows.shape[0], out_features, dtype=torch.float32)
    if rows.shape[0]:
        scales = () if scale is None else (scale.data_ptr(),)
        kernel.products[packed.dtype](rows.data_ptr(), packed.data_ptr(), *scales,
                                      None if bias is None else bias.data_ptr(), out.data_ptr(), rows.shape[0],
                                      out_features, k)
    return out.reshape(*x.shape[:-1], out_features)


def _thin_linear_shape(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor | None,
                       bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """The fake kernel ``torch.compile`` (and the meta device) runs: the same checks, an output of the right shape."""
    _check(x, packed, scale, bias, out_features)
    return x.new_empty((*x.shape[:-1], out_features))


# Registered through ``torch.library.Library`` rather than the ``custom_op`` decorator: the same operator to the
# dispatcher, the profiler and ``torch.compile``, with a fraction of the decorator's per-call Python overhead,
# which a forward pays once per linear layer. One implementation for every backend, so a tensor on another device
# gets ``_check``'s one line rather than a missing-kernel error.
_LIBRARY = torch.library.Library(OP.split("::")[0], "DEF")
_LIBRARY.define(f"{OP.split('::')[1]}(Tensor x, Tensor packed, Tensor? scale, Tensor? bias, SymInt out_features) "
                "-> Tensor")
_LIBRARY.impl(OP.split("::")[1], _thin_linear, "CompositeExplicitAutograd")
torch.library.register_fake(OP, _thin_linear_shape, lib=_LIBRARY)
