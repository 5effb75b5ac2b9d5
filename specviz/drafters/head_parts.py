"""Pieces every feature-reading drafter is built from besides its layers (``head_layer``): the target's parts it
borrows, fresh initialisation and the packed-kernel copy used for inference. One definition each (EAGLE, MTP, Medusa,
DFlash/DSpark share them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters.checkpoint_files import TargetShape
from specviz.drafters.quantized import (
    Projection,
    check_draft_quant,
    int8_layer,
    int8_layers_run,
    int8_projection,
    resolve_draft_quant,
)
from specviz.errors import SpecvizError
from specviz.models import fast_forward

M = TypeVar("M", bound=nn.Module)


def target_parts(model: nn.Module) -> tuple[TargetShape, torch.Tensor, nn.Module]:
    """(shape, embedding weight, output layer) of a causal LM (``Target.model`` or a loaded HF model): what a
    drafter borrows instead of storing copies."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    output = model.get_output_embeddings()
    if output is None or not hasattr(output, "weight"):
        raise SpecvizError(f"{type(model).__name__} has no output layer a drafter can borrow")
    shape = TargetShape.of(config, vocab_size=int(output.weight.shape[0]))
    return shape, model.get_input_embeddings().weight, output


def shallow_copy(module: nn.Module, pack) -> nn.Module:
    """``module`` and its children copied (tensors shared); each ``nn.Linear`` runs through ``pack``."""
    new = copy.copy(module)
    new._modules = {name: None if child is None else shallow_copy(child, pack)
                    for name, child in module._modules.items()}
    if isinstance(module, nn.Linear):
        new.forward = pack(module.weight, module.bias)
    return new


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Projection:
    """``x -> F.linear(x, weight, bias)``: ``shallow_copy``'s packing where packed kernels do not run."""
    return lambda x: F.linear(x, weight, bias)


def output_projection(rows: torch.Tensor, quant: str = "off", *, packed: bool = False) -> Projection | None:
    """An inference copy's output projection over ``rows`` (``[V, H]``), the biggest product of a draft step:
    int8 weights with ``quant="int8"`` (a quarter of the bytes; the draft changes, verification does not, so the
    output stays the target's), else float weights pre-packed where packing runs. None: keep the module's own
    forward (``packed``: ``rows`` are the fast target's output layer, already packed; or packing cannot run)."""
    rows = rows.detach()
    if resolve_draft_quant(quant, rows.device, rows.dtype) == "int8":
        return int8_projection(rows.contiguous())
    if packed or not fast_forward.available(str(rows.device), rows.dtype):
        return None
    return fast_forward.packed_linear(rows.contiguous())


def inference_copy(module: M, weight: torch.Tensor, rows: torch.Tensor | None, draft_quant: str = "off", *,
                   rows_packed: bool = False) -> M:
    """``module``'s copy for drafting (tensors shared; the module itself stays trainable): its linear layers through
    pre-packed kernels where they run (``fast_forward.packed_linear``; ``weight``, one of its own, says the device and
    dtype), in int8 with ``draft_quant="int8"`` where the thin kernel runs (``int8_layer``), and
    ``_output_op`` over the output ``rows`` (``output_projection``; ``rows_packed``: the copy already runs them
    packed). Modules with ``stack_projections`` (attention's q/k/v, the MLP's gate/up) get their siblings stacked
    into one product. ``draft_quant="auto"`` is resolved for the rows it would quantise (``weight`` when there are
    none); the copy's ``draft_quant`` says what it drafts with."""
    quantised = rows if rows is not None else weight
    draft_quant = resolve_draft_quant(draft_quant, quantised.device, quantised.dtype)
    packs = fast_forward.available(str(weight.device), weight.dtype)
    if not packs and draft_quant == "off":
        return module
    if draft_quant == "int8" and int8_layers_run(weight):
        linear = int8_layer
    else:
        linear = fast_forward.packed_linear if packs else plain_linear
    fast = shallow_copy(module, linear)
    for part in fast.modules():  # sibling projections that read one input: one product (``head_layer``)
        if hasattr(part, "stack_projections"):
            part.stack_projections(linear)
    fast.draft_quant = draft_quant
    if rows is not None:
        fast._output_op = output_projection(rows, draft_quant, packed=rows_packed or not packs)
    return fast


def drafting_copy(module: nn.Module, pack: bool, draft_quant: str = "off") -> tuple[nn.Module, str]:
    """What a drafter drafts with, and in which precision (``"off"`` or ``"int8"``): ``module.for_inference``
    (``"auto"`` resolved there, ``inference_copy``), or with ``pack=False`` the module itself (the unpacked reference
    path, which has no reduced-precision weights: ``"auto"`` means full precision)."""
    if pack:
        runner = module.for_inference(draft_quant)
        return runner, getattr(runner, "draft_quant", "off")
    if check_draft_quant(draft_quant) not in ("off", "auto"):
        raise SpecvizError(f"draft-quant {draft_quant} needs the drafter's packed inference copy")
    return module, "off"


def fresh(build: Callable[[], M], seed: int | None, *, embeddings: bool = False, std: float = 0.02) -> M:
    """``build()`` with its own linear layers (and embeddings, with ``embeddings``) drawn N(0, std), biases zero,
    under ``seed`` when one is given; the global RNG is left as it was. Borrowed target tensors are not modules of
    the drafter, so they are untouched."""
    state = torch.random.get_rng_state()
    if seed is not None:
        torch.manual_seed(seed)
    try:
        module = build()
        kinds = (nn.Linear, nn.Embedding) if embeddings else (nn.Linear,)
        for part in module.modules():
            if isinstance(part, kinds):
                nn.init.normal_(part.weight, std=std)
                if getattr(part, "bias", None) is not None:
                    nn.init.zeros_(part.bias)
    finally:
        if seed is not None:
            torch.random.set_rng_state(state)
    return module
