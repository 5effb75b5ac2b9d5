"""The drafter's confidence: calibration over a run (the metric) and the block / reliability panel (the view)."""

import dataclasses
import json

import pytest
from test_viz import make_round

from specviz.engine.metrics import FORMULAS, calibration, confidence_samples, head_confidence_samples
from specviz.viz.confidence import block_positions, confidence_spec


def rounded(samples):
    return [(round(c, 9), hit) for c, hit in samples]


def with_confidence(round_, confidence, **meta):
    return dataclasses.replace(round_, confidence=confidence, meta=meta)


def test_samples_are_the_judged_nodes_with_their_own_conditional_confidence():
    """Chain of 3, two accepted: nodes 0, 1 accepted, node 2 rejected; c = s_k / s_{k-1}."""
    chain = with_confidence(make_round([-1, 0, 1], [0, 1]), [0.8, 0.4, 0.1])
    assert rounded(confidence_samples(chain)) == [(0.8, True), (0.5, True), (0.25, False)]
    early = with_confidence(make_round([-1, 0, 1], []), [0.8, 0.4, 0.1])  # below a rejection: never judged
    assert confidence_samples(early) == [(0.8, False)]
    tree = with_confidence(make_round([-1, -1, 0], [0]), [0.6, 0.3, 0.3])
    assert rounded(confidence_samples(tree)) == [(0.6, True), (0.3, False), (0.5, False)]
    assert confidence_samples(make_round([-1], [0])) == []  # no confidence, no sample


def test_rejection_sampling_counts_only_the_siblings_it_tested():
    draws = [{"parent": -1, "node": 0, "accepted": True, "u": 0.1, "ratio": 1.0}]
    round_ = with_confidence(make_round([-1, -1], [0], rule="rejection-sampling", draws=draws), [0.7, 0.2])
    assert rounded(confidence_samples(round_)) == [(0.7, True)]  # node 1 was never tested


def test_calibration_bins_and_ece_by_hand():
    rounds = [with_confidence(make_round([-1], [0]), [0.95]), with_confidence(make_round([-1], []), [0.92]),
              with_confidence(make_round([-1], [0]), [0.15]), make_round([-1], [0])]
    result = calibration(rounds)
    assert result.samples == 3 and [(b.low, b.count) for b in result.bins] == [(0.1, 1), (0.9, 2)]
    assert result.bins[1].predicted == pytest.approx(0.935) and result.bins[1].realised == 0.5
    assert result.ece == pytest.approx((1 * abs(1 - 0.15) + 2 * abs(0.5 - 0.935)) / 3)
    assert calibration([]).samples == 0 and calibration([]).ece == 0.0
    assert "ECE" in FORMULAS["calibration"]


def dspark_round():
    """A DSpark-style round: 2 verified drafts (first accepted), 2 cut by the schedule, the head's ĉ recorded."""
    round_ = make_round([-1, 0], [0], q=[0.9, 0.5], texts=["<b>", "cat"])
    pruned = [{"token": 50, "depth": 3, "q": 0.3, "confidence": 0.2, "parent": 1, "pruned_parent": None,
               "text": "&amp"},
              {"token": 51, "depth": 4, "q": 0.2, "confidence": 0.05, "parent": None, "pruned_parent": 0}]
    schedule = {"length": 2, "values": [0.03, 0.035, 0.034], "cost_ms": [50.0, 55.0, 62.0], "curve": "measured"}
    return with_confidence(round_, [0.8, 0.5], pruned=pruned, schedule=schedule,
                           confidence_head=[0.8, 0.625, 0.4, 0.25])


def test_block_positions_run_through_the_cut_drafts():
    rows = block_positions(dspark_round())
    assert [r["depth"] for r in rows] == [1, 2, 3, 4]
    assert [r["outcome"] for r in rows] == ["accepted", "rejected", "cut", "cut"]
    assert [r["c"] for r in rows] == [0.8, 0.625, 0.4, 0.25]  # the head's own ĉ, not survival ratios
    assert [r["s"] for r in rows] == [0.8, 0.5, 0.2, 0.05] and rows[3]["text"] == "#51"
    plain = with_confidence(make_round([-1, 0], [0, 1], q=[0.5, 0.5]), [0.5, 0.2])
    assert [r["c"] for r in block_positions(plain)] == pytest.approx([0.5, 0.4])  # ratios without a head


