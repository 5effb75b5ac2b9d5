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
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if first is None and len(ours) != len(theirs):
            first = min(len(ours), len(theirs))
        row = {"prompt": index, "identical": first is None, "first_difference": first, "reference_token": None,
               "other_token": None, "reference_margin": None}
        if first is not None:
            row.update(reference_token=ours[first] if first < len(ours) else None,
                       other_token=theirs[first] if first < len(theirs) else None,
                       reference_margin=round(margin(reference, ids + ours[:first]), 6))
        rows.append(row)
    return {"prompts": len(prompts), "tokens": new_tokens, "flips": sum(not r["identical"] for r in rows),
            "rows": rows}


@torch.inference_mode()
def margin(target: Target, ids: list[int]) -> float:
    """The gap between the best and second-best next-token logits after ``ids``."""
    logits = target.model(input_ids=torch.tensor([ids], device=target.device), logits_to_keep=1).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])
