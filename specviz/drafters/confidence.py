"""A drafter's confidence recalibrated online, on the verification outcomes of the run so far.

DSpark's confidence head learns the sampling acceptance rate 1 − ½‖p − q‖₁; a greedy run accepts a draft only when
it is the target's argmax, which happens less often, so the head's ĉ overstates greedy acceptance (its model card
gives both calibration errors). ``OnlineCalibration`` is histogram binning learned as the run goes: predictions in
bin b become ``(hits_b + w·ĉ) / (trials_b + w)``, where a trial is a draft the target judged (every draft before it
in the chain was accepted). A fresh run starts at the head's own values (a greedy one at the shipped curve, below)
and follows the rule it is verified by.

A bin learns only from drafts that were verified: one whose estimate fell low sees its drafts cut and learns
slowly (the first draft of a round is always verified, so that position keeps learning). With ten bins and a prior
of four pseudo-trials, a bin follows the run after a few dozen judged drafts, a few hundred tokens of text.

It only reads outcomes of rounds already verified, so a cut chosen with it depends on the draft and on the past,
never on the target's answer to the round being verified: verification stays lossless (docs/dflash.md).

Where the drafter ships a ``ReliabilityCurve`` fitted offline under greedy verification (on training prompts, by
``python -m specviz.training.calibrate``), a greedy run starts from that curve instead of the raw values, so its
first rounds are calibrated too; the online bins still follow the run from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from specviz.errors import SpecvizError

BINS = 10
#: pseudo-trials at the prior per bin: how many real trials it takes for a bin to follow the run
PRIOR_WEIGHT = 4.0
#: judged drafts a fitted bin needs; sparser bins are pooled with their neighbour
MIN_BIN_SAMPLES = 20


class OnlineCalibration:
    """Per-bin recalibration of confidences in [0, 1] from (raw confidence, accepted) outcomes."""

    def __init__(self, bins: int = BINS, weight: float = PRIOR_WEIGHT,
                 prior: Callable[[float], float] | None = None):
        self.bins, self.weight = bins, weight
        self.prior = prior  # where a bin starts (a ``ReliabilityCurve``); None: the raw value itself
        self.trials = [0] * bins
        self.hits = [0] * bins

    def _bin(self, raw: float) -> int:
        return min(self.bins - 1, max(0, int(raw * self.bins)))

    def __call__(self, raw: float) -> float:
        """The calibrated confidence for a raw one."""
        b = self._bin(raw)
        start = raw if self.prior is None else self.prior(raw)
        return (self.hits[b] + self.weight * start) / (self.trials[b] + self.weight)

    def record(self, verified: list[float], accepted: int) -> None:
        """A verified chain: the raw confidences of the drafts verified, the first ``accepted`` of them accepted; the
        target judged draft i when every draft before it was accepted (the first rejection is judged, the rest not)."""
        for value, hit in judged_drafts(verified, accepted):
            b = self._bin(value)
            self.trials[b] += 1
            self.hits[b] += hit


def judged_drafts(verified: list[float], accepted: int) -> list[tuple[float, bool]]:
    """(value, accepted) of the drafts of a verified chain the target judged: every draft whose predecessors were all
    accepted (the accepted ones and the first rejection)."""
    return [(value, i < accepted) for i, value in enumerate(verified[: accepted + 1])]


@dataclass(frozen=True)
class ReliabilityCurve:
    """Acceptance as a function of the raw confidence, fitted offline under one verification rule: piecewise linear
    through each pooled bin's (mean raw confidence, realised acceptance), non-decreasing, flat beyond the ends."""

    points: tuple[tuple[float, float], ...]
    samples: int
    rule: str = "greedy"

    def __post_init__(self):
        if not self.points or any(not (0 <= x <= 1 and 0 <= y <= 1) for x, y in self.points):
            raise SpecvizError("a reliability curve needs points (raw, rate) with both in [0, 1]")
        if self.samples < 1:
            raise SpecvizError(f"a reliability curve is fitted on at least one draft, this one on {self.samples}")
        if any(b[0] < a[0] or b[1] < a[1] for a, b in zip(self.points, self.points[1:])):
            raise SpecvizError("a reliability curve's points must be non-decreasing in raw confidence and in rate")

    def __call__(self, raw: float) -> float:
        points = self.points
        if raw <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if raw <= x1:
                return y0 if x1 == x0 else y0 + (y1 - y0) * (raw - x0) / (x1 - x0)
        return points[-1][1]

    @classmethod
    def fit(cls, samples: Iterable[tuple[float, bool]], rule: str = "greedy", bins: int = BINS,
            min_count: int = MIN_BIN_SAMPLES) -> ReliabilityCurve:
        """Histogram binning of ``(raw confidence, accepted)`` samples, sparse bins pooled into the next, then pool
        adjacent violators (a bin realising less than the one below it is merged with it) so the curve rises."""
        sums = [[0, 0.0, 0] for _ in range(bins)]  # count, raw sum, accepted count
        for value, hit in samples:
            try:
                raw = min(1.0, max(0.0, float(value)))
            except (TypeError, ValueError):
                continue
            if not math.isfinite(raw):
                continue
            entry = sums[min(bins - 1, int(raw * bins))]
            entry[0] += 1
            entry[1] += raw
            entry[2] += bool(hit)
        groups: list[list] = []
        for entry in (e for e in sums if e[0]):
            if groups and groups[-1][0] < min_count:
                groups[-1] = [a + b for a, b in zip(groups[-1], entry)]
            else:
                groups.append(list(entry))
        if len(groups) > 1 and groups[-1][0] < min_count:
            groups[-2:] = [[a + b for a, b in zip(*groups[-2:])]]
        pooled: list[list] = []
        for group in groups:
            pooled.append(group)
            while len(pooled) > 1 and pooled[-1][2] / pooled[-1][0] < pooled[-2][2] / pooled[-2][0]:
                pooled[-2:] = [[a + b for a, b in zip(*pooled[-2:])]]
        if not pooled:
            raise SpecvizError("no judged drafts to fit a reliability curve on")
        return cls(tuple((round(total / count, 6), round(hits / count, 6)) for count, total, hits in pooled),
                   sum(group[0] for group in pooled), rule)

    def to_dict(self) -> dict:
        return {"rule": self.rule, "samples": self.samples, "points": [list(point) for point in self.points]}

    @classmethod
    def from_dict(cls, data) -> ReliabilityCurve:
        """Read ``to_dict``'s output (a drafter's config); anything else is one line saying what is wrong."""
        try:
            points = tuple((float(x), float(y)) for x, y in data["points"])
            samples = data["samples"]
            if not isinstance(samples, int) or isinstance(samples, bool):
                raise ValueError(f"'samples' must be a whole number, got {samples!r}")
            return cls(points, samples, str(data.get("rule", "greedy")))
        except (KeyError, TypeError, ValueError) as error:
            raise SpecvizError(f"a reliability curve needs 'points' [[raw, rate], ...] and 'samples': {error}"
                               ) from None
