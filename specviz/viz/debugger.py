"""The rejection debugger: for one node of one round, one story of why it was proposed and how it was judged.

Each accept rule tells its own story (``STORIES``) with the numbers that rule used, and only those: greedy compares
the node with the target's argmax, target sampling with the token the target sampled, rejection sampling a coin u
with min(1, p/q), or, for a sibling tested after rejected ones, with the residual they left (``sibling_test``).
Row ``parent + 1`` of ``target_top`` / ``draft_top`` / ``target_entropy`` is the distribution the node was drafted
from and judged against; ``draws`` at that parent are the rule's actual decisions; ``residual_top`` is where a
correction was sampled from when it was not p itself. Why the drafter proposed the node is read from what the round
recorded (``why_proposed``): the lookup's match, the hybrid's source, a head's q, a block's position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from specviz.engine.round import Round, TokenChoice
from specviz.viz.charts import topk_figure
from specviz.viz.labels import node_labels, pruned_label
from specviz.viz.outcome import OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.text import escape, fmt_prob, visible
from specviz.viz.tree_figure import shown_pruned


def _quoted(text: str) -> str:
    return f"“{visible(text)}”"

EXTRA = "extra"
PRUNED = "pruned:"  # a pruned node's choice value: "pruned:<its index in meta['pruned']>"

RULE_TEXT = {
    "greedy": "greedy: a draft token is accepted iff it is the target's argmax at its parent",
    "target-sampling": "target sampling: the target draws y ~ p at the parent; the child whose token is y is "
                       "accepted (so a deterministic draft token survives with probability p)",
    "rejection-sampling": "rejection sampling: each drawn child is accepted with probability min(1, p/q); after a "
                          "rejection p ← norm(max(0, p − q)) and the next sibling is tested",
}

#: Where a rule draws no coin, the settings that give one (``accept.choose_rule``: rejection sampling needs a draft
#: drawn at random from q).
SHOW_DRAWS = ("to see draws, sample (temperature > 0) a chain (--chain, the “chain” draft shape) or a stochastic "
              "tree (--stochastic-tree, the “stochastic tree” setting) from a drafter that samples its q (a draft "
              "model, an EAGLE or MTP head, DSpark's chain); the n-gram lookup, Medusa and DFlash always draft "
              "deterministically")
NO_COIN = {
    "greedy": "greedy decoding draws no coin and uses no q, so there is no coin u to inspect",
    "target-sampling": "target sampling draws no coin: the draft is deterministic (q is a point mass), so p/q is "
                       "never computed and there is no u to inspect",
}
NEVER_REACHED = ("never reached: an ancestor was rejected (or, under rejection sampling, an earlier sibling was "
                 "accepted), so the rule never tested it. Its p_target was still computed, because the whole tree is "
                 "verified in one forward pass")


def node_choices(round_: Round | None) -> list[tuple[str, str]]:
    """Dropdown choices (label, value) for every node plus the extra token."""
    if round_ is None:
        return []
    outcomes = node_outcomes(round_)
    drafted_by = node_labels(round_)
    choices = []
    for i, outcome in enumerate(outcomes):
        by = f" ({drafted_by[i]})" if drafted_by else ""
        text = visible(round_.text[i]) if i < len(round_.text) else round_.tokens[i]
        choices.append((f"node {i}{by}: {text} — {OUTCOME_LABELS[outcome]}", str(i)))
    choices.append((f"{round_.extra_kind}: {visible(round_.extra_text)}", EXTRA))
    for index, record in shown_pruned(round_).items():  # the ones the tree draws: a pick is ringed there
        by = pruned_label(record)
        choices.append((f"pruned {index}{f' ({by})' if by else ''}: {visible(_pruned_text(record))} — pruned (not "
                        "verified)", f"{PRUNED}{index}"))
    return choices


def _pruned_text(record: dict) -> str:
    return str(record.get("text", f"#{record.get('token')}"))


def selected_node(value: str | None) -> int | str | tuple | None:
    """A choice value as the tree figure's node key: an index, ``"extra"`` or ``("pruned", i)``."""
    if value is None or value == EXTRA:
        return value
    if value.startswith(PRUNED):
        return ("pruned", int(value[len(PRUNED):]))
    return int(value)


def default_node(round_: Round | None) -> str | None:
    """The most instructive node: the first rejected one, else the extra token."""
    if round_ is None:
        return None
    for i, outcome in enumerate(node_outcomes(round_)):
        if outcome is Outcome.REJECTED:
            return str(i)
    return EXTRA


def _token_text(round_: Round, row: int, token: int | None) -> str:
    if token is None:
        return "—"
    text = _plain_text(round_, row, token)
    return f"id {token}" if text is None else _quoted(text)


