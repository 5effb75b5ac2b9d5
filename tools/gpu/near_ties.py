"""Where greedy decoding in bf16 parts from float32: near-tie flips, counted and shown, never hidden.

bf16 rounds every activation to 8 bits of mantissa, so where the target's two best tokens are nearly tied the argmax
can flip; from there the two texts differ. That is no fault of speculative decoding (which is checked against plain
decoding in the same dtype), but a user comparing a GPU run with a CPU one sees it, so the GPU check reports each
flip with the float32 logit margin at that position: a small margin says it was a near tie.
"""

from __future__ import annotations

import torch

from specviz.engine.loop import GenerationConfig, plain_decode
from specviz.engine.target import Target


def compare(reference: Target, other: Target, prompts: list[list[int]], new_tokens: int) -> dict:
    """Greedy plain decoding of each prompt by ``reference`` (float32) and ``other`` (bf16, same weights).

    ``{"prompts", "tokens", "flips", "rows": [{"prompt", "identical", "first_difference", "reference_token",
    "other_token", "reference_margin"}]}``; ``flips`` counts prompts whose outputs differ.
    """
    config = GenerationConfig(max_new_tokens=new_tokens)
    rows = []
    for index, ids in enumerate(prompts):
        ours = plain_decode(reference, ids, config).token_ids
        theirs = plain_decode(other, ids, config).token_ids
        parted = divergence(reference, ids, ours, theirs)
        row = {"prompt": index, "identical": parted is None, "first_difference": None, "reference_token": None,
               "other_token": None, "reference_margin": None}
        if parted is not None:
            row.update(first_difference=parted["position"], reference_token=parted["reference_token"],
                       other_token=parted["other_token"], reference_margin=parted["margin"])
        rows.append(row)
    return {"prompts": len(prompts), "tokens": new_tokens, "flips": sum(not r["identical"] for r in rows),
            "rows": rows}


def divergence(target: Target, prompt_ids: list[int], reference: list[int], other: list[int]) -> dict | None:
    """Where ``other`` first parts from ``reference`` (greedy outputs after ``prompt_ids``), with ``target``'s
    top-two logit margin there and its logit gap between the two tokens (``gap``: reference's logit minus
    other's); None when they are identical. A gap near zero says a near tie flipped, a large one a bug."""
    first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if first is None and len(reference) == len(other):
        return None
    if first is None:
        first = min(len(reference), len(other))
    ours = reference[first] if first < len(reference) else None
    theirs = other[first] if first < len(other) else None
    logits = next_logits(target, prompt_ids + reference[:first])
    top = torch.topk(logits, 2).values
    gap = None if ours is None or theirs is None else round(float(logits[ours] - logits[theirs]), 6)
    return {"position": first, "reference_token": ours, "other_token": theirs,
            "margin": round(float(top[0] - top[1]), 6), "gap": gap}


@torch.inference_mode()
def next_logits(target: Target, ids: list[int]) -> torch.Tensor:
    """The next-token logits after ``ids``, as float32 on the CPU."""
    logits = target.model(input_ids=torch.tensor([ids], device=target.device), logits_to_keep=1).logits[0, -1]
    return logits.float().cpu()
