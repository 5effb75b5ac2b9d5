"""``ngram:auto``: n-gram chains cut by their own acceptance so far and the target's verify-cost curve.

Lossless like every drafter (greedy output identical, sampled output distributed as the target's), and the cut
follows the estimates: nothing is verified where no prefix pays, all k where verifying is free.
"""

import dataclasses
import json

import pytest
import tiny
import torch
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, V, chi_square_p

from specviz import api
from specviz.drafters.ngram import NgramDrafter, parse_argument
from specviz.engine import accept as accept_module
from specviz.engine.accept import Acceptance
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.sampling import make_generator, probabilities
from specviz.errors import SpecvizError
from specviz.viz.confidence import block_positions, confidence_spec
from specviz.viz.tree_figure import tree_spec

REPEATING = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
#: Verifying more costs more: a first draft pays at an estimated acceptance above 0.4, each further one a little less.
STEEP = CostCurve.from_points({1: 10.0, 2: 14.0, 9: 40.0})


def test_acceptance_stats_shrink_toward_the_position_then_one_half():
    drafter = NgramDrafter(schedule=CostCurve.flat())
    stats = drafter.stats
    assert stats.estimate(3, 1) == 0.5  # nothing seen yet
    stats.record(3, [True, True, False, True])  # drafts 1 and 2 matched, 3 missed, 4 is never counted
    assert stats.estimate(3, 1) == pytest.approx((1 + 2 * (2 / 3)) / 3)
    assert stats.estimate(3, 3) == pytest.approx((0 + 2 * (1 / 3)) / 3)
    assert stats.estimate(3, 4) == 0.5
    assert stats.estimate(1, 1) == pytest.approx(2 / 3)  # another n: the position's pooled rate
    stats.record(2, [True] * 20)
    assert stats.trials[2, stats.POSITIONS] == 20 - stats.POSITIONS + 1  # deep positions share a bucket


def test_the_cut_follows_the_estimates_and_the_curve():
    context = REPEATING + [5, 9, 3]  # "9 3" was followed by "17 5 22 40 3 17"
    budget, generator = DraftBudget(k=6), make_generator(0)
    free = NgramDrafter(schedule=CostCurve.flat())
    free.begin(context)
    tree = free.propose(context, budget, CONFIG, generator)
    assert tree.tokens == [17, 5, 22, 40, 3, 17] and tree.meta["verify_length"] == 6
    assert tree.confidence == pytest.approx([0.5 ** j for j in range(1, 7)])

    steep = NgramDrafter(schedule=CostCurve.from_points({1: 10.0, 2: 18.0, 8: 80.0}))
    steep.begin(context)
    tree = steep.propose(context, budget, CONFIG, generator)
    assert tree.tokens == [] and tree.meta["schedule"]["length"] == 0  # 1.5 tokens for 18 ms < 1 for 10 ms
    assert [node["token"] for node in tree.meta["pruned"]] == [17, 5, 22, 40, 3, 17]  # drafted, shown, cut
    assert len(tree.meta["schedule"]["values"]) == 2  # the scan stopped at the first drop
    for _ in range(30):  # this generation's drafts from 2-grams were all accepted: now drafts pay
        steep.stats.record(2, [True] * 6)
    tree = steep.propose(context, budget, CONFIG, generator)
    assert tree.tokens[:1] == [17] and tree.meta["match"]["n"] == 3  # a 3-gram, trusted through the pooled rate

    fixed = NgramDrafter()
    fixed.begin(context)
    assert fixed.propose(context, budget, CONFIG, generator).confidence is None  # unchanged without a curve


@pytest.mark.parametrize("forward", ["hf", "fast"])
@pytest.mark.parametrize("budget", [DraftBudget(k=2), DraftBudget(k=8), DraftBudget(k=16)], ids=lambda b: b.describe())
def test_greedy_output_is_plain_decoding_and_the_cut_varies(forward, budget):
    """Exact output; the verified length follows the estimates (some rounds skipped, then verified again: cut drafts
    are still scored against the committed tokens, so a skipped match is not skipped for good)."""
    target = tiny.target("llama", 64, forward=forward, layers=3, scale=25)
    config = GenerationConfig(max_new_tokens=120)
    baseline = plain_decode(target, REPEATING, config)
    run = generate(target, REPEATING, config, NgramDrafter(schedule=STEEP), budget)
    assert run.token_ids == baseline.token_ids
    scheduled = [r for r in run.rounds if "schedule" in r.meta]
    assert scheduled and all(r.meta["verify_length"] == len(r.tokens) for r in scheduled)
    assert all(r.confidence == pytest.approx(r.meta["survival"][: len(r.tokens)], abs=1e-6) for r in scheduled)
    lengths = [r.meta["verify_length"] for r in scheduled]
    assert any(a == 0 and b > 0 for a, b in zip(lengths, lengths[1:]))  # skipped, then verified again
    if budget.k > 2:
        assert len(set(lengths)) > 2 and any(r.meta["pruned"] for r in scheduled)