def _plain_text(round_: Round, row: int, token: int) -> str | None:
    """A token's display text at ``row`` from the round's top-k rows, nodes or extra token (None: not recorded)."""
    for rows in (round_.target_top, round_.draft_top or []):
        if row < len(rows):
            for choice in rows[row]:
                if choice.id == token:
                    return choice.text
    for i, t in enumerate(round_.tokens):
        if t == token and i < len(round_.text):
            return round_.text[i]
    if token == round_.extra_token:
        return round_.extra_text
    return None


def draws_table(round_: Round, parent: int) -> str:
    """The accept rule's decisions at ``parent`` (-1 = root), as an HTML table."""
    rows = [d for d in round_.draws if d.get("parent") == parent]
    if not rows:
        if round_.extra_kind == "bonus" and parent == (round_.accepted[-1] if round_.accepted else -1):
            return ('<div class="sv-note">The walk ended here: this accepted node is a leaf, with no draft child '
                    'to test, so the rule had nothing to decide.</div>')
        return '<div class="sv-note">The accept rule made no decision here (the walk never reached this parent).</div>'
    body = []
    for d in rows:
        node = d.get("node")
        if node is None:
            node_text = "none matched"
        else:
            node_text = f"node {node} {escape(_token_text(round_, parent + 1, round_.tokens[node]))}"
        if "u" in d:  # siblings after the first met the residual the rejections before them left (p′, q′)
            test = f"u = {fmt_prob(d['u'])} {'<' if d['accepted'] else '≥'} " + (
                f"min(1, p/q) = {fmt_prob(d.get('ratio'))}" if d is _coin_draws(round_, parent)[0] else
                f"min(1, p′/q′) = {fmt_prob(d.get('ratio'))} (residual)")
        else:
            test = f"target chose {escape(_token_text(round_, parent + 1, d.get('target_token')))}"
        verdict = "accepted" if d.get("accepted") else "rejected" if node is not None else "no draft taken"
        body.append(f"<tr><td>{node_text}</td><td>{test}</td><td><b>{verdict}</b></td></tr>")
    return ('<table class="sv-table"><tr><th>candidate</th><th>draw</th><th>result</th></tr>'
            f'{"".join(body)}</table>')


def explain(round_: Round | None, node: str | None, *, context: Sequence[str] | None = None,
            prompt_tokens: int | None = None) -> tuple[str, go.Figure]:
    """HTML explanation and the target-vs-draft top-k figure for ``node`` (an index as text, ``"extra"`` or a pruned
    node's value). ``context``: the display pieces of every token before the round, and ``prompt_tokens`` how many of
    them are the prompt, so a lookup's match can be quoted."""
    if round_ is None or node is None:
        return '<div class="sv-muted">Pick a round and a node.</div>', topk_figure([], None, title="no node selected")
    if node.startswith(PRUNED):
        return explain_pruned(round_, int(node[len(PRUNED):]))
    if node == EXTRA:
        return explain_extra(round_)
    index = int(node)
    if not 0 <= index < len(round_.tokens):
        return '<div class="sv-muted">That node is not in this round.</div>', topk_figure([], None)
    parent, token = round_.parents[index], round_.tokens[index]
    text = round_.text[index] if index < len(round_.text) else str(token)
    outcome = node_outcomes(round_)[index]
    after = "the last committed token" if parent < 0 else f"node {parent}"
    facts = [f"<b>{escape(OUTCOME_LABELS[outcome])}</b> token <code>{escape(_quoted(text))}</code> (id {token}), "
             f"round {round_.index}, drafted after {after}",
             why_proposed(round_, index, context=context, prompt_tokens=prompt_tokens)]
    facts += STORIES.get(round_.rule, _other_story)(round_, index)
    if not round_.lossless:
        facts.append("this rule is LOSSY: the output may differ from the target's own")
    facts.append(_entropy_fact(round_, parent + 1))
    html = _facts_html(facts)
    html += '<div class="sv-subhead">Decisions of the accept rule at this position</div>'
    html += draws_table(round_, parent)
    test = sibling_test(round_, index) if round_.rule == "rejection-sampling" else None
    residual = [choice for choice, bound in test.top if not bound] if test is not None and test.top else None
    title = f"target top-k vs draft top-k at {'the root' if parent < 0 else f'node {parent}'} (round {round_.index})"
    if residual:
        title += ": orange, the residual this node was tested against"
    row = parent + 1
    figure = topk_figure(_at(round_.target_top, row) or [], _at(round_.draft_top, row), residual, highlight=token,
                         highlight_text=text, highlight_p=_at(round_.p_target, index),
                         highlight_q=_at(round_.q_draft, index), title=title)
    return html, figure


