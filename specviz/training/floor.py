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


def matmul_gflops(dtype: torch.dtype = torch.float32, *, side: int = SIDE, repeats: int = 4,
                  device: str = "cpu") -> float:
    """This machine's rate on a ``side``² matrix product in ``dtype`` (GFLOP/s, the best of ``repeats``)."""
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

    def describe(self, dtype: torch.dtype) -> str:
        name = str(dtype).removeprefix("torch.")
        return (f"{self.answer_tokens / self.seconds:.0f} answer tokens/s, {self.tokens / self.seconds:.0f} forward "
                f"tokens/s = {self.fraction:.0%} of the floor ({self.floor:.0f} tokens/s: {name} products at "
                f"{self.gflops:.0f} GFLOP/s ÷ {self.flops_per_token / 1e9:.3f} GFLOP a token)")
