"""Views: outcomes, tree figure, token HTML, panels, diagnostics and the rejection debugger, on hand-built rounds."""

from __future__ import annotations

import json
import random
from html import unescape

import pytest

from specviz.engine import trace
from specviz.engine.metrics import FORMULAS, acceptance_by_label
from specviz.engine.round import Round, TokenChoice
from specviz.viz import charts, debugger, diagnostics, panels, verdict
from specviz.viz.outcome import OUTCOME_COLORS, OUTCOME_LABELS, Outcome, committed_outcomes, node_outcomes
from specviz.viz.record import RunRecord
from specviz.viz.text import html_token, label, visible
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import EXTRA, MAX_PRUNED_SHOWN, ROOT, tree_figure, tree_layout, tree_spec

XSS = "<img src=x onerror=alert(1)>"


def make_round(parents, accepted, *, index=0, start=0, texts=None, extra_kind="correction", extra_text="X",
               q=None, rule="greedy", draws=None, residual=None, p=None) -> Round:
    n = len(parents)
    texts = texts or [f"t{i}" for i in range(n)]
    tokens = list(range(10, 10 + n))
    committed = [tokens[i] for i in accepted] + [99]
    rows = n + 1
    top = [[TokenChoice(id=99, p=0.6, text=extra_text), TokenChoice(id=10, p=0.3, text=texts[0] if n else "?")]
           for _ in range(rows)]
    return Round(
        index=index, start=start, tokens=tokens, parents=list(parents), text=texts, q_draft=q, confidence=None,
        sampled=rule == "rejection-sampling", p_target=p or [0.3] * n, target_top=top,
        draft_top=[[TokenChoice(id=10, p=0.8, text="t0")] for _ in range(rows)] if q else None,
        target_entropy=[1.5] * rows, accepted=list(accepted), extra_token=99, extra_text=extra_text,
        extra_kind=extra_kind, committed=committed, committed_text=[texts[i] for i in accepted] + [extra_text],
        draws=draws if draws is not None else [{"parent": -1, "node": None, "accepted": False, "target_token": 99}],
        residual_top=residual, rule=rule, lossless=True, draft_ms=1.0, verify_ms=10.0, other_ms=0.5,
    )


def random_tree(n: int, seed: int = 0) -> Round:
    rnd = random.Random(seed)
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, n)]
    accepted, node = [], -1
    while len(accepted) < 3:
        kids = [i for i, parent in enumerate(parents) if parent == node]
        if not kids:
            break
        node = kids[0]
        accepted.append(node)
    return make_round(parents, accepted, extra_kind="correction")


# ---- outcomes -----------------------------------------------------------------------------------------------
def test_chain_outcomes():
    r = make_round([-1, 0, 1, 2], [0, 1])
    assert node_outcomes(r) == [Outcome.ACCEPTED, Outcome.ACCEPTED, Outcome.REJECTED, Outcome.UNREACHED]
    assert committed_outcomes(r) == [Outcome.ACCEPTED, Outcome.ACCEPTED, Outcome.CORRECTION]


def test_tree_outcomes_examined_vs_never_reached():
    # root → 0 (accepted) → {2 (rejected), 3 (rejected)}; root → 1 (rejected) → 4 (never reached)
    r = make_round([-1, -1, 0, 0, 1], [0])
    assert node_outcomes(r) == [Outcome.ACCEPTED, Outcome.REJECTED, Outcome.REJECTED, Outcome.REJECTED,
                                Outcome.UNREACHED]


def test_rejection_sampling_untested_sibling_is_never_reached():
    draws = [{"parent": -1, "node": 0, "accepted": True, "u": 0.1, "ratio": 0.9}]
    r = make_round([-1, -1], [0], rule="rejection-sampling", q=[0.5, 0.4], draws=draws, extra_kind="bonus")
    assert node_outcomes(r) == [Outcome.ACCEPTED, Outcome.UNREACHED]


def test_the_showcase_round_has_a_draft_the_rule_turned_down():
    """A sampled tree whose walk took the first child at every level has no rejected node (its other nodes were never
    tested), so the debugger would open on its bonus token: the showcase prefers a round with a real rejection."""
    whole_path = [{"parent": -1, "node": 0, "accepted": True, "u": 0.1, "ratio": 0.9},
                  {"parent": 0, "node": 2, "accepted": True, "u": 0.2, "ratio": 0.8}]
    untested = make_round([-1, -1, 0, 0], [0, 2], index=0, rule="rejection-sampling", q=[0.5, 0.4, 0.5, 0.3],
                          draws=whole_path, extra_kind="bonus")
    turned_down = [{"parent": -1, "node": 0, "accepted": True, "u": 0.1, "ratio": 0.9},
                   {"parent": 0, "node": 2, "accepted": False, "u": 0.9, "ratio": 0.2}]
    rejected = make_round([-1, -1, 0, 0], [0], index=1, start=3, rule="rejection-sampling", q=[0.5, 0.4, 0.5, 0.3],
                          draws=turned_down)
    assert Outcome.REJECTED not in node_outcomes(untested)
    assert record_of([untested, rejected]).showcase_index() == 1
    assert debugger.default_node(rejected) == "2"