def test_confidence_spec_draws_block_cut_cost_and_calibration():
    rounds = [dspark_round(), dataclasses.replace(dspark_round(), index=1)]
    spec = confidence_spec(rounds, 0)
    names = [trace.get("name") for trace in spec["data"]]
    assert "confidence ĉ_k" in names and "survival s_k" in names and "realised per bin" in names
    assert any("cost" in (name or "") for name in names) and any("Σ s" in (name or "") for name in names)
    assert spec["layout"]["shapes"][0]["x0"] == 2.5  # the cut after ℓ = 2
    texts = [a["text"] for a in spec["layout"]["annotations"]]
    assert "verify ℓ = 2" in texts and any(t.startswith("Run calibration: ECE") for t in texts)
    dumped = json.dumps(spec)
    assert "<b>" not in dumped.replace("<br>", "") and "&lt;b&gt;" in dumped  # token text escaped for plotly
    assert "&amp;lt;" not in dumped  # and only once


def test_each_position_names_its_token_under_the_axis():
    """The token text once sat inside each q bar, where plotly drops it when the bar is short (a small q, the
    common case): it is now the position's tick label, escaped, cut drafts included."""
    axis = confidence_spec([dspark_round()], 0)["layout"]["xaxis"]
    assert axis["tickvals"] == [1, 2, 3, 4]
    assert axis["ticktext"] == ["1<br>&lt;b&gt;", "2<br>cat", "3<br>&amp;amp", "4<br>#51"]
    assert "tickvals" not in confidence_spec([])["layout"]["xaxis"]


def test_a_block_capped_by_the_run_says_what_the_schedule_weighed():
    """DSpark drafts only as far as the run's chain length (or tree depth): with k = 2 against a block of 7, the
    schedule could only weigh 2 drafts, and the panel says how to let it weigh the block."""
    def note(cap):
        round_ = dspark_round()
        round_.meta["block"] = {"size": 8, "drafts": 7, "tokens": [10, 11, 12, 13], "q": [0.9, 0.5, 0.3, 0.2]}
        if cap is not None:
            round_.meta["schedule"]["cap"] = cap
        return " ".join(a["text"] for a in confidence_spec([round_], 0)["layout"]["annotations"])

    assert "capped ℓ at 2 of the block's 7 drafts" in note(2) and "a chain of k = 7" in note(2)
    assert "capped" not in note(7)  # the whole block: the scan drafting 4 and stopping is the schedule's own choice
    assert "capped" not in note(None)  # a trace from before the cap was recorded


def test_a_block_capped_by_the_tokens_left_does_not_ask_for_a_longer_chain():
    """Near the end of a run the tokens left to generate cap the schedule under any budget: a run already at k = 7
    once read "capped ℓ at 1 …; a chain of k = 7 lets the schedule weigh them all"."""
    round_ = dspark_round()
    round_.meta["block"] = {"size": 8, "drafts": 7, "tokens": [10, 11, 12, 13], "q": [0.9, 0.5, 0.3, 0.2]}
    round_.meta["schedule"]["cap"] = 2

    def note(budget):
        return " ".join(a["text"] for a in confidence_spec([round_], 0, budget=budget)["layout"]["annotations"])

    assert "only 2 tokens left to generate" in note({"tree": False, "k": 7}) and "k = 7" not in note({"k": 7})
    assert "a chain of k = 7" in note({"tree": False, "k": 2})  # the budget itself capped it
    assert "a chain of k = 7" in note({"tree": True, "depth": 2, "max_nodes": 4, "width": 3})
    assert "tokens left" in note({"tree": True, "depth": 4, "max_nodes": 16, "width": 3})


def test_confidence_spec_without_confidence_or_on_trees_says_so():
    texts = lambda spec: [a["text"] for a in spec["layout"]["annotations"]]  # noqa: E731
    assert "this drafter sets no confidence" in texts(confidence_spec([make_round([-1], [0])]))
    assert "no round yet" in texts(confidence_spec([]))
    tree = with_confidence(make_round([-1, -1], [0]), [0.6, 0.3])
    assert any(t.startswith("a tree round") for t in texts(confidence_spec([tree])))
    assert "ECE" in " ".join(texts(confidence_spec([tree])))  # the tree still feeds the calibration


def test_other_drafters_pruned_nodes_are_not_a_cut_tail():
    """A dynamic tree that came out as a chain reports pruned siblings, not drafts cut after the chain."""
    pruned = [{"token": 60, "depth": 1, "q": 0.1, "confidence": 0.1, "parent": None, "pruned_parent": None}]
    round_ = with_confidence(make_round([-1, 0], [0], q=[0.9, 0.5]), [0.9, 0.45], pruned=pruned)
    assert [r["outcome"] for r in block_positions(round_)] == ["accepted", "rejected"]