def explain_extra(round_: Round) -> tuple[str, go.Figure]:
    """The correction or bonus token: the target's own token where the walk stopped, and what it was drawn from."""
    parent = round_.accepted[-1] if round_.accepted else -1
    row = parent + 1
    token, text = round_.extra_token, round_.extra_text
    outcome = Outcome(round_.extra_kind)
    p = _p_at(round_, row, token)
    residual = round_.residual_top if outcome is Outcome.CORRECTION else None
    after = "the last committed token" if parent < 0 else f"node {parent}"
    facts = [f"<b>{escape(OUTCOME_LABELS[outcome])}</b> token <code>{escape(_quoted(text))}</code> (id {token}), "
             f"round {round_.index}, the target's own token after {after}",
             f"p_target = {fmt_prob(p)}" + (" (outside the recorded top-k)" if p is None else ""),
             escape(RULE_TEXT.get(round_.rule, f"rule {round_.rule}")) + ("" if round_.lossless else " (LOSSY)"),
             _why_extra(round_, outcome, parent), _no_coin(round_) if round_.rule in NO_COIN else "",
             _entropy_fact(round_, row)]
    html = _facts_html(facts)
    html += '<div class="sv-subhead">Decisions of the accept rule at this position</div>'
    html += draws_table(round_, parent)
    if residual:
        html += ('<div class="sv-note">The correction was sampled from the residual distribution '
                 'norm(max(0, p − q)) shown in orange.</div>')
    title = f"target top-k vs draft top-k at {'the root' if parent < 0 else f'node {parent}'} (round {round_.index})"
    figure = topk_figure(_at(round_.target_top, row) or [], _at(round_.draft_top, row), residual, highlight=token,
                         highlight_text=text, highlight_p=p, title=title)
    return html, figure


def _facts_html(facts: list[str]) -> str:
    return '<ul class="sv-facts">' + "".join(f"<li>{f}</li>" for f in facts if f) + "</ul>"


def _entropy_fact(round_: Round, row: int) -> str:
    entropy = _at(round_.target_entropy, row)
    if entropy is None:
        return ""
    return (f"target entropy at this position = {entropy:.2f} nats "
            f"({'confident' if entropy < 1.0 else 'uncertain' if entropy > 3.0 else 'moderate'})")


def _at(values: Sequence | None, i: int):
    """``values[i]``, or None where the round has no such entry (absent lists, rows a trace left short)."""
    return values[i] if values is not None and 0 <= i < len(values) else None


# ---- one story per accept rule ----------------------------------------------------------------------------------
def greedy_story(round_: Round, index: int) -> list[str]:
    """Greedy: the node against the target's argmax at its parent, each with its p; no q, no coin."""
    row, outcome = round_.parents[index] + 1, node_outcomes(round_)[index]
    argmax = _target_choice(round_, index)
    if argmax is None and _at(round_.target_top, row):
        argmax = round_.target_top[row][0].id
    best = escape(_token_text(round_, row, argmax))
    facts = ["<b>Rule:</b> greedy (temperature 0): a draft is accepted iff it is the target's argmax at its parent",
             f"the target's argmax here: {best} (p = {fmt_prob(_p_at(round_, row, argmax))}) · this token: "
             f"p = {fmt_prob(_at(round_.p_target, index))}"]
    if outcome is Outcome.ACCEPTED:
        facts.append("<b>Why:</b> it is the target's argmax here, so it was accepted.")
    elif outcome is Outcome.REJECTED:
        facts.append(f"<b>Why:</b> the target's argmax here is {best}, not this token, so it was rejected.")
    else:
        facts.append(f"<b>Why:</b> {NEVER_REACHED}.")
    return [*facts, _no_coin(round_)]


def target_sampling_story(round_: Round, index: int) -> list[str]:
    """Target sampling: the token the target sampled at the parent against the node's; the node's p is its chance."""
    row, outcome = round_.parents[index] + 1, node_outcomes(round_)[index]
    facts = ["<b>Rule:</b> target sampling: the draft is deterministic, so the target samples y ~ p at the parent "
             "and the child whose token is y is accepted (a draft survives with probability p)"]
    sampled = _target_choice(round_, index)
    p = fmt_prob(_at(round_.p_target, index))
    if sampled is None:
        facts.append(f"this token: p = {p} (the chance the target would have sampled it)")
        facts.append(f"<b>Why:</b> {NEVER_REACHED}.")
    else:
        chosen = escape(_token_text(round_, row, sampled))
        facts.append(f"the target sampled {chosen} (p = {fmt_prob(_p_at(round_, row, sampled))}) · this token: "
                     f"p = {p}, its chance to be the one sampled")
        facts.append("<b>Why:</b> the target sampled this very token, so it was accepted." if outcome is
                     Outcome.ACCEPTED else f"<b>Why:</b> the target sampled {chosen}, not this token, so it was "
                     f"rejected (it would have survived with probability p = {p}).")
    return [*facts, _no_coin(round_)]


