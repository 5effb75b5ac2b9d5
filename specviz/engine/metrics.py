"""Metrics, defined once. Each has its formula beside it; the UI shows the same text.

A *round* is one target verify forward. Counting the bonus/correction token, plain decoding has tau = 1.00.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from specviz.engine.round import Round

FORMULAS = {
    "tau": "τ = tokens committed ÷ target forwards (rounds); bonus/correction included, so plain decoding = 1.00",
    "acceptance_rate": "acceptance rate = accepted draft tokens ÷ drafted tokens (all tree nodes count as drafted)",
    "per_position": "conditional[d] = P(depth-d draft accepted | depth d-1 accepted and a depth-d node was drafted); "
    "cumulative[d] = P(accepted length ≥ d)",
    "per_label": "acceptance of label L (Medusa's head, MTP's module) = times the accepted path went on into a child "
    "labelled L ÷ times it reached a node with a child labelled L (per depth, and summed over depths)",
    "histogram": "histogram[a] = rounds whose accepted draft length is a (0 = every draft token rejected)",
    "tokens_per_s": "tokens/s = new tokens ÷ generation wall time (prefill + every round; excludes the caller's time)",
    "speedup": "speedup = speculative tokens/s ÷ plain-decoding tokens/s of the same target, measured on this machine",
    "verified_per_round": "verified per round = target tokens processed per verify forward (tree nodes + 1)",
    "wasted": "wasted verification = verified tokens that were not committed ÷ verified tokens",
    "draft_ms": "draft ms per round = the drafter's wall time in a round (proposing the tokens, updating its own "
    "cache), mean over rounds",
    "verify_ms": "verify ms per round = wall time of the round's one target forward over every verified token (the "
    "newest committed token + each draft node), mean over rounds",
    "overhead_ms": "engine overhead per round = round wall time − draft time − verify forward time",
    "calibration": "calibration: every verified draft node whose parent was accepted (or is the root) is one sample, "
    "predicted c = confidence(node) ÷ confidence(parent) (DSpark: the ĉ its schedule used, its confidence head's "
    "recalibrated on the run so far, and beside it the head's own ĉ; ngram:auto: its acceptance estimates; others: "
    "the draft probability), realised = 1 "
    "if the node was accepted; ECE = Σ over 10 equal-width bins of "
    "(samples in bin ÷ samples) × |mean realised − mean predicted|",
}


@dataclass
class Metrics:
    rounds: int
    new_tokens: int
    drafted: int
    accepted: int
    tau: float
    acceptance_rate: float
    conditional: list[float]  # index d-1 for depth d
    cumulative: list[float]
    histogram: list[int]
    verified_per_round: float
    wasted: float
    draft_ms: float
    verify_ms: float
    overhead_ms: float  # per round, mean
    tokens_per_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def compute(rounds: Sequence[Round], elapsed_s: float | None = None) -> Metrics:
    """Aggregate rounds; ``elapsed_s`` (total generation wall time) gives tokens/s."""
    count = len(rounds)
    new_tokens = sum(len(r.committed) for r in rounds)
    drafted = sum(len(r.tokens) for r in rounds)
    accepted = sum(len(r.accepted) for r in rounds)
    max_depth = max((max(r.depth, default=0) for r in rounds), default=0)
    reached = [0] * (max_depth + 1)  # rounds whose accepted length >= d
    offered = [0] * (max_depth + 1)  # rounds that drafted depth d with depth d-1 accepted
    histogram = [0] * (max_depth + 1)
    for r in rounds:
        length = len(r.accepted)
        histogram[length] += 1
        has_children = set(r.parents)
        for d in range(1, length + 1):
            reached[d] += 1
        for d in range(1, min(length + 1, max_depth) + 1):
            node = -1 if d == 1 else r.accepted[d - 2]
            if node in has_children:
                offered[d] += 1
    conditional = [reached[d] / offered[d] if offered[d] else 0.0 for d in range(1, max_depth + 1)]
    cumulative = [reached[d] / count if count else 0.0 for d in range(1, max_depth + 1)]
    verified = sum(r.verified for r in rounds)
    return Metrics(
        rounds=count,
        new_tokens=new_tokens,
        drafted=drafted,
        accepted=accepted,
        tau=new_tokens / count if count else 0.0,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        conditional=conditional,
        cumulative=cumulative,
        histogram=histogram,
        verified_per_round=verified / count if count else 0.0,
        wasted=(verified - new_tokens) / verified if verified else 0.0,
        draft_ms=sum(r.draft_ms for r in rounds) / count if count else 0.0,
        verify_ms=sum(r.verify_ms for r in rounds) / count if count else 0.0,
        overhead_ms=sum(r.other_ms for r in rounds) / count if count else 0.0,
        tokens_per_s=new_tokens / elapsed_s if elapsed_s else None,
    )


def speedup(speculative_tokens_per_s: float, plain_tokens_per_s: float) -> float:
    return speculative_tokens_per_s / plain_tokens_per_s if plain_tokens_per_s > 0 else 0.0


@dataclass
class Offered:
    """How often the accepted path reached a parent of some nodes (offered) and went on into one of them."""

    offered: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.offered if self.offered else 0.0


@dataclass
class LabelAcceptance(Offered):
    """``Offered`` for one node label over a run, and split by draft depth (``depths[d]``)."""

    depths: dict[int, Offered] = field(default_factory=dict)


def acceptance_by_label(rounds: Iterable[Round], key: str) -> dict[int | str, LabelAcceptance]:
    """Per-label acceptance (``FORMULAS["per_label"]``) from ``meta[key]``, one label per draft node.

    Medusa labels nodes by head and MTP by module, so this is the per-head acceptance Medusa reports. Each node
    the accepted path reaches (the root first) *offers* every label among its children once; the offer is
    accepted when the path goes on into a child with that label. A label repeated down a path (MTP's modules
    cycle when the draft is deeper than the stack) is offered once per depth. Rounds without labels are skipped.
    """
    stats: dict[int | str, LabelAcceptance] = {}
    for round_ in rounds:
        labels = (round_.meta or {}).get(key)
        if not isinstance(labels, list) or len(labels) != len(round_.tokens) or \
                not all(isinstance(label, (int, str)) for label in labels):
            continue  # no labels, or not one plain label per node (a hand-edited trace)
        children: dict[int, list[int]] = {}
        for node, parent in enumerate(round_.parents):
            children.setdefault(parent, []).append(node)
        path = round_.accepted
        for step, at in enumerate([-1, *path]):  # -1: the root
            taken = path[step] if step < len(path) else None
            for label in dict.fromkeys(labels[node] for node in children.get(at, [])):
                hit = taken is not None and labels[taken] == label
                entry = stats.setdefault(label, LabelAcceptance())
                depth = entry.depths.setdefault(step + 1, Offered())
                for counts in (entry, depth):
                    counts.offered += 1
                    counts.accepted += int(hit)
    return dict(sorted(stats.items(), key=lambda item: (type(item[0]).__name__, item[0])))


@dataclass
class CalibrationBin:
    """One bin of predicted confidences ``[low, high)`` and what was realised there."""

    low: float
    high: float
    count: int
    predicted: float  # mean predicted confidence
    realised: float  # fraction accepted


@dataclass
class Calibration:
    """The drafter's per-node confidence against realised acceptance over a run (``FORMULAS["calibration"]``)."""

    bins: list[CalibrationBin]
    samples: int
    ece: float


