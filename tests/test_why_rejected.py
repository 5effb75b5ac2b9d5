"""The "Why was it rejected?" story: one per node, with the numbers its accept rule used and why it was proposed.

The sampled-tree case runs the engine's own ``accept.rejection_walk`` on a small vocabulary whose top-k rows are the
whole vocabulary, so the residual the debugger rebuilds from the record can be checked against the true one.
"""

from __future__ import annotations

import pytest
import torch

from specviz.drafters.ngram import NgramDrafter
from specviz.engine import accept, sampling, trace
from specviz.engine.drafter import DraftBudget
from specviz.engine.round import Round, TokenChoice
from specviz.engine.tree import DraftTree
from specviz.viz import debugger
from specviz.viz.record import RunRecord

TEXTS = ["<a>", "b", "c", "d", "e", "f"]
# The target favours tokens 1-3, the draft token 0: siblings 0, 1 and 4 (drawn in that order) meet three tests.
P = torch.tensor([0.02, 0.40, 0.30, 0.18, 0.05, 0.05])
Q = torch.tensor([0.40, 0.35, 0.05, 0.05, 0.10, 0.05])
SIBLINGS = [0, 1, 4]


def _top(probs: torch.Tensor) -> list[TokenChoice]:
    order = torch.argsort(probs, descending=True).tolist()
    return [TokenChoice(id=t, p=round(float(probs[t]), 6), text=TEXTS[t]) for t in order]


def sampled_round() -> tuple[Round, accept.Acceptance]:
    """A stochastic tree of three root siblings, judged by the real walk at a seed where the first two are
    rejected (the third, with nothing of p left after them, always is)."""
    rows = torch.stack([Q] * (len(SIBLINGS) + 1))
    tree = DraftTree(tokens=SIBLINGS, parents=[-1] * len(SIBLINGS), q_token=[float(Q[t]) for t in SIBLINGS],
                     q_dist=rows, sampled=True)
    p_rows = torch.stack([P] * (len(SIBLINGS) + 1))
    for seed in range(100):
        result = accept.rejection_walk(tree, p_rows, sampling.make_generator(seed))
        if [d.accepted for d in result.draws] == [False, False, False]:
            break
    else:
        pytest.fail("no seed rejected the first two siblings")
    round_ = Round(
        index=3, start=0, tokens=list(SIBLINGS), parents=[-1] * 3, text=[TEXTS[t] for t in SIBLINGS],
        q_draft=[float(Q[t]) for t in SIBLINGS], confidence=None, sampled=True,
        p_target=[float(P[t]) for t in SIBLINGS], target_top=[_top(P)] * 4, draft_top=[_top(Q)] * 4,
        target_entropy=[1.2] * 4, accepted=[], extra_token=result.extra_token, extra_text=TEXTS[result.extra_token],
        extra_kind="correction", committed=[result.extra_token], committed_text=[TEXTS[result.extra_token]],
        draws=[d.to_dict() for d in result.draws], residual_top=_top(result.residual), rule="rejection-sampling",
        lossless=True, draft_ms=1.0, verify_ms=2.0, other_ms=0.1)
    return round_, result


def _story(html: str) -> str:
    """The node's own facts, without the decision table of every sibling at its parent."""
    return html.split('<div class="sv-subhead">')[0]