def rejection_story(round_: Round, index: int) -> list[str]:
    """Rejection sampling: one draft at the parent is the chain case; several are multi-draft with residual."""
    parent = round_.parents[index]
    if len(_children(round_, parent)) == 1:
        return chain_story(round_, index)
    return multi_draft_story(round_, index)


def chain_story(round_: Round, index: int) -> list[str]:
    """Chain rejection sampling (Leviathan et al.): u against min(1, p/q) with the round's own p and q."""
    rule = ("<b>Rule:</b> chain rejection sampling: the draft, drawn from q, is accepted when a coin "
            "u < min(1, p/q); after a rejection the correction is drawn from the residual norm(max(0, p − q))")
    return [rule, *_first_test(round_, index)]


def multi_draft_story(round_: Round, index: int) -> list[str]:
    """Multi-draft rejection sampling: the first sibling as a chain; a later one against the residual it met."""
    parent = round_.parents[index]
    rule = (f"<b>Rule:</b> multi-draft rejection sampling with residual: the {len(_children(round_, parent))} "
            "siblings here were drawn from q without replacement and are tested in draw order, the first against "
            "min(1, p/q); each rejection turns p into the residual norm(max(0, p − q)) and removes the rejected "
            "token from q before the next sibling is tested")
    test = sibling_test(round_, index)
    if test is None:
        return [rule, *_first_test(round_, index)]
    return [rule, *_residual_test(round_, index, test)]


def _first_test(round_: Round, index: int) -> list[str]:
    """p, q, min(1, p/q) and u for a draft tested against the target's own p (the first, or only, sibling)."""
    p, q = _at(round_.p_target, index), _at(round_.q_draft, index)
    draw = _draw_of(round_, index)
    if draw is None:
        return [f"p = {fmt_prob(p)} · q = {fmt_prob(q)} (never tested: no ratio, no coin)",
                f"<b>Why:</b> {NEVER_REACHED}."]
    ratio = None if p is None or q is None else (1.0 if q <= 0 else min(1.0, p / q))
    numbers = (f"p = {fmt_prob(p)} · q = {fmt_prob(q)} · p/q = {fmt_prob(None if ratio is None or q <= 0 else p / q)}"
               f" · min(1, p/q) = {fmt_prob(ratio)}")
    won = "<" if draw.get("accepted") else "≥"
    verdict = "accepted" if draw.get("accepted") else "rejected"
    why = (f"<b>Why:</b> the coin u = {fmt_prob(draw.get('u'))} {won} min(1, p/q) = {fmt_prob(draw.get('ratio'))}, "
           f"so it was {verdict}")
    if not draw.get("accepted"):
        later = [d for d in _coin_draws(round_, round_.parents[index]) if d is not draw]
        why += ("; the next sibling was then tested against the residual" if later else
                "; no sibling was left, so the correction was drawn from the residual norm(max(0, p − q))")
    return [f"{numbers} · u = {fmt_prob(draw.get('u'))}", why + "."]