def test_the_views_draw_scheduled_rounds_and_skipped_ones():
    """Every round's tree and confidence panel draw (JSON-ready); a round that verified nothing shows its drafts cut."""
    target = tiny.target("llama", 64, layers=3, scale=25)
    run = generate(target, REPEATING, GenerationConfig(max_new_tokens=80), NgramDrafter(schedule=STEEP),
                   DraftBudget(k=8))
    skipped = [i for i, r in enumerate(run.rounds) if r.meta.get("pruned") and not r.tokens]
    assert skipped
    for index, round_ in enumerate(run.rounds):
        json.dumps(tree_spec(round_))
        json.dumps(confidence_spec(run.rounds, index))
    spec = confidence_spec(run.rounds, skipped[0])
    assert any(note["text"] == "verify ℓ = 0" for note in spec["layout"]["annotations"])
    rows = block_positions(run.rounds[skipped[0]])
    assert rows and all(row["outcome"] == "cut" and row["q"] is None for row in rows)
    hover = tree_spec(run.rounds[skipped[0]])["data"]
    assert any("ℓ=0 (a plain step)" in str(trace.get("hovertext", "")) for trace in hover)
    # a trace recorded before the key's rename (plain_value) still shows the line
    old = run.rounds[skipped[0]]
    schedule = dict(old.meta["schedule"])
    schedule["plain_value"] = schedule.pop("fallback_value")
    renamed = dataclasses.replace(old, meta={**old.meta, "schedule": schedule})
    assert any("ℓ=0 (a plain step)" in str(trace.get("hovertext", "")) for trace in tree_spec(renamed)["data"])


# ---- sampling --------------------------------------------------------------------------------------------------
SAMPLING_PROMPT = [1, 5, 2, 1, 5]  # "5" and "1 5" were followed by "2 1 5": a draft from the first round on
#: A first draft pays at the prior's 0.5 and not after a rejection, so the verified length depends on history.
SAMPLING_CURVE = CostCurve.from_points({1: 1.0, 2: 1.3, 3: 1.7})


def exact_pairs(net: torch.nn.Module, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(x1, x2) of the target after ``prompt``, computed from its logits."""
    with torch.inference_mode():
        first = probabilities(net(torch.tensor([prompt])).logits[0, -1].float(), CONFIG)
        rows = probabilities(net(torch.tensor([prompt + [a] for a in range(V)])).logits[:, -1].float(), CONFIG)
    return {(a, b): float(first[a] * rows[a, b]) for a in range(V) for b in range(V)}


def engine_pairs(make_drafter, budget: DraftBudget, samples: int) -> tuple[dict, dict, list]:
    """Sampled runs of two tokens after ``SAMPLING_PROMPT``, one per seed, each with ``make_drafter()``: the counts of
    (x1, x2), the exact P(x1, x2), and every run's rounds (the chi-square tests of the deterministic drafters)."""
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    exact = exact_pairs(tiny.model("llama", V, layers=2, seed=0, scale=15), SAMPLING_PROMPT)
    counts: dict[tuple[int, int], int] = {}
    rounds = []
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        run = Generation(target, SAMPLING_PROMPT, config, make_drafter(), budget).run()
        counts[tuple(run.token_ids)] = counts.get(tuple(run.token_ids), 0) + 1
        rounds.append(run.rounds)
    return counts, exact, rounds


def sampled_pairs(samples: int) -> tuple[dict, dict, set[int]]:
    drafter = NgramDrafter(schedule=SAMPLING_CURVE)  # one drafter for every run: its acceptance history carries over
    counts, exact, rounds = engine_pairs(lambda: drafter, DraftBudget(k=2), samples)
    return counts, exact, {len(r.tokens) for run in rounds for r in run}


def test_sampled_scheduled_chains_keep_the_target_distribution():
    counts, exact, lengths = sampled_pairs(1_500)
    assert lengths == {0, 1}  # proposed in some rounds, skipped in others
    assert chi_square_p(counts, exact) > PASS_P


def trust_every_draft(monkeypatch) -> None:
    """Break the target-sampling rule: accept every deterministic draft instead of drawing from the target."""
    def trusting(tree, choice, rule):
        path = list(range(len(tree.tokens)))
        return Acceptance(path, int(choice[len(path)]), "bonus", rule, [])

    monkeypatch.setattr(accept_module, "walk_target_choice", trusting)


def test_a_verifier_that_trusts_the_drafts_is_detected(monkeypatch):
    """Control: accepting every deterministic draft instead of drawing from the target biases the output."""
    trust_every_draft(monkeypatch)
    counts, exact, _ = sampled_pairs(300)
    assert chi_square_p(counts, exact) < FAIL_P


# ---- the spec ----------------------------------------------------------------------------------------------------
def test_spec_names_and_bad_arguments():
    assert parse_argument("") == (3, False) and parse_argument("auto") == (3, True)
    assert parse_argument("auto:5") == (5, True) and parse_argument("4") == (4, False)
    for bad in ("auto:auto", "5:auto", "auto:9", "fast", "auto:"):
        with pytest.raises(SpecvizError) as error:
            parse_argument(bad)
        assert "ngram takes a maximum n-gram size" in str(error.value) and "\n" not in str(error.value)
    target = tiny.target("llama", 64, layers=2)
    drafter = api.make_drafter("ngram:auto:4", target)
    assert drafter.max_ngram == 4 and drafter.schedule is not None and drafter.name == "ngram:auto:4"
    assert drafter.describe()["cost_curve"]["source"] == "measured on tiny-llama"
    assert api.make_drafter("ngram", target).schedule is None