def test_a_rejected_sibling_is_judged_against_the_residual_it_met():
    """The panel once showed the second sibling's raw p/q (min(1, p/q) = 1) and then a coin against the residual's
    ratio (0): the story now shows the residual p′ and the renormalised q′ the rule compared, drawn."""
    round_, result = sampled_round()
    p1 = sampling.residual(P, Q)  # what the walk tested node 1 against
    q1 = Q.clone()
    q1[0] = 0.0
    q1 = q1 / q1.sum()
    test = debugger.sibling_test(round_, 1)
    assert test is not None and test.rejected == [0] and not test.accepted
    assert test.ratio == pytest.approx(result.draws[1].ratio)
    assert test.q == pytest.approx(float(q1[1]), rel=1e-5)
    assert test.p == pytest.approx(float(p1[1]), rel=1e-4)
    assert float(P[1] / Q[1]) > 1  # the raw ratio would have accepted it
    exact = [(c.id, c.p, bound) for c, bound in test.top]
    truth = sorted(((float(v), t) for t, v in enumerate(p1.tolist()) if v > 0), reverse=True)
    assert [(t, pytest.approx(v, rel=1e-4), False) for v, t in truth] == exact
    html, figure = debugger.explain(round_, "1")
    story = _story(html)
    assert "multi-draft rejection sampling with residual" in story
    assert f"p′ = {float(p1[1]):.3f} · q′ = {float(q1[1]):.3f}" in story
    mass = (P - Q).clamp_min(0)
    total = float(mass.sum())  # the normaliser, pinned by the draw's ratio
    assert f"max(0, p − q) = {float(mass[1]):.3f}, divided by the residual's total mass {total:.3f}" in story
    assert f"min(1, p′/q′) = {result.draws[1].ratio:.3f} · u = {result.draws[1].u:.3f}" in story
    assert "min(1, p/q) =" not in story and "p/q =" not in story  # the raw ratio was not what it was tested on
    assert f"“c” {float(p1[2]):.3f}" in story  # the residual, drawn: its largest entry
    assert "&lt;a&gt;" in html and "<a>" not in html  # token text escaped, sibling 0 named in the story
    assert "residual norm(max(0, p − q))" in {t.name for t in figure.data}
    assert "min(1, p′/q′) = " in html.split('<div class="sv-subhead">')[1]  # the decision table says so too


def test_a_sibling_with_nothing_left_says_so_and_the_first_keeps_its_raw_ratio():
    round_, result = sampled_round()
    p1, q1 = sampling.residual(P, Q), Q.clone()
    q1[0] = 0.0
    q1 = q1 / q1.sum()
    p2 = sampling.residual(p1, q1)  # what the third sibling met
    story = _story(debugger.explain(round_, "2")[0])
    assert "p′ = 0.000" in story and "nothing of the target's mass was left" in story
    assert "node 0" in story and "node 1" in story and "min(1, p/q) =" not in story
    assert f"“c” ≤ {float(p2[2]):.3f}" in story  # normaliser not pinned by a ratio of 0: a bound, here exact
    first = _story(debugger.explain(round_, "0")[0])
    ratio = result.draws[0].ratio
    assert f"min(1, p/q) = {ratio:.3f} · u = {result.draws[0].u:.3f}" in first and "p′" not in first
    assert "the next sibling was then tested against the residual" in first


def test_a_chain_draft_is_tested_on_its_own_p_and_q():
    round_, _ = sampled_round()
    chain = Round.from_dict({**round_.to_dict(), "tokens": [0], "parents": [-1], "text": ["<a>"], "q_draft": [0.4],
                             "p_target": [0.02], "target_top": round_.to_dict()["target_top"][:2],
                             "draft_top": round_.to_dict()["draft_top"][:2], "target_entropy": [1.2, 1.2],
                             "draws": [{"parent": -1, "node": 0, "accepted": False, "u": 0.5, "ratio": 0.05}]})
    story = _story(debugger.explain(chain, "0")[0])
    assert "chain rejection sampling" in story and "min(1, p/q) = 0.050 · u = 0.500" in story
    assert "correction was drawn from the residual" in story


def greedy_round(rule: str = "greedy") -> Round:
    top = [[TokenChoice(id=99, p=0.6, text="X"), TokenChoice(id=10, p=0.3, text="t0")]] * 3
    return Round(
        index=0, start=0, tokens=[10, 11], parents=[-1, -1], text=["t0", "t1"], q_draft=[0.8, 0.1],
        confidence=[0.7, 0.2], sampled=False, p_target=[0.3, 0.05], target_top=top,
        draft_top=[[TokenChoice(id=10, p=0.8, text="t0"), TokenChoice(id=11, p=0.1, text="t1")]] * 3,
        target_entropy=[1.5] * 3, accepted=[], extra_token=99, extra_text="X", extra_kind="correction",
        committed=[99], committed_text=["X"], draws=[{"parent": -1, "node": None, "accepted": False,
                                                      "target_token": 99}],
        residual_top=None, rule=rule, lossless=True, draft_ms=1.0, verify_ms=2.0, other_ms=0.1)


