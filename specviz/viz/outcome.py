"""What happened to each draft node in a round: the one classification every view colours by."""

from __future__ import annotations

from enum import Enum

from specviz.engine.round import Round


class Outcome(str, Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNREACHED = "unreached"
    CORRECTION = "correction"
    BONUS = "bonus"
    PROMPT = "prompt"


OUTCOME_LABELS = {
    Outcome.ACCEPTED: "accepted draft",
    Outcome.REJECTED: "rejected",
    Outcome.UNREACHED: "never reached",
    Outcome.CORRECTION: "correction",
    Outcome.BONUS: "bonus",
    Outcome.PROMPT: "prompt",
}

#: Colour-blind-friendly palette (Okabe-Ito based); the same colours in the tree, the text and the charts.
OUTCOME_COLORS = {
    Outcome.ACCEPTED: "#009E73",
    Outcome.REJECTED: "#D55E00",
    Outcome.UNREACHED: "#B5B5B5",
    Outcome.CORRECTION: "#E69F00",
    Outcome.BONUS: "#0072B2",
    Outcome.PROMPT: "#6b6b6b",
}


def node_outcomes(round_: Round) -> list[Outcome]:
    """Outcome of every draft node (not the extra token; that is ``round_.extra_kind``).

    accepted: on the accepted path. rejected: the target examined it (a child of the root or of an accepted node)
    and did not take it. never reached: below a rejected node, so the walk never got there. Under rejection
    sampling the walk stops testing siblings once one is accepted, so untested siblings (absent from
    ``round_.draws``) are never reached too.
    """
    accepted = set(round_.accepted)
    examined_parents = {-1, *accepted}
    tested: set[int] | None = None
    if round_.rule == "rejection-sampling" and round_.draws:
        tested = {d["node"] for d in round_.draws if d.get("node") is not None}
    outcomes = []
    for node, parent in enumerate(round_.parents):
        if node in accepted:
            outcomes.append(Outcome.ACCEPTED)
        elif parent in examined_parents and (tested is None or node in tested):
            outcomes.append(Outcome.REJECTED)
        else:
            outcomes.append(Outcome.UNREACHED)
    return outcomes


def committed_outcomes(round_: Round) -> list[Outcome]:
    """Provenance of each committed token: accepted draft tokens, then the correction or bonus token."""
    accepted = len(round_.accepted)
    extra = Outcome(round_.extra_kind)
    return [Outcome.ACCEPTED if i < accepted else extra for i in range(len(round_.committed))]
