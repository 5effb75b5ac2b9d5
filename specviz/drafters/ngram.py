"""Prompt lookup / n-gram drafting: continue the text the way it continued after the same n-gram before.

Deterministic (no draft distribution), so its proposals are verified with the target-sampling rule. An index of
every n-gram's end positions is updated incrementally on commit, so a round costs O(new tokens), not O(context).

``ngram:auto`` schedules its chains: it keeps, per matched n-gram length and draft position, how often this
generation's drafts matched the target (``AcceptanceStats``), turns the counts into a confidence ĉ_j for each drafted
token and a prefix survival s_j, and verifies the prefix that maximises (1 + Σ s) ÷ cost(1 + ℓ) on the target's
measured verify-cost curve, or nothing where no prefix beats a plain step. A long, reliable match is verified to k
tokens; a weak one costs no verify width. Drafts it cut are scored too, against the tokens the round committed
(a deterministic draft is accepted exactly when the target's own token equals it, greedy or sampled), so a skipped
match keeps being judged and is verified again once it pays. The cut depends only on the drafts and on past rounds,
so it stays lossless (greedy and sampled alike).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch

from specviz.drafters.registry import DrafterFamily, register
from specviz.engine import cost_curve
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

MAX_NGRAM = 8
DEFAULT_MAX_NGRAM = 3
#: ``ngram:auto`` schedules its chains (``NgramDrafter(schedule=...)``) on the verify-cost curve measured up to
#: ``SCHEDULE_WIDEST`` tokens (wider verifies extrapolate its last segment).
AUTO = "auto"
SCHEDULE_WIDEST = 17


class AcceptanceStats:
    """How often drafted tokens were accepted, given every draft before them was, per matched n-gram length n and
    draft position j (positions past ``POSITIONS`` share the last bucket).

    The estimate for (n, j) shrinks its own rate toward the rate at position j over every n, and that one toward
    ½: ``(a + w·prior) / (t + w)`` with ``w`` pseudo-trials at each level, so a fresh generation starts undecided
    and follows its own text within a few rounds.
    """

    POSITIONS = 8

    def __init__(self, weight: float = 2.0):
        self.weight = weight
        self.trials: dict[tuple[int, int], int] = defaultdict(int)
        self.accepted: dict[tuple[int, int], int] = defaultdict(int)

    def _bucket(self, j: int) -> int:
        return min(j, self.POSITIONS)

    def estimate(self, n: int, j: int) -> float:
        j = self._bucket(j)
        pooled_trials = sum(t for (_, position), t in self.trials.items() if position == j)
        pooled_accepted = sum(a for (_, position), a in self.accepted.items() if position == j)
        pooled = (pooled_accepted + self.weight * 0.5) / (pooled_trials + self.weight)
        return (self.accepted[n, j] + self.weight * pooled) / (self.trials[n, j] + self.weight)

    def record(self, n: int, outcomes: list[bool]) -> None:
        """Drafts 1, 2, … of a chain from an n-gram match matched the target's tokens (True) up to the first miss."""
        for j, hit in enumerate(outcomes, start=1):
            self.trials[n, self._bucket(j)] += 1
            self.accepted[n, self._bucket(j)] += hit
            if not hit:
                break


