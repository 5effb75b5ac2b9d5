"""The network pieces every drafter with attention shares (EAGLE-1/3, MTP, DFlash/DSpark), for drafting and training.

``DecoderLayer`` is one Llama-style layer: RMSNorm, RoPE, grouped-query attention over an explicit KV cache (anything
with ``update(keys, values, layer_idx)``: a ``DynamicCache`` while drafting, EAGLE's stacked steps in training), a
boolean mask for trees (True = attend) or causal / whole-block attention, and a SwiGLU MLP. Its tensors carry
transformers' Llama names (``self_attn.q_proj`` ... ``mlp.down_proj``, ``input_layernorm``,
``post_attention_layernorm``), the names the published layouts of all these families use, so one class serves them
all. What a family does differently is an option:

- ``attention_in``: q/k/v read a wider input (EAGLE-3's cat(norm(embedding), norm(hidden)): 2H);
- ``input_norm=False``: no ``input_layernorm`` (EAGLE-1's layer reads ``fc``'s output as it is);
- ``two_streams``: EAGLE-3's input, the token embedding beside the hidden state, each with its own norm
  (``input_layernorm``, ``hidden_norm``); ``norm_residual``: the residual is the normed hidden state;
- ``bias``: q/k/v biases (Qwen2, MiMo); ``qk_norm``: per-head RMSNorm on q and k (Qwen3, DFlash);
- per call, ``context``: DFlash's KV injection (target-context rows that give keys and values, no queries), and
  ``causal=False``: a block that sees itself whole (DFlash).

``DraftNetwork`` is the frame around the layers: the spec, the target's borrowed embedding and output layer, RoPE's
frequencies and the output projection an inference copy swaps in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters.borrowed import Borrowed, rope_frequencies
from specviz.drafters.head_parts import inference_copy
from specviz.drafters.layouts import DecoderSpec, Spec
from specviz.errors import SpecvizError

#: RoPE's (cos, sin) for the positions of one forward, ``[B, 1, S, head_dim]`` each.
Rotation = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    """A decoder layer's attention projections, named as in transformers' Llama (``q_proj`` … ``o_proj``), reading
    ``in_features``; ``bias`` on q/k/v, ``qk_norm`` per head. ``DecoderLayer.attend`` runs them."""

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
        self.qkv = None  # an inference copy's q/k/v as one product (``stack_projections``)

    def stack_projections(self, linear: Callable) -> None:
        """Run q/k/v as one product of their stacked rows through ``linear`` (an inference copy's packing): one
        pass over one weight instead of three kernel calls, each output the same sum it was."""
        self.qkv = stacked(linear, self.q_proj, self.k_proj, self.v_proj)
        self.widths = (self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features)

    def project(self, x: torch.Tensor, keyed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries of ``x``, keys and values of ``keyed`` (``x`` itself, or context rows before it)."""
        if self.qkv is not None and keyed is x:
            return self.qkv(x).split(self.widths, dim=-1)
        return self.q_proj(x), self.k_proj(keyed), self.v_proj(keyed)


class GatedMLP(nn.Module):
    """The Llama/Qwen MLP, ``down(silu(gate(x)) * up(x))``, with the published weight names."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up = None  # an inference copy's gate and up as one product (``stack_projections``)

    def stack_projections(self, linear: Callable) -> None:
        """Run gate and up as one product of their stacked rows (see ``Attention.stack_projections``)."""
        self.gate_up = stacked(linear, self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (self.gate_proj(x), self.up_proj(x)) if self.gate_up is None else self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def stacked(linear: Callable, *projections: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """``linear`` over the rows of ``projections`` stacked (biases too, where they have them): their outputs side by
    side. Per-output int8 scales and the kernel's per-output sums make each column what its own product gives."""
    weight = torch.cat([p.weight.detach() for p in projections])
    biases = [p.bias for p in projections]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    return linear(weight, bias)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of the last dimension's two halves (the HF convention)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderLayer(nn.Module):
    """One decoder layer with the options the families need (the module's docstring lists them).

    ``spec``: the shape (the target's, for our drafters); ``layer_idx``: the layer's entry in a cache several layers
    share.
    """

    def __init__(self, spec: DecoderSpec, *, layer_idx: int = 0, attention_in: int | None = None,
                 input_norm: bool = True, two_streams: bool = False, norm_residual: bool = False, bias: bool = False,
                 qk_norm: bool = False):
        super().__init__()
        hidden, eps = spec.hidden_size, spec.rms_norm_eps
        self.layer_idx, self.qk_norm = layer_idx, qk_norm
        self.two_streams, self.norm_residual = two_streams, norm_residual
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.self_attn = Attention(attention_in or hidden, hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                   bias=bias, qk_norm=qk_norm, eps=eps)
        self.mlp = GatedMLP(hidden, spec.intermediate_size)
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps) if input_norm or two_streams else None
        if two_streams:
            self.hidden_norm = nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden, eps=eps)

    def forward(self, h: torch.Tensor, rotation: Rotation, *, embedding: torch.Tensor | None = None,
                context: torch.Tensor | None = None, cache=None, mask: torch.Tensor | None = None,
                causal: bool = True) -> torch.Tensor:
        """The layer over ``h`` ``[B, T, H]`` (the residual stream); ``embedding``: the tokens' embedding beside it
        (``two_streams``). ``rotation``: ``DraftNetwork.rotation`` of the positions of [context ; h]. See
        ``attend`` for the rest."""
        if self.two_streams:
            normed = self.hidden_norm(h)
            x = torch.cat([self.input_layernorm(embedding), normed], dim=-1)
            residual = normed if self.norm_residual else h
        else:
            x, residual = h if self.input_layernorm is None else self.input_layernorm(h), h
        h = residual + self.attend(x, rotation, context=context, cache=cache, mask=mask, causal=causal)
        return h + self.mlp(self.post_attention_layernorm(h))

    def attend(self, x: torch.Tensor, rotation: Rotation, *, context: torch.Tensor | None = None, cache=None,
               mask: torch.Tensor | None = None, causal: bool = True) -> torch.Tensor:
        """Attention of the rows ``x`` ``[B, T, in]``: their queries, keys and values (and the keys and values of
        ``context`` ``[B, C, in]`` before them, when given), the cache's entries appended (``layer_idx``), then SDPA
        with ``mask`` (bool, True = attend, broadcastable to ``[B, heads, T, S]``) or, without one, causal from the
        bottom right (``causal``) or everything visible."""
        attn, (batch, length, _) = self.self_attn, x.shape
        keyed = x if context is None else torch.cat([context, x], dim=1)
        q, k, v = attn.project(x, keyed)
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, -1, self.num_kv_heads, self.head_dim)
        v = v.view(batch, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rotation
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos[..., -length:, :] + rotate_half(q) * sin[..., -length:, :]
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        total = k.shape[-2]
        if mask is None and causal and length > 1:
            mask = torch.ones(length, total, dtype=torch.bool, device=q.device).tril(total - length)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
        return attn.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class DraftNetwork(nn.Module):
    """The frame of a drafter network over a target: its ``spec``, the target's embedding and output layer borrowed
    (``borrowed``: never parameters, so never trained, moved, saved or counted), RoPE's frequencies (``_rope``) for its
    decoder layers and ``_output_op``, the output projection an inference copy swaps in (``head_parts``).

    ``own_output``: the network may bring its own output layer (then ``output`` may be None); ``whole_embedding``:
    check the embedding's rows against the vocabulary too (its ids are embedded as they are); ``rope`` False: no
    attention layers (Medusa).
    """

    def __init__(self, spec: Spec, embedding: torch.Tensor | None, output: nn.Module | None, *,
                 own_output: bool = False, whole_embedding: bool = False, rope: bool = True):
        super().__init__()
        self.spec = spec
        wanted = (spec.vocab_size, spec.hidden_size) if whole_embedding else (spec.hidden_size,)
        if embedding is not None and tuple(embedding.shape[-len(wanted):]) != wanted:
            raise SpecvizError(f"the target embedding is {list(embedding.shape)}; the drafter needs "
                               f"{list(wanted) if whole_embedding else f'[..., {spec.hidden_size}]'}")
        if output is None and not own_output:
            raise SpecvizError("a drafter without an output layer of its own needs the target's")
        self.borrowed = Borrowed(embedding, output)
        self._output_op = None  # inference copies: the output rows pre-packed, or in int8
        if rope:
            self._rope = rope_frequencies(spec)

    def draft_vocabulary(self, name: str, size: int) -> None:
        """Register ``name``, the map of a reduced draft vocabulary of ``size`` ids to the target's (a buffer, saved
        with the weights), or None where the network drafts over the whole vocabulary (``size`` 0)."""
        if size:
            self.register_buffer(name, torch.zeros(size, dtype=torch.long))
        else:
            setattr(self, name, None)

    @staticmethod
    def widen(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Logits over draft-vocabulary ``ids`` spread over the target's ``vocab_size``: every other id gets -inf
        (q = 0), so verification stays lossless."""
        full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
        return full.index_copy_(-1, ids.to(logits.device), logits)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the network's weights (float32 when it has none)."""
        weight = next(self.parameters(), None)
        return torch.float32 if weight is None else weight.dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) embedding of ``token_ids``, in the network's dtype."""
        return self.borrowed.embed(token_ids, self.dtype)

    def rotation(self, positions: torch.Tensor, like: torch.Tensor) -> Rotation:
        """RoPE's (cos, sin) at ``positions`` (``[S]`` or ``[B, S]``) in ``like``'s dtype and device, the angles as
        transformers computes them; one forward computes them once for all its layers."""
        inv_freq, scaling = self._rope
        positions = positions.reshape(-1, positions.shape[-1]).to(like.device)
        freqs = positions[..., None].float() * inv_freq.to(like.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * scaling).to(like.dtype)[:, None], (angles.sin() * scaling).to(like.dtype)[:, None]

    def project_out(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` through the output projection: the inference copy's own (``_output_op``) where it has one, else the
        target's output layer, in that layer's dtype."""
        if self._output_op is not None:
            return self._output_op(h)
        layer = self.borrowed.output
        return layer(h.to(layer.weight.dtype))

    def output_rows(self) -> tuple[torch.Tensor, bool]:
        """The ``[V, H]`` rows a draft step's logits multiply, and whether the drafting copy runs them as they are
        (the fast target's output layer comes packed)."""
        return self.borrowed.output.weight, self.borrowed.output_packed

    def for_inference(self, draft_quant: str = "off") -> DraftNetwork:
        """The network's copy for drafting, every tensor shared (``head_parts.inference_copy``): its projections
        through pre-packed kernels where they run, as the fast target path does, the output rows in int8 with
        ``draft_quant="int8"``. The network itself stays trainable."""
        rows, packed = self.output_rows()
        return inference_copy(self, next(self.parameters()), rows, draft_quant, rows_packed=packed)