def _residual_test(round_: Round, index: int, test: SiblingTest) -> list[str]:
    """What a later sibling met: its raw p and q, the residual p′ and the renormalised q′, their ratio and u."""
    row = round_.parents[index] + 1
    rejected = ", ".join(f"node {i} {escape(_token_text(round_, row, round_.tokens[i]))}" for i in test.rejected)
    removed = " − ".join(fmt_prob(_at(round_.q_draft, i)) for i in test.rejected)
    p, q = _at(round_.p_target, index), _at(round_.q_draft, index)
    facts = [f"tested after {rejected} {'was' if len(test.rejected) == 1 else 'were'} rejected: its own p = "
             f"{fmt_prob(p)} and q = {fmt_prob(q)} were no longer what the rule compared",
             f"q′ = q / (1 − {removed}) = {fmt_prob(test.q)}: the rejected siblings were removed from q"]
    if test.mass is not None:
        last = f"node {test.rejected[-1]}"
        if test.mass <= 0:
            tail = ", so nothing of the target's mass was left for it"
        elif test.p:
            tail = f", divided by the residual's total mass {fmt_prob(test.mass / test.p)}"
        else:
            tail = ""
        facts.append(f"p′ = norm(max(0, p − q)) of the p and q {last} was tested on: at this token max(0, p − q) = "
                     f"{fmt_prob(test.mass)}{tail}")
    if test.p is None:
        facts.append(f"p′ ≥ q′ = {fmt_prob(test.q)} (its normaliser is not recorded) · min(1, p′/q′) = "
                     f"{fmt_prob(test.ratio)} · u = {fmt_prob(test.u)}")
    else:
        facts.append(f"p′ = {fmt_prob(test.p)} · q′ = {fmt_prob(test.q)} · p′/q′ = "
                     f"{fmt_prob(test.p / test.q if test.q > 0 else None)} · min(1, p′/q′) = {fmt_prob(test.ratio)}"
                     f" · u = {fmt_prob(test.u)}")
    facts.append(_residual_line(test))
    won = "<" if test.accepted else "≥"
    facts.append(f"<b>Why:</b> the coin u = {fmt_prob(test.u)} {won} min(1, p′/q′) = {fmt_prob(test.ratio)}, so it "
                 f"was {'accepted' if test.accepted else 'rejected'}.")
    return facts


def _residual_line(test: SiblingTest) -> str:
    """The residual p′ drawn as its largest recorded entries (≤: the token's q is outside the draft's top-k)."""
    if not test.top:
        return ("the residual p′ cannot be rebuilt from the record here: an earlier normaliser is pinned only by a "
                "draw with 0 < min(1, p′/q′) < 1, and the round records the top-k rows, not the whole vocabulary")
    entries = " · ".join(f"{escape(_quoted(choice.text))} {'≤ ' if bound else ''}{fmt_prob(choice.p)}"
                         for choice, bound in test.top)
    note = (" (≤: an upper bound, the token's q or the normaliser is outside what the round records)"
            if any(bound for _, bound in test.top) else "")
    return f"the residual p′ it was tested against, largest recorded entries: {entries}{note}"


def _other_story(round_: Round, index: int) -> list[str]:
    draw = _draw_of(round_, index)
    verdict = "it was not reached" if draw is None else f"it was {'accepted' if draw.get('accepted') else 'rejected'}"
    return [f"<b>Rule:</b> {escape(round_.rule)}", f"<b>Why:</b> {verdict} (a rule this view does not explain)."]


STORIES: dict[str, Callable[[Round, int], list[str]]] = {
    "greedy": greedy_story,
    "target-sampling": target_sampling_story,
    "rejection-sampling": rejection_story,
}


def _no_coin(round_: Round) -> str:
    return f"<b>Draws:</b> {escape(NO_COIN[round_.rule])}; {escape(SHOW_DRAWS)}."


def _children(round_: Round, parent: int) -> list[int]:
    return [i for i, p in enumerate(round_.parents) if p == parent]


def _coin_draws(round_: Round, parent: int) -> list[dict]:
    """Rejection sampling's coin draws at ``parent``, in draw order."""
    return [d for d in round_.draws if d.get("parent") == parent and "u" in d and d.get("node") is not None]


def _draw_of(round_: Round, index: int) -> dict | None:
    return next((d for d in round_.draws if d.get("node") == index), None)


def _target_choice(round_: Round, index: int) -> int | None:
    """The token the target chose (argmax or sample) at the node's parent, if the walk got there."""
    parent = round_.parents[index]
    draw = next((d for d in round_.draws if d.get("parent") == parent and "target_token" in d), None)
    return None if draw is None else draw["target_token"]


def _p_at(round_: Round, row: int, token: int | None) -> float | None:
    return next((c.p for c in _at(round_.target_top, row) or [] if c.id == token), None)


# ---- the residual a later sibling met ---------------------------------------------------------------------------
@dataclass
class SiblingTest:
    """How rejection sampling tested a sibling drawn after rejected ones, rebuilt from the round: p′ and q′ are the
    residual and the renormalised q it met, not the round's raw p and q."""

    rejected: list[int]  # the siblings rejected before it, in draw order
    q: float  # q′ = q / (1 − Σ q of the rejected): siblings are drawn without replacement
    p: float | None  # p′ at its token = ratio · q′ (None: accepted at ratio 1, where only p′ ≥ q′ is known)
    mass: float | None  # max(0, p − q) at its token before the last normalisation, where the record pins it
    top: list[tuple[TokenChoice, bool]] | None  # p′'s largest recorded entries, True where only an upper bound
    u: float
    ratio: float
    accepted: bool


