"""``python tools/attention_ab.py``: the fast target's forward on each of its CPU attentions, side by side.

The fast path attends through the thin library's ``specviz::verify_attention`` where it can, else through torch's
fused SDPA kernel (``specviz_grouped_sdpa``). This times one forward of the fast target after ``--contexts`` cached
tokens, on each backend in turn inside every repeat (so drift on a noisy machine hits both alike): a plain step (one
token), a verify of a chain of ``--width`` tokens and of a tree of as many (the pending token and a binary tree).
Prints the median milliseconds per context, shape and backend as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

import torch

from specviz.bench.attention_cost import binary_tree
from specviz.engine import cache as kv
from specviz.engine.attention import attention_implementation
from specviz.engine.verify import masked_forward, prefill, tree_visibility
from specviz.errors import SpecvizError, exit_status
from specviz.models import fast_forward, grouped_sdpa, load_model, verify_attention
from specviz.models.registry import DEFAULT_TARGET

BACKENDS = (grouped_sdpa.NAME, verify_attention.NAME)
SHAPES = ("step", "chain", "tree")


def forward(model: torch.nn.Module, cache, shape: str, width: int, past: int) -> None:
    """One forward of ``shape`` on top of ``past`` cached tokens, then the cache back to ``past``."""
    if shape == "step":
        masked_forward(model, cache, [7], [past], None)
    elif shape == "chain":
        masked_forward(model, cache, list(range(7, 7 + width)), list(range(past, past + width)), None)
    else:
        tree = binary_tree(width - 1)
        masked_forward(model, cache, [7, *range(8, 8 + width - 1)], [past + d for d in (0, *tree.depth)],
                       tree_visibility(tree, past))
    kv.crop_to(cache, past)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/attention_ab.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, help="registry name or model directory")
    parser.add_argument("--contexts", default="100,300,600", help="cached tokens before each forward, comma-separated")
    parser.add_argument("--width", type=int, default=5, help="tokens a chain or tree verify carries")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    def run() -> int:
        try:
            contexts = [int(c) for c in args.contexts.split(",")]
        except ValueError:
            raise SpecvizError(f"--contexts takes comma-separated whole numbers, got {args.contexts!r}") from None
        for option, value in (("--width", args.width), ("--repeats", args.repeats), ("--threads", args.threads),
                              *(("--contexts", c) for c in contexts)):
            if value is not None and value < 1:
                raise SpecvizError(f"{option} must be 1 or more, got {value}")
        if args.width > verify_attention.MAX_ROWS:
            raise SpecvizError(f"--width must be at most {verify_attention.MAX_ROWS}, got {args.width}")
        if args.threads:
            torch.set_num_threads(args.threads)
        model = fast_forward.fast_copy(load_model(args.target).model)
        if model.config._attn_implementation != verify_attention.NAME:
            parameter = next(model.parameters())
            why = verify_attention.usable(parameter.dtype, parameter.device, fast_forward.head_dim(model.config))
            raise SpecvizError(f"the fast path cannot run verify attention for this target: {why}")
        for past in contexts:
            cache = kv.new_cache(model, past + args.width + 1, "target", preallocate=True)
            prefill(model, cache, [(11 + 7 * i) % model.config.vocab_size for i in range(past)])
            samples = {(shape, name): [] for shape in SHAPES for name in BACKENDS}
            for repeat in range(args.repeats + 1):  # the first warms up
                for shape in SHAPES:
                    for name in BACKENDS if repeat % 2 else BACKENDS[::-1]:
                        with attention_implementation(model, name):
                            started = time.perf_counter()
                            forward(model, cache, shape, args.width, past)
                            if repeat:
                                samples[shape, name].append((time.perf_counter() - started) * 1e3)
            for (shape, name), times in samples.items():
                print(json.dumps({"context": past, "shape": shape, "width": 1 if shape == "step" else args.width,
                                  "backend": name, "ms": round(statistics.median(times), 2)}))
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
