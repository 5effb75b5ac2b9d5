"""``hybrid:<spec>``: the scheduled lookup where a prefix of its match pays, the model drafter elsewhere.

Lossless like every drafter (greedy output identical through both target paths, chains and trees; sampled output
distributed as the target's, with a broken-rule control for each kind of round), both drafters really propose,
the model drafter's drafts after rounds it sat out are the ones a fresh drafter makes on the same text, and the
views label who drafted what.
"""

from __future__ import annotations

import json

import pytest
import tiny
import torch
from test_eagle import LAYERS, fit, sampling_head
from test_ngram_schedule import REPEATING, trust_every_draft
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, Table, V, chi_square_p
from test_sampling_lossless import PROMPT as SAMPLING_PROMPT

from specviz import api
from specviz.drafters import registry
from specviz.drafters.eagle import EagleDrafter, build_head, new_head, save_head
from specviz.drafters.hybrid import LOOKUP_LABEL, HybridDrafter, RoundRate, model_labels
from specviz.drafters.ngram import NgramDrafter
from specviz.engine import accept as accept_module
from specviz.engine import metrics
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError
from specviz.viz.charts import run_charts_spec
from specviz.viz.confidence import confidence_spec
from specviz.viz.labels import node_labels
from specviz.viz.tree_figure import tree_spec

VOCAB = 64
#: Verifying more costs more, so the lookup verifies only where its matches have held.
CURVE = CostCurve.from_points({1: 10.0, 2: 12.0, 9: 30.0})
#: Steeper: at the prior's 0.5 a first lookup draft does not beat a plain step, so the first matches are skipped.
STEEP = CostCurve.from_points({1: 10.0, 2: 18.0, 8: 80.0})
SHAPES = [DraftBudget(k=2), DraftBudget(k=6), DraftBudget(tree=True, width=2, depth=3, max_nodes=6)]


def fixed_cost(budget: DraftBudget) -> float:
    """Model rounds' drafting cost, the same every run (as ``hybrid.stored_draft_cost`` is on one machine)."""
    return 2.0


def hybrid(head, target, curve: CostCurve = CURVE) -> HybridDrafter:
    model = EagleDrafter(build_head(target.model, head.spec, head.state_dict()), target.vocab_size)
    return HybridDrafter(NgramDrafter(schedule=curve, name="lookup"), model, draft_cost=fixed_cost)


@pytest.fixture(scope="module")
def setup():
    targets = tiny.both_forwards("llama", VOCAB, layers=LAYERS, scale=25)
    head = fit(new_head(targets["hf"].model, "eagle3", seed=1), targets["hf"].model)
    return targets, head


@pytest.mark.parametrize("budget", SHAPES, ids=lambda b: b.describe().replace(" ", "_"))
@pytest.mark.parametrize("forward", ["hf", "fast"])
def test_greedy_output_is_plain_decoding_and_both_drafters_propose(setup, forward, budget):
    targets, head = setup
    target = targets[forward]
    config = GenerationConfig(max_new_tokens=96)
    run = generate(target, REPEATING, config, hybrid(head, target), budget)
    assert run.token_ids == plain_decode(target, REPEATING, config).token_ids
    sources = [r.meta["source"] for r in run.rounds]
    assert "lookup" in sources and "eagle3" in sources
    lookup_rounds = [r for r in run.rounds if r.meta["source"] == "lookup"]
    assert all(r.tokens and r.meta["match"] and len(r.tokens) <= budget.longest_chain for r in lookup_rounds)
    assert all(r.meta["node_labels"] == [LOOKUP_LABEL] * len(r.tokens) for r in lookup_rounds)
    assert all(len(r.tokens) <= (budget.max_nodes if budget.tree else budget.k) for r in run.rounds)
    assert any(r.accepted for r in lookup_rounds)  # accepted model rounds: test_greedy_lossless (self-drafting)


