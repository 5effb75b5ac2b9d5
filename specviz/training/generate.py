"""Self-distillation data: the target's own chat answers, with its top-k probabilities.

Answers come from ``slot_decoder.SlotDecoder`` (continuous batching over preallocated key/value buffers) where the
target's architecture is one it runs, else from ``greedy_batch`` (one left-padded batch through transformers'
forward; finished rows leave it). Decoded in the target's own dtype, the logits computed while decoding are exactly
the target's next-token distributions, so no second pass is needed for the labels. Decoded in another dtype
(``decode_dtype``: bfloat16 products run about twice as fast as float32 ones on CPUs with bfloat16 instructions),
the labels are that dtype's numbers (``tools/answer_rate.py`` measures how often its top-1 differs from the target's
own) until a teacher-forced pass of the target in its own dtype relabels them: the pass that also gives the feature
trainers their hidden states (``layers``), so for those families every label is the target's own.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from specviz.engine import sampling
from specviz.errors import SpecvizError
from specviz.training import slot_decoder
from specviz.training.features import FeatureSet, extract_features

#: Longest prompt answered by default (generated prompts are shorter; longer ones keep their last tokens).
MAX_PROMPT_TOKENS = 640


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """The target's chat template around one user turn, ending with the assistant header."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=True,
                                        add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def stop_ids(tokenizer, model) -> set[int]:
    """Token ids that end an answer (the tokenizer's eos and the model's generation eos)."""
    ids = {tokenizer.eos_token_id}
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return {int(i) for i in ids if i is not None}


@torch.no_grad()
def greedy_batch(model, prompts: list[list[int]], *, max_new_tokens: int, eos: set[int], pad_id: int,
                 topk: int = 8, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Answers for a batch of prompts: per prompt (answer ids, top-k ids [n, k], top-k probs [n, k]).

    Greedy by default; ``temperature`` > 0 samples instead (more varied contexts for the drafter to learn from).
    Row ``t`` of the top-k arrays is always the target's own (temperature-1) distribution at answer position ``t``.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        attn[row, width - len(prompt):] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, positions = ids.to(device), attn.to(device), positions.to(device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache, logits = out.cache, out.logits[:, -1]
    alive = list(range(len(prompts)))  # original row of each live batch row
    answers: list[list[int]] = [[] for _ in prompts]
    tops_i: list[list[torch.Tensor]] = [[] for _ in prompts]
    tops_p: list[list[torch.Tensor]] = [[] for _ in prompts]
    eos_t = torch.tensor(sorted(eos), device=device)
    last_pos = positions[:, -1:]
    for _step in range(max_new_tokens):
        probs = torch.softmax(logits.float(), dim=-1)
        top_p, top_i = probs.topk(topk, dim=-1)
        if temperature > 0:
            scaled = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = sampling.draw(scaled, generator).to(device)
        else:
            nxt = top_i[:, 0]
        done = torch.isin(nxt, eos_t)
        for row, orig in enumerate(alive):
            answers[orig].append(int(nxt[row]))
            tops_i[orig].append(top_i[row].cpu())
            tops_p[orig].append(top_p[row].cpu())
        keep = (~done).nonzero().flatten()
        if keep.numel() == 0:
            break
        if keep.numel() < len(alive):
            cache.batch_select_indices(keep)
            attn, nxt, last_pos = attn[keep], nxt[keep], last_pos[keep]
            alive = [alive[int(k)] for k in keep]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        last_pos = last_pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last_pos, cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1]
    return [(answers[i], torch.stack(tops_i[i]), torch.stack(tops_p[i])) for i in range(len(prompts))]