# ---- tree figure ---------------------------------------------------------------------------------------------
def _trace_named(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_tree_figure_colours_each_outcome():
    r = make_round([-1, -1, 0, 0, 1], [0], extra_kind="correction")
    fig = tree_figure(r)
    expected = {Outcome.ACCEPTED: 1, Outcome.REJECTED: 3, Outcome.UNREACHED: 1, Outcome.CORRECTION: 1,
                Outcome.BONUS: 0}
    for outcome, count in expected.items():
        trace_ = _trace_named(fig, OUTCOME_LABELS[outcome])
        assert len(trace_.x) == count, outcome
        assert trace_.marker.color == OUTCOME_COLORS[outcome]
    path = _trace_named(fig, "accepted path")
    assert len([x for x in path.x if x is not None]) == 4  # root→0, 0→extra


def test_tree_figure_bonus_and_chain_layout():
    r = make_round([-1, 0, 1], [0, 1, 2], extra_kind="bonus")
    fig = tree_figure(r)
    assert len(_trace_named(fig, OUTCOME_LABELS[Outcome.BONUS]).x) == 1
    _, pos = tree_layout(r)
    assert [pos[n][0] for n in (ROOT, 0, 1, 2, EXTRA)] == [0, 1, 2, 3, 4]
    assert len({pos[n][1] for n in (ROOT, 0, 1, 2, EXTRA)}) == 1  # a chain is a straight line


def test_selection_ring_is_drawn_under_the_node_labels():
    """The debugger rings the selected node; drawn over the nodes, its outline crossed out the node's own label."""
    r = make_round([-1, -1, 0], [0], texts=[")", "t1", "t2"])
    spec = tree_spec(r, selected=1)
    names = [t.get("name") for t in spec["data"]]
    ring = names.index("selected")
    labelled = [i for i, t in enumerate(spec["data"]) if "text" in t.get("mode", "")]
    assert labelled and ring < min(labelled)


def test_tree_figure_escapes_token_text():
    r = make_round([-1, 0], [0], texts=["<script>alert(1)</script>", XSS], extra_text="<b>")
    data = json.dumps(tree_figure(r, root_text="</div>").to_plotly_json()["data"])
    for raw in ("<script>", "<img", "</div>", "<b>\""):
        assert raw not in data
    assert "&lt;script&gt;" in data and "&lt;img" in data
    # plotly decodes &lt; &gt; &amp; but would show &quot; literally
    quoted = make_round([-1], [0], texts=['"q"'], extra_text="it's")
    data = json.dumps(tree_figure(quoted).to_plotly_json()["data"])
    assert "&quot;" not in data and "&#x27;" not in data


def test_tree_figure_64_nodes():
    fig = tree_figure(random_tree(64, 2))
    points = sum(len(t.x) for t in fig.data if t.name in OUTCOME_LABELS.values())
    assert points == 65  # 64 nodes + the extra token (draw time is measured by tools/ui_perf.py, not asserted)


def test_a_crowded_tree_keeps_labels_only_where_the_target_judged():
    """At the node budget's upper end the leaf rows are a few pixels apart: never-reached labels would print over
    each other, so they move to the hover text; accepted, rejected and the extra token keep theirs."""
    def modes(round_):
        spec = tree_spec(round_)
        return {t["name"]: t["mode"] for t in spec["data"] if t.get("name") in OUTCOME_LABELS.values()}

    fan = make_round([-1] * 8 + [i % 8 for i in range(120)], [0])  # 8 first drafts, 120 grandchildren
    crowded = modes(fan)
    assert crowded[OUTCOME_LABELS[Outcome.UNREACHED]] == "markers"
    for outcome in (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.CORRECTION):
        assert crowded[OUTCOME_LABELS[outcome]] == "markers+text", outcome
    assert modes(make_round([-1, 0, 0, 1], [0]))[OUTCOME_LABELS[Outcome.UNREACHED]] == "markers+text"


def test_tree_figure_draws_pruned_nodes_faded_and_capped():
    r = make_round([-1, 0], [0])
    # kept 0 gets a pruned child (a), which has its own pruned child (b); root gets a pruned sibling (c)
    def node(token, depth, confidence, parent, pruned_parent=None, **extra):
        return {"token": token, "depth": depth, "q": 0.2, "score": -1.0, "confidence": confidence, "parent": parent,
                "pruned_parent": pruned_parent, **extra}

    pruned = [node(7, 2, 0.1, 0, text=XSS), node(8, 3, 0.05, None, 0), node(9, 1, 0.08, -1)]
    r.meta = {"pruned": pruned}
    fig = tree_figure(r)
    faded = _trace_named(fig, "pruned (not verified)")
    assert len(faded.x) == 3 and sorted(faded.x) == [1.0, 2.0, 3.0]  # depths: c at 1, a at 2, b at 3
    assert "<img" not in json.dumps(fig.to_plotly_json()["data"]) and "#8" in list(faded.text)
    assert sum(len(t.x) for t in fig.data if t.name in OUTCOME_LABELS.values()) == 3  # kept nodes unchanged
    many = [{"token": i, "depth": 1, "q": 0.01, "score": -5.0 - i, "confidence": 0.5 / (i + 1), "parent": -1,
             "pruned_parent": None} for i in range(100)]
    r.meta = {"pruned": many + [{"token": 1, "depth": 2, "q": 0.5, "score": -200.0, "confidence": 1e-9,
                                 "parent": None, "pruned_parent": 99}]}
    faded = _trace_named(tree_figure(r), "pruned (not verified)")
    assert len(faded.x) == MAX_PRUNED_SHOWN and set(faded.text) == {f"#{i}" for i in range(MAX_PRUNED_SHOWN)}


def test_empty_figure():
    assert tree_figure(None).layout.annotations[0].text == "no round yet"


# ---- tokens ------------------------------------------------------------------------------------------------
def test_token_html_escapes_and_shows_whitespace():
    r = make_round([-1, 0], [0], texts=["<script>", " a\nb"], extra_text=" ")
    html = tokens_html([XSS, "\n"], [r])
    assert "<script>" not in html and "<img" not in html
    spaced = html.replace('<span class="sv-mark">␣</span><span class="sv-sp"> </span><wbr>', " ")
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in spaced
    assert "sv-accepted" in html and "sv-correction" in html and "sv-prompt" in html
    assert '<span class="sv-mark">↵</span>\n' in html and '<span class="sv-mark">␣</span>' in html


def test_a_token_with_part_of_a_character_says_so():
    """Byte-level tokens that hold part of an emoji show ∅, and their hover says why (the next token shows it all)."""
    from specviz.viz.tokens import PART_OF_A_CHARACTER

    r = make_round([-1, 0], [0, 1], texts=["", "🚀"], extra_text=" ok")
    html = tokens_html([], [r])
    assert "∅" in html and "🚀" in html and html.count(PART_OF_A_CHARACTER) == 1


def test_html_token_and_labels():
    # the space stays a space (the text reads as text); its glyph shows only when the page turns markers on
    assert html_token("a b") == 'a<span class="sv-mark">␣</span><span class="sv-sp"> </span><wbr>b'
    assert html_token("${x}") == "&#36;{x}"
    assert visible("\t\n ") == "→↵␣"
    assert label("<" * 20).startswith("&lt;") and label("<" * 20).endswith("…")


def test_long_prompt_is_elided():
    html = tokens_html([f"p{i}" for i in range(1000)], [])
    assert "prompt tokens …" in html and "p999" in html and "p500<" not in html


# ---- panels / record / diagnostics ------------------------------------------------------------------------------
def record_of(rounds, **kwargs) -> RunRecord:
    header = {"type": "header", "target": {"name": "t"}, "drafter": {"name": "ngram"},
              "config": {"temperature": 0.0, "seed": 0}, "budget": {"tree": False, "k": 4},
              "prompt": {"pieces": ["hi"]}}
    return RunRecord(header=header, rounds=rounds, **kwargs)


def test_round_summary_explains_its_accept_rule_on_hover():
    """At temperature > 0 a round is judged by target sampling or rejection sampling; the round summary names the
    rule, and its tooltip says what acceptance means under it."""
    from specviz.viz.text import escape

    for rule in ("greedy", "target-sampling", "rejection-sampling"):
        html = panels.round_info_html(make_round([-1], [0], rule=rule), 1)
        assert f'title="{escape(debugger.RULE_TEXT[rule])}">{rule}</code>' in html


def test_metrics_panel_shows_values_with_formulas():
    rec = record_of([make_round([-1, 0], [0], index=0), make_round([-1, 0], [0, 1], index=1, start=2,
                                                                     extra_kind="bonus")])
    html = panels.metrics_html(rec)
    assert "2.50" in html  # τ = 5 tokens / 2 rounds
    assert "75%" in html  # 3 of 4 drafted accepted
    from specviz.viz.text import escape

    assert escape(FORMULAS["tau"]) in html
    markdown = panels.formulas_markdown()
    assert all(text in markdown for text in FORMULAS.values())


def test_speedup_compares_like_with_like():
    # one round of 11.5 ms committing 2 tokens, after a 100 ms prefill
    rec = record_of([make_round([-1], [0])], prefill_ms=100.0,
                    calibration={"tokens_per_s": 50.0, "decode_tokens_per_s": 100.0, "new_tokens": 32})
    value, source, decode_only = rec.baseline()
    assert (value, decode_only) == (100.0, True) and source.startswith("calibration")
    assert rec.speedup() == pytest.approx((2 / 0.0115) / 100.0)  # decode phase on both sides
    assert "(decode)" in panels.speedup_html(rec)
    rec.plain = {"tokens_per_s": 10.0, "token_ids": rec.token_ids}
    rec.summary = {"elapsed_s": 0.1115}
    assert rec.baseline() == (10.0, "plain decoding of this prompt (full run)", False)
    assert rec.speedup() == pytest.approx((2 / 0.1115) / 10.0)  # whole generation on both sides
    assert "lossless" in panels.speedup_html(rec)


def test_a_baseline_measured_beside_the_run_comes_first_with_its_spread_and_its_limit():
    """Plain rounds timed between the run's rounds beat a full plain run and a cached calibration taken at another
    moment; the speedup carries their quartile spread, and one above what tau allows is flagged, not stated."""
    rec = record_of([make_round([-1], [0])], prefill_ms=100.0,  # 2 tokens in 11.5 ms: 173.9 tokens/s decode phase
                    calibration={"tokens_per_s": 50.0, "decode_tokens_per_s": 100.0, "new_tokens": 32})
    rec.plain = {"tokens_per_s": 10.0, "token_ids": rec.token_ids}
    rec.beside = {"method": "interleaved", "tokens_per_s": 100.0, "low": 80.0, "high": 125.0, "samples": 7,
                  "runs_sharing": 2}
    value, source, decode_only = rec.baseline()
    assert (value, decode_only) == (100.0, True)
    assert "7 plain tokens" in source and "2 runs shared the machine" in source
    rate = 2 / 0.0115
    # a trace without the plain tokens' times (older traces): the speedup at their quartiles
    assert rec.speedup_range() == (pytest.approx(rate / 125.0), pytest.approx(rate / 80.0))
    assert rec.speedup_text() == f"×{rate / 100:.2f} (×{rate / 125:.2f}–×{rate / 80:.2f})"  # τ 2: within reach
    assert not rec.speedup_beyond_limit()
    rec.beside = {**rec.beside, "tokens_per_s": 50.0, "low": 40.0, "high": 60.0}  # ×3.5 at τ 2: impossible
    assert rec.speedup_beyond_limit() and "beyond what τ allows" in rec.speedup_text()
    assert "beyond what τ allows" in panels.speedup_html(rec)
    assert any("beyond what τ allows" in d.title for d in diagnostics.diagnose(rec))
    rec.header.update(type="header", schema=trace.SCHEMA, version=trace.VERSION)
    back = RunRecord.from_trace(trace.loads(rec.to_trace()))
    assert back.beside == rec.beside and back.speedup() == pytest.approx(rec.speedup())


def test_a_live_speedups_interval_resamples_its_rounds_and_plain_tokens():
    """With the plain tokens' times kept, the stated range is ``baseline.speedup_interval`` over the run's rounds
    and those times: around the speedup, and the same after a trace round trip."""
    from specviz.engine.baseline import estimate, speedup_interval

    kept = [3, 0, 1, 2, 0, 3]
    starts = [sum(kept[:i]) + i for i in range(len(kept))]  # each round commits its kept tokens and one more
    rounds = [make_round([-1, 0, 1], [0, 1, 2][:n], index=i, start=starts[i]) for i, n in enumerate(kept)]
    rec = record_of(rounds)
    rec.beside = {**estimate([6.0, 6.6, 7.5, 6.3, 9.0, 6.0]).to_dict(), "runs_sharing": 1}
    expected = speedup_interval([len(r.committed) for r in rounds], [r.total_ms for r in rounds],
                                rec.beside["samples_ms"])
    low, high = rec.speedup_range()
    assert (low, high) == expected and low < rec.speedup() < high
    assert rec.speedup_text() == f"×{rec.speedup():.2f} (×{low:.2f}–×{high:.2f})"
    rec.header.update(type="header", schema=trace.SCHEMA, version=trace.VERSION)
    back = RunRecord.from_trace(trace.loads(rec.to_trace()))
    assert back.speedup_range() == (low, high)


def test_record_trace_round_trip():
    rec = record_of([make_round([-1, 0], [0], index=0), make_round([-1], [], index=1, start=2)], prefill_ms=5.0)
    rec.header.update(type="header", schema=trace.SCHEMA, version=trace.VERSION)
    back = RunRecord.from_trace(trace.loads(rec.to_trace()), name="x.jsonl")
    assert back.token_ids == rec.token_ids
    assert back.metrics().tau == pytest.approx(rec.metrics().tau)
    assert back.elapsed_s == pytest.approx(rec.elapsed_s)


def test_malformed_trace_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header", "schema": "specviz.trace", "version": 1}\n{"type": "round", "index": 0}\n')
    with pytest.raises(trace.TraceError, match="missing field") as info:
        trace.read(bad)
    assert "\n" not in str(info.value)
    (tmp_path / "junk.jsonl").write_text("not json")
    with pytest.raises(trace.TraceError, match="not JSON"):
        trace.read(tmp_path / "junk.jsonl")


def test_diagnostics_flag_silent_failures():
    rejected = [make_round([-1, 0], [], index=i, start=i) for i in range(8)]
    titles = [d.title for d in diagnostics.diagnose(record_of(rejected))]
    assert "Every round rejected at position 1" in titles
    mismatch = [make_round([-1], [], index=i, start=i, q=[0.9], p=[0.001]) for i in range(8)]
    assert any("tokenizer" in d.title for d in diagnostics.diagnose(record_of(mismatch)))
    slow = record_of([make_round([-1, 0], [0], index=i, start=2 * i) for i in range(8)],
                     calibration={"tokens_per_s": 10_000.0})
    titles = [d.title for d in diagnostics.diagnose(slow)]
    assert any(t.startswith("Slower than plain decoding") for t in titles)
    healthy = record_of([make_round([-1, 0], [0, 1], index=i, start=3 * i, extra_kind="bonus") for i in range(8)])
    assert diagnostics.diagnose(healthy) == []


def test_charts_build():
    rec = record_of([make_round([-1, 0], [0], index=0), make_round([-1, 0], [0, 1], index=1, start=2)])
    fig = charts.run_charts(rec.metrics(), rec.rounds, plain_tokens_per_s=5.0, elapsed_s=rec.elapsed)
    names = {t.name for t in fig.data}
    assert {"draft ms", "verify ms", "overhead ms", "plain decoding tokens/s", "speculative tokens/s"} <= names


# ---- Chain vs Tree: stats and verdict ------------------------------------------------------------------------------
CHAIN = [-1, 0]  # two draft nodes in a line: 3 target tokens verified per round
TREE = [-1, -1, 0]  # root children 0 and 1, node 2 under 0: 4 verified per round


def side(parents, accepted, *, draft_ms=1.0, verify_ms=10.0, beside=None) -> RunRecord:
    """A run of one round per ``accepted`` path, each round timed draft + verify + 0.5 ms."""
    rounds, start = [], 0
    for i, path in enumerate(accepted):
        r = make_round(parents, path, index=i, start=start)
        r.draft_ms, r.verify_ms = draft_ms, verify_ms
        rounds.append(r)
        start += len(r.committed)
    return record_of(rounds, beside=beside)


def beside(median: float, low: float, high: float) -> dict:
    return {"method": "interleaved", "tokens_per_s": median, "low": low, "high": high, "samples": 9}


def speed_better(html: str, row: str) -> str:
    """The "better" cell of a verdict row."""
    cells = unescape(html).split(f"<td>{row}</td>")[1].split("</tr>")[0]
    return cells.split("<b>")[1].split("</b>")[0]


NARROW = beside(100.0, 97.0, 103.0)  # ±3 % each: ±6 % for the pair


def test_verdict_names_the_chain_when_it_is_faster_beyond_the_noise():
    """The issue's case: same τ, the chain verifies less, wastes less and is faster by more than the plain timings'
    spread. The old verdict said "No clear winner" while its own table favoured the chain on three rows."""
    chain = side(CHAIN, [[0], [0, 1], [], [0]], beside=NARROW)  # 8 tokens in 4 rounds of 11.5 ms: 173.9 tokens/s
    tree = side(TREE, [[0], [0, 2], [], [0]], draft_ms=2.0, verify_ms=11.0, beside=NARROW)  # 13.5 ms: 148.1
    call = verdict.speed_call(chain, tree)
    assert (call.winner, call.measured) == ("chain", True)
    assert call.noise == pytest.approx(100 / 97 - 100 / 103)
    assert call.gap == pytest.approx((8 / 46) / (8 / 54) - 1)
    html = verdict.verdict_html(chain, tree)
    text = unescape(html)
    assert ("The chain is 17% faster: chain ×1.74 vs tree ×1.48 plain decoding, more than the measured noise (±6%"
            in text)
    assert "No clear winner" not in text
    assert ("The tree verified 1.00 more target tokens per round (4.00 vs 3.00) for no gain in τ (2.00 both)."
            in text)
    assert "Wasted verification: tree 50% vs chain 33%." in text
    assert "A tree round took 2.0 ms longer (13.5 vs 11.5 ms: drafting +1.0 ms, verifying +1.0 ms)" in text
    assert speed_better(html, "speedup vs plain") == "chain"
    assert speed_better(html, "τ tokens / round") == "same"
    assert speed_better(html, "target tokens verified / round") == "chain"
    assert speed_better(html, "wasted verification") == "chain"


def test_verdict_names_the_tree_and_the_tau_it_bought_per_extra_verified_node():
    chain = side(CHAIN, [[0], [0, 1], [], [0]], beside=NARROW)  # τ 2.00, 173.9 tokens/s
    tree = side(TREE, [[0, 2], [0, 2], [1], [0]], verify_ms=11.0, beside=NARROW)  # τ 2.50 in 12.5 ms: 200 tokens/s
    assert verdict.speed_call(chain, tree).winner == "tree"
    html = verdict.verdict_html(chain, tree)
    text = unescape(html)
    assert "The tree is 15% faster: tree ×2.00 vs chain ×1.74 plain decoding, more than the measured noise (±6%" in text
    assert ("The tree verified 1.00 more target tokens per round (4.00 vs 3.00) and gained 0.50 τ (2.50 vs 2.00): "
            "0.50 τ per extra verified node." in text)
    assert "Wasted verification: tree 38% vs chain 33%." in text
    assert "A tree round took 1.0 ms longer (12.5 vs 11.5 ms: verifying +1.0 ms)" in text
    assert "drafting" not in text.split("A tree round")[1]  # no difference, no sentence about it
    assert speed_better(html, "speedup vs plain") == "tree" and speed_better(html, "τ tokens / round") == "tree"


def test_verdict_is_a_tie_within_the_measured_noise():
    """No winner where the gap is within the plain timings' spread, and none where raw tokens/s differ only because
    the machine was faster while one side ran (each side divided by plain decoding timed beside it)."""
    wide = beside(100.0, 80.0, 125.0)  # ±22.5 % each
    chain = side(CHAIN, [[0], [0, 1], [], [0]], beside=wide)
    tree = side(TREE, [[0], [0, 2], [], [0]], draft_ms=2.0, verify_ms=11.0, beside=wide)
    call = verdict.speed_call(chain, tree)
    assert call.winner == "" and call.noise == pytest.approx(0.45)
    html = verdict.verdict_html(chain, tree)
    text = unescape(html)
    assert ("No clear winner on tokens/s: chain ×1.74 vs tree ×1.48 plain decoding differ by 17%, within the measured "
            "noise (±45%" in text)
    assert "is 17% faster" not in text and speed_better(html, "speedup vs plain") == "within noise"
    assert "for no gain in τ" in text  # the metrics still say what they show
    # the tree's raw 200 tokens/s beat the chain's 173.9 by 15 %, but plain decoding was 10 % faster beside it
    chain = side(CHAIN, [[0], [0, 1], [], [0]], beside=NARROW)
    tree = side(TREE, [[0, 2], [0, 2], [1], [0]], verify_ms=11.0, beside=beside(110.0, 107.0, 113.0))
    call = verdict.speed_call(chain, tree)
    assert call.winner == "" and call.tree == pytest.approx(200 / 110)
    assert ("No clear winner on tokens/s: chain ×1.74 vs tree ×1.82 plain decoding differ by 5%, within the measured "
            "noise (±6%" in unescape(verdict.verdict_html(chain, tree)))


def test_verdict_without_plain_timings_beside_the_runs_says_its_noise_is_assumed():
    """Older traces: the decode tokens/s are compared against a stated fixed noise."""
    chain = side(CHAIN, [[0], [0, 1], [], [0]])
    tree = side(TREE, [[0], [0, 2], [], [0]], draft_ms=2.0, verify_ms=11.0)
    html = verdict.verdict_html(chain, tree)
    text = unescape(html)
    assert ("The chain is 17% faster: chain 173.9 vs tree 148.1 decode tokens/s, more than a fixed ±5% (no plain "
            "decoding was timed beside both runs" in text)
    assert speed_better(html, "decode tokens/s") == "chain" and speed_better(html, "speedup vs plain") == ""
    same = side(TREE, [[0], [0, 2], [], [0]])  # the chain's 11.5 ms rounds and τ
    assert verdict.speed_call(chain, same).winner == ""
    assert "No clear winner on tokens/s" in unescape(verdict.verdict_html(chain, same))


def test_compare_and_verdict_tooltips_match_their_rows():
    """The "verify ms / round" row explained the overhead formula."""
    from specviz.viz.text import escape

    rec = side(TREE, [[0], [0, 2]], beside=NARROW)
    for html in (panels.compare_stats_html(rec), verdict.verdict_html(rec, rec)):
        for row, key in (("verify ms / round", "verify_ms"), ("draft ms / round", "draft_ms"), ("τ tokens / round",
                                                                                                   "tau")):
            assert f'<tr title="{escape(FORMULAS[key])}"><td>{escape(row)}</td>' in html, (row, html)
        assert escape(FORMULAS["overhead_ms"]) not in html
    assert "target forward" in FORMULAS["verify_ms"]


# ---- debugger -----------------------------------------------------------------------------------------------
def test_debugger_explains_greedy_rejection():
    r = make_round([-1, 0], [], texts=["<a>", "b"])
    choices = debugger.node_choices(r)
    assert [v for _, v in choices] == ["0", "1", "extra"]
    assert debugger.default_node(r) == "0"
    html, fig = debugger.explain(r, "0")
    assert "rejected" in html and "argmax" in html and "&lt;a&gt;" in html and "<a>" not in html
    assert {t.name for t in fig.data} == {"target p (top-k)"}
    html, _ = debugger.explain(r, "1")
    assert "never reached" in html


def test_debugger_shows_rejection_sampling_draw_and_residual():
    draws = [{"parent": -1, "node": 0, "accepted": False, "u": 0.7, "ratio": 0.25}]
    residual = [TokenChoice(id=99, p=0.9, text="X")]
    r = make_round([-1], [], rule="rejection-sampling", q=[0.8], p=[0.2], draws=draws, residual=residual)
    html, _ = debugger.explain(r, "0")
    assert "u = 0.700 ≥ min(1, p/q) = 0.250" in html
    html, fig = debugger.explain(r, "extra")
    assert "residual" in html
    assert "residual norm(max(0, p − q))" in {t.name for t in fig.data}


def _hover_of(spec: dict, outcome: Outcome) -> str:
    return next(t["hovertext"][0] for t in spec["data"] if t.get("name") == OUTCOME_LABELS[outcome])


def test_node_hover_shows_the_test_its_rule_applied():
    """min(1, p/q) is rejection sampling's test only: on a greedy node it read as a 66% chance of a token the
    target's argmax turned down, so each rule's hover names its own test."""
    greedy = make_round([-1, -1], [0], q=[0.4, 0.3], p=[0.6, 0.2], texts=["t0", "t1"])
    hover = _hover_of(tree_spec(greedy), Outcome.REJECTED)
    assert "min(1, p/q)" not in hover and "argmax here: 'X'" in hover
    sampled = make_round([-1, -1], [0], q=[0.4, 0.3], p=[0.6, 0.2], rule="target-sampling")
    hover = _hover_of(tree_spec(sampled), Outcome.REJECTED)
    assert "min(1, p/q)" not in hover and "probability p = 0.200" in hover
    draws = [{"parent": -1, "node": 0, "accepted": True, "u": 0.1, "ratio": 1.0},
             {"parent": -1, "node": 1, "accepted": False, "u": 0.9, "ratio": 0.5}]
    rejection = make_round([-1, -1], [0], q=[0.4, 0.4], p=[0.6, 0.2], rule="rejection-sampling", draws=draws)
    hover = _hover_of(tree_spec(rejection), Outcome.ACCEPTED)
    assert "accept probability min(1, p/q) = 1.000" in hover


def test_an_extra_token_outside_the_recorded_top_k_says_so():
    r = make_round([-1], [0], extra_kind="bonus")
    r.extra_token = 7  # sampled outside the recorded top-k: its p is unknown, not missing
    spec = tree_spec(r)
    assert "p_target — (outside the recorded top-k)" in _hover_of(spec, Outcome.BONUS)


def test_debugger_explains_a_bonus_as_the_end_of_the_walk():
    """A bonus follows a leaf: the rule had nothing to decide there, which the debugger once called a parent "the
    walk never reached", and it called the target's own token "drafted"."""
    r = make_round([-1, 0], [0, 1], extra_kind="bonus",
                   draws=[{"parent": -1, "node": 0, "accepted": True, "target_token": 10},
                          {"parent": 0, "node": 1, "accepted": True, "target_token": 11}])
    html, _ = debugger.explain(r, "extra")
    assert "never reached" not in html and "drafted after" not in html
    assert "the target's own token after node 1" in html and "is a leaf" in html
    correction = make_round([-1], [])
    html, _ = debugger.explain(correction, "extra")
    assert "taken as the target's argmax" in html and "no draft taken" in html


def test_debugger_explains_a_pruned_node():
    """Nodes drafted and then cut before verification can be picked too: an engineer asking why a draft was never
    verified sees the cut's reason, its confidence against the kept nodes' and what the target would have said."""
    r = make_round([-1, 0], [0])
    r.confidence = [0.5, 0.2]
    r.meta = {"pruned": [{"token": 99, "depth": 2, "q": 0.3, "confidence": 0.05, "parent": 0, "pruned_parent": None,
                          "text": XSS, "reason": "cut to the node budget", "module": 1},
                         {"token": 8, "depth": 3, "q": 0.2, "confidence": 0.01, "parent": None, "pruned_parent": 0}]}
    values = [value for _, value in debugger.node_choices(r)]
    assert values == ["0", "1", "extra", "pruned:0", "pruned:1"]
    assert "(module 2)" in debugger.node_choices(r)[3][0]
    html, figure = debugger.explain(r, "pruned:0")
    assert "pruned (not verified)" in html and "cut to the node budget" in html and "down to 0.200" in html
    assert "target gives it p = 0.600" in html and "top token there" in html and XSS not in html
    assert "node 0" in figure.layout.title.text
    html, figure = debugger.explain(r, "pruned:1")  # hangs off a pruned node: the target computed nothing there
    assert "pruned node 0" in html and "never verified" in figure.layout.title.text
    assert debugger.selected_node("pruned:1") == ("pruned", 1) and debugger.selected_node("extra") == EXTRA
    ring = [t for t in tree_spec(r, selected=("pruned", 1))["data"] if t.get("name") == "selected"]
    assert ring and ring[0]["x"] == [3.0] and ring[0]["marker"]["size"] < 28  # not over its faint label


# ---- node labels: Medusa's heads, MTP's modules ------------------------------------------------------------------
def labelled(parents, accepted, key, values, **kwargs) -> Round:
    r = make_round(parents, accepted, **kwargs)
    r.meta = {key: list(values)}
    return r


def medusa_rounds() -> list[Round]:
    """Chains and a tree labelled by head (0-based, depth d = head d - 1), as ``MedusaDrafter`` labels them."""
    return [labelled([-1, 0, 1], [0, 1], "head", [0, 1, 2], index=0),  # heads 1, 2 accepted; head 3 rejected
            labelled([-1, 0, 1], [], "head", [0, 1, 2], index=1, start=3),  # head 1 rejected
            # root → {0, 1} (head 1), 0 → {2, 3} (head 2), 1 → 4 (head 2, never offered): path 0 → 2
            labelled([-1, -1, 0, 0, 1], [0, 2], "head", [0, 0, 1, 1, 1], index=2, start=4)]


def test_acceptance_by_label_counts_offers_per_depth():
    per_head = acceptance_by_label(medusa_rounds(), "head")
    assert list(per_head) == [0, 1, 2]
    assert [(s.accepted, s.offered) for s in per_head.values()] == [(2, 3), (2, 2), (0, 1)]
    assert per_head[0].rate == pytest.approx(2 / 3) and per_head[2].rate == 0.0
    # Medusa's head d drafts depth d only, so per head is per position
    assert [s.rate for s in per_head.values()] == pytest.approx(record_of(medusa_rounds()).metrics().conditional)
    # MTP with 2 modules on a 4-deep chain: the modules cycle, each is offered once at each of its depths
    per_module = acceptance_by_label([labelled([-1, 0, 1, 2], [0, 1, 2], "module", [0, 1, 0, 1])], "module")
    assert {k: (s.accepted, s.offered) for k, s in per_module.items()} == {0: (2, 2), 1: (1, 2)}
    assert {d: (o.accepted, o.offered) for d, o in per_module[1].depths.items()} == {2: (1, 1), 4: (0, 1)}
    assert acceptance_by_label([make_round([-1, 0], [0])], "head") == {}
    broken = labelled([-1, 0], [0], "head", [0])  # one label for two nodes (a hand-edited trace): skipped
    assert acceptance_by_label([broken], "head") == {}


def test_tree_figure_labels_depths_by_head_and_module():
    r = medusa_rounds()[2]
    fig = tree_figure(r)
    hovers = {h for t in fig.data if t.name in OUTCOME_LABELS.values() for h in (t.hovertext or [])}
    node_hover = {int(h.split("</b>")[0].split()[-1]): h for h in hovers if h.startswith("<b>node ")}
    assert all("depth 2 · head 2 ·" in node_hover[n] for n in (2, 3, 4))
    assert all("depth 1 · head 1 ·" in node_hover[n] for n in (0, 1))
    columns = {a.x: a.text for a in fig.layout.annotations}
    assert columns == {1: "head 1", 2: "head 2"}
    chain = labelled([-1, 0, 1], [0], "module", [0, 1, 0])
    assert {a.x: a.text for a in tree_figure(chain).layout.annotations} == {1: "module 1", 2: "module 2",
                                                                             3: "module 1"}
    chain.meta["pruned"] = [{"token": 7, "depth": 2, "q": 0.2, "score": -1.0, "confidence": 0.1, "parent": 0,
                             "pruned_parent": None, "module": 1}]
    faded = _trace_named(tree_figure(chain), "pruned (not verified)")
    assert "depth 2 · module 2 ·" in faded.hovertext[0]
    assert not tree_figure(make_round([-1, 0], [0])).layout.annotations  # unlabelled drafters: no column labels


def test_tokens_and_debugger_name_the_module_that_drafted_a_token():
    chain = labelled([-1, 0, 1], [0, 1], "module", [0, 1, 2])
    html = tokens_html(None, [chain])
    assert "accepted draft node 0 (module 1)" in html and "accepted draft node 1 (module 2)" in html
    assert "(module 3)" not in html  # rejected, so never committed
    assert [c[0].split(":")[0] for c in debugger.node_choices(chain)[:3]] == [
        "node 0 (module 1)", "node 1 (module 2)", "node 2 (module 3)"]


def label_bars(spec: dict) -> list[dict]:
    """The per-label bars: the per-position panel's bar traces (only they are bars on axes x/y)."""
    return [t for t in spec["data"] if t["type"] == "bar" and t["xaxis"] == "x"]


def test_per_label_chart_has_one_bar_trace_per_head():
    rounds = medusa_rounds()
    rec = record_of(rounds)
    spec = charts.run_charts_spec(rec.metrics(), rounds)
    bars = label_bars(spec)
    assert [t["name"] for t in bars] == ["head 1: 67% (2/3)", "head 2: 100% (2/2)", "head 3: 0% (0/1)"]
    assert [t["x"] for t in bars] == [[1], [2], [3]]
    assert [t["y"] for t in bars] == [pytest.approx([2 / 3]), [1.0], [0.0]]
    assert all(t["yaxis"] == "y" for t in bars)  # the per-position panel
    assert "Per-position acceptance (bars: per head)" in [a["text"] for a in spec["layout"]["annotations"]]
    go_figure = charts.run_charts(rec.metrics(), rounds)  # and plotly accepts it
    assert len([t for t in go_figure.data if t.type == "bar" and t.xaxis == "x"]) == 3
    # MTP: module 1 owns depths 1 and 3 of a 2-module chain; two labels at one depth stand side by side
    mtp = [labelled([-1, 0, 1], [0, 1], "module", [0, 1, 0])]
    module_bars = label_bars(charts.run_charts_spec(record_of(mtp).metrics(), mtp))
    assert [(t["name"], t["x"]) for t in module_bars] == [("module 1: 50% (1/2)", [1, 3]),
                                                          ("module 2: 100% (1/1)", [2])]
    mixed = [labelled([-1, -1], [0], "node_labels", ["a", "b"])]
    xs = [t["x"][0] for t in label_bars(charts.run_charts_spec(record_of(mixed).metrics(), mixed))]
    assert xs == pytest.approx([0.8, 1.2])
    plain = charts.run_charts_spec(rec.metrics(), [make_round([-1, 0], [0])])  # other drafters: unchanged
    assert not label_bars(plain)
    assert "Per-position acceptance" in [a["text"] for a in plain["layout"]["annotations"]]


def test_node_labels_are_escaped_everywhere():
    r = labelled([-1, 0], [0], "node_labels", ["<b>x</b>", XSS])
    figure = json.dumps(tree_figure(r).to_plotly_json())
    chart = json.dumps(charts.run_charts(record_of([r]).metrics(), [r]).to_plotly_json())
    for data in (figure, chart):
        assert "<img" not in data and "<b>x" not in data and "&lt;b&gt;x" in data
    assert "&lt;img" in figure
    html = tokens_html(None, [r])
    assert "<b>x" not in html and "(&lt;b&gt;x&lt;/b&gt;)" in html


def test_run_label_says_how_an_mtp_drafter_was_trained():
    rec = record_of([make_round([-1], [0])])
    rec.header["drafter"] = {"name": "mtp", "feature_layers": [2], "trained": "post hoc on a frozen target by "
                             "specviz, not jointly with the model as published MTP layers are"}
    line = panels.run_label(rec)
    assert "drafter mtp (reads the target's hidden_states[2]; trained post hoc on a frozen target" in line
    assert "not jointly with the model" in line
    rec.header["drafter"] = {"name": "ngram"}
    assert "trained" not in panels.run_label(rec)


def test_run_label_names_the_attention_kernel_that_ran():
    """The trace header's attention object reaches the run line; older traces without it show nothing extra."""
    import torch

    from specviz.models import cascade_attention

    rec = record_of([make_round([-1], [0])])
    assert "attention" not in panels.run_label(rec)
    rec.header["attention"] = cascade_attention.describe("cpu", torch.float32)
    assert "attention specviz_cascade (torch_cpu_flash prefix kernel)" in panels.run_label(rec)
    rec.header["attention"] = {"implementation": "sdpa", "chain": "sdpa (causal mask)", "tree": "sdpa (4D tree mask)"}
    assert panels.run_label(rec).endswith("attention sdpa")


def test_run_label_says_how_mtp_modules_map_to_depths():
    """One shipped module labels every node "module 1": the line says it is reused, so that reads as intended."""
    rec = record_of([make_round([-1], [0])])
    rec.header["drafter"] = {"name": "mtp", "modules": 1}
    assert "drafter mtp (1 module, reused at every depth)" in panels.run_label(rec)
    rec.header["drafter"] = {"name": "mtp", "modules": 3}
    assert "3 modules; depth d drafts with module (d − 1) mod 3 + 1" in panels.run_label(rec)
    rec.header["drafter"] = {"name": "mtp", "modules": "3"}
    assert "module" not in panels.run_label(rec)


def test_run_label_says_when_the_draft_ran_in_int8():
    """The hovers' q then comes from int8 draft weights (verification stays full precision): the label says so."""
    rec = record_of([make_round([-1], [0])])
    rec.header["drafter"] = {"name": "eagle3", "feature_layers": [2, 15, 27], "draft_quant": "int8"}
    assert "hidden_states[27]; int8 draft weights)" in panels.run_label(rec)
    rec.header["drafter"] = {"name": "eagle3", "draft_quant": None}
    assert "draft weights" not in panels.run_label(rec)
    rec.header["drafter"] = {"name": "eagle3", "draft_quant": "<b>x"}  # a hand-edited trace: escaped on the page
    assert "&lt;b&gt;x draft weights" in panels.status_html(panels.run_label(rec))
