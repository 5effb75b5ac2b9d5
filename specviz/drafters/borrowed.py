"""What a feature-reading drafter takes from its target instead of owning: the embedding and output layer (never
parameters, never saved, fingerprint-checked at load), and RoPE's frequencies for its own attention layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specviz.errors import SpecvizError
from specviz.models.shared_embedding import check_fingerprint, fingerprint, spec_of

#: RoPE scalings that change with the sequence length: a drafter's frequencies are computed once, so they are refused.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass
class Borrowed:
    """The target's embedding weight ``[V, H]`` and output layer (a module with ``weight`` ``[V, H]``; None where the
    drafter has its own). ``output_packed``: the output layer is the fast target path's pre-packed one."""

    embedding: torch.Tensor | None
    output: nn.Module | None
    output_packed: bool = False

    def __post_init__(self) -> None:
        if self.embedding is not None:
            self.embedding = self.embedding.detach()

    def embed(self, token_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's (frozen) embedding of ``token_ids``, in ``dtype``."""
        weight = self.embedding
        return F.embedding(token_ids.to(weight.device), weight).to(dtype)


def rope_frequencies(spec) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention scaling) for a drafter's attention, as transformers' Llama computes them from
    ``spec`` (``hidden_size``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``rope``, ``max_position_embeddings``).

    Float32 tensors kept outside the module's buffers: a ``.to(float16)`` for saving must not round them."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    kind = spec.rope.get("rope_type", "default")
    if kind in LENGTH_DEPENDENT_ROPE:
        raise SpecvizError(f"{kind} RoPE scaling (it changes with the sequence length) is not supported in drafters")
    config = LlamaConfig(hidden_size=spec.hidden_size, num_attention_heads=spec.num_heads,
                         num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         rope_parameters=dict(spec.rope), max_position_embeddings=spec.max_position_embeddings)
    rotary = LlamaRotaryEmbedding(config)
    return rotary.inv_freq.detach().float().clone(), float(rotary.attention_scaling)


def check_same_target(config: dict, embedding: torch.Tensor, carried: dict[str, tuple[torch.Tensor, torch.Tensor]]
                      | None = None, *, plural: bool = False, fingerprint_required: bool = True) -> None:
    """A drafter trained for another model drafts garbage: refuse it in one line.

    Our folders record the target embedding's fingerprint (``config``'s shared-weights record); published layouts
    may carry copies of target tensors (``carried``: name -> (stored copy, this target's tensor)), which must be this
    target's. ``fingerprint_required`` False: a record without a fingerprint (exported without the target at hand)
    passes. ``plural``: the drafter is named as "they" (heads, modules)."""
    was = "they were" if plural else "it was"
    record = spec_of(config)
    if record is not None and (fingerprint_required or record.get("fingerprint")):
        check_fingerprint(embedding, record.get("fingerprint") or [],
                          f"{was} trained for {record.get('from', 'another target')}: the target's embedding is not "
                          f"the one {was} trained with")
    for name, (stored, mine) in (carried or {}).items():
        if tuple(stored.shape) != tuple(mine.shape):
            raise SpecvizError(f"its {name} is {list(stored.shape)}, the target's {list(mine.shape)}")
        check_fingerprint(mine, fingerprint(stored), f"{was} trained for another model: its {name} is not this "
                                                     f"target's")
