"""The one sampler: temperature, top-k and top-p turn logits into probabilities.

Drafter, target and the plain-decoding baseline all call these functions, so the distributions compared during
verification are processed identically (a requirement for lossless rejection sampling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz import settings

GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = settings.default("temperature")
    top_p: float = settings.default("top_p")
    top_k: int = settings.default("top_k")

    def __post_init__(self) -> None:  # the ranges the settings declare, for API callers who bypass them
        for name, value in self.to_dict().items():
            settings.check_exact(name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Processed distribution over the vocabulary (last dim), in float32.

    Greedy returns a one-hot at the argmax, so rejection-sampling code can treat greedy as a special case.
    """
    logits = logits.float()
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / config.temperature
    if config.top_k and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p (always keeps the first token).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None | Sequence[torch.Generator]) -> torch.Tensor:
    """One token id per distribution along the last dim: ``torch.multinomial(probs, 1, generator=generator)`` token
    for token, and cheaper on CPU (docs/bench-log/notes.md); with a sequence of generators, row ``i`` of a 2-D
    ``probs`` is ``torch.multinomial(probs[i], 1, generator=generator[i])``.

    For one sample, multinomial takes argmax(p / q) over q ~ Exp(1) from ``Tensor.exponential_``, whose CPU kernel
    turns one float64 uniform at a time into -log1p(-u) and rounds it to float32; the same uniforms drawn as one
    float64 tensor and turned into q all at once are the same q, bit for bit (``tests/test_units.py``), and the
    generator ends in the same state.
    """
    p = probs.float().cpu()
    total = p.sum(-1)
    if not bool(((total > 0) & torch.isfinite(total)).all()) or bool((p < 0).any()):
        raise ValueError("invalid distribution to sample: a row with no mass, a negative or a non-finite entry")
    if isinstance(generator, Sequence):
        uniforms = torch.empty(p.shape, dtype=torch.float64)
        for row, row_generator in zip(uniforms, generator, strict=True):
            torch.rand(row.shape, dtype=torch.float64, generator=row_generator, out=row)
    else:
        uniforms = torch.rand(p.shape, dtype=torch.float64, generator=generator)
    waits = uniforms.neg_().log1p_().neg_().float()
    return (p / waits).argmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution (``draw``)."""
    return int(draw(probs, generator))


def uniform(generator: torch.Generator | None) -> float:
    """One U(0, 1) draw from the run's generator (acceptance coins)."""
    return float(torch.rand((), generator=generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, p - q)): what to sample from after a draft token is rejected.

    When the residual has no mass (p == q up to rounding) rejection cannot have happened in exact arithmetic;
    fall back to p so the result stays a distribution.
    """
    diff = (p - q).clamp_min(0.0)
    total = diff.sum()
    if float(total) <= 1e-12:
        return p
    return diff / total


def make_generator(seed: int | None) -> torch.Generator:
    """A private CPU generator so runs are reproducible and concurrent runs do not share state."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(0 if seed is None else int(seed))
    return generator
