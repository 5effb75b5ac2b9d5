"""The Lesson tab: every step of every round of shipped traces (greedy chain, greedy tree, sampled tree) renders its
sentence, numbers and formula, with the numbers the round recorded; the glossary defines every term it prints; token
text is escaped; and the tab's callbacks walk a run in order.
"""

from __future__ import annotations

import copy
import re

import gradio as gr
import pytest

from specviz.engine.metrics import FORMULAS
from specviz.engine.round import TokenChoice
from specviz.ui import examples
from specviz.ui import lesson as lesson_ui
from specviz.ui.state import Session
from specviz.viz import debugger
from specviz.viz import lesson as steps
from specviz.viz.glossary import GLOSSARY, glossary_html, term
from specviz.viz.record import RunRecord
from specviz.viz.text import fmt_prob

GREEDY_CHAIN = "summarization-ngram-chain.jsonl"
GREEDY_TREE = "coding-eagle3-tree.jsonl"
SAMPLED_TREE = "coding-smollm2-135m-draft-tree-sampled.jsonl"
TRACES = [GREEDY_CHAIN, GREEDY_TREE, SAMPLED_TREE]


def plain(html: str) -> str:
    """The text a reader sees: tags dropped, the few entities the views write decoded."""
    text = re.sub(r"<[^>]+>", " ", html)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", '"')


def walk(record: RunRecord) -> list[tuple[int, str]]:
    """Every position Next visits from the first step, the totals last."""
    at, seen = (0, steps.STEPS[0]), []
    while at not in seen:
        seen.append(at)
        at = steps.next_position(record, *at)
    return seen


@pytest.fixture(scope="module", params=TRACES)
def record(request) -> RunRecord:
    return examples.load_trace(request.param)


def test_next_visits_every_step_of_every_round_then_the_totals_and_previous_walks_back(record):
    seen = walk(record)
    assert len(seen) == len(steps.STEPS) * len(record.rounds) + 1
    assert seen[-1][1] == steps.TOTALS and seen[:6] == [(0, step) for step in steps.STEPS]
    assert [steps.previous_position(record, *at) for at in seen[1:]] == seen[:-1]
    assert steps.previous_position(record, *seen[0]) == seen[0]  # nothing before the first step


def test_every_step_renders_its_sentence_numbers_and_formula(record):
    for index, step in walk(record):
        page = steps.lesson(record, index, step)
        for part in (page.title, page.sentence, page.body, page.formula):
            assert plain(part).strip(), (record.name, index, step)
        assert "Traceback" not in page.body


def test_the_accept_step_says_how_many_guesses_were_kept(record):
    for index, round_ in enumerate(record.rounds):
        sentence = plain(steps.lesson(record, index, "accept").sentence)
        match = re.search(r"guessed (\d+) tokens?; the model kept (\d+) and added its own \( (\w+) \)", sentence)
        assert match, sentence
        assert (int(match[1]), int(match[2]), match[3]) == (len(round_.tokens), len(round_.accepted),
                                                            round_.extra_kind)


def test_the_cache_and_forward_steps_count_what_the_round_verified_and_kept(record):
    prompt = len(record.header["prompt"]["token_ids"])
    for index, round_ in enumerate(record.rounds):
        kept, verified = len(round_.accepted), round_.verified
        cache = plain(steps.lesson(record, index, "cache").sentence)
        assert f"wrote {verified} entries" in cache and f"keeps {1 + kept}" in cache
        assert f"drops {verified - 1 - kept}" in cache
        body = plain(steps.lesson(record, index, "cache").body)
        before = prompt + round_.start - 1
        assert f"{before} + 1 + {kept} = {before + 1 + kept}" in body
        forward = plain(steps.lesson(record, index, "forward").sentence)
        assert f"over {verified} tokens" in forward
        context = plain(steps.lesson(record, index, "context").sentence)
        assert f"holds {prompt + round_.start} tokens" in context


def test_each_test_shows_the_numbers_its_rule_used(record):
    for index, round_ in enumerate(record.rounds):
        page = steps.lesson(record, index, "accept")
        body, formula = plain(page.body), plain(page.formula)
        for draw in round_.draws:
            if "u" in draw:  # rejection sampling: the coin against min(1, p/q) with the p and q it met
                assert f"u = {fmt_prob(draw['u'])}" in body
                assert f"min(1, {fmt_prob(draw['p'])} / {fmt_prob(draw['q'])}) = {fmt_prob(draw['ratio'])}" in body
            else:  # greedy or target sampling: the target's own token
                assert ("argmax" if round_.rule == "greedy" else "draw") in body
        if round_.rule in debugger.NO_COIN:  # no coin: say so, and which settings give one
            assert debugger.NO_COIN[round_.rule] in formula and "stochastic tree" in formula
        else:
            assert "min(1, p(x) / q(x))" in formula
        assert len(re.findall(r"\b(kept|rejected|none kept)\b", body)) == len(round_.draws)