def test_a_rejected_greedy_token_shows_the_argmax_and_no_p_over_q():
    """A rejected greedy token once read "min(1, p/q) = 1.000"; greedy compares with the argmax and uses no q."""
    story = _story(debugger.explain(greedy_round(), "0")[0])
    assert "greedy" in story and "the target's argmax here: “X” (p = 0.600) · this token: p = 0.300" in story
    assert "p/q" not in story and "min(1" not in story and "u =" not in story
    assert "--stochastic-tree" in story and "temperature &gt; 0" in story  # how to get draws
    assert "most likely token at its parent (q = 0.800)" in story  # why proposed: the drafter's top choice


def test_a_target_sampling_node_says_which_setting_shows_draws():
    """At temperature 0.8 the default tree is deterministic, judged by target sampling: no coin, no p/q."""
    story = _story(debugger.explain(greedy_round("target-sampling"), "1")[0])
    assert "target sampling" in story and "the target sampled “X”" in story
    assert "this token: p = 0.050, its chance to be the one sampled" in story
    assert "p/q =" not in story and "min(1" not in story and "u =" not in story
    assert "--chain" in story and "--stochastic-tree" in story and "stochastic tree" in story


CHAT = ["<|im_start|>", "user", "\n", "hi", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", "ok",
        "<|im_end|>", "\n"]


def lookup_round(meta: dict) -> Round:
    tokens = list(range(len(CHAT)))
    ids = {text: tokens[CHAT.index(text)] for text in CHAT}  # one id per distinct piece
    context = [ids[text] for text in CHAT]
    drafter = NgramDrafter(max_ngram=3)
    drafter.begin(context)
    tree = drafter.propose(context, DraftBudget(k=2), sampling.SamplingConfig(), torch.Generator())
    assert [CHAT[t] for t in tree.tokens] == ["<|im_start|>", "assistant"]  # what followed "<|im_end|>\n" before
    return Round(
        index=0, start=0, tokens=tree.tokens, parents=tree.parents, text=[CHAT[t] for t in tree.tokens],
        q_draft=None, confidence=[0.5, 0.25], sampled=False, p_target=[0.9, 0.1],
        target_top=[[TokenChoice(id=0, p=0.9, text=CHAT[0])]] * 3, draft_top=None, target_entropy=[0.4] * 3,
        accepted=[0], extra_token=3, extra_text="hi", extra_kind="correction", committed=[0, 3],
        committed_text=["<|im_start|>", "hi"], draws=[{"parent": -1, "node": 0, "accepted": True, "target_token": 0},
                                                      {"parent": 0, "node": None, "accepted": False,
                                                       "target_token": 3}],
        residual_top=None, rule="target-sampling", lossless=True, draft_ms=0.1, verify_ms=2.0, other_ms=0.1,
        meta={**tree.meta, **meta})


def test_a_lookup_node_says_which_match_it_copied():
    """The panel said only "confidence 0.500" for a lookup draft; it now quotes the match it continued."""
    round_ = lookup_round({})
    assert round_.meta["lookup"] == [{"n": 2, "from": 6}, {"n": 2, "from": 7}]
    html, _ = debugger.explain(round_, "0", context=CHAT, prompt_tokens=9)
    proposed = next(line for line in html.split("<li>") if "Why proposed" in line)
    assert "the context's last 2 tokens “&lt;|im_end|&gt;↵” earlier in the prompt (context tokens 4–5)" in proposed
    assert "what followed there, “&lt;|im_start|&gt;”" in proposed and "<|im_" not in html
    assert "drafter confidence ĉ = 0.500" in proposed
    second = debugger.explain(round_, "1", context=CHAT, prompt_tokens=9)[0]
    assert "“&lt;|im_start|&gt;assistant”; this node copies its token 2 (context token 7)" in second
    without = debugger.explain(round_, "0")[0]  # no context (an API caller): positions only
    assert "ending at context token 5" in without and "context token 6" in without


