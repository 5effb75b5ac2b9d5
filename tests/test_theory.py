"""Theory beside measurement (``specviz.viz.theory``): the closed form, the per-position τ against a real run's
measured τ, the optimum against the verify-cost curve, and the panel for live runs and recorded traces."""

import plotly.graph_objects as go
import pytest
import tiny

from specviz import api
from specviz.drafters.ngram import NgramDrafter
from specviz.engine import trace
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate
from specviz.engine.round import Round
from specviz.ui import examples, runner
from specviz.ui.controller import apply
from specviz.viz import theory
from specviz.viz.record import RunRecord

VOCAB = 64
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]  # repeats itself: lookup drafts have something to match
EAGLE_CHAIN = "summarization-eagle3-chain.jsonl"  # a real EAGLE-3 run (greedy chain, k = 4), recorded without a curve


def speedup_traces(spec: dict) -> list[dict]:
    return [t for t in spec["data"] if t.get("xaxis") == "x2"]


def test_closed_form_and_per_position_values():
    assert theory.closed_form_tau(0.5, 3) == pytest.approx(1.875)  # 1 + 1/2 + 1/4 + 1/8
    assert [theory.closed_form_tau(1.0, g) for g in (0, 1, 4, 9)] == [1, 2, 5, 10]  # every draft kept, plus one
    assert theory.closed_form_tau(0.0, 7) == 1.0
    # equal rates reproduce the closed form; past the last measured rate the last one stands in
    assert theory.per_position_tau([0.5, 0.5, 0.5], 3) == pytest.approx(1.875)
    assert theory.per_position_tau([0.5], 3) == pytest.approx(1.875)
    assert theory.per_position_tau([1.0, 1.0, 0.5], 4) == pytest.approx(1 + 1 + 1 + 0.5 + 0.25)
    assert theory.per_position_tau([], 4) == 1.0
    assert theory.position_rates([0.8, 0.4, 0.0, 0.0]) == pytest.approx([0.8, 0.5, 0.0, 0.0])


def test_a_round_costs_its_verify_width_relative_to_one_token_plus_drafting_and_overhead():
    costs = theory.Costs(CostCurve.from_points({1: 10.0, 5: 20.0}), step_ms=10.0, step_source="given", draft_ms=1.0,
                         overhead_ms=2.0, side_rows=0)
    assert costs.per_round(4) == pytest.approx(20 / 10 + (4 * 1.0 + 2.0) / 10)
    assert costs.timed(4) and not costs.timed(5)  # width 6 lies past the widest timed forward


def round_of(index: int, parents: list[int], accepted: list[int]) -> Round:
    """A greedy round with this tree and accepted path (token ids and texts are placeholders)."""
    n = len(parents)
    return Round(index=index, start=0, tokens=list(range(n)), parents=parents, text=["t"] * n, q_draft=None,
                 confidence=None, sampled=False, p_target=[1.0] * n, target_top=[], draft_top=None, target_entropy=[],
                 accepted=accepted, extra_token=0, extra_text="t", extra_kind="bonus",
                 committed=[0] * (len(accepted) + 1), committed_text=["t"] * (len(accepted) + 1), draws=[],
                 residual_top=None, rule="greedy", lossless=True, draft_ms=1.0, verify_ms=10.0, other_ms=1.0)


def test_a_trees_tau_is_its_rounds_cut_to_each_node_budget():
    parents = [-1, -1, 0, 1, 2]  # two roots; node 2 under 0, 3 under 1, 4 under 2
    rounds = [round_of(0, parents, [1, 3]), round_of(1, parents, [0, 2, 4])]
    # budget n keeps nodes 0 … n − 1: the first path survives 1 node from n = 2, 2 from n = 4; the second 1, 2, 3
    # nodes from n = 1, 3, 5
    assert theory.budget_taus(rounds, 5) == pytest.approx([1.5, 2.0, 2.5, 3.0, 3.5])
    t = theory.theory(RunRecord(header={"budget": {"tree": True, "max_nodes": 6}}, rounds=rounds))
    assert t.tree and t.own == 5 and t.x == [1, 2, 3, 4, 5, 6] and t.closed is None
    assert t.tau[-2:] == pytest.approx([3.5, 3.5]) and t.tau_measured == pytest.approx(3.5)  # no node 5 drafted
    assert [theory.judged(r) for r in rounds] == [2, 3]  # both paths end on a leaf: nothing refused to judge


@pytest.fixture(scope="module")
def ngram_run():
    """A long greedy n-gram chain on a tiny target whose greedy text falls into a loop: high acceptance."""
    target = tiny.target("llama", VOCAB, layers=2, scale=25)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=240), NgramDrafter(max_ngram=3), DraftBudget(k=4))
    return RunRecord(header=api.header_for(run), rounds=run.rounds, summary=api.summary_for(run))


def assert_per_position_tau_is_measured_tau(record: RunRecord) -> None:
    """At the run's own k, the per-position τ equals the measured τ, up to the one round a length limit cut short.

    Why near exact: α_i is measured on these same rounds as P(accepted length ≥ i | ≥ i − 1), so the product
    α_1 ⋯ α_i telescopes to P(accepted length ≥ i), and 1 + Σ_(i≤k) P(accepted length ≥ i) = 1 + mean accepted
    length. The measured τ is tokens committed ÷ rounds = 1 + mean accepted length, except that the run's last round
    may commit fewer tokens than it accepted (max new tokens or EOS): at most k fewer, so the stated tolerance is
    k ÷ rounds (plus float rounding). A wrong product (an index off by one, the closed form, conditional rates that
    skip rounds the drafter cut short) misses by more than that on these runs.
    """
    t = theory.theory(record)
    m = record.metrics()
    k = t.own
    assert not t.tree and k == 4
    tolerance = k / m.rounds + 1e-9
    predicted = t.tau_at(k)
    assert predicted == pytest.approx(1 + m.accepted / m.rounds, abs=1e-9)  # the telescoping identity
    assert 0 <= predicted - m.tau <= tolerance, (predicted, m.tau, tolerance)
    # the same numbers, counted another way: each round's accepted path cut to the first γ drafts
    assert theory.budget_taus(record.rounds, len(t.rates)) == pytest.approx(t.tau[: len(t.rates)], abs=1e-9)


