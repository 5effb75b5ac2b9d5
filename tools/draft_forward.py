"""``python tools/draft_forward.py``: one draft step through transformers' forward vs the lean forward
(and, on CPU, the lean forward with int8 draft weights).

The bench reports draft milliseconds per round, which mixes the forward with the drafter's bookkeeping; this
isolates the forward itself (one new token on top of a cached context, the shape of every chain draft step), both
paths on the same weights, interleaved, so the ratio is what the lean path buys on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

import torch

from specviz.drafters.lean_llama import lean_forward_for
from specviz.engine import cache as kv
from specviz.engine.cost_curve import time_forward
from specviz.engine.verify import prefill
from specviz.errors import SpecvizError, exit_status
from specviz.models.registry import DEFAULT_DRAFT


def time_step(model: torch.nn.Module, context: list[int], repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` one-token forwards after ``context`` (cache cropped back each time)."""
    cache = kv.new_cache(model, len(context) + 1, "draft")
    prefill(model, cache, context[:-1])
    return time_forward(model, cache, context[-1:], len(context) - 1, repeats + 1)[1:]  # the first warms up


def compare(model: torch.nn.Module, context: list[int], repeats: int = 50, rounds: int = 3) -> dict:
    """Median ms per draft step for each forward, in alternating blocks: transformers', the lean one and, on CPU,
    the lean one with ``draft_quant="int8"``. ``speedup`` = transformers ÷ lean; ``int8_speedup`` = lean ÷ int8."""
    lean = lean_forward_for(model)
    if lean is None:
        raise SpecvizError(f"{type(model).__name__} is not a Llama configuration the lean forward reproduces")
    if len(context) < 2:
        raise SpecvizError("draft forward timing needs a context of at least 2 tokens")
    forwards = {"transformers": model, "lean": lean}
    weight = next(model.parameters())
    if weight.device.type == "cpu" and weight.dtype == torch.float32:
        forwards["lean int8"] = lean_forward_for(model, "int8")
    times: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(rounds):
        for name, forward in forwards.items():
            times[name] += time_step(forward, context, repeats)
    result = {name: statistics.median(values) for name, values in times.items()}
    result["speedup"] = result["transformers"] / result["lean"]
    if "lean int8" in result:
        result["int8_speedup"] = result["lean"] / result["lean int8"]
    result["context"] = len(context)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/draft_forward.py", description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default=DEFAULT_DRAFT, help="registry name or model directory")
    parser.add_argument("--context", type=int, default=300, help="cached context length in tokens")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    def run() -> int:
        from specviz.models import load_model

        for option, value in (("--context", args.context), ("--repeats", args.repeats), ("--threads", args.threads)):
            if value is not None and value < 1:
                raise SpecvizError(f"{option} must be 1 or more, got {value}")
        if args.threads:
            torch.set_num_threads(args.threads)
        loaded = load_model(args.draft)
        generator = torch.Generator().manual_seed(0)
        vocab = loaded.model.config.vocab_size
        context = torch.randint(0, vocab, (args.context,), generator=generator).tolist()
        result = compare(loaded.model, context, args.repeats)
        result["threads"] = torch.get_num_threads()
        print(json.dumps(result))
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
