"""Reduced-precision weights for a draft model's projections on CPU (``draft_quant="int8"``), and for the output
layer of the head and block drafters (``head_parts.output_projection``).

Why: on a CPU a draft step is memory-bound, and most of it is the 49k-row output layer. int8 weights are a quarter
of the bytes, so the output-layer product gets several times cheaper (measured figures: BENCHMARKS.md). Only the
draft changes: the target still verifies in full precision, so the output stays exactly the target's; a less
faithful draft can only cost acceptance.

How: per-output-channel symmetric int8 weights, activations kept float32, so only the weights are rounded (teacher-
forced on the Spec-Bench dev answers the shipped draft's top-1 agreement stays that of fp32: BENCHMARKS.md). The
products run through specviz's thin kernel (the ``specviz::thin_linear`` operator, ``specviz.models.linear_ops``:
int8 panels widened to float32 in registers) where it builds. Where it does not, an explicit ``"int8"`` runs the same
rounded weights dequantised to float32 through torch's ``F.linear``: the same draft to float tolerance, without the
saving; a drafter's own layers then stay float32 (``int8_layers_run``), since rounding them would only cost.

``"auto"``, the setting's default, is int8 where the thin kernel runs (a float32 draft on CPU) and the draft's own
weights elsewhere (``resolve_draft_quant``); a drafter's ``describe()`` records what it resolved to.

Packing happens when the drafter is built (it lengthens that step, not a run), so it is outside every timed
generation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specviz import settings
from specviz.errors import SpecvizError
from specviz.models import fast_forward, linear_ops

DRAFT_QUANT_CHOICES = settings.get("draft_quant").choices

Projection = Callable[[torch.Tensor], torch.Tensor]


def check_draft_quant(value) -> str:
    """``draft_quant`` is one of the declared choices (``"off"`` keeps the draft's own weights): the drafter's own
    guard; users' values are checked where they enter (``specviz.settings``)."""
    if value not in DRAFT_QUANT_CHOICES:
        return settings.check("draft_quant", value)  # raises the declaration's one-line message
    return value


def _int8_missing(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why int8 weights cannot be made for a draft on ``device`` in ``dtype``; None when they can."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"draft-quant int8 runs on CPU only; this draft is on {device.type}"
    if dtype != torch.float32:
        return f"draft-quant int8 needs a float32 draft, this one is {dtype}"
    return None


def resolve_draft_quant(value, device: torch.device | str, dtype: torch.dtype) -> str:
    """The precision a draft on ``device`` in ``dtype`` drafts with: ``"auto"`` is int8 where the thin kernel runs
    int8 products (float32 on a CPU), since a draft step there is memory-bound and int8 reads a quarter of the bytes;
    elsewhere (a GPU, half precision, no kernel) the draft's own weights. Other values are returned as they are."""
    if check_draft_quant(value) != "auto":
        return value
    return "int8" if _int8_missing(device, dtype) is None and linear_ops.available() else "off"


def check_quantizable(weight: torch.Tensor) -> None:
    """The int8 products take float32 CPU weights only; say so in one line instead of a kernel error."""
    reason = _int8_missing(weight.device, weight.dtype)
    if reason:
        raise SpecvizError(reason)


def full_precision(weight: torch.Tensor) -> Projection:
    """``x @ weight.T`` with the weight as it is: through the fast path's declared kernel
    (``fast_forward.packed_linear``) where it runs, else ``F.linear``."""
    if fast_forward.available(str(weight.device), weight.dtype):
        return fast_forward.packed_linear(weight)
    return lambda x: F.linear(x, weight)


def int8_projection(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Projection:
    """``x -> x @ W'.T + bias`` for ``W'``, ``weight`` rounded to int8 per output channel: through the thin kernel
    where it runs, else dequantised to float32 for ``F.linear``. Activations stay float32 either way."""
    check_quantizable(weight)
    weight = weight.detach()
    bias = None if bias is None else bias.detach().float().contiguous()
    if linear_ops.available():
        packed = linear_ops.pack(weight, torch.int8)
        return lambda x: linear_ops.linear(x, packed, bias)
    values, scale = linear_ops.int8_rounded(weight)
    dequantised = values * scale[:, None]
    return lambda x: F.linear(x, dequantised, bias)


def int8_layers_run(weight: torch.Tensor) -> bool:
    """Whether a drafter's own layers like ``weight`` go int8 (``int8_layer``): the thin kernel runs and the weight is
    a float32 CPU one. Without the kernel int8 would save nothing there, so they keep their float32 weights."""
    return linear_ops.available() and _int8_missing(weight.device, weight.dtype) is None


def int8_layer(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Projection:
    """``x -> x @ weight.T + bias`` with int8 weights, activations float32: a drafter's own layers, where
    ``int8_layers_run``."""
    return int8_projection(weight, bias)


def projections(quant: str) -> tuple[Callable[[torch.Tensor], Projection], Callable[[torch.Tensor], Projection]]:
    """(for inputs that are RMS-normalised, for raw residual-stream inputs) projection builders for ``quant``: both
    int8 with ``"int8"`` (the activations stay float32, so raw inputs lose nothing to rounding), else full
    precision."""
    check_draft_quant(quant)
    if quant == "int8":
        return int8_projection, int8_projection
    return full_precision, full_precision