def test_per_position_tau_matches_a_long_greedy_ngram_run(ngram_run):
    m = ngram_run.metrics()
    assert m.rounds >= 40 and m.acceptance_rate > 0.5, (m.rounds, m.acceptance_rate)  # long, and worth drafting
    assert_per_position_tau_is_measured_tau(ngram_run)
    t = theory.theory(ngram_run)
    tolerance = t.own / m.rounds
    assert abs(t.tau_at(t.own - 1) - m.tau) > tolerance  # the tolerance tells neighbouring lengths apart
    assert abs(t.closed[t.own - 1] - m.tau) > tolerance  # and the closed form from the rounds (not the point here)


def test_per_position_tau_matches_a_recorded_eagle3_run():
    """A real EAGLE-3 head on the real default target (a short run, so only the identity, not the spread, is tested)."""
    assert_per_position_tau_is_measured_tau(examples.load_trace(EAGLE_CHAIN))


def test_the_optimum_moves_shorter_when_verifying_costs_more():
    """One run's acceptance, two verify-cost curves: where a wider forward costs more, fewer drafts pay."""
    record = examples.load_trace(EAGLE_CHAIN)
    gentle = CostCurve.from_points({1: 40.0, 17: 44.0}, "measured (a GPU-like curve)")
    steep = CostCurve.from_points({1: 40.0, 2: 52.0, 17: 232.0}, "measured (a CPU-like curve)")
    flat, rising = (theory.theory(record, theory.Costs(curve, 40.0, "given", 1.0, 2.0, 0)) for curve in (gentle, steep))
    assert rising.best < flat.best, (rising.best, flat.best)
    for t in (flat, rising):  # the optimum is the argmax of τ(γ) ÷ the round's cost, as the docstring says
        scores = {g: t.tau_at(g) / t.costs.per_round(g) for g in t.x}
        assert t.best == max(scores, key=scores.get)
        assert t.speedup_at(t.best) == pytest.approx(scores[t.best])
        star = [d for d in theory.figure_spec(t)["data"] if d["name"].startswith("best")]
        assert star and star[0]["x"] == [t.best]


@pytest.mark.parametrize("name", [value for _, value in examples.trace_choices()])
def test_the_panel_builds_for_every_recorded_trace(name):
    record = examples.load_trace(name)
    t = theory.theory(record)
    spec = theory.figure_spec(t)
    go.Figure(spec)  # plotly validates every attribute
    words = theory.explanation(t)
    assert "τ" in words and "<script" not in words
    if t.costs is None:  # said, not invented: no speedup curve, and the figure and the words say why
        assert not speedup_traces(spec) and t.best is None
        assert "no verify-cost curve" in t.missing and t.missing in words
        assert any("no verify-cost curve" in a["text"] for a in spec["layout"]["annotations"])
    else:  # the hybrid's lookup timed one on the recording machine
        assert t.costs.curve.source.startswith("measured") and t.best in t.x
        assert any(d["name"].startswith("expected speedup") for d in speedup_traces(spec))
    assert any(d["name"].startswith("this run: measured τ") for d in spec["data"])


def test_no_rounds_and_no_curve_say_so():
    assert theory.theory(None) is None and theory.theory(RunRecord(header={})) is None
    assert "after the first round" in theory.explanation(None)
    assert not theory.figure_spec(None)["data"]
    record = examples.load_trace(EAGLE_CHAIN)
    record.summary = {**record.summary, "cost_curve": {"widths": [1, 2], "ms": [1.0, 2.0], "source": "flat"}}
    assert theory.theory(record).costs is None  # a curve nobody timed is not a measurement


def test_a_live_run_times_its_curve_and_a_replay_draws_the_same_panel():
    """The app's run (``runner.stream``) ends with the verify-cost curve in its summary; the trace keeps it."""
    import gradio as gr

    from specviz.ui.views import RunView

    runner.preload("tiny-theory", tiny.target("llama", VOCAB, layers=2, scale=25))
    request = runner.RunRequest(prompt=" ".join(f"w{i}" for i in PROMPT), chat=False, target="tiny-theory",
                                drafter="ngram", tree=False, k=3, max_new_tokens=40).validate()
    record = RunRecord(header={})
    for event in runner.stream(request):
        apply(record, event)
    curve = record.summary["cost_curve"]
    assert curve["source"].startswith("measured on") and curve["widths"][-1] == theory.widest(3, False, 0)
    live = theory.theory(record)
    assert live.costs is not None and live.own == 3 and live.speedup_measured  # measured beside the run
    assert any(d["name"].startswith("this run: measured ×") for d in speedup_traces(theory.figure_spec(live)))
    replayed = theory.theory(RunRecord.from_trace(trace.loads(record.to_trace())))
    assert replayed.speedup == pytest.approx(live.speedup) and replayed.best == live.best
    with gr.Blocks():
        view = RunView.build("theory-")
    updates = view.render(record)
    assert view.theory in updates and "verify-cost curve (measured on" in updates[view.theory_note]
