"""The rejection debugger: for one node of one round, everything the accept rule looked at.

Row ``parent + 1`` of ``target_top`` / ``draft_top`` / ``target_entropy`` is the distribution the node was drafted
from and judged against; ``draws`` at that parent are the rule's actual decisions; ``residual_top`` is where a
correction was sampled from when it was not p itself.
"""

from __future__ import annotations

import plotly.graph_objects as go

from specviz.engine.round import Round
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
        if "u" in d:
            test = f"u = {fmt_prob(d['u'])} {'<' if d['accepted'] else '≥'} min(1, p/q) = {fmt_prob(d.get('ratio'))}"
        else:
            test = f"target chose {escape(_token_text(round_, parent + 1, d.get('target_token')))}"
        verdict = "accepted" if d.get("accepted") else "rejected" if node is not None else "no draft taken"
        body.append(f"<tr><td>{node_text}</td><td>{test}</td><td><b>{verdict}</b></td></tr>")
    return ('<table class="sv-table"><tr><th>candidate</th><th>draw</th><th>result</th></tr>'
            f'{"".join(body)}</table>')


def explain(round_: Round | None, node: str | None) -> tuple[str, go.Figure]:
    """HTML explanation and the target-vs-draft top-k figure for ``node`` (an index as text, or ``"extra"``)."""
    if round_ is None or node is None:
        return '<div class="sv-muted">Pick a round and a node.</div>', topk_figure([], None, title="no node selected")
    if node.startswith(PRUNED):
        return explain_pruned(round_, int(node[len(PRUNED):]))
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

    after = "the last committed token" if parent < 0 else f"node {parent}"
    origin = f"the target's own token after {after}" if node == EXTRA else f"drafted after {after}"
    facts = [f"<b>{escape(OUTCOME_LABELS[outcome])}</b> token <code>{escape(_quoted(text))}</code> (id {token}), "
             f"round {round_.index}, {origin}"]
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
        source = ("the residual norm(max(0, p − q))" if round_.residual_top else "the target's argmax"
                  if round_.rule == "greedy" else "the target's distribution p")
        where = "the root" if parent < 0 else f"node {parent}"
        taken = "taken as" if round_.rule == "greedy" and not round_.residual_top else "drawn from"
        return (f"<b>Why:</b> no child of {where} was accepted, so the target's own token ({taken} {source}) "
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