def test_a_hand_edited_trace_draws_less_and_never_fails():
    """Odd values in an uploaded trace: the panel and the calibration skip what they cannot read."""
    odd = [
        with_confidence(make_round([-1, 0], [0]), [0.5, None]),
        with_confidence(make_round([-1, 0], [0]), ["high", 0.2]),
        dataclasses.replace(make_round([-1, 0], [0], q=[0.9]), confidence=[0.5, 0.2],
                            meta={"schedule": {"length": "two", "values": ["x"]}, "confidence_head": [None, "y"],
                                  "pruned": [{"depth": "x"}, {"depth": None}, 7, {"depth": 3, "q": "?"}]}),
        dataclasses.replace(make_round([-1, 0], [0]), confidence=[0.5, 0.2], meta=["not", "a", "dict"]),
        with_confidence(make_round([-1, 0], [0]), [float("nan"), 0.2]),
    ]
    assert calibration(odd[:2]).samples == 0 and calibration(odd[-1:]).samples == 0
    for index in range(len(odd)):
        json.dumps(confidence_spec(odd, index))
    rows = block_positions(odd[2])
    assert [r["outcome"] for r in rows] == ["accepted", "rejected", "cut"] and rows[1]["q"] is None
    assert rows[2]["q"] is None and rows[0]["c"] == 0.5  # unreadable head values fall back to survival ratios


def recalibrated_round():
    """A DSpark round whose schedule multiplied recalibrated ĉ (``meta["calibrated"]``), the head's own beside them."""
    round_ = dspark_round()
    return dataclasses.replace(round_, confidence=[0.5, 0.25],
                               meta={**round_.meta, "calibrated": [0.5, 0.5, 0.4, 0.25]})


def test_recalibrated_confidence_is_what_the_block_shows_with_the_heads_own_beside_it():
    rows = block_positions(recalibrated_round())
    assert [r["c"] for r in rows] == [0.5, 0.5, 0.4, 0.25]  # what the survival multiplied
    assert [r["head"] for r in rows] == [0.8, 0.625, 0.4, 0.25]
    assert all(r["head"] is None for r in block_positions(dspark_round()))  # not recalibrated: one ĉ


def test_head_samples_are_the_judged_chain_drafts_raw_values():
    assert head_confidence_samples(recalibrated_round()) == [(0.8, True), (0.625, False)]  # cut drafts never judged
    rejected = dataclasses.replace(recalibrated_round(), accepted=[])
    assert head_confidence_samples(rejected) == [(0.8, False)]
    assert head_confidence_samples(make_round([-1, -1], [0])) == []  # no head values (and a tree)


def test_reliability_diagram_draws_both_calibrations_with_their_ece():
    rounds = [recalibrated_round(), dataclasses.replace(recalibrated_round(), index=1, accepted=[])]
    spec = confidence_spec(rounds)
    names = [trace.get("name") for trace in spec["data"]]
    assert "realised per bin (recalibrated ĉ)" in names and "realised per bin (the head's own ĉ)" in names
    assert "confidence ĉ_k (recalibrated on this run)" in names and "confidence head's own ĉ_k" in names
    own = calibration(rounds, head=True)
    used = calibration(rounds)
    assert own.samples == 3 and used.samples == 3 and own.ece != used.ece
    title = next(a["text"] for a in spec["layout"]["annotations"] if a["text"].startswith("Run calibration"))
    assert f"ECE {used.ece:.3f} recalibrated,<br>{own.ece:.3f} the head's own" in title


def test_the_shipped_greedy_curve_is_drawn_where_the_run_started_from_it():
    curve = {"rule": "greedy", "samples": 40, "points": [[0.1, 0.05], [0.5, 0.3], [0.9, 0.7]]}
    spec = confidence_spec([recalibrated_round()], 0, curve)
    drawn = [t for t in spec["data"] if "shipped greedy curve" in (t.get("name") or "")]
    assert len(drawn) == 1 and drawn[0]["x"] == [0.1, 0.5, 0.9] and drawn[0]["y"] == [0.05, 0.3, 0.7]
    assert drawn[0]["xaxis"] == "x3"  # on the reliability diagram
    for odd in (None, "curve", {"points": "xy"}, {"points": [[0.5], ["a", 0.2], [2.0, 0.5], None]}):
        names = [t.get("name") or "" for t in confidence_spec([recalibrated_round()], 0, odd)["data"]]
        assert not any("shipped greedy curve" in name for name in names)


@pytest.mark.parametrize("schedule", [None, {"length": 1, "capped": True}])
def test_panel_titles_clear_the_plot_label(schedule):
    """gr.Plot lays its label over the figure's top-left corner; the block title above the plot area (at 1.07 of
    its height) must start below that strip, or its first line is half hidden."""
    round_ = with_confidence(make_round([-1, 0], [0], q=[0.9, 0.5]), [0.8, 0.4], schedule=schedule or {})
    layout = confidence_spec([round_])["layout"]
    block = next(a for a in layout["annotations"] if a["y"] == 1.07 and a["x"] == 0)
    plot_height = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
    lines = 1 + block["text"].count("<br>")
    title_top = layout["margin"]["t"] - 0.07 * plot_height - 16 * lines
    assert title_top >= 24  # the label strip