def test_under_a_tree_budget_the_lookup_chain_may_fill_the_node_budget(setup):
    """The tree's depth shapes the model's trees; the lookup's one chain may hold every node the budget allows (a
    flat verify cost: each longer prefix pays), and the output stays plain decoding's."""
    targets, head = setup
    target, budget = targets["fast"], DraftBudget(tree=True, width=2, depth=1, max_nodes=4)
    drafter = hybrid(head, target, CostCurve.flat("flat"))
    config = GenerationConfig(max_new_tokens=48)
    run = generate(target, REPEATING, config, drafter, budget)
    assert run.token_ids == plain_decode(target, REPEATING, config).token_ids
    lookup_rounds = [r for r in run.rounds if r.meta["source"] == "lookup"]
    assert lookup_rounds and all(r.is_chain for r in lookup_rounds)
    assert max(len(r.tokens) for r in lookup_rounds) == budget.max_nodes > budget.depth


def test_the_model_catches_up_after_rounds_it_sat_out(setup):
    """Each model round drafts what a fresh EAGLE drafter, prefilled on the same committed text, drafts."""
    targets, head = setup
    target, budget = targets["hf"], DraftBudget(k=3)
    run = generate(target, REPEATING, GenerationConfig(max_new_tokens=64), hybrid(head, target), budget)
    context, checked = list(REPEATING), 0
    for index, round_ in enumerate(run.rounds):
        if round_.meta["source"] == "eagle3" and index and run.rounds[index - 1].meta["source"] == "lookup":
            fresh = EagleDrafter(build_head(target.model, head.spec, head.state_dict()), target.vocab_size)
            first = Generation(target, list(context), GenerationConfig(max_new_tokens=budget.k + 1), fresh,
                               budget).run()
            assert first.rounds[0].tokens == round_.tokens
            checked += 1
        context += round_.committed
    assert checked


def test_drafting_costs_are_known_before_the_first_round(setup):
    """The model's drafting cost is asked for once, for the run's budget, when the run begins: a budget timed for the
    first time on a machine (half a second of throwaway drafting) never lands inside a round, nor do the budgets
    capped to the tokens left near the end."""
    targets, head = setup
    target, budget = targets["hf"], DraftBudget(k=4)
    asked: list[tuple[DraftBudget, int]] = []
    drafter = hybrid(head, target)
    run = Generation(target, REPEATING, GenerationConfig(max_new_tokens=30), drafter, budget)

    def cost(asked_budget: DraftBudget) -> float:
        asked.append((asked_budget, len(run.rounds)))
        return 2.0

    drafter.draft_cost = cost
    run.run()
    assert asked == [(budget, 0)]
    assert any(r.meta["source"] == "eagle3" for r in run.rounds)


def test_the_lookup_must_beat_the_model_rounds_rate():
    """Where the model's rounds commit more per ms than the lookup's best prefix would, the lookup stands aside."""
    rate = RoundRate(plain_ms=10.0)
    assert rate.value == pytest.approx(0.1)
    rate.add(3, 10.0)
    assert rate.value == pytest.approx(5 / 30)
    lookup = NgramDrafter(schedule=CURVE)
    context = REPEATING + [5, 9, 3]
    lookup.begin(context)
    assert lookup.propose(context, DraftBudget(k=4), CONFIG, torch.Generator()).tokens  # beats a plain step
    lookup.fallback = (rate.value, "a faster drafter")
    tree = lookup.propose(context, DraftBudget(k=4), CONFIG, torch.Generator())
    assert tree.tokens == [] and tree.meta["schedule"]["fallback"] == "a faster drafter"
    assert tree.meta["schedule"]["fallback_value"] == pytest.approx(5 / 30, abs=1e-6)