def sibling_test(round_: Round, index: int) -> SiblingTest | None:
    """The residual test of node ``index`` if rejection sampling drew it after rejected siblings, else None.

    ``accept.rejection_walk`` turns p into norm(max(0, p − q)) after each rejection and drops the rejected token from
    q. ``sampling.residual`` does that over the whole vocabulary, which the round does not record (only the nodes'
    p and q and the top-k rows), so the steps are replayed here over the recorded tokens, each normaliser read off
    a draw: a draw's ratio is p′/q′ at its token when below 1, which pins p′ there and so the normaliser.
    """
    parent = round_.parents[index]
    tested = _coin_draws(round_, parent)
    order = [d["node"] for d in tested]
    if round_.q_draft is None or index not in order or order.index(index) == 0:
        return None
    j = order.index(index)
    p_row, q_row = _row_probs(round_, parent + 1)
    kept = 1.0  # q′ = q / kept: the draft mass left once the rejected siblings are removed
    residual: dict[int, float] | None = dict(p_row)
    before: dict[int, float] | None = None
    mass = None
    for i in range(1, j + 1):
        before = None if residual is None else {t: max(0.0, v - q_row.get(t, 0.0) / kept) for t, v in residual.items()}
        kept -= round_.q_draft[order[i - 1]]
        token, ratio = round_.tokens[order[i]], float(tested[i].get("ratio", 1.0))
        pinned = tested[i].get("p")  # the residual's p′ at the token, recorded with the draw (newer traces)
        if pinned is None:  # older traces: a ratio below 1 is p′/q′, which pins p′
            pinned = ratio * round_.q_draft[order[i]] / kept if ratio < 1.0 and kept > 0 else None
        mass = None if before is None else before.get(token)
        residual = None if not (before and mass and pinned) else {t: v * pinned / mass for t, v in before.items()}
    draw = tested[j]
    q_prime = round_.q_draft[index] / kept if kept > 0 else round_.q_draft[index]
    ratio = float(draw.get("ratio", 1.0))
    if residual is not None:
        top = _largest(round_, parent + 1, residual, q_row)
    else:  # the last normaliser is not pinned: the exactly known entries' sum bounds it from below
        total = sum(v for t, v in (before or {}).items() if t in q_row)
        top = None if total <= 0 else [(choice, True) for choice, _ in _largest(
            round_, parent + 1, {t: v / total for t, v in before.items()}, q_row)]
    p_prime = draw.get("p", ratio * q_prime if ratio < 1.0 else None)
    return SiblingTest(rejected=order[:j], q=q_prime, p=p_prime, mass=mass,
                       top=top, u=float(draw.get("u", 0.0)), ratio=ratio, accepted=bool(draw.get("accepted")))


def _row_probs(round_: Round, row: int) -> tuple[dict[int, float], dict[int, float]]:
    """token → p and token → q at ``row`` as recorded: the top-k rows, with the nodes' own exact values."""
    p = {c.id: c.p for c in _at(round_.target_top, row) or []}
    q = {c.id: c.p for c in _at(round_.draft_top, row) or []}
    for child in _children(round_, row - 1):
        if _at(round_.p_target, child) is not None:
            p[round_.tokens[child]] = round_.p_target[child]
        if _at(round_.q_draft, child) is not None:
            q[round_.tokens[child]] = round_.q_draft[child]
    return p, q


def _largest(round_: Round, row: int, residual: dict[int, float], q_row: dict[int, float],
             count: int = 5) -> list[tuple[TokenChoice, bool]]:
    """The ``count`` largest residual entries; True marks an upper bound (q not recorded: taken as 0)."""
    ranked = sorted(((v, t) for t, v in residual.items() if v > 0), reverse=True)[:count]
    return [(TokenChoice(id=t, p=round(v, 6), text=_plain_text(round_, row, t)), t not in q_row) for v, t in ranked]


# ---- why the drafter proposed it --------------------------------------------------------------------------------
def why_proposed(round_: Round, index: int, *, context: Sequence[str] | None = None,
                 prompt_tokens: int | None = None) -> str:
    """Why the drafter proposed node ``index``, from what the round recorded: the lookup's match, the hybrid's
    source, a block's position, a head's (or draft model's) q, and its confidence."""
    reasons = []
    source = round_.meta.get("source")
    if isinstance(source, str):
        reasons.append(_hybrid_reason(round_, source))
    lookup = _at(round_.meta.get("lookup"), index)
    retrieved = _at(round_.meta.get("retrieval"), index)
    block = round_.meta.get("block")
    if isinstance(lookup, dict):
        reasons.append(_lookup_reason(round_, index, lookup, context, prompt_tokens))
    elif isinstance(retrieved, dict):
        reasons.append(_retrieval_reason(round_, retrieved))
    elif isinstance(_at(round_.meta.get("pool_origin"), index), str):
        reasons.append(_pool_reason(round_, index, _at(round_.meta.get("pool_origin"), index)))
    elif isinstance(block, dict):
        reasons.append(_block_reason(round_, index, block))
    elif round_.q_draft is not None:
        reasons.append(_q_reason(round_, index))
    confidence = _at(round_.confidence, index)
    if confidence is not None:
        reasons.append(_confidence_reason(round_, confidence, isinstance(lookup, dict), isinstance(retrieved, dict)))
    if not reasons:
        reasons.append("the drafter recorded no reason for it (no probability, no match)")
    return "<b>Why proposed:</b> " + "; ".join(reasons) + "."


