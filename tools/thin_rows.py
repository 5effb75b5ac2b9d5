"""``python tools/thin_rows.py``: one pass of the thin kernel over a target's linear weights, at 1 .. N rows.

A verify forward multiplies every weight by as many rows as it verifies tokens; the kernel reads each weight panel
once for up to its block of rows (``thin_kernel.c``: 16 with AVX-512, 6 with AVX2). This times that pass alone, over
the fast path's own packed weights (q/k/v and gate/up stacked, more than the caches hold, so every weight comes from
memory as in a forward): the best of ``--repeats``, with the rate it reads the weights at.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

import torch

from specviz.errors import SpecvizError, exit_status
from specviz.models import fast_forward, linear_ops, load_model, thin_kernel
from specviz.models.registry import DEFAULT_TARGET


def pass_ms(weights: list[linear_ops.PackedWeight], rows: int, repeats: int) -> float:
    """Best milliseconds of one product per weight, each with ``rows`` rows of input."""
    inputs = [torch.randn(rows, w.in_features) for w in weights]
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up
        started = time.perf_counter()
        for x, w in zip(inputs, weights):
            linear_ops.linear(x, w)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/thin_rows.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, help="registry name or model directory")
    parser.add_argument("--rows", type=int, default=8, help="time 1 .. this many rows")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    def run() -> int:
        for option, value in (("--rows", args.rows), ("--repeats", args.repeats), ("--threads", args.threads)):
            if value is not None and value < 1:
                raise SpecvizError(f"{option} must be 1 or more, got {value}")
        if not linear_ops.available():
            raise SpecvizError(f"the thin kernel is not available here: {thin_kernel.unavailable_reason()}")
        if args.threads:
            torch.set_num_threads(args.threads)
        fast = fast_forward.fast_copy(load_model(args.target).model, thin=True)
        weights = [k.packed for k in fast_forward.linear_kernels(fast)]
        gigabytes = sum(w.values.numel() * 4 for w in weights) / 1e9
        kernel = thin_kernel.load()
        print(json.dumps({"products": len(weights), "weights_gb": round(gigabytes, 3), "block_rows": kernel.max_rows,
                          "pair_rows": kernel.pair_rows, "threads": torch.get_num_threads()}))
        for rows in range(1, args.rows + 1):
            ms = pass_ms(weights, rows, args.repeats)
            print(json.dumps({"rows": rows, "ms": round(ms, 2), "gb_per_s": round(gigabytes / ms * 1e3, 1)}))
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