def test_a_later_sibling_is_tested_against_the_residual():
    record = examples.load_trace(SAMPLED_TREE)
    found = 0
    for index, round_ in enumerate(record.rounds):
        body = plain(steps.lesson(record, index, "accept").body)
        for parent in {d["parent"] for d in round_.draws if "u" in d}:
            coins = [d for d in round_.draws if d["parent"] == parent and "u" in d]
            found += len(coins) - 1
            assert body.count("p′/q′") >= len(coins) - 1
    assert found, "the sampled trace tested no sibling after a rejection"


def test_the_extra_step_names_the_token_and_its_source(record):
    for index, round_ in enumerate(record.rounds):
        page = steps.lesson(record, index, "extra")
        sentence = plain(page.sentence)
        assert round_.extra_kind in sentence and f"commits {len(round_.committed)} token" in sentence
        if round_.residual_top:
            assert "residual" in sentence and "max(0, p(x) − q(x))" in plain(page.formula)


def test_the_totals_show_the_run_metrics_with_their_definitions(record):
    page = steps.lesson(record, 0, steps.TOTALS)
    m = record.metrics()
    body, formula = plain(page.body), plain(page.formula)
    assert f"{m.new_tokens} tokens ÷ {m.rounds} rounds = {m.tau:.2f}" in body
    assert f"{m.accepted} kept ÷ {m.drafted} drafted" in body
    assert f"α_1 = {m.conditional[0]:.2f}" in body
    assert f"= {m.wasted:.0%}" in body
    assert record.speedup_text() in body
    for key in ("tau", "acceptance_rate", "per_position", "wasted", "speedup"):
        assert FORMULAS[key] in formula


def test_interesting_rounds_are_real_rounds_with_what_they_promise(record):
    picks = steps.interesting_rounds(record)
    assert picks and all(0 <= index < len(record.rounds) for _, index in picks)
    most = max(len(r.accepted) for r in record.rounds)
    assert any("most guesses kept" in label and len(record.rounds[i].accepted) == most for label, i in picks)
    for label, index in picks:
        round_ = record.rounds[index]
        if "every guess rejected" in label:
            assert round_.tokens and not round_.accepted
        if "a bonus token" in label:
            assert round_.extra_kind == "bonus"
        if "residual" in label:
            assert round_.rule == "rejection-sampling"


def test_the_glossary_defines_every_term_the_lesson_prints(record):
    used = set()
    for index, step in walk(record):
        page = steps.lesson(record, index, step)
        for part in (page.sentence, page.body, page.formula):
            used |= {re.sub("&#x27;", "'", t) for t in re.findall(r'data-term="([^"]+)"', part)}
    assert used and used <= set(GLOSSARY)
    with pytest.raises(KeyError):
        term("no such term")


def test_the_glossary_covers_the_terms_the_pages_use():
    required = {"τ", "acceptance rate", "α per position", "correction", "bonus", "residual", "confidence", "ECE",
                "prefill", "wasted verification", "speedup", "KV cache", "cache rollback", "q", "p", "greedy",
                "target sampling", "rejection sampling", "lossless", "pruned", "entropy", "calibration", "survival",
                "node budget", "verify-cost curve", "temperature", "top-p", "top-k"}
    assert required <= set(GLOSSARY)
    assert all(entry.plain for entry in GLOSSARY.values())
    # the metric definitions are the metrics' own
    assert GLOSSARY["τ"].formula == FORMULAS["tau"] and GLOSSARY["speedup"].formula == FORMULAS["speedup"]
    html = glossary_html()
    assert all(name.replace("'", "&#x27;") in html for name in GLOSSARY)


def test_token_text_is_escaped_everywhere():
    record = copy.deepcopy(examples.load_trace(SAMPLED_TREE))
    evil, worse = "<b>bold</b>", "<img src=x onerror=alert(1)>"
    record.header["prompt"]["pieces"][-1] = worse
    for round_ in record.rounds:
        round_.text = [evil] * len(round_.tokens)
        round_.extra_text = worse
        round_.committed_text = [evil] * len(round_.committed)
        round_.target_top = [[TokenChoice(c.id, c.p, evil) for c in row] for row in round_.target_top]
        if round_.residual_top:
            round_.residual_top = [TokenChoice(c.id, c.p, worse) for c in round_.residual_top]
    for index, step in walk(record):
        page = steps.lesson(record, index, step)
        for part in (page.title, page.sentence, page.body, page.formula):
            assert "<b>bold" not in part and "<img" not in part, (index, step)
    assert "&lt;b&gt;bold" in steps.lesson(record, 1, "proposal").body
    assert "&lt;img" in steps.lesson(record, 0, "context").sentence


