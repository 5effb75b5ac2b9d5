"""Pieces every feature-reading drafter is built from: the target's borrowed parts, a SwiGLU MLP, RoPE's rotation
and the packed-kernel copy used for inference. One definition each (EAGLE, MTP, Medusa, DFlash/DSpark share them).
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


class Attention(nn.Module):
    """A decoder layer's attention projections, named as in transformers' Llama (``q_proj`` … ``o_proj``), reading
    ``in_features`` (EAGLE-3's layer reads 2H); ``bias`` on q/k/v (Qwen2), ``qk_norm`` per head (Qwen3, DFlash).
    The forward is each drafter's own (``rope_attention``)."""

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 bias: bool = False, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        self.q_proj = nn.Linear(in_features, q, bias=bias)
        self.k_proj = nn.Linear(in_features, kv, bias=bias)
        self.v_proj = nn.Linear(in_features, kv, bias=bias)
        self.o_proj = nn.Linear(q, hidden_size, bias=False)
        if qk_norm:
            self.q_norm = nn.RMSNorm(head_dim, eps=eps)
            self.k_norm = nn.RMSNorm(head_dim, eps=eps)


class GatedMLP(nn.Module):
    """The Llama/Qwen MLP, ``down(silu(gate(x)) * up(x))``, with the published weight names."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of the last dimension's two halves (the HF convention)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
    packed). ``draft_quant="auto"`` is resolved for the rows it would quantise (``weight`` when there are none);
    the copy's ``draft_quant`` says what it drafts with."""
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


def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: torch.Tensor,
                   rope: tuple[torch.Tensor, float], *, cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Llama-style RoPE on ``[B, heads, T, D]`` q and k (``rope`` = (inv_freq, attention scaling), angles as
    transformers computes them), the cache's keys and values appended, then SDPA (GQA when the head counts differ;
    causal from the bottom right when no ``mask`` is given). Returns ``[B, heads, T, D]``."""
    length = q.shape[-2]
    inv_freq, scaling = rope
    freqs = position_ids.reshape(-1, length).to(q.device)[..., None].float() * inv_freq.to(q.device)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (angles.cos() * scaling).to(q.dtype)[:, None], (angles.sin() * scaling).to(q.dtype)[:, None]
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    if cache is not None:
        k, v = cache.update(k, v, 0)
    total = k.shape[-2]
    if mask is None and length > 1:
        mask = torch.ones(length, total, dtype=torch.bool, device=q.device).tril(total - length)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
