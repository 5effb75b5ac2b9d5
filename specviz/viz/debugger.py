"""The rejection debugger: for one node of one round, everything the accept rule looked at.

Row ``parent + 1`` of ``target_top`` / ``draft_top`` / ``target_entropy`` is the distribution the node was drafted
from and judged against; ``draws`` at that parent are the rule's actual decisions; ``residual_top`` is where a
correction was sampled from when it was not p itself.
"""

from __future__ import annotations

import plotly.graph_objects as go

from specviz.engine.round import Round
from specviz.viz.charts import topk_figure
from specviz.viz.labels import node_labels
from specviz.viz.outcome import OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.text import escape, fmt_prob, visible


def _quoted(text: str) -> str:
    return f"“{visible(text)}”"

EXTRA = "extra"

RULE_TEXT = {
    "greedy": "greedy: a draft token is accepted iff it is the target's argmax at its parent",
    "target-sampling": "target sampling: the target draws y ~ p at the parent; the child whose token is y is "
                       "accepted (so a deterministic draft token survives with probability p)",
    "rejection-sampling": "rejection sampling: each drawn child is accepted with probability min(1, p/q); after a "
                          "rejection p ← norm(max(0, p − q)) and the next sibling is tested",
}


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
    return choices


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
    for rows in (round_.target_top, round_.draft_top or []):
        if row < len(rows):
            for choice in rows[row]:
                if choice.id == token:
                    return _quoted(choice.text)
    for i, t in enumerate(round_.tokens):
        if t == token and i < len(round_.text):
            return _quoted(round_.text[i])
    if token == round_.extra_token:
        return _quoted(round_.extra_text)
    return f"id {token}"


def draws_table(round_: Round, parent: int) -> str:
    """The accept rule's decisions at ``parent`` (-1 = root), as an HTML table."""
    rows = [d for d in round_.draws if d.get("parent") == parent]
    if not rows:
        return '<div class="sv-note">The accept rule made no decision here (the walk never reached this parent).</div>'
    body = []
    for d in rows:
        node = d.get("node")
        if node is None:
            node_text = "none matched"
        else:
            node_text = f"node {node} {escape(_token_text(round_, parent + 1, round_.tokens[node]))}"
        if "u" in d:
            test = f"u = {fmt_prob(d['u'])} {'<' if d['accepted'] else '≥'} min(1, p/q) = {fmt_prob(d.get('ratio'))}"
        else:
            test = f"target chose {escape(_token_text(round_, parent + 1, d.get('target_token')))}"
        verdict = "accepted" if d.get("accepted") else "rejected"
        body.append(f"<tr><td>{node_text}</td><td>{test}</td><td><b>{verdict}</b></td></tr>")
    return ('<table class="sv-table"><tr><th>candidate</th><th>draw</th><th>result</th></tr>'
            f'{"".join(body)}</table>')


