"""Plain decoding measured beside a run, under the same load: the baseline a live speedup divides by.

A speedup is two rates measured on one machine; if the plain rate was taken at another moment (before a second
visitor started a run, or while the machine was busy), their ratio measures the load, not the drafter.
``InterleavedBaseline`` therefore runs plain decoding of the same prompt (same target, sampling, seed and round
records as the run, so both pay the same bookkeeping per round; its own cache) one round at a time *between* the
run's rounds: one plain round after each of the run's
first ``warm`` rounds, then after every ``every``-th. A plain round commits one token, so its time is one plain token
at that moment. The estimate is their mean rate (tokens over their total time: the statistic the run's own rate is,
so a load spike weighs on both sides alike; a median would drop the plain side's spikes and keep the run's), with the
spread between the quartiles of their times; it lives and dies with the run it was measured beside.

The speedup's uncertainty (``speedup_interval``) resamples both sides: a run's rate varies with which rounds it had
(their tokens and times), and the plain rate with which moments its tokens were timed at; the quartiles of the plain
side alone would state a precision that a second run of the same prompt does not repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.round import Round
from specviz.engine.target import Target

#: plain rounds after each of the run's first rounds (a short run still gets a spread), then one every EVERY rounds
WARM_SAMPLES = 5
EVERY = 3
#: a speedup above tau by more than this is beyond what one forward per round allows: flagged, not shown as fact
LIMIT_SLACK = 1.1
#: the speedup's interval holds this share of the resampled speedups
INTERVAL = 0.9
RESAMPLES = 2000


@dataclass(frozen=True)
class BaselineEstimate:
    """Plain decoding's rate beside a run: the mean rate and the quartile rates of the plain rounds timed."""

    tokens_per_s: float
    low: float  # tokens/s at the slow quartile
    high: float  # tokens/s at the fast quartile
    samples: int
    samples_ms: tuple[float, ...] = ()  # each plain token's time, for the speedup's interval

    def speedup_range(self, rate: float) -> tuple[float, float]:
        """The run's speedup at the fast and the slow end of the plain spread."""
        return rate / self.high, rate / self.low

    def to_dict(self) -> dict:
        return {"method": "interleaved", "tokens_per_s": self.tokens_per_s, "low": self.low, "high": self.high,
                "samples": self.samples, "samples_ms": list(self.samples_ms)}

    @classmethod
    def from_dict(cls, data: dict) -> BaselineEstimate | None:
        try:
            values = [float(data[key]) for key in ("tokens_per_s", "low", "high")]
            samples = int(data["samples"])
            samples_ms = tuple(float(ms) for ms in data.get("samples_ms") or ())  # absent in older traces
        except (KeyError, TypeError, ValueError):
            return None
        if samples < 1 or not all(v > 0 for v in (*values, *samples_ms)):
            return None
        return cls(*values, samples=samples, samples_ms=samples_ms)


def estimate(samples_ms: list[float]) -> BaselineEstimate | None:
    """The rate of plain rounds that took ``samples_ms`` (one token each); None without a sample."""
    timed = [ms for ms in samples_ms if ms > 0]
    if not timed:
        return None
    mean = statistics.fmean(timed)
    fast, slow = (statistics.quantiles(timed, n=4, method="inclusive")[::2] if len(timed) > 1 else (mean, mean))
    # the spread holds the estimate even where a few slow tokens pull the mean past the slow quartile
    return BaselineEstimate(tokens_per_s=1e3 / mean, low=1e3 / max(slow, mean), high=1e3 / min(fast, mean),
                            samples=len(timed), samples_ms=tuple(timed))


def speedup_interval(round_tokens: Sequence[int], round_ms: Sequence[float], plain_ms: Sequence[float], *,
                     level: float = INTERVAL, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """The central ``level`` of the speedups of resampled runs (a bootstrap): the run's rounds and the plain tokens
    drawn with replacement, as many of each as were measured, each draw's speedup its committed tokens per ms times
    the mean plain token's ms. Seeded, so a trace replays the interval it was shown with. None with fewer than two
    of either."""
    if len(round_ms) < 2 or len(plain_ms) < 2 or len(round_tokens) != len(round_ms):
        return None
    generator = torch.Generator().manual_seed(seed)
    tokens, ms = torch.tensor(round_tokens, dtype=torch.float64), torch.tensor(round_ms, dtype=torch.float64)
    plain = torch.tensor(plain_ms, dtype=torch.float64)
    rounds = torch.randint(len(ms), (resamples, len(ms)), generator=generator)
    plains = torch.randint(len(plain), (resamples, len(plain)), generator=generator)
    speedups = tokens[rounds].sum(1) / ms[rounds].sum(1) * plain[plains].mean(1)
    tails = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    low, high = torch.quantile(speedups, tails).tolist()
    return low, high


def beyond_limit(speedup: float, tau: float) -> bool:
    """A round costs at least one target forward, which costs at least a plain step, so a speedup cannot exceed tau
    (tokens per round) by more than measurement noise: above that, the two rates saw different loads."""
    return speedup > tau * LIMIT_SLACK


class InterleavedBaseline:
    """Plain decoding of the run's prompt, stepped between the run's rounds (``after_round``)."""

    def __init__(self, target: Target, prompt_ids: list[int], config: GenerationConfig, *,
                 warm: int = WARM_SAMPLES, every: int = EVERY):
        # the run's config (its records cost what the run's do), never stopping at EOS: every plain round is one more
        # token's cost, up to the run's length
        plain = Generation(target, prompt_ids, replace(config, stop_at_eos=False))
        self._rounds: Iterator[Round] = iter(plain)
        self.warm, self.every = warm, every
        self.samples_ms: list[float] = []
        self._seen = 0

    def after_round(self) -> float | None:
        """Call after each of the run's rounds; steps plain decoding when it is due and returns that round's ms."""
        self._seen += 1
        if self._seen > self.warm and self._seen % self.every:
            return None
        record = next(self._rounds, None)  # the first call also prefills the prompt, outside the round's timings
        if record is None:
            return None
        self.samples_ms.append(record.total_ms)
        return record.total_ms

    def estimate(self) -> BaselineEstimate | None:
        return estimate(self.samples_ms)