def test_a_run_without_rounds_says_what_to_do():
    page = steps.lesson(RunRecord(header={}), 0, "context")
    assert "no rounds yet" in plain(page.sentence)
    assert steps.position(None, "x", "nonsense") == (0, steps.STEPS[0])


# ---- the tab --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tab():
    """The tab's callbacks and components, laid out in a Blocks of its own."""
    with gr.Blocks():
        session = gr.State(Session)
        built = lesson_ui.build(session)
    header, text, formula, tree, round_slider, step, jump, shown = built["outputs"]
    return built, dict(header=header, text=text, formula=formula, tree=tree, round=round_slider, step=step,
                       jump=jump, shown=shown)


def _value(update):
    return update.value if hasattr(update, "value") else update


def test_the_tab_walks_a_trace_and_the_playground_run(tab):
    built, parts = tab
    state = Session()
    state.record = examples.load_trace(GREEDY_CHAIN)
    # the tab opens on the Playground's run, at its first step
    out = built["on_tab"](state, lesson_ui.PLAYGROUND, 5, "forward", "")
    assert _value(out[parts["step"]]) == "context" and _value(out[parts["round"]]) == 0
    assert "step 1 of 6" in out[parts["text"]] and "replay of" in out[parts["header"]]
    key = out[parts["shown"]]
    # the reader's place is kept while the record is the same one
    kept = built["on_tab"](state, lesson_ui.PLAYGROUND, 3, "accept", key)
    assert _value(kept[parts["round"]]) == 3 and _value(kept[parts["step"]]) == "accept"
    # Next and Previous move one step; the jump goes to a round's context
    nxt = built["on_next"](state, lesson_ui.PLAYGROUND, 3, "cache", key)
    assert (_value(nxt[parts["round"]]), _value(nxt[parts["step"]])) == (4, "context")
    back = built["on_previous"](state, lesson_ui.PLAYGROUND, 4, "context", key)
    assert (_value(back[parts["round"]]), _value(back[parts["step"]])) == (3, "cache")
    # a step that draws the same figure as the one before sends none; a step that rings another node sends its own
    same = built["on_next"](state, lesson_ui.PLAYGROUND, 3, "context", key)
    assert same[parts["tree"]] == gr.skip() and "step 2 of 6" in same[parts["text"]]
    ringed = built["on_next"](state, lesson_ui.PLAYGROUND, 3, "forward", key)
    assert ringed[parts["tree"]] != gr.skip() and ringed[parts["tree"]].data
    choices = out[parts["jump"]].choices
    assert choices
    jumped = built["on_jump"](state, lesson_ui.PLAYGROUND, choices[0][1], key)
    assert _value(jumped[parts["round"]]) == int(choices[0][1])
    # a new Playground run starts the lesson from its top
    state.record = examples.load_trace(GREEDY_TREE)
    fresh = built["on_tab"](state, lesson_ui.PLAYGROUND, 3, "accept", key)
    assert _value(fresh[parts["round"]]) == 0 and fresh[parts["shown"]] != key
    # a shipped trace by name; out-of-range or malformed positions are clamped, not errors
    opened = built["on_source"](state, SAMPLED_TREE)
    assert _value(opened[parts["round"]]) == 0
    trace = built["on_step"](state, SAMPLED_TREE, 10_000, "totals", opened[parts["shown"]])
    assert "The run&#x27;s totals" in trace[parts["text"]] and trace[parts["tree"]] is not None
    odd = built["on_round"](state, SAMPLED_TREE, "not a number", trace[parts["shown"]])
    assert _value(odd[parts["round"]]) == 0


def test_the_tab_without_a_run_or_with_an_unknown_source_shows_a_line_not_a_traceback(tab):
    built, parts = tab
    empty = built["on_tab"](Session(), lesson_ui.PLAYGROUND, 0, None, "")
    assert "no rounds yet" in empty[parts["text"]] and empty[parts["formula"]]
    with pytest.warns(UserWarning, match="No such run"):
        unknown = built["on_tab"](Session(), "../../etc/passwd", 0, None, "")
    assert "no rounds yet" in unknown[parts["text"]]


def test_the_app_has_the_lesson_tab_after_the_playground():
    from specviz.ui.app import build_app

    config = build_app().config
    ids = [c["props"].get("elem_id") for c in config["components"] if c.get("type") == "tabitem"]
    assert ids[:2] == ["tab-playground", "tab-lesson"]
