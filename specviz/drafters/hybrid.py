"""Prompt lookup first, a model drafter where the lookup has nothing worth verifying: ``hybrid[:<drafter spec>]``.

Each round the scheduled n-gram lookup (``ngram:auto``) looks for the context's last n-gram earlier in the text. Where
a prefix of its match pays, that prefix is the round's draft and the model drafter does not run (it catches up on the
committed text at its next turn, in one forward); otherwise the model drafter proposes exactly as it would alone.
"Pays" means beats the model drafter's own rounds: the lookup's best prefix must commit more tokens per millisecond
(its survival over the target's verify cost) than the model's rounds did so far in this run (their committed tokens
over their draft cost plus verify cost: ``RoundRate``). Both costs are measured once per machine and kept
(``specviz.engine.timings``: the target's verify-cost curve, and a model round's drafting time at the run's budget,
timed on a throwaway copy of the model drafter), never timed live, so the same seed and settings give the same
rounds in every run. The model drafts in every round the lookup sits out, even where its rounds do a little worse
than plain steps: skipping it there was tried and measured slower (BENCHMARKS.md), the rate being too noisy a guide
at that margin.

A lookup costs nothing and, where text repeats (extraction, code edits, summaries quoting their source), its matches
are long and reliable; a model drafter costs a forward per step but still guesses on new text. Serving stacks pair
them the same way (suffix or prompt lookup beside a learned speculator).

Lossless: who proposes depends only on the committed text and past rounds (the lookup's acceptance and the model
rounds' rate so far), never on this round's draft tokens, so every round is one drafter's own proposal,
verified by that proposal's own rule (deterministic lookup drafts by the target-sampling rule, the model's by
rejection sampling against its q).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from specviz import settings
from specviz.drafters import registry
from specviz.drafters.ngram import SCHEDULE_WIDEST, NgramDrafter
from specviz.drafters.registry import DrafterFamily, register
from specviz.engine import cost_curve, timings
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.features import TargetFeatures
from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

NAME = "hybrid"
#: How the views label a node the lookup drafted (``Round.meta["node_labels"]``).
LOOKUP_LABEL = "lookup"
#: The model drafter a bare ``hybrid`` pairs with the lookup: the best model drafter measured (BENCHMARKS.md).
DEFAULT_PARTNER = "eagle3"
#: The longest chain the lookup drafts under a tree budget (the chain length's own ceiling)
LONGEST_LOOKUP = settings.get("k").high
#: Families that cannot be the model side: the lookup is already there.
NOT_PARTNERS = ("ngram", NAME)
#: The throwaway generation that times a model round's drafting once per machine and budget (``stored_draft_cost``)
CALIBRATION_PROMPT, CALIBRATION_TOKENS = 32, 12


class RoundRate:
    """Committed tokens per millisecond of a drafter's rounds so far, starting from ``prior_rounds`` plain steps (one
    token for ``plain_ms``) so that its first rounds do not swing it."""

    def __init__(self, plain_ms: float, prior_rounds: float = 2.0):
        self.tokens, self.ms = prior_rounds, prior_rounds * plain_ms

    def add(self, tokens: int, ms: float) -> None:
        self.tokens += tokens
        self.ms += ms

    @property
    def value(self) -> float:
        return self.tokens / self.ms


class HybridDrafter(Drafter):
    """``lookup`` (an ``NgramDrafter`` with a schedule) proposes when a prefix of its match pays, else ``model``.

    The lookup drafts a chain of up to k tokens (under ``--tree``: up to the node budget, which verifies a chain of
    that many for what it verifies the tree for; the depth shapes the model's trees); the model drafter gets the
    budget as it is. ``source`` is who proposed the last round (``"lookup"`` or the model's name);
    ``model_rate`` what the model's rounds committed per ms so far, each costing ``draft_cost(budget)`` ms of drafting
    (a fixed figure per budget: ``stored_draft_cost``; default 0) plus the verify-cost curve's width.
    """

    def __init__(self, lookup: NgramDrafter, model: Drafter, name: str | None = None,
                 draft_cost: Callable[[DraftBudget], float] = lambda budget: 0.0):
        if lookup.schedule is None:
            raise SpecvizError("the hybrid drafter's lookup needs a verify-cost curve to schedule on")
        self.lookup, self.model, self.draft_cost = lookup, model, draft_cost
        self.name = name or f"{NAME}:{model.name}"
        self.feature_layers = tuple(model.feature_layers)
        self.source: str | None = None
        self.model_rate = RoundRate(lookup.schedule.cost(1))
        self._model_ms = 0.0  # the model round in flight: its draft time and verify cost so far
        self._run_draft_ms: float | None = None  # the run budget's drafting cost, known before its first round

    def describe(self) -> dict:
        model = self.model.describe()
        described = {"name": self.name, "kind": NAME, "lookup": self.lookup.describe(), "model": model}
        for key in ("trained", "draft_quant"):  # the views say how an MTP stack was trained, and int8 draft weights
            if model.get(key):
                described[key] = model[key]
        return described

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        self.lookup.begin(prompt_ids, max_new_tokens, budget)
        self.model.begin(prompt_ids, max_new_tokens, budget)
        self.source = None
        self.model_rate = RoundRate(self.lookup.schedule.cost(1))
        # a budget's drafting cost is timed the first time a machine needs it (half a second): here, before the
        # run's first round, not inside one of its rounds; the rounds near the end, whose budget is capped to the
        # tokens left, are charged the run's budget (no more than they cost) rather than timing each capped one
        self._run_draft_ms = self.draft_cost(budget) if budget is not None else None

    def observe(self, features: TargetFeatures) -> None:
        self.model.observe(features)

    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        chain = replace(budget, tree=False, k=min(budget.longest_chain, LONGEST_LOOKUP)) if budget.tree else budget
        self.lookup.fallback = (self.model_rate.value, f"{self.model.name}'s rounds so far")
        tree = self.lookup.propose(context, chain, sampling, generator)
        if tree.tokens:
            self.source = "lookup"
            tree.meta["node_labels"] = [LOOKUP_LABEL] * len(tree.tokens)
        else:
            skipped = _skipped(tree.meta)
            self.source = self.model.name
            tree = self.model.propose(context, budget, sampling, generator)
            draft_ms = self.draft_cost(budget) if self._run_draft_ms is None else self._run_draft_ms
            self._model_ms = draft_ms + self.lookup.schedule.cost(1 + len(tree.tokens))
            tree.meta["node_labels"] = model_labels(tree, self.model.name)
            if skipped:  # a match the lookup judged not worth verifying: the views say what it was worth
                tree.meta["lookup_skipped"] = skipped
        tree.meta["source"] = self.source
        return tree

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        self.lookup.commit(context, tree, accepted)  # scores its drafts, verified or not, and indexes the new text
        if self.source != "lookup":
            self.model.commit(context, tree, accepted)
            self.model_rate.add(len(accepted) + 1, self._model_ms)


def model_labels(tree: DraftTree, name: str) -> list[str]:
    """Each model-drafted node's label: the drafter's name, with the Medusa head or MTP module that drafted it (0-based
    in ``meta``, 1-based in words, as the views number them), so one run's per-label chart holds both kinds of round."""
    for key in ("head", "module"):
        values = tree.meta.get(key)
        if isinstance(values, list) and len(values) == len(tree.tokens):
            return [f"{name} {key} {value + 1}" for value in values]
    return [name] * len(tree.tokens)


def _skipped(meta: dict) -> dict | None:
    """What a match the lookup cut to nothing was worth: its n-gram length, drafts, best value and the bar it missed."""
    match, schedule = meta.get("match"), meta.get("schedule")
    if not match or not schedule:
        return None
    return {**match, "value": max(schedule["values"]), "bar": schedule["fallback_value"],
            "against": schedule.get("fallback") or "a plain step"}


# ---- the family ----------------------------------------------------------------------------------------------
def _partner(argument: str) -> str:
    """The model drafter's spec (checked, no model loads): ``argument`` or the default partner."""
    spec = argument or DEFAULT_PARTNER
    family, _ = registry.parse(spec, where=f" in {NAME}:{spec}")
    if family.name in NOT_PARTNERS:
        raise SpecvizError(f"{NAME} pairs the n-gram lookup with a model drafter; {spec!r} is not one (give e.g. "
                           f"{NAME}:{DEFAULT_PARTNER} or {NAME}:dspark)")
    return spec


def _check(argument: str) -> str:
    _partner(argument)
    return argument


def stored_draft_cost(spec: str, target: Target, settings: Mapping[str, Any]) -> Callable[[DraftBudget], float]:
    """Milliseconds a round of ``spec``'s drafting (propose and commit) takes on this machine at a budget: measured the
    first time a budget is asked for, on a throwaway copy of the drafter over a short real generation (the run's own
    drafter keeps its state), then kept per machine (``timings.remembered``) and per run."""
    known: dict[DraftBudget, float] = {}

    def measure(budget: DraftBudget) -> dict:
        probe = registry.build(spec, target, settings)
        ids = [(7 + 31 * i) % target.vocab_size for i in range(CALIBRATION_PROMPT)]
        config = GenerationConfig(max_new_tokens=CALIBRATION_TOKENS, stop_at_eos=False, detail=False,
                                  top_k_report=0)
        rounds = Generation(target, ids, config, probe, budget).run().rounds[1:]  # the first warms up
        return {"ms": statistics.median(r.draft_ms for r in rounds) if rounds else 0.0}

    def cost(budget: DraftBudget) -> float:
        if budget not in known:
            key = {"model": timings.model_key(target.model), "forward": target.forward, "drafter": spec,
                   "settings": {name: settings.get(name) for name in FAMILY.reads}, "budget": budget.to_dict()}
            known[budget] = timings.remembered("draft-cost", key, lambda: measure(budget), _milliseconds)
        return known[budget]

    return cost


def _milliseconds(value: dict) -> float:
    ms = float(value["ms"])
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"a stored draft cost must be finite milliseconds >= 0, got {ms}")
    return ms


def _build(argument: str, target: Target, settings: Mapping[str, Any]) -> HybridDrafter:
    spec = _partner(argument)
    model = registry.build(spec, target, settings)
    lookup = NgramDrafter(schedule=cost_curve.measured(target, SCHEDULE_WIDEST), name="lookup")
    return HybridDrafter(lookup, model, name=f"{NAME}:{argument}" if argument else NAME,
                         draft_cost=stored_draft_cost(spec, target, settings))


def _ready(target: str) -> list[str]:
    """The bare spec where the default partner is shipped for ``target`` (other partners: ``hybrid:<spec>``)."""
    return [""] if registry.get(DEFAULT_PARTNER).shipped(target) else []


FAMILY = register(DrafterFamily(
    name=NAME,
    syntax=f"{NAME}[:<drafter spec>]",
    title="lookup + model",
    plain_name="Prompt lookup, else EAGLE-3",
    plain_line="copies from earlier in the text where that has paid off so far, else asks a small trained "
               "network",
    description=f"prompt lookup where this run's matches say a prefix pays (as ngram:auto), else the model drafter "
                f"(any spec but ngram; bare name: {DEFAULT_PARTNER}, the head shipped for the target)",
    build=_build,
    check=_check,
    reads=("stochastic_tree", "min_draft_prob", "draft_vocab", "draft_quant"),
    features="the model drafter's",
    checkpoints=_ready,
    order=90,
))
