"""``python tools/exactness.py``: does the fast target path decode exactly what transformers decodes?

The fast path multiplies the same weights in another summation order, so its logits differ from transformers' in
the last bits. Greedy output can then differ only where the top two logits are nearly tied. For each prompt this
runs plain greedy decoding through the fast path and transformers' own ``generate``, and reports either "same"
or the first position where they part, with the logit gap between the two tokens there (from transformers'
forward over the shared prefix): a tiny gap is a near-tie flip, a large one would be a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

import torch

from specviz import api, outputs
from specviz.bench.prompts import DEFAULT_PROMPTS, load_prompts, select
from specviz.errors import SpecvizError
from specviz.models.registry import DEFAULT_TARGET


def compare(fast: api.Target, reference: api.Target, prompt_ids: list[int], new_tokens: int) -> dict:
    """Greedy tokens of both paths, and where and by how much they part (None when identical)."""
    ours = api.plain_decode(fast, prompt_ids, api.GenerationConfig(max_new_tokens=new_tokens)).token_ids
    eos = sorted(reference.eos_ids) or None
    with torch.inference_mode():
        out = reference.model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False,
                                       eos_token_id=eos, pad_token_id=eos[0] if eos else None)
    theirs = out[0, len(prompt_ids):].tolist()
    common = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if common is None and len(ours) == len(theirs):
        return {"identical": True, "tokens": len(ours)}
    if common is None:
        return {"identical": False, "position": min(len(ours), len(theirs)), "gap": None,
                "note": f"lengths differ ({len(ours)} vs {len(theirs)})"}
    with torch.inference_mode():
        logits = reference.model(torch.tensor([prompt_ids + theirs[:common]])).logits[0, -1].float()
    gap = float(logits[theirs[common]] - logits[ours[common]])
    return {"identical": False, "position": common, "fast_token": ours[common], "hf_token": theirs[common],
            "gap": gap, "tokens": len(ours)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/exactness.py", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--limit-per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    try:
        if args.out is not None:  # a bad path fails now, not after the comparison
            outputs.output_file(args.out, "--out")
        fast = api.load_target(args.target, target_forward="fast")
        reference = api.load_target(args.target, target_forward="hf")
        prompts = select(load_prompts(args.prompts), None, args.limit_per_category)
        rows = []
        for prompt in prompts:
            ids = fast.encode_prompt(prompt.text, chat=True)
            result = {"question_id": prompt.question_id, "category": prompt.category,
                      **compare(fast, reference, ids, args.max_new_tokens)}
            rows.append(result)
            where = "same" if result["identical"] else f"part at {result['position']} (gap {result['gap']})"
            print(f"#{prompt.question_id} {prompt.category}: {where}", file=sys.stderr, flush=True)
    except SpecvizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    same = sum(r["identical"] for r in rows)
    print(f"{same}/{len(rows)} prompts identical to transformers' generate over {args.max_new_tokens} tokens")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
