"""Continuous-batching decoding for training data: the target's answers at the rate its matrix products allow.

``generate.greedy_batch`` decodes one padded batch through transformers' forward: every step re-concatenates every
layer's cache, short answers leave the batch and nothing takes their place, so on a CPU it runs at a fraction of what
the machine's matrix products could do (``floor.py`` measures that floor; BENCHMARKS.md has the figures). Here the
decoder keeps a fixed number of *slots* with preallocated key/value buffers: a finished answer frees its slot, the
next prompts are prefilled into the free slots together, and each step decodes every live answer in one forward
whose products have a row per answer. A step's attention in bfloat16 runs the thin library's decode attention
(``specviz.models.decode_attention``: each row reads its own cache once, up to its own length, with float32 sums);
elsewhere torch's products, with slots kept sorted by context length (live ones first) so that the step reads each
group of neighbours only up to the group's longest context. The forward is the model's own
maths on its own tensors (q/k/v and gate/up stacked once), written out so that the cache is two tensors per layer
instead of a ``Cache`` object.

Supported: decoder-only models of the Llama shape (``ARCHITECTURES``: RMSNorm, rotary positions from the model's own
rotary module, grouped-query attention, SiLU-gated MLP; Qwen2's q/k/v biases and Qwen3's q/k norms). Others return a
reason from ``unsupported`` and the caller keeps ``greedy_batch``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specviz.engine import sampling
from specviz.models import decode_attention

#: model types whose decoder layers compute exactly what ``_layer`` below computes
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
#: most prompt tokens prefilled in one forward (bounds the prefill's activation memory)
PREFILL_TOKENS = 4096
#: neighbouring slots whose attention reads up to one shared length
GROUP = 16


def unsupported(model) -> str | None:
    """Why ``SlotDecoder`` cannot run ``model`` (None when it can)."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model type {kind!r} is not one of {', '.join(ARCHITECTURES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and kind == "mistral":
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    return None


@dataclass
class Answer:
    """One prompt's answer: its token ids and, per answer position, the target's top-k (ids, probabilities)."""

    ids: list[int] = field(default_factory=list)
    top_ids: list[torch.Tensor] = field(default_factory=list)
    top_probs: list[torch.Tensor] = field(default_factory=list)


