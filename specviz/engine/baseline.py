"""Plain decoding measured beside a run, under the same load: the baseline a live speedup divides by.

A speedup is two rates measured on one machine; if the plain rate was taken at another moment (before a second
visitor started a run, or while the machine was busy), their ratio measures the load, not the drafter.
``InterleavedBaseline`` therefore runs plain decoding of the same prompt (same target, sampling, seed and round
records as the run, so both pay the same bookkeeping per round; its own cache) one round at a time *between* the
run's rounds: one plain round after each of the run's
first ``warm`` rounds, then after every ``every``-th. A plain round commits one token, so its time is one plain token
at that moment. The estimate is their mean rate (tokens over their total time: the statistic the run's own rate is,
so a load spike weighs on both sides alike; a median would drop the plain side's spikes and keep the run's), and its
uncertainty the spread between the quartiles of their times; it lives and dies with the run it was measured beside.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, replace

from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.round import Round
from specviz.engine.target import Target

#: plain rounds after each of the run's first rounds (a short run still gets a spread), then one every EVERY rounds
WARM_SAMPLES = 5
EVERY = 3
#: a speedup above tau by more than this is beyond what one forward per round allows: flagged, not shown as fact
LIMIT_SLACK = 1.1


@dataclass(frozen=True)
class BaselineEstimate:
    """Plain decoding's rate beside a run: the mean rate and the quartile rates of the plain rounds timed."""

    tokens_per_s: float
    low: float  # tokens/s at the slow quartile
    high: float  # tokens/s at the fast quartile
    samples: int

    def speedup_range(self, rate: float) -> tuple[float, float]:
        """The run's speedup at the fast and the slow end of the plain spread."""
        return rate / self.high, rate / self.low

    def to_dict(self) -> dict:
        return {"method": "interleaved", "tokens_per_s": self.tokens_per_s, "low": self.low, "high": self.high,
                "samples": self.samples}

    @classmethod
    def from_dict(cls, data: dict) -> BaselineEstimate | None:
        try:
            values = [float(data[key]) for key in ("tokens_per_s", "low", "high")]
            samples = int(data["samples"])
        except (KeyError, TypeError, ValueError):
            return None
        if samples < 1 or not all(v > 0 for v in values):
            return None
        return cls(*values, samples=samples)


def estimate(samples_ms: list[float]) -> BaselineEstimate | None:
    """The rate of plain rounds that took ``samples_ms`` (one token each); None without a sample."""
    timed = [ms for ms in samples_ms if ms > 0]
    if not timed:
        return None
    mean = statistics.fmean(timed)
    fast, slow = (statistics.quantiles(timed, n=4, method="inclusive")[::2] if len(timed) > 1 else (mean, mean))
    # the spread holds the estimate even where a few slow tokens pull the mean past the slow quartile
    return BaselineEstimate(tokens_per_s=1e3 / mean, low=1e3 / max(slow, mean), high=1e3 / min(fast, mean),
                            samples=len(timed))


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