def test_the_hybrid_says_who_drafted_and_the_lookup_meta_survives_a_trace():
    round_ = lookup_round({"source": "lookup", "node_labels": ["lookup", "lookup"]})
    html = debugger.explain(round_, "0", context=CHAT, prompt_tokens=9)[0]
    assert "the hybrid let its lookup draft this round" in html and "last 2 tokens" in html
    header = {"type": "header", "schema": trace.SCHEMA, "version": trace.VERSION, "target": {"name": "t"},
              "drafter": {"name": "hybrid"}, "config": {"temperature": 0.8, "seed": 0},
              "budget": {"tree": False, "k": 2}, "prompt": {"pieces": CHAT}}
    back = RunRecord.from_trace(trace.loads(RunRecord(header=header, rounds=[round_]).to_trace()))
    assert back.rounds[0].meta["lookup"] == round_.meta["lookup"]
    model = greedy_round()
    model.meta = {"source": "eagle3", "lookup_skipped": {"n": 2, "value": 0.1, "bar": 0.2}}
    assert "its model drafter “eagle3” draft this round (its lookup's 2-gram match did not pay)" in (
        debugger.explain(model, "0")[0])


def test_a_tree_lookup_records_where_each_node_was_copied_from():
    context = [5, 6, 7, 5, 6, 8, 5, 6]
    drafter = NgramDrafter(max_ngram=2)
    drafter.begin(context)
    tree = drafter.propose(context, DraftBudget(tree=True, width=2, depth=2, max_nodes=4), sampling.SamplingConfig(),
                           torch.Generator())
    assert len(tree.meta["lookup"]) == len(tree.tokens) == 4
    assert all(context[entry["from"]] == token for entry, token in zip(tree.meta["lookup"], tree.tokens))


def test_a_block_or_head_node_says_where_it_came_from():
    block = greedy_round()
    block.parents, block.meta = [-1, 0], {"block": {"size": 8, "drafts": 7, "anchor_predicts": False}}
    assert "this is draft 2 of 7, predicted at block position 2, where the drafter gave it q = 0.100" in (
        debugger.explain(block, "1")[0])
    head = greedy_round()
    head.meta = {"head": [0, 0]}
    assert "head 1: the drafter's 2nd most likely token at its parent (q = 0.100)" in debugger.explain(head, "1")[0]
    drawn = sampled_round()[0]
    assert "drawn at random from the drafter's q at its parent, where it had q = 0.350" in (
        debugger.explain(drawn, "1")[0])


def test_the_tab_quotes_the_text_before_the_round():
    """The tab rebuilds the context's pieces (the prompt's, then each earlier round's committed tokens) for a lookup
    round, and gives up where they would not line up with the context the lookup matched in."""
    from specviz.ui.debugger import lookup_context

    first = lookup_round({})
    second = Round.from_dict({**first.to_dict(), "index": 1, "start": 2})
    header = {"type": "header", "prompt": {"pieces": CHAT[:9]}}
    record = RunRecord(header=header, rounds=[first, second])
    assert lookup_context(record, 0) == (CHAT[:9], 9)
    assert lookup_context(record, 1) == ([*CHAT[:9], "<|im_start|>", "hi"], 9)
    second.start = 5  # committed text missing for some tokens: no quote rather than a wrong one
    assert lookup_context(record, 1) == (None, None)
    second.meta = {}
    assert lookup_context(record, 0) == (CHAT[:9], 9) and lookup_context(record, 1) == (None, None)


def test_a_sibling_never_tested_shows_no_ratio():
    round_, _ = sampled_round()
    round_.draws = [{"parent": -1, "node": 0, "accepted": True, "u": 0.01, "ratio": 0.05}]
    round_.accepted = [0]
    story = _story(debugger.explain(round_, "1")[0])
    assert "never tested: no ratio, no coin" in story and "never reached" in story and "min(1, p/q) =" not in story