class _Layer:
    """One decoder layer's tensors, in the decoding dtype, with q/k/v and gate/up stacked."""

    def __init__(self, layer, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        cast = lambda t: None if t is None else t.detach().to(dtype)  # noqa: E731
        self.qkv = cast(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv_bias = cast(torch.cat(biases)) if biases[0] is not None else None
        self.o = cast(attn.o_proj.weight)
        self.o_bias = cast(attn.o_proj.bias)
        self.gate_up = cast(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        self.down = cast(mlp.down_proj.weight)
        self.norm_in = cast(layer.input_layernorm.weight)
        self.norm_post = cast(layer.post_attention_layernorm.weight)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = cast(q_norm.weight) if q_norm is not None else None
        self.k_norm = cast(k_norm.weight) if k_norm is not None else None


class SlotDecoder:
    """Answers many prompts with ``slots`` rows decoding at once; see the module docstring."""

    def __init__(self, model, *, slots: int = 64, dtype: torch.dtype | None = None, attention_kernel: bool = True):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"the slot decoder cannot run this model: {reason}")
        config = model.config
        self.dtype = dtype or next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.slots = slots
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        inner = model.model
        self.rotary = inner.rotary_emb
        self.embed = inner.embed_tokens.weight.detach().to(self.dtype)
        self.layers = [_Layer(layer, self.dtype) for layer in inner.layers]
        self.final_norm = inner.norm.weight.detach().to(self.dtype)
        self.lm_head = model.lm_head.weight.detach().to(self.dtype)
        self.scaling = self.head_dim ** -0.5
        #: why attention runs through torch rather than the decode-attention kernel (None: the kernel)
        self.torch_attention_reason = (decode_attention.usable(self.dtype, self.device, self.head_dim)
                                       if attention_kernel else "attention_kernel=False")

    def describe_attention(self) -> str:
        """Which attention the decoder runs, for the data log."""
        reason = self.torch_attention_reason
        return "specviz::decode_attention" if reason is None else f"torch's ({reason})"

    # -- the forward ---------------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(self.dtype) * weight

    def _attention_inputs(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        rows, width = x.shape[:2]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = F.linear(self._norm(x, layer.norm_in), layer.qkv, layer.qkv_bias)
        q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
        q = q.view(rows, width, self.heads, self.head_dim)
        k = k.view(rows, width, self.kv_heads, self.head_dim)
        if layer.q_norm is not None:
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q, k, v.view(rows, width, self.kv_heads, self.head_dim).transpose(1, 2)

    def _finish_layer(self, layer: _Layer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        rows, width = x.shape[:2]
        x = x + F.linear(attended.transpose(1, 2).reshape(rows, width, -1), layer.o, layer.o_bias)
        gate, up = F.linear(self._norm(x, layer.norm_post), layer.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.down)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(self.embed[:1], positions)
        return cos.to(self.dtype), sin.to(self.dtype)

    def _prefill(self, prompts: list[list[int]], slots: list[int], keys, values) -> torch.Tensor:
        """Run right-padded ``prompts`` (causal attention keeps padding out of every real row), store their keys and
        values in ``slots``; return the logits at each prompt's last token."""
        width = max(map(len, prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)] = torch.tensor(prompt, device=self.device)
        cos, sin = self._rope(torch.arange(width, device=self.device).expand(len(prompts), width))
        x = self.embed[ids]
        index = torch.tensor(slots, device=self.device)
        row_slots = index.repeat_interleave(width)  # the kernel's rows: every position of every prompt
        row_lengths = torch.arange(width, device=self.device).repeat(len(prompts))
        for layer, k_buf, v_buf in zip(self.layers, keys, values):
            q, k, v = self._attention_inputs(layer, x, cos, sin)
            k_buf[index, :, :width] = k
            v_buf[index, :, :width] = v
            if self.torch_attention_reason is None:
                rows = q.transpose(1, 2).reshape(len(prompts) * width, self.heads, 1, self.head_dim)
                attended = self._attend_kernel(rows, k_buf, v_buf, row_lengths, row_slots)
                attended = attended.view(len(prompts), width, self.heads, self.head_dim).transpose(1, 2)
            else:
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling,
                                                          enable_gqa=True)
            x = self._finish_layer(layer, x, attended)
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        return F.linear(self._norm(x[torch.arange(len(prompts)), last], self.final_norm), self.lm_head)

    def _step(self, tokens: torch.Tensor, lengths: torch.Tensor, keys, values) -> torch.Tensor:
        """Decode one token in every slot given (the first ones: the loop keeps answers in them) at position
        ``lengths[slot]``; return their logits."""
        rows = torch.arange(len(lengths), device=self.device)
        cos, sin = self._rope(lengths[:, None])
        attend = self._attend_kernel if self.torch_attention_reason is None else self._attend_groups(lengths)
        x = self.embed[tokens][:, None]
        for layer, k_buf, v_buf in zip(self.layers, keys, values):
            q, k, v = self._attention_inputs(layer, x, cos, sin)
            k_buf[rows, :, lengths] = k[:, :, 0]
            v_buf[rows, :, lengths] = v[:, :, 0]
            x = self._finish_layer(layer, x, attend(q, k_buf, v_buf, lengths))
        return F.linear(self._norm(x[:, 0], self.final_norm), self.lm_head)

    def _attend_kernel(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                       slots: torch.Tensor | None = None) -> torch.Tensor:
        """Each row's query heads ``[rows, heads, 1, head_dim]`` against its slot's cache (``slots``, default: row r
        reads slot r) up to ``lengths[row]``, through ``specviz::decode_attention``."""
        rows = q.shape[0]
        grouped = q.reshape(rows, self.kv_heads, self.heads // self.kv_heads, self.head_dim).float().contiguous()
        out = decode_attention.attend(grouped, keys, values, lengths, self.scaling, slots)
        return out.view(rows, self.heads, 1, self.head_dim).to(self.dtype)

    def _attend_groups(self, lengths: torch.Tensor):
        """Torch's attention for a step: each group of ``GROUP`` neighbouring slots reads up to its longest context
        (the loop keeps slots sorted by length, so neighbours have similar contexts and little is read twice)."""
        positions = torch.arange(int(lengths.max()) + 1, device=self.device)
        groups = []
        for start in range(0, len(lengths), GROUP):
            stop = min(start + GROUP, len(lengths))
            members = lengths[start:stop]
            span = int(members.max()) + 1
            groups.append((start, stop, span, (positions[None, :span] > members[:, None])[:, None, None, :]))

        def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            return torch.cat([self._attend_one(q[a:b], keys[a:b, :, :span], values[a:b, :, :span], hidden)
                              for a, b, span, hidden in groups])
        return attend

    @staticmethod
    def _sort(lengths: torch.Tensor, tokens: torch.Tensor, keys, values, owner: dict[int, int],
              free: list[int]) -> None:
        """Renumber the slots, longest context first and free slots last, moving their caches along (in place)."""
        order = sorted(range(len(lengths)), key=lambda slot: (slot not in owner, -int(lengths[slot])))
        permutation = torch.tensor(order, device=lengths.device)
        span = int(lengths.max()) + 1
        for buffer in (*keys, *values):
            buffer[:, :, :span] = buffer[permutation, :, :span]
        lengths.copy_(lengths[permutation])
        tokens.copy_(tokens[permutation])
        moved = {new: owner[old] for new, old in enumerate(order) if old in owner}
        owner.clear()
        owner.update(moved)
        free[:] = [slot for slot in range(len(order)) if slot not in moved]
        lengths[free] = 0

    def _attend_one(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    hidden: torch.Tensor) -> torch.Tensor:
        """One query per row against its cached keys, the query heads grouped on their key/value head (torch's
        fused CPU attention is several times slower in bfloat16 for a single query). Scores in float32."""
        rows, group = q.shape[0], self.heads // self.kv_heads
        grouped = q.view(rows, self.kv_heads, group, self.head_dim)
        scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * self.scaling
        weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).to(self.dtype)
        return torch.matmul(weights, values).view(rows, self.heads, 1, self.head_dim)

    # -- the loop ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def answer(self, prompts: list[list[int]], *, max_new_tokens: int, eos: set[int], topk: int = 8,
               temperature: float = 0.0, seed: int = 0) -> list[Answer]:
        """Every prompt's answer (greedy, or sampled at ``temperature``: prompt ``i`` draws from its own generator
        seeded ``seed + i``, so its answer does not depend on which prompts shared the batch)."""
        if not prompts:
            return []
        capacity = max(map(len, prompts)) + max_new_tokens
        shape = (self.slots, self.kv_heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        lengths = torch.zeros(self.slots, dtype=torch.long, device=self.device)
        tokens = torch.zeros(self.slots, dtype=torch.long, device=self.device)
        owner: dict[int, int] = {}  # slot -> prompt index
        free = list(range(self.slots))
        waiting = deque(sorted(range(len(prompts)), key=lambda i: len(prompts[i])))
        answers = [Answer() for _ in prompts]
        generators = ([torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
                      if temperature > 0 else None)

        def record(slots: list[int], logits: torch.Tensor) -> None:
            """Take the next token of each of ``slots``' answers from its row of ``logits``; free the slots whose
            answers end."""
            probs = torch.softmax(logits.float(), dim=-1)
            top_p, top_i = probs.topk(topk, dim=-1)
            top_p, top_i = top_p.cpu(), top_i.cpu()
            if generators:
                scaled = probs if temperature == 1.0 else torch.softmax(logits.float() / temperature, dim=-1)
                drawn = sampling.draw(scaled, [generators[owner[slot]] for slot in slots]).tolist()
            for row, slot in enumerate(slots):
                index = owner[slot]
                answer = answers[index]
                token = drawn[row] if generators else int(top_i[row, 0])
                answer.ids.append(token)
                answer.top_ids.append(top_i[row])
                answer.top_probs.append(top_p[row])
                if token in eos or len(answer.ids) >= max_new_tokens:
                    del owner[slot]
                    free.append(slot)
                else:
                    tokens[slot] = token

        while waiting or owner:
            if waiting and (len(free) * 8 >= self.slots or not owner):
                admitted: list[tuple[int, int]] = []
                while waiting and free:
                    admitted.append((free.pop(), waiting.popleft()))
                for chunk in _chunks(admitted, [len(prompts[i]) for _, i in admitted]):
                    chunk_prompts = [prompts[i] for _, i in chunk]
                    logits = self._prefill(chunk_prompts, [slot for slot, _ in chunk], keys, values)
                    for slot, index in chunk:
                        owner[slot] = index
                        lengths[slot] = len(prompts[index])
                    record([slot for slot, _ in chunk], logits)
                self._sort(lengths, tokens, keys, values, owner, free)
            if not owner:
                continue
            if len(owner) * 4 < (max(owner) + 1) * 3:  # many finished answers among the live ones: close the gaps
                self._sort(lengths, tokens, keys, values, owner, free)
            used = max(owner) + 1
            logits = self._step(tokens[:used], lengths[:used], keys, values)
            live = sorted(owner)
            lengths[live] += 1
            record(live, logits[live])
            for slot in free:  # a freed slot below ``used`` decodes a harmless token at position 0 until reused
                lengths[slot] = 0
        return answers


def _chunks(admitted: list[tuple[int, int]], sizes: list[int]) -> list[list[tuple[int, int]]]:
    """``admitted`` (similar lengths, in order) cut so that each prefill holds at most ``PREFILL_TOKENS`` padded
    tokens (one prompt longer than that still goes alone)."""
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    widest = 0
    for item, size in zip(admitted, sizes):
        if current and max(widest, size) * (len(current) + 1) > PREFILL_TOKENS:
            chunks.append(current)
            current, widest = [], 0
        current.append(item)
        widest = max(widest, size)
    if current:
        chunks.append(current)
    return chunks