def test_the_views_label_who_drafted(setup):
    targets, head = setup
    target = targets["hf"]
    drafter = hybrid(head, target, curve=STEEP)
    run = generate(target, REPEATING, GenerationConfig(max_new_tokens=64), drafter, DraftBudget(k=4))
    for index, round_ in enumerate(run.rounds):
        json.dumps(tree_spec(round_))
        json.dumps(confidence_spec(run.rounds, index))
        json.dumps(round_.meta)  # traces keep it
        if round_.tokens:
            expected = LOOKUP_LABEL if round_.meta["source"] == "lookup" else "eagle3"
            assert node_labels(round_) == [expected] * len(round_.tokens)
    bars = [trace["name"] for trace in run_charts_spec(metrics.compute(run.rounds, run.elapsed_s), run.rounds)["data"]
            if trace["type"] == "bar" and trace.get("xaxis") == "x"]
    assert sorted(name.split(":")[0] for name in bars) == ["eagle3", LOOKUP_LABEL]  # acceptance per drafter
    medusa = DraftTree.chain([4, 7], meta={"head": [0, 1]})  # Medusa's heads and MTP's modules keep their number
    assert model_labels(medusa, "medusa") == ["medusa head 1", "medusa head 2"]
    assert model_labels(DraftTree.chain([4]), "eagle3") == ["eagle3"]
    skipped = [r for r in run.rounds if r.meta["source"] == "eagle3" and r.meta.get("lookup_skipped")]
    assert skipped  # a match the lookup judged not worth verifying, then the model's round
    assert all(r.meta["lookup_skipped"]["value"] <= r.meta["lookup_skipped"]["bar"] for r in skipped)
    hover = str(tree_spec(skipped[0])["data"])
    assert "lookup sat out: its" in hover and "gram match was worth" in hover


# ---- sampling --------------------------------------------------------------------------------------------------
#: A first lookup draft pays at the prior's 0.5 and not after a rejection: both kinds of round occur.
SAMPLING_CURVE = CostCurve.from_points({1: 1.0, 2: 1.3, 3: 1.7})


def sampled_counts(samples: int) -> tuple[dict, dict, set]:
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    exact = Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()
    drafter = HybridDrafter(NgramDrafter(schedule=SAMPLING_CURVE), EagleDrafter(sampling_head(target, "eagle"), V),
                            draft_cost=fixed_cost)
    counts: dict[tuple[int, int], int] = {}
    sources: set = set()
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        run = Generation(target, SAMPLING_PROMPT, config, drafter, DraftBudget(k=2)).run()
        counts[tuple(run.token_ids)] = counts.get(tuple(run.token_ids), 0) + 1
        sources.update((r.meta["source"], r.rule) for r in run.rounds if r.tokens)
    return counts, exact, sources


def test_sampled_output_keeps_the_target_distribution():
    counts, exact, sources = sampled_counts(1_500)
    assert sources == {("lookup", "target-sampling"), ("eagle", "rejection-sampling")}
    assert chi_square_p(counts, exact) > PASS_P


def test_a_verifier_that_trusts_lookup_drafts_is_detected(monkeypatch):
    trust_every_draft(monkeypatch)
    counts, exact, _ = sampled_counts(400)
    assert chi_square_p(counts, exact) < FAIL_P


def test_a_broken_residual_in_model_rounds_is_detected(monkeypatch):
    monkeypatch.setattr(accept_module.sampling, "residual", lambda p, q: p)
    counts, exact, _ = sampled_counts(800)
    assert chi_square_p(counts, exact) < FAIL_P


# ---- the spec ----------------------------------------------------------------------------------------------------
def test_specs_and_bad_partners(setup, tmp_path):
    targets, head = setup
    target = targets["hf"]
    save_head(head, tmp_path / "head", target_name="tiny")
    drafter = api.make_drafter(f"hybrid:eagle3:{tmp_path / 'head'}", target)
    assert isinstance(drafter, HybridDrafter) and drafter.name == f"hybrid:eagle3:{tmp_path / 'head'}"
    assert drafter.feature_layers == drafter.model.feature_layers and drafter.lookup.schedule is not None
    described = drafter.describe()
    assert described["kind"] == "hybrid" and described["model"]["kind"] == "eagle3"
    # the default draft precision, auto, drafts the head's output rows in int8 on CPU; the views read it at the top
    assert described["model"]["draft_quant"] == described["draft_quant"] == "int8"
    for bad, says in [("hybrid:ngram", "is not one"), ("hybrid:hybrid:eagle3", "is not one"),
                      ("hybrid:ngram:auto", "is not one"), ("hybrid:nope", "unknown drafter 'nope'")]:
        with pytest.raises(SpecvizError) as error:
            registry.parse(bad)
        assert says in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(SpecvizError, match="no EAGLE-3 head is shipped for"):
        api.make_drafter("hybrid", target)  # the bare name pairs with the head shipped for the target