def confidence_samples(round_: Round) -> list[tuple[float, bool]]:
    """``(predicted, accepted)`` for each node of one round the target judged (its parent was accepted or is the
    root; under rejection sampling, a sibling tested before the accepted one or the accepted one itself).

    ``confidence`` is a path quantity (the chance the node and all its ancestors are accepted), so one node's own
    chance given its parent was accepted is the ratio of the two. Rounds without confidence give nothing.
    """
    confidence = round_.confidence
    if (not isinstance(confidence, list) or len(confidence) != len(round_.tokens)
            or not all(isinstance(c, (int, float)) and math.isfinite(c) for c in confidence)):
        return []  # no confidence, or not one number per node (a hand-edited trace)
    reached = {-1, *round_.accepted}
    accepted = set(round_.accepted)
    # rejection sampling stops testing a node's children at the first accepted one: the rest were never judged
    tested = ({d.get("node") for d in round_.draws if isinstance(d, dict)}
              if round_.rule == "rejection-sampling" and round_.draws else None)
    samples = []
    for node, parent in enumerate(round_.parents):
        if parent not in reached or (tested is not None and node not in tested):
            continue
        above = 1.0 if parent < 0 else confidence[parent]
        if above > 0:
            samples.append((min(1.0, max(0.0, confidence[node] / above)), node in accepted))
    return samples


def head_confidence_samples(round_: Round) -> list[tuple[float, bool]]:
    """``(ĉ, accepted)`` from a chain round's raw confidence-head values (``meta["confidence_head"]``, DSpark's), for
    each verified draft the target judged (every draft before it was accepted); none where the round has none."""
    heads = round_.meta.get("confidence_head") if isinstance(round_.meta, dict) else None
    if not isinstance(heads, list) or not round_.is_chain:
        return []
    accepted = len(round_.accepted)
    return [(min(1.0, max(0.0, float(c))), i < accepted)
            for i, c in enumerate(heads[: min(len(round_.tokens), accepted + 1)])
            if isinstance(c, (int, float)) and math.isfinite(c)]


def calibration(rounds: Iterable[Round], bins: int = 10, *, head: bool = False) -> Calibration:
    """Reliability-diagram bins and the expected calibration error over ``rounds`` (empty bins are left out): of the
    confidences the rounds carry, or with ``head`` of the confidence head's own values."""
    samples_of = head_confidence_samples if head else confidence_samples
    return calibration_of((sample for round_ in rounds for sample in samples_of(round_)), bins)


def calibration_of(samples: Iterable[tuple[float, bool]], bins: int = 10) -> Calibration:
    """``calibration`` of ``(predicted in [0, 1], accepted)`` pairs, wherever they come from."""
    sums = [[0, 0.0, 0] for _ in range(bins)]  # count, predicted sum, accepted count
    for predicted, hit in samples:
        entry = sums[min(bins - 1, int(predicted * bins))]
        entry[0] += 1
        entry[1] += predicted
        entry[2] += hit
    total = sum(entry[0] for entry in sums)
    kept = [CalibrationBin(i / bins, (i + 1) / bins, count, predicted / count, hits / count)
            for i, (count, predicted, hits) in enumerate(sums) if count]
    ece = sum(b.count * abs(b.realised - b.predicted) for b in kept) / total if total else 0.0
    return Calibration(kept, total, ece)