def self_distill(model, tokenizer, prompts: list[str], *, categories: list[str] | None = None,
                 max_new_tokens: int = 160, batch_size: int = 24, topk: int = 8,
                 max_prompt_tokens: int = MAX_PROMPT_TOKENS, temperature: float = 0.0, seed: int = 0,
                 decode_dtype: torch.dtype | None = None, layers: tuple[int, ...] = ()) -> FeatureSet:
    """Answer every prompt (greedy, or sampled at ``temperature`` with ``seed``); return prompt+answer sequences
    with top-k on the answer positions only. Prompts longer than ``max_prompt_tokens`` keep their last tokens.
    ``batch_size`` is the number of answers decoded at once; ``decode_dtype`` (default: the model's) see above.
    With ``layers`` (hidden_states indices), a teacher-forced pass of ``model`` in its own dtype relabels the answers
    and keeps those hidden states: one pass gives the feature trainers exact labels and their inputs."""
    encoded = [chat_ids(tokenizer, text)[-max_prompt_tokens:] for text in prompts]
    results = continue_ids(model, tokenizer, encoded, max_new_tokens=max_new_tokens, batch_size=batch_size, topk=topk,
                           temperature=temperature, seed=seed, decode_dtype=decode_dtype)
    ids, masks, t_ids, t_probs, starts = [], [], [], [], [0]
    for prompt, (answer, top_i, top_p) in zip(encoded, results):
        seq = prompt + answer
        mask = torch.zeros(len(seq), dtype=torch.bool)
        mask[len(prompt) - 1:len(seq) - 1] = True  # position j predicts token j+1 = each answer token
        full_i = torch.full((len(seq), topk), -1, dtype=torch.long)
        full_p = torch.zeros(len(seq), topk)
        full_i[len(prompt) - 1:len(seq) - 1] = top_i
        full_p[len(prompt) - 1:len(seq) - 1] = top_p
        ids.append(torch.tensor(seq))
        masks.append(mask)
        t_ids.append(full_i)
        t_probs.append(full_p)
        starts.append(starts[-1] + len(seq))
    answered = FeatureSet(torch.cat(ids), torch.tensor(starts), torch.cat(masks), torch.cat(t_ids), torch.cat(t_probs),
                          categories=categories or ["chat"] * len(prompts))
    return relabel(model, answered, topk, layers) if layers else answered


def continue_ids(model, tokenizer, encoded: list[list[int]], *, max_new_tokens: int, batch_size: int, topk: int,
                 temperature: float = 0.0, seed: int = 0,
                 decode_dtype: torch.dtype | None = None) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Each token sequence of ``encoded`` continued until a stop token or ``max_new_tokens``: (new ids, top-k ids,
    top-k probs) per sequence, by the slot decoder where it runs the model (sampling prompt ``i`` from its own generator
    seeded ``seed + i``), else by padded batches (the model's own dtype; one generator seeded ``seed``)."""
    eos = stop_ids(tokenizer, model)
    own_dtype = next(model.parameters()).dtype
    decode_dtype = decode_dtype or own_dtype
    if slot_decoder.unsupported(model) is None:
        decoder = slot_decoder.SlotDecoder(model, slots=batch_size, dtype=decode_dtype)
        return [(a.ids, torch.stack(a.top_ids), torch.stack(a.top_probs))
                for a in decoder.answer(encoded, max_new_tokens=max_new_tokens, eos=eos, topk=topk,
                                        temperature=temperature, seed=seed)]
    if decode_dtype != own_dtype:
        raise SpecvizError(f"decoding in {decode_dtype} needs the slot decoder, which cannot run this model: "
                           f"{slot_decoder.unsupported(model)}")
    return _padded_batches(model, tokenizer, encoded, eos, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           topk=topk, temperature=temperature, seed=seed)


def relabel(model, answered: FeatureSet, topk: int, layers: tuple[int, ...] = ()) -> FeatureSet:
    """``answered`` relabelled by a teacher-forced pass of ``model`` in its own dtype: every position's top-k (the
    prompt's too, as the feature pass over cached answers gives them) and ``layers``' hidden states; the same loss
    mask (the answer positions)."""
    seqs = [answered.input_ids[answered.sequence(i)].tolist() for i in range(answered.num_sequences)]
    masks = [answered.loss_mask[answered.sequence(i)].tolist() for i in range(answered.num_sequences)]
    return extract_features(model, seqs, topk=topk, layers=layers, loss_masks=masks, categories=answered.categories,
                            desc="target labels")


def _padded_batches(model, tokenizer, encoded: list[list[int]], eos: set[int], *, max_new_tokens: int,
                    batch_size: int, topk: int, temperature: float, seed: int) -> list[tuple]:
    """``greedy_batch`` over length-sorted batches of ``encoded``, results in the prompts' order."""
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    results: dict[int, tuple] = {}
    with tqdm(total=len(encoded), desc="target answers", unit="prompt") as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            for i, result in zip(batch, greedy_batch(model, [encoded[i] for i in batch], max_new_tokens=max_new_tokens,
                                                     eos=eos, pad_id=pad_id, topk=topk, temperature=temperature,
                                                     generator=generator)):
                results[i] = result
            bar.update(len(batch))
    return [results[i] for i in range(len(encoded))]