def _hybrid_reason(round_: Round, source: str) -> str:
    if source == "lookup":
        return "the hybrid let its lookup draft this round: a prefix of the match paid more than its model's rounds"
    skipped = round_.meta.get("lookup_skipped")
    why = (f"its lookup's {skipped['n']}-gram match did not pay" if isinstance(skipped, dict) and "n" in skipped
           else "its lookup had no match worth verifying")
    return f"the hybrid let its model drafter {escape(_quoted(source))} draft this round ({why})"


def _lookup_reason(round_: Round, index: int, lookup: dict, context: Sequence[str] | None,
                   prompt_tokens: int | None) -> str:
    """The n-gram lookup's match: the context's last n tokens occurred before; the draft copies what followed."""
    n, source, depth = lookup.get("n"), lookup.get("from"), round_.depth[index]
    if not isinstance(n, int) or not isinstance(source, int):
        return "the n-gram lookup copied it from earlier in the text"
    start = source - depth + 1  # the copied continuation starts right after the earlier occurrence
    where = ("" if prompt_tokens is None else " in the prompt" if start <= prompt_tokens else
             " in the generated text")
    head = f"the n-gram lookup found the context's last {n} token{'s' if n != 1 else ''}"
    if context is None or start - n < 0 or source >= len(context):
        return (f"{head} earlier{where} (ending at context token {start - 1}) and drafted what followed there; this "
                f"node copies context token {source}")
    matched, followed = "".join(context[start - n:start]), "".join(context[start:source + 1])
    return (f"{head} {escape(_quoted(matched))} earlier{where} (context tokens {start - n}–{start - 1}) and drafted "
            f"what followed there, {escape(_quoted(followed))}; this node copies its token {depth} (context token "
            f"{source})")


def _retrieval_reason(round_: Round, node: dict) -> str:
    """The retrieval drafter's node: how often the stores continued the matched text with this path, and where."""
    match = round_.meta.get("retrieved") if isinstance(round_.meta.get("retrieved"), dict) else {}
    length, text = match.get("length"), match.get("text")
    matched = (f"the context's last {length} token{'s' if length != 1 else ''}" if isinstance(length, int)
               else "the context's end") + (f" ({escape(_quoted(text))})" if isinstance(text, str) else "")
    sources = node.get("sources") if isinstance(node.get("sources"), dict) else {}
    where = ", ".join(f"{escape(str(name))} {count}×" for name, count in sources.items())
    return (f"retrieval found {matched} {match.get('occurrences', '?')} times in its stores; {node.get('count', '?')} "
            f"of the {node.get('of', '?')} occurrences that reached this node's parent went on with this token"
            + (f" (from {where})" if where else ""))


def _pool_reason(round_: Round, index: int, origin: str) -> str:
    """Lookahead's node: an n-gram of its pool that starts with the last committed token."""
    window = round_.meta.get("lookahead") if isinstance(round_.meta.get("lookahead"), dict) else {}
    held = window.get("candidates")
    return (f"lookahead's n-gram pool held {held if isinstance(held, int) else 'some'} n-gram"
            f"{'' if held == 1 else 's'} starting with the last committed token; this node is token "
            f"{round_.depth[index]} of one of them, harvested from {escape(origin)}")


def _block_reason(round_: Round, index: int, block: dict) -> str:
    """A block drafter's node at depth d is the block's draft d, all drafted in one forward."""
    depth, q = round_.depth[index], _at(round_.q_draft, index)
    anchor = bool(block.get("anchor_predicts"))
    position = depth - 1 if anchor else depth
    return (f"the block drafter denoised its {block.get('size', '?')}-position block in one forward; this is draft "
            f"{depth} of {block.get('drafts', '?')}, predicted at block position {position}"
            + ("" if q is None else f", where the drafter gave it q = {fmt_prob(q)}"))


