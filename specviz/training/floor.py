"""The compute floor of making training data: what this machine's matrix products allow, and how close a stage runs.

A transformer forward costs about two FLOPs per weight of its linear layers per token (attention's scores are
extra and small at these context lengths). Dividing the rate of a large matrix product on this machine, in the dtype
the stage computes in, by that cost gives the most tokens per second any implementation could process: the floor
of the data stages' time. ``Rate`` reports a stage's tokens per second as a fraction of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

#: the side of the square product timed (large enough to run at the machine's full rate, small enough to take ~1 s)
SIDE = 2048


#: below this rate (GFLOP/s) on a small product a dtype is emulated (bfloat16 on a CPU with neither AMX nor AVX-512
#: BF16): it is timed at that small size, since a ``SIDE``² product would take most of a minute and run no faster
EMULATED_GFLOPS, EMULATED_SIDE = 10.0, 256


def matmul_gflops(dtype: torch.dtype = torch.float32, *, side: int = SIDE, repeats: int = 4,
                  device: str = "cpu") -> float:
    """This machine's rate on a ``side``² matrix product in ``dtype`` (GFLOP/s, the best of ``repeats``), or on an
    ``EMULATED_SIDE``² one where the dtype runs emulated."""
    if side > EMULATED_SIDE and _timed_gflops(dtype, EMULATED_SIDE, 1, device) < EMULATED_GFLOPS:
        side, repeats = EMULATED_SIDE, 2
    return _timed_gflops(dtype, side, repeats, device)


def _timed_gflops(dtype: torch.dtype, side: int, repeats: int, device: str) -> float:
    a = torch.randn(side, side, device=device).to(dtype)
    b = torch.randn(side, side, device=device).to(dtype)
    a @ b  # warm-up: thread pools, packing, lazy kernel loads
    best = float("inf")
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * side ** 3 / best / 1e9


def flops_per_token(model) -> float:
    """Two FLOPs per weight of every linear layer (the output layer included): one forward token's products."""
    return 2.0 * sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))


@dataclass
class Rate:
    """A stage's throughput against the floor: ``tokens`` processed (prompt and answer) in ``seconds``, of which
    ``answer_tokens`` were generated, with products in a dtype the machine runs at ``gflops``."""

    tokens: int
    answer_tokens: int
    seconds: float
    gflops: float
    flops_per_token: float

    @property
    def floor(self) -> float:
        """Tokens per second at the machine's matrix-product rate."""
        return self.gflops * 1e9 / self.flops_per_token

    @property
    def fraction(self) -> float:
        """Forward tokens per second as a fraction of the floor."""
        return self.tokens / self.seconds / self.floor

    def describe(self, dtype: torch.dtype, generated: str = "answer") -> str:
        name = str(dtype).removeprefix("torch.")
        return (f"{self.answer_tokens / self.seconds:.0f} {generated} tokens/s, "
                f"{self.tokens / self.seconds:.0f} forward tokens/s = {self.fraction:.0%} of the floor "
                f"({self.floor:.0f} tokens/s: {name} products at {self.gflops:.0f} GFLOP/s ÷ "
                f"{self.flops_per_token / 1e9:.3f} GFLOP a token)")


#: the best matrix-product rate measured in this process, per (dtype, device)
_BEST_GFLOPS: dict[tuple[torch.dtype, str], float] = {}


def best_gflops(dtype: torch.dtype, device: str) -> float:
    """The machine's matrix-product rate in ``dtype``, measured again at every call (a fraction of a second) and the
    best kept: a floor first measured while other work shared the machine would otherwise stay understated for a
    whole data build, and every later stage would read as a larger share of it than it is."""
    key = (dtype, device)
    _BEST_GFLOPS[key] = max(_BEST_GFLOPS.get(key, 0.0), matmul_gflops(dtype, device=device))
    return _BEST_GFLOPS[key]


def stage_rate(model, *, tokens: int, generated: int, seconds: float, dtype: torch.dtype, device: str) -> Rate:
    """A data stage's throughput (``tokens`` through ``model``'s forward, ``generated`` of them new) against this
    machine's floor in ``dtype``."""
    return Rate(tokens=tokens, answer_tokens=generated, seconds=seconds, gflops=best_gflops(dtype, device),
                flops_per_token=flops_per_token(model))


def faster_dtype(device: str = "cpu") -> tuple[torch.dtype, dict[torch.dtype, float]]:
    """bfloat16 where this machine's bfloat16 products run at least half as fast as its float32 ones (decoding reads
    half the bytes in bfloat16, so it pays there), else float32; with both rates (GFLOP/s) for the log."""
    rates = {dtype: matmul_gflops(dtype, device=device) for dtype in (torch.float32, torch.bfloat16)}
    return (torch.bfloat16 if rates[torch.bfloat16] >= rates[torch.float32] / 2 else torch.float32), rates


def describe_rates(rates: dict[torch.dtype, float]) -> str:
    """``rates`` as one log phrase: "float32 products 71 GFLOP/s, bfloat16 0.6 GFLOP/s"."""
    return ", ".join(f"{str(dtype).removeprefix('torch.')}{' products' if i == 0 else ''} {gflops:.3g} GFLOP/s"
                     for i, (dtype, gflops) in enumerate(rates.items()))
