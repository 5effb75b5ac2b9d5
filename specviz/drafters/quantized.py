"""Reduced-precision weights for a draft model's projections on CPU (``draft_quant="int8"``), and for the output
layer of the head and block drafters (``head_parts.output_projection``).

Why: on a CPU a draft step is memory-bound, and most of it is the 49k-row output layer. int8 weights are a quarter
of the bytes, so the output-layer product gets several times cheaper (measured figures: BENCHMARKS.md). Only the
draft changes: the target still verifies in full precision, so the output stays exactly the target's; a less
faithful draft can only cost acceptance.

Which weights: int8 (per output channel) for every projection where the thin kernel runs: its activations stay
float32, so only the weights are rounded, and teacher-forced on the Spec-Bench dev answers the shipped draft's top-1
agreement stays that of fp32. fbgemm quantises the activations too, with one scale per call, which the attention
output and MLP down projections' raw, outlier-heavy inputs do not survive; there those two keep fp16-packed weights
and the rest int8 (measured figures: BENCHMARKS.md).

``"auto"``, the setting's default, is int8 wherever these kernels run (a float32 draft on CPU) and the draft's own
weights elsewhere (``resolve_draft_quant``); a drafter's ``describe()`` records what it resolved to.

Packing happens when the drafter is built (it lengthens that step, not a run), so it is outside every timed
generation.

The products run through specviz's thin kernel (``specviz.models.thin_kernel``: the weights widened to float32 in
registers, float32 activations) where it builds, else fbgemm's packed matmuls (``torch.ops.quantized``: int8
activations quantised per call), which torch has marked deprecated; where neither runs the option fails with one
line and the full-precision draft keeps working.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from specviz import settings
from specviz.errors import SpecvizError
from specviz.models import fast_forward, thin_kernel

DRAFT_QUANT_CHOICES = settings.get("draft_quant").choices

Projection = Callable[[torch.Tensor], torch.Tensor]


def check_draft_quant(value) -> str:
    """``draft_quant`` is one of the declared choices (``"off"`` keeps the draft's own weights): the drafter's own
    guard; users' values are checked where they enter (``specviz.settings``)."""
    if value not in DRAFT_QUANT_CHOICES:
        return settings.check("draft_quant", value)  # raises the declaration's one-line message
    return value


def _int8_missing(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why int8 products (the thin kernel's or fbgemm's) cannot run for weights on ``device`` in ``dtype``; None when
    they can."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"draft-quant int8 runs on CPU only; this draft is on {device.type}"
    if dtype != torch.float32:
        return f"draft-quant int8 needs a float32 draft, this one is {dtype}"
    engines = torch.backends.quantized.supported_engines
    if "fbgemm" not in engines and "x86" not in engines and thin_kernel.load() is None:
        return "draft-quant int8 needs a torch build with the fbgemm/x86 quantized engine"
    return None


def resolve_draft_quant(value, device: torch.device | str, dtype: torch.dtype) -> str:
    """The precision a draft on ``device`` in ``dtype`` drafts with: ``"auto"`` is int8 where int8 products
    run (float32 on a CPU), since a draft step there is memory-bound and int8 reads a quarter of the bytes;
    elsewhere (a GPU, half precision) the draft's own weights. Other values are returned as they are."""
    if check_draft_quant(value) != "auto":
        return value
    return "off" if _int8_missing(device, dtype) else "int8"


def check_quantizable(weight: torch.Tensor) -> None:
    """The int8 and float16 products take float32 CPU weights only; say so in one line instead of a kernel error."""
    reason = _int8_missing(weight.device, weight.dtype)
    if reason:
        raise SpecvizError(reason)


def full_precision(weight: torch.Tensor) -> Projection:
    """``x @ weight.T`` with the weight as it is: pre-packed (``fast_forward.packed_linear``) where it runs, else
    ``F.linear``."""
    if fast_forward.available(str(weight.device), weight.dtype):
        return fast_forward.packed_linear(weight)
    return lambda x: F.linear(x, weight)


@contextmanager
def _packing():
    """torch marks its quantized tensor constructors deprecated (a warning per call); turn a build that has
    dropped them into one clear error."""
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            yield
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        raise SpecvizError(f"draft-quant int8 is not available in torch {torch.__version__}: "
                           f"{str(error).splitlines()[0]}") from error


def int8_projection(weight: torch.Tensor) -> Projection:
    """Per-output-channel symmetric int8 weights: the thin kernel's (float32 activations) where it runs, else
    fbgemm's dynamic linear (activations quantised per call)."""
    check_quantizable(weight)
    if thin_kernel.load() is not None:
        return _thin_product(weight, torch.int8)
    with _packing():
        scale = thin_kernel.int8_scales(weight).double()
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        packed = torch.ops.quantized.linear_prepack(
            torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8), None)
    # reduce_range keeps activations to 7 bits, which avoids int16 saturation on CPUs without VNNI
    return lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)


def int8_layers_run(weight: torch.Tensor) -> bool:
    """Whether a drafter's own layers like ``weight`` can go int8 (``int8_layer``): the thin kernel runs and the
    weight is a float32 CPU one."""
    return thin_kernel.load() is not None and _int8_missing(weight.device, weight.dtype) is None


def int8_layer(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Projection:
    """``x -> x @ weight.T + bias`` with int8 weights through the thin kernel, activations float32: for a drafter's
    own layers, whose inputs need not be normalised, so fbgemm's (which quantises the activations too) is not used.
    Only where ``int8_layers_run``."""
    return _thin_product(weight, torch.int8, bias)


def _thin_product(weight: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None) -> Projection:
    """``x -> x @ weight.T + bias`` through the thin kernel with the weight packed once in ``dtype``."""
    thin = thin_kernel.load()
    packed = thin.pack(weight.detach(), dtype)
    bias = None if bias is None else bias.detach().float().contiguous()
    return lambda x: thin.linear(x, packed, bias)


def fp16_projection(weight: torch.Tensor) -> Projection:
    """float16 weights, float32 activations and accumulation: the thin kernel where it runs, else fbgemm."""
    check_quantizable(weight)
    if thin_kernel.load() is not None:
        return _thin_product(weight, torch.float16)
    with _packing():
        packed = torch.ops.quantized.linear_prepack_fp16(weight, None)
    return lambda x: torch.ops.quantized.linear_dynamic_fp16(x, packed)


def projections(quant: str) -> tuple[Callable[[torch.Tensor], Projection], Callable[[torch.Tensor], Projection]]:
    """(for inputs that are RMS-normalised, for raw residual-stream inputs) projection builders for ``quant``."""
    check_draft_quant(quant)
    if quant == "int8":
        return int8_projection, int8_projection if thin_kernel.load() is not None else fp16_projection
    return full_precision, full_precision