def explain(round_: Round | None, node: str | None) -> tuple[str, go.Figure]:
    """HTML explanation and the target-vs-draft top-k figure for ``node`` (an index as text, or ``"extra"``)."""
    if round_ is None or node is None:
        return '<div class="sv-muted">Pick a round and a node.</div>', topk_figure([], None, title="no node selected")
    if node == EXTRA:
        parent = round_.accepted[-1] if round_.accepted else -1
        token, text = round_.extra_token, round_.extra_text
        outcome = Outcome(round_.extra_kind)
        p = next((c.p for c in (round_.target_top[parent + 1] if parent + 1 < len(round_.target_top) else [])
                  if c.id == token), None)
        q = None
    else:
        index = int(node)
        if not 0 <= index < len(round_.tokens):
            return '<div class="sv-muted">That node is not in this round.</div>', topk_figure([], None)
        parent = round_.parents[index]
        token = round_.tokens[index]
        text = round_.text[index] if index < len(round_.text) else str(token)
        outcome = node_outcomes(round_)[index]
        p = round_.p_target[index] if index < len(round_.p_target) else None
        q = round_.q_draft[index] if round_.q_draft is not None else None
    row = parent + 1
    target_top = round_.target_top[row] if row < len(round_.target_top) else []
    draft_top = round_.draft_top[row] if round_.draft_top is not None and row < len(round_.draft_top) else None
    entropy = round_.target_entropy[row] if row < len(round_.target_entropy) else None
    residual = round_.residual_top if (node == EXTRA and outcome is Outcome.CORRECTION) else None

    facts = [f"<b>{escape(OUTCOME_LABELS[outcome])}</b> token <code>{escape(_quoted(text))}</code> (id {token}), "
             f"round {round_.index}, drafted after {'the last committed token' if parent < 0 else f'node {parent}'}"]
    if node != EXTRA:
        if q is None:
            facts.append(f"p_target = {fmt_prob(p)} · q_draft = — (deterministic draft: q is a point mass, so "
                         f"min(1, p/q) = p = {fmt_prob(p)})")
        else:
            ratio = None if p is None else (1.0 if q <= 0 else min(1.0, p / q))
            facts.append(f"p_target = {fmt_prob(p)} · q_draft = {fmt_prob(q)} · p/q = "
                         f"{fmt_prob(None if p is None or q <= 0 else p / q)} · min(1, p/q) = {fmt_prob(ratio)}")
        if round_.confidence is not None:
            facts.append(f"drafter confidence = {fmt_prob(round_.confidence[int(node)])}")
    else:
        facts.append(f"p_target = {fmt_prob(p)}" + (" (outside the recorded top-k)" if p is None else ""))
    if entropy is not None:
        facts.append(f"target entropy at this position = {entropy:.2f} nats "
                     f"({'confident' if entropy < 1.0 else 'uncertain' if entropy > 3.0 else 'moderate'})")
    facts.append(escape(RULE_TEXT.get(round_.rule, f"rule {round_.rule}")) + ("" if round_.lossless else " (LOSSY)"))
    facts.append(_why(round_, outcome, node, parent, p, q))
    html = "<ul class=\"sv-facts\">" + "".join(f"<li>{f}</li>" for f in facts) + "</ul>"
    html += '<div class="sv-subhead">Decisions of the accept rule at this position</div>'
    html += draws_table(round_, parent)
    if residual:
        html += ('<div class="sv-note">The correction was sampled from the residual distribution '
                 'norm(max(0, p − q)) shown in orange.</div>')
    title = f"target top-k vs draft top-k at {'the root' if parent < 0 else f'node {parent}'} (round {round_.index})"
    figure = topk_figure(target_top, draft_top, residual, highlight=token, highlight_text=text, highlight_p=p,
                         highlight_q=q, title=title)
    return html, figure


def _why(round_: Round, outcome: Outcome, node: str, parent: int, p: float | None, q: float | None) -> str:
    if outcome is Outcome.UNREACHED:
        return ("<b>Why:</b> never reached: an ancestor was rejected (or, under rejection sampling, an earlier sibling "
                "was accepted), so the rule never tested it. Its p_target was still computed, because the whole tree "
                "is verified in one forward pass.")
    if outcome is Outcome.ACCEPTED:
        return "<b>Why:</b> the rule took it; see the decision table below."
    if outcome is Outcome.BONUS:
        return ("<b>Why:</b> every draft on the path was accepted down to a leaf, so the target's next token at "
                "the leaf comes free with the same forward pass.")
    if outcome is Outcome.CORRECTION:
        source = "the residual norm(max(0, p − q))" if round_.residual_top else "the target's distribution p"
        where = "the root" if parent < 0 else f"node {parent}"
        return (f"<b>Why:</b> no child of {where} was accepted, so the target's own token (drawn from {source}) "
                "replaces the draft.")
    chosen = next((d for d in round_.draws if d.get("parent") == parent and "target_token" in d), None)
    if round_.rule == "greedy" and chosen is not None:
        target_text = escape(_token_text(round_, parent + 1, chosen.get("target_token")))
        return f"<b>Why:</b> the target's argmax here is {target_text}, not this token (p_target {fmt_prob(p)})."
    if round_.rule == "target-sampling" and chosen is not None:
        target_text = escape(_token_text(round_, parent + 1, chosen.get("target_token")))
        return (f"<b>Why:</b> the target sampled {target_text}; this token would have survived with probability "
                f"p = {fmt_prob(p)}.")
    draw = next((d for d in round_.draws if d.get("node") == int(node)), None) if node != EXTRA else None
    if draw is not None and "u" in draw:
        return (f"<b>Why:</b> the coin u = {fmt_prob(draw['u'])} was not below min(1, p/q) = "
                f"{fmt_prob(draw.get('ratio'))}.")
    return "<b>Why:</b> the target examined it and did not take it."