def _q_reason(round_: Round, index: int) -> str:
    """A model drafter's node: drawn from its q, or its rank in q (with the head or module that drafted it)."""
    labels = node_labels(round_)
    by = f"{escape(labels[index])}: " if labels and labels[index] != "lookup" else ""
    q, row = _at(round_.q_draft, index), round_.parents[index] + 1
    if round_.sampled:
        return f"{by}drawn at random from the drafter's q at its parent, where it had q = {fmt_prob(q)}"
    ranked = [c.id for c in _at(round_.draft_top, row) or []]
    token = round_.tokens[index]
    if token in ranked:
        rank = ranked.index(token) + 1
        place = "most likely token" if rank == 1 else f"{_ordinal(rank)} most likely token"
        return f"{by}the drafter's {place} at its parent (q = {fmt_prob(q)})"
    return f"{by}the drafter kept it at its parent with q = {fmt_prob(q)}"


def _confidence_reason(round_: Round, confidence: float, lookup: bool, retrieved: bool = False) -> str:
    if retrieved:
        return (f"its confidence ĉ = {fmt_prob(confidence)} is its path's score, the product of each step's "
                "frequency in the stores")
    if lookup and round_.meta.get("survival") is not None:
        return (f"its confidence ĉ = {fmt_prob(confidence)} is the chance, from how this run's earlier lookup "
                "drafts fared (½ with no evidence), that the drafts survive down to it")
    return f"drafter confidence ĉ = {fmt_prob(confidence)}"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def explain_pruned(round_: Round, index: int) -> tuple[str, go.Figure]:
    """A drafted node cut before verification (``meta["pruned"]``): why it was cut, its q and confidence against the
    verified nodes', and, where its parent was verified, what the target would have made of it."""
    record = shown_pruned(round_).get(index)
    if record is None:
        return '<div class="sv-muted">That node is not in this round.</div>', topk_figure([], None)
    token, text = record.get("token"), _pruned_text(record)
    parent = record.get("parent")
    where = ("the last committed token" if parent == -1 else f"node {parent}" if isinstance(parent, int)
             else f"pruned node {record.get('pruned_parent')}")
    reason = str(record.get("reason") or "drafted, then cut to the node budget")
    facts = [f"<b>pruned (not verified)</b> token <code>{escape(_quoted(text))}</code> (id {token}), round "
             f"{round_.index}, drafted after {escape(where)}",
             f"q_draft = {fmt_prob(record.get('q'))} · drafter confidence = {fmt_prob(record.get('confidence'))}"]
    if round_.confidence:
        facts.append(f"the verified nodes' confidence went down to {fmt_prob(min(round_.confidence))}: the drafter "
                     "kept the ones it was surer of")
    row = parent + 1 if isinstance(parent, int) else None
    target_top = round_.target_top[row] if row is not None and row < len(round_.target_top) else []
    draft_top = (round_.draft_top[row] if row is not None and round_.draft_top is not None
                 and row < len(round_.draft_top) else None)
    p = next((c.p for c in target_top if c.id == token), None)
    if target_top:
        best = target_top[0]
        facts.append(f"its parent was verified: there the target gives it p = {fmt_prob(p)}"
                     + (" (outside the recorded top-k)" if p is None else "")
                     + ("; it is the target's top token there" if best.id == token else
                        f"; the target's top token was {escape(_quoted(best.text))}"))
    facts.append(f"<b>Why:</b> {escape(reason)}. The target never saw it, so no accept rule judged it.")
    html = "<ul class=\"sv-facts\">" + "".join(f"<li>{f}</li>" for f in facts) + "</ul>"
    title = (f"target top-k vs draft top-k at {where} (round {round_.index})" if target_top else
             "never verified: its parent was cut too, so the target computed nothing here")
    figure = topk_figure(target_top, draft_top, highlight=token if isinstance(token, int) else None,
                         highlight_text=text, highlight_p=p, highlight_q=record.get("q"), title=title)
    return html, figure


def _why_extra(round_: Round, outcome: Outcome, parent: int) -> str:
    if outcome is Outcome.BONUS:
        return ("<b>Why:</b> every draft on the path was accepted down to a leaf, so the target's next token at "
                "the leaf comes free with the same forward pass.")
    source = ("the residual norm(max(0, p − q))" if round_.residual_top else "the target's argmax"
              if round_.rule == "greedy" else "the target's distribution p")
    where = "the root" if parent < 0 else f"node {parent}"
    taken = "taken as" if round_.rule == "greedy" and not round_.residual_top else "drawn from"
    return (f"<b>Why:</b> no child of {where} was accepted, so the target's own token ({taken} {source}) "
            "replaces the draft.")