class NgramDrafter(Drafter):
    """Look up the latest n-gram (longest first) that ends the context; propose what followed it."""

    name = "ngram"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1, *, schedule: CostCurve | None = None,
                 name: str | None = None):
        if not 1 <= min_ngram <= max_ngram <= MAX_NGRAM:
            raise SpecvizError(f"n-gram sizes must satisfy 1 <= min <= max <= {MAX_NGRAM}, "
                               f"got min={min_ngram} max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.schedule = schedule  # the verify-cost curve chains are scheduled on; None: verify all k
        self.name = name or self.name
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self._indexed = 0
        self.stats = AcceptanceStats()
        self._drafted: tuple[int, list[int], int] | None = None  # (matched n, drafts, context length) of a schedule
        #: What a round that verifies none of the drafts commits per ms, and what it is: a plain step unless a
        #: caller (the hybrid drafter) sets the value of its own alternative before ``propose``.
        self.fallback: tuple[float, str] | None = None

    def describe(self) -> dict:
        described = {"name": self.name, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}
        if self.schedule is not None:
            described["cost_curve"] = self.schedule.to_dict()
        return described

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        self._index.clear()
        self._indexed = 0
        self.stats = AcceptanceStats()
        self._drafted = None
        self._extend(prompt_ids)

    def _extend(self, context: list[int]) -> None:
        """Index n-grams ending at every position not indexed yet (value = position right after the n-gram)."""
        for end in range(max(self._indexed, 1), len(context) + 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self._index[tuple(context[end - n : end])].append(end)
        self._indexed = len(context) + 1

    def continuations(self, context: list[int], depth: int, limit: int) -> list[list[int]]:
        """Up to ``limit`` distinct continuations (at most ``depth`` tokens), longest n-gram and most recent first."""
        return [follow for _, _, follow in self._matches(context, depth, limit)]

    def _matches(self, context: list[int], depth: int, limit: int) -> list[tuple[int, int, list[int]]]:
        """``continuations`` with the length n of the n-gram each one followed and where it starts in ``context``."""
        found: list[tuple[int, int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if n > len(context):
                continue
            ends = self._index.get(tuple(context[-n:]), [])
            for end in reversed(ends):
                if end >= len(context):  # the suffix itself
                    continue
                follow = context[end : end + depth]
                if follow and tuple(follow) not in seen:
                    seen.add(tuple(follow))
                    found.append((n, end, follow))
                    if len(found) >= limit:
                        return found
        return found

    def propose(
        self, context: list[int], budget: DraftBudget, sampling: SamplingConfig, generator: torch.Generator
    ) -> DraftTree:
        if len(context) + 1 < self._indexed:  # a new, shorter context: start over
            self.begin(context)
        else:
            self._extend(context)
        self._drafted = None
        if not budget.tree:
            found = self._matches(context, budget.k, 1)
            if not found:
                return DraftTree.empty()
            n, end, tokens = found[0]
            lookup = lookup_meta(n, end, len(tokens))
            if self.schedule is None:
                return DraftTree.chain(tokens, meta={"lookup": lookup})
            self._drafted = (n, tokens, len(context))
            return self._scheduled(n, tokens, lookup)
        return _trie(self._matches(context, budget.depth, budget.width), budget.max_nodes)

    def _scheduled(self, n: int, tokens: list[int], lookup: list[dict]) -> DraftTree:
        """The prefix of ``tokens`` worth verifying (possibly none), with each draft's confidence and the scan."""
        estimates = [self.stats.estimate(n, j) for j in range(1, len(tokens) + 1)]
        survival = cost_curve.survival(estimates)
        plan = cost_curve.best_prefix(survival, self.schedule, len(tokens))
        bar, fallback = self.fallback or (1.0 / self.schedule.cost(1), "a plain step")  # tokens per ms of ℓ = 0
        length = plan.length if plan.values[plan.length - 1] > bar else 0
        meta = {"match": {"n": n, "drafted": len(tokens)}, "survival": [round(v, 6) for v in survival],
                "pruned": cost_curve.cut_tail(tokens, None, survival, length), "verify_length": length,
                "schedule": {**plan.to_dict(), "length": length, "fallback_value": round(bar, 6), "fallback": fallback,
                             "curve": self.schedule.source}, "lookup": lookup[:length]}
        return DraftTree.chain(tokens[:length], confidence=survival[:length], meta=meta)

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        if self._drafted is not None:  # every draft the round's tokens can judge, verified or cut
            n, drafts, start = self._drafted
            self.stats.record(n, [a == b for a, b in zip(drafts, context[start:])])
            self._drafted = None
        self._extend(context)


def lookup_meta(n: int, start: int, count: int) -> list[dict]:
    """Why each of ``count`` drafts was proposed (``Round.meta["lookup"]``, one entry per node): the context's last
    ``n`` tokens occurred earlier, followed by the draft, which is the context's token at position ``from``."""
    return [{"n": n, "from": start + i} for i in range(count)]


def _trie(matches: list[tuple[int, int, list[int]]], max_nodes: int) -> DraftTree:
    """Merge continuations (``_matches``) into a prefix tree (shared prefixes become one branch), breadth-first under
    a node cap; each node keeps the match that first proposed it (``lookup_meta``)."""
    tokens: list[int] = []
    parents: list[int] = []
    lookup: list[dict] = []
    node_of: dict[tuple[int, ...], int] = {}
    depth = max((len(c) for _, _, c in matches), default=0)
    for level in range(depth):
        for n, start, seq in matches:
            if level >= len(seq):
                continue
            parent = ROOT if level == 0 else node_of.get(tuple(seq[:level]))
            if parent is None:
                continue  # its prefix was cut by the node cap
            key = tuple(seq[: level + 1])
            if key in node_of:
                continue
            if len(tokens) >= max_nodes:
                break
            node_of[key] = len(tokens)
            tokens.append(seq[level])
            parents.append(parent)
            lookup.append({"n": n, "from": start + level})
    return DraftTree(tokens=tokens, parents=parents, meta={"lookup": lookup} if tokens else {})


# ---- the family ----------------------------------------------------------------------------------------------
def parse_argument(argument: str) -> tuple[int, bool]:
    """(maximum n, scheduled) of an ``ngram[:auto][:N]`` spec's argument (``""``: the default n, not scheduled)."""
    parts = argument.split(":") if argument else []
    scheduled = bool(parts) and parts[0] == AUTO
    rest = parts[1:] if scheduled else parts
    if len(rest) > 1 or (rest and (not rest[0].isdigit() or not 1 <= int(rest[0]) <= MAX_NGRAM)):
        raise SpecvizError(f"ngram takes a maximum n-gram size from 1 to {MAX_NGRAM} and an optional '{AUTO}', "
                           f"e.g. ngram:3 or ngram:{AUTO}:3, got {'ngram:' + argument!r}")
    return (int(rest[0]) if rest else DEFAULT_MAX_NGRAM), scheduled


def ngram_size(argument: str) -> int:
    """The maximum n of an ``ngram[:auto][:N]`` spec's argument (``""``: the default)."""
    return parse_argument(argument)[0]


def _check(argument: str) -> str:
    parse_argument(argument)
    return argument


def _build(argument: str, target: Target, settings: Mapping[str, Any]) -> NgramDrafter:
    size, scheduled = parse_argument(argument)
    curve = cost_curve.measured(target, SCHEDULE_WIDEST) if scheduled else None
    return NgramDrafter(max_ngram=size, schedule=curve, name=f"ngram:{argument}" if argument else None)


FAMILY = register(DrafterFamily(
    name="ngram",
    syntax="ngram[:auto][:N]",
    title="n-gram lookup",
    plain_name="Prompt lookup (n-gram)",
    plain_line="copies what followed the same words earlier in the text",
    description=f"prompt lookup: continue with what followed the latest match of the context's last n tokens "
                f"(n = N down to 1; N = {DEFAULT_MAX_NGRAM} by default); no model, no draft probabilities; "
                f"ngram:{AUTO} verifies the prefix (up to k) that this run's acceptance so far says pays on this "
                "machine's verify-cost curve, or none",
    build=_build,
    check=_check,
    default_spec="ngram",
    variants=("ngram:2", "ngram:4", f"ngram:{AUTO}"),
    order=10,
))
