"""A drafter's confidence recalibrated online, on the verification outcomes of the run so far.

DSpark's confidence head learns the sampling acceptance rate 1 − ½‖p − q‖₁; a greedy run accepts a draft only when
it is the target's argmax, which happens less often, so the head's ĉ overstates greedy acceptance (its model card
gives both calibration errors). ``OnlineCalibration`` is histogram binning learned as the run goes: predictions in
bin b become ``(hits_b + w·ĉ) / (trials_b + w)``, where a trial is a draft the target judged (every draft before it
in the chain was accepted). A fresh run starts at the head's own values and follows the rule it is verified by.

A bin learns only from drafts that were verified: one whose estimate fell low sees its drafts cut and learns
slowly (the first draft of a round is always verified, so that position keeps learning). With ten bins and a prior
of four pseudo-trials, a bin follows the run after a few dozen judged drafts, a few hundred tokens of text.

It only reads outcomes of rounds already verified, so a cut chosen with it depends on the draft and on the past,
never on the target's answer to the round being verified: verification stays lossless (docs/dflash.md).
"""

from __future__ import annotations

BINS = 10
#: pseudo-trials at the raw value per bin: how many real trials it takes for a bin to follow the run
PRIOR_WEIGHT = 4.0


class OnlineCalibration:
    """Per-bin recalibration of confidences in [0, 1] from (raw confidence, accepted) outcomes."""

    def __init__(self, bins: int = BINS, weight: float = PRIOR_WEIGHT):
        self.bins, self.weight = bins, weight
        self.trials = [0] * bins
        self.hits = [0] * bins

    def _bin(self, raw: float) -> int:
        return min(self.bins - 1, max(0, int(raw * self.bins)))

    def __call__(self, raw: float) -> float:
        """The calibrated confidence for a raw one."""
        b = self._bin(raw)
        return (self.hits[b] + self.weight * raw) / (self.trials[b] + self.weight)

    def record(self, verified: list[float], accepted: int) -> None:
        """A verified chain: the raw confidences of the drafts verified, the first ``accepted`` of them accepted; the
        target judged draft i when every draft before it was accepted (the first rejection is judged, the rest not)."""
        for i, value in enumerate(verified[: accepted + 1]):
            b = self._bin(value)
            self.trials[b] += 1
            self.hits[b] += i < accepted
