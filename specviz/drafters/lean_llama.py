"""A lean forward for Llama-architecture draft models: transformers' maths on the same weights, in far fewer calls.

Why: a draft model is small on purpose, so on a CPU its forward is dominated by per-operator dispatch, not
arithmetic. transformers' Llama goes through many small module and tensor calls per layer (separate q/k/v and
gate/up projections, rotate-half with two slices and a concat, mask building, attention-interface lookup). This
forward fuses q/k/v and gate/up into one matmul each and calls ``rms_norm``/``scaled_dot_product_attention``
directly, so a small draft's step gets markedly cheaper on CPU (``python tools/draft_forward.py`` measures
it; measured figures: BENCHMARKS.md).

Only the configurations whose maths it reproduces are accepted (plain RoPE, SiLU MLP, no biases, no sliding
window); anything else keeps transformers' forward. It reads and writes the same ``DynamicCache`` and takes the
same inputs as ``model(...)`` in ``masked_forward``, so the drafter's cache bookkeeping is unchanged. Drafts only:
the target always runs transformers' own forward, so verification is bit-for-bit the plain-decoding path.
With ``quant="int8"`` the projections use int8 weights instead (two in fp16 where the thin kernel cannot run;
``specviz.drafters.quantized``): logits close to transformers', no longer equal.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from specviz.drafters.quantized import projections


def lean_forward_for(model: torch.nn.Module, quant: str = "off") -> LeanLlama | None:
    """A ``LeanLlama`` over ``model``'s weights, or None when its configuration is not one this forward reproduces.

    ``quant="int8"`` runs the projections with reduced-precision weights (see ``specviz.drafters.quantized``).
    """
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if config is None or getattr(config, "model_type", None) != "llama" or inner is None:
        return None
    rope = getattr(config, "rope_parameters", None) or {}
    plain = (
        rope.get("rope_type", "default") == "default"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", None) == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
        and not getattr(config, "sliding_window", None)
        and isinstance(head, torch.nn.Linear)
        and head.bias is None
    )
    return LeanLlama(model, quant) if plain else None


class LeanLlama(torch.nn.Module):
    """Wraps a ``LlamaForCausalLM`` (weights shared; q/k/v and gate/up concatenated once) with a short forward.

    The concatenated copies hold those projections a second time (about 12 MB for a 4-layer, 256-wide draft).
    Each projection is a callable: ``F.linear`` on the weight, or a packed reduced-precision matmul.
    """

    def __init__(self, model: torch.nn.Module, quant: str = "off"):
        super().__init__()
        normalised, raw = projections(quant)
        self.quant = quant
        self.source = model
        config = model.config
        inner = model.model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.head = normalised(model.get_output_embeddings().weight)
        self.inv_freq = inner.rotary_emb.inv_freq.float()
        self.rope_scale = float(inner.rotary_emb.attention_scaling)
        with torch.no_grad():
            self.layers = [
                SimpleNamespace(
                    norm1=layer.input_layernorm.weight,
                    qkv=normalised(torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                                              layer.self_attn.v_proj.weight])),
                    out=raw(layer.self_attn.o_proj.weight),
                    norm2=layer.post_attention_layernorm.weight,
                    gate_up=normalised(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])),
                    down=raw(layer.mlp.down_proj.weight),
                )
                for layer in inner.layers
            ]

    @property
    def config(self):
        return self.source.config

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.source.get_output_embeddings()

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[n, 1, head_dim]`` for the positions, computed as transformers does (float32, then cast)."""
        freqs = position_ids[0, :, None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache, position_ids: torch.Tensor | None = None, attention_mask=None,
                use_cache: bool = True, logits_to_keep: int = 0) -> SimpleNamespace:
        """Batch-1 forward on top of ``cache``; ``attention_mask`` is None (causal) or ``[1, 1, n, kv]`` additive.

        ``position_ids`` default to the positions after the cached tokens, as in transformers.
        """
        n = input_ids.shape[1]
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device)[None]
        hidden = F.embedding(input_ids, self.embed)
        cos, sin = self._rope(position_ids, hidden.dtype)
        half, rotated = self.head_dim // 2, self.heads + self.kv_heads
        mask = attention_mask
        if mask is None and n > 1:  # causal over the new tokens, everything cached is visible
            mask = torch.ones(n, past + n, dtype=torch.bool, device=hidden.device).tril(past)
        for index, layer in enumerate(self.layers):
            x = F.rms_norm(hidden, (hidden.shape[-1],), layer.norm1, self.eps)
            qkv = layer.qkv(x).view(n, rotated + self.kv_heads, self.head_dim)
            qk, v = qkv[:, :rotated], qkv[:, rotated:]
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
            q = qk[:, : self.heads].transpose(0, 1)[None]
            k, v = cache.update(qk[:, self.heads :].transpose(0, 1)[None], v.transpose(0, 1)[None], index)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
            hidden = hidden + layer.out(attended[0].transpose(0, 1).reshape(1, n, -1))
            x = F.rms_norm(hidden, (hidden.shape[-1],), layer.norm2, self.eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        hidden = F.rms_norm(hidden, (hidden.shape[-1],), self.final_norm, self.eps)
        return SimpleNamespace(logits=self.head(hidden))
