"""How fast the target's training answers are made, against this machine's compute floor, and what bfloat16 changes.

    python tools/answer_rate.py [--target smollm2-135m] [--prompts 256] [--gen-tokens 144] [--threads 2]

Answers the same generated training prompts (``specviz data``'s own) four ways, one after another in one process:
transformers' padded batches (``generate.greedy_batch``, 16 rows: the pipeline before the slot decoder), the slot
decoder in float32 and in bfloat16 with torch's attention, and in bfloat16 with the decode-attention kernel (what
``specviz data`` runs; 128 slots). Each line gives answer and forward tokens per second and the
fraction of the floor in its dtype (``specviz.training.floor``). Then the labels: on the bfloat16 answers, the share
of answer positions whose bfloat16 top-1 differs from the float32 target's on the same context (a teacher-forced
pass), and the mean total-variation distance of their top-k probabilities. Last, the float32 feature pass that
relabels the answers (and gives the hidden-state families their features, ``specviz train --live-features`` at every
step) over the same sequences, through the fast forward on the engine's declared kernel (thin where it builds) and on
torch's (the data stages run the faster of the two), against the float32 floor. ``--kernel-only`` runs only what
``specviz data`` and ``train`` run: the decoder in the dtype ``--gen-dtype auto`` chooses here (bfloat16 with the
kernel, or float32 where bfloat16 is emulated), then the feature passes. ``--temperature T`` samples the slot
decoder's answers at T instead (each prompt from its own generator, as ``--sampled-answers`` and ``--self-prompts``
sample). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from specviz.models import fast_forward, load_model
from specviz.training.features import extract_features
from specviz.training.floor import Rate, faster_dtype, flops_per_token
from specviz.training.generate import MAX_PROMPT_TOKENS, chat_ids, greedy_batch, stop_ids
from specviz.training.prompts import build_prompts
from specviz.training.slot_decoder import SlotDecoder
from specviz.training.text_sources import iter_documents

#: the hidden states the feature pass keeps: the shipped EAGLE-3 head's
FEATURE_LAYERS = (2, 15, 27)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--data", nargs="+", default=["../shared/corpus", "stdlib"])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=144)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-padded", action="store_true", help="leave out the padded batches (the slowest)")
    parser.add_argument("--kernel-only", action="store_true",
                        help="only the decoder specviz data runs here (--gen-dtype auto), then the feature passes")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample the slot decoder's answers at this temperature (0: greedy)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.target)
    model = target.model
    documents = list(iter_documents(args.data, stdlib_limit=400, seed=0))
    prompts = [chat_ids(target.tokenizer, p.text)[-MAX_PROMPT_TOKENS:]
               for p in build_prompts(documents, args.prompts, seed=0)]
    eos = stop_ids(target.tokenizer, model)
    per_token = flops_per_token(model)
    chosen, rates = faster_dtype()  # both dtypes' matrix-product rates (an emulated one timed small)
    print(f"{args.prompts} prompts ({sum(map(len, prompts))} tokens), answers up to {args.gen_tokens} tokens, "
          f"{args.threads} threads")

    def report(name: str, dtype: torch.dtype, answers: list[list[int]], seconds: float) -> None:
        answered = sum(map(len, answers))
        rate = Rate(tokens=answered + sum(map(len, prompts)), answer_tokens=answered, seconds=seconds,
                    gflops=rates[dtype], flops_per_token=per_token)
        print(f"{name:<34} {seconds:6.0f} s  {rate.describe(dtype)}")

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    if not (args.skip_padded or args.kernel_only):
        start = time.perf_counter()
        padded = {}
        fast = target.fast_model()
        for at in range(0, len(order), 16):
            batch = order[at:at + 16]
            for i, (ids, _, _) in zip(batch, greedy_batch(fast, [prompts[i] for i in batch], eos=eos,
                                                          pad_id=min(eos), max_new_tokens=args.gen_tokens)):
                padded[i] = ids
        report("padded batches of 16, float32", torch.float32, list(padded.values()), time.perf_counter() - start)
    decoded = {}
    ways = ((chosen, chosen == torch.bfloat16),) if args.kernel_only else (
        (torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True))
    for dtype, kernel in ways:
        start = time.perf_counter()
        decoder = SlotDecoder(model, slots=128, dtype=dtype, attention_kernel=kernel)
        decoded[dtype, kernel] = decoder.answer(prompts, max_new_tokens=args.gen_tokens, eos=eos,
                                                temperature=args.temperature)
        sampled = f", sampled at {args.temperature:g}" if args.temperature else ""
        report(f"slot decoder, 128 slots, {str(dtype).removeprefix('torch.')}{sampled}", dtype,
               [a.ids for a in decoded[dtype, kernel]], time.perf_counter() - start)
        print(f"  attention: {decoder.describe_attention()}")
    sequences = [p + a.ids for p, a in zip(prompts, decoded[ways[-1]])]
    for name, thin in (("engine's kernel", None), ("torch's kernel", False)):  # the engine's: thin where it builds
        fast = fast_forward.fast_copy(model, thin=thin)
        extract_features(fast, sequences[:4], topk=8, layers=FEATURE_LAYERS, desc=None)  # warm up
        start = time.perf_counter()
        extract_features(fast, sequences, topk=8, layers=FEATURE_LAYERS, desc=None)
        seconds = time.perf_counter() - start
        rate = Rate(tokens=sum(map(len, sequences)), answer_tokens=0, seconds=seconds, gflops=rates[torch.float32],
                    flops_per_token=per_token)
        print(f"feature pass, float32, {name:<15} {seconds:6.0f} s  {rate.tokens / seconds:.0f} tokens/s = "
              f"{rate.fraction:.0%} of the float32 floor ({rate.floor:.0f} tokens/s)")
    if args.kernel_only:
        return
    for kernel in (False, True):
        same = sum(a.ids == b.ids for a, b in zip(decoded[torch.float32, False], decoded[torch.bfloat16, kernel]))
        print(f"bfloat16 ({'decode-attention kernel' if kernel else 'torch attention'}): answers identical to "
              f"float32's: {same} of {len(prompts)}")
        _label_change(model, prompts, decoded[torch.bfloat16, kernel])


def _label_change(model, prompts: list[list[int]], answers) -> None:
    """bfloat16 labels against the float32 target's on the same contexts (the bfloat16 answers)."""
    sequences = [p + a.ids for p, a in zip(prompts, answers)]
    exact = extract_features(model, sequences, topk=8)
    differ, total, distance = 0, 0, 0.0
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        span = exact.sequence(i)
        at = slice(span.start + len(prompt) - 1, span.start + len(prompt) - 1 + len(answer.ids))
        top_ids, top_probs = exact.topk_ids[at], exact.topk_probs[at]
        fast_ids, fast_probs = torch.stack(answer.top_ids), torch.stack(answer.top_probs)
        differ += int((top_ids[:, 0] != fast_ids[:, 0]).sum())
        total += len(answer.ids)
        for row in range(len(answer.ids)):
            exact_p = dict(zip(top_ids[row].tolist(), top_probs[row].tolist()))
            fast_p = dict(zip(fast_ids[row].tolist(), fast_probs[row].tolist()))
            distance += 0.5 * sum(abs(exact_p.get(t, 0.0) - fast_p.get(t, 0.0)) for t in exact_p.keys() | fast_p)
    print(f"bfloat16 labels: top-1 differs from the float32 target's at {differ} of {total} answer positions "
          f"({differ / total:.2%}); mean top-8 total-variation distance {distance / total:.4f}")


if __name__ == "__main__":
    main()
