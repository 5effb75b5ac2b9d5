"""The draft tree of one round: networkx lays it out, plotly draws it, coloured by what the target did.

Depth runs left to right (token labels are wide, trees are shallow); siblings stack top to bottom in draft order.
The correction or bonus token is its own node, hanging off the last accepted node, so the committed path reads
root → accepted … → extra along the highlighted edges. A chain is the same picture with one child per node.
Dynamic trees (EAGLE-2) also report the nodes they drafted and then pruned to the node budget
(``Round.meta["pruned"]``): those hang faded off their parents, the most confident ``MAX_PRUNED_SHOWN`` of them.
Drafters that label their nodes (Medusa by head, MTP by module; ``specviz.viz.labels``) get the label in each
node's hover text and above each depth column, so "depth d comes from head d" can be read off the picture.
"""

from __future__ import annotations

import networkx as nx
import plotly.graph_objects as go

from specviz.engine.round import Round
from specviz.viz import labels
from specviz.viz.charts import LABEL_PX, TITLE_PX
from specviz.viz.outcome import OUTCOME_COLORS, OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.text import fmt_prob, label
from specviz.viz.text import plot_escape as escape

ROOT, EXTRA = "root", "extra"
ROOT_COLOR = "#444444"
EDGE_COLOR = "#c8c8c8"
PRUNED_COLOR = "#e4e4e4"
#: Pruned nodes drawn per round, most confident first (a set closed under parents: a child is never more confident).
MAX_PRUNED_SHOWN = 40
LEGEND_ORDER = (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.UNREACHED, Outcome.CORRECTION, Outcome.BONUS)
MAX_HEIGHT_PX, ROW_PX, FRAME_PX = 900, 26, 100
#: Below this many pixels per leaf row, labels of nodes the target never judged (never reached, pruned) are left to
#: the hover text: at the node budget's upper end they would print over each other in an unreadable smear.
MIN_LABEL_ROW_PX = 16
#: The strip at the top where gr.Plot lays its label over the figure, and one title line's height.
LABEL_STRIP_PX, TITLE_LINE_PX = 30, 20


def figure_height(rows: float) -> int:
    """Pixels for a tree with ``rows`` leaf rows: ``ROW_PX`` a row, within [280, ``MAX_HEIGHT_PX``]."""
    return int(min(MAX_HEIGHT_PX, max(280, FRAME_PX + ROW_PX * rows)))


def row_px(height: int, rows: float) -> float:
    """Vertical pixels per leaf row at ``height``."""
    return (height - FRAME_PX) / max(rows, 1)


def tree_graph(round_: Round) -> nx.DiGraph:
    """Root, draft nodes 0..n-1 and the extra token, with edges parent → child in draft order."""
    graph = nx.DiGraph()
    graph.add_node(ROOT)
    for node, parent in enumerate(round_.parents):
        graph.add_edge(ROOT if parent < 0 else parent, node)
    graph.add_edge(round_.accepted[-1] if round_.accepted else ROOT, EXTRA)
    for index, node in shown_pruned(round_).items():
        parent = node["parent"]
        source = ("pruned", node["pruned_parent"]) if parent is None else (ROOT if parent < 0 else parent)
        graph.add_edge(source, ("pruned", index))
    return graph


def shown_pruned(round_: Round) -> dict[int, dict]:
    """The pruned nodes drawn: ``meta["pruned"]`` index -> record, the most confident first, parents included."""
    pruned = round_.meta.get("pruned") or []
    order = sorted(range(len(pruned)), key=lambda i: (-pruned[i].get("confidence", 0.0), i))
    chosen = set(order[:MAX_PRUNED_SHOWN])
    return {i: pruned[i] for i in sorted(chosen)
            if pruned[i]["parent"] is not None or pruned[i]["pruned_parent"] in chosen}


def tree_layout(round_: Round) -> tuple[nx.DiGraph, dict]:
    """A tidy layout: x = depth, leaves on consecutive rows (depth-first order), a parent centred on its children."""
    graph = tree_graph(round_)
    depth = nx.shortest_path_length(graph, ROOT)
    pos: dict = {}
    next_row = 0
    for node in nx.dfs_postorder_nodes(graph, ROOT):
        children = list(graph.successors(node))
        if children:
            y = (pos[children[0]][1] + pos[children[-1]][1]) / 2
        else:
            y, next_row = float(next_row), next_row + 1
        pos[node] = (float(depth[node]), y)
    return graph, pos


def _target_p(round_: Round, row: int, token: int) -> float | None:
    """The target's probability of ``token`` at a verified row, if it is in the recorded top-k."""
    if row < len(round_.target_top):
        for choice in round_.target_top[row]:
            if choice.id == token:
                return choice.p
    return None


def _node_hover(round_: Round, node: int, outcome: Outcome, drafted_by: str | None = None) -> str:
    p = round_.p_target[node] if node < len(round_.p_target) else None
    q = round_.q_draft[node] if round_.q_draft is not None else None
    lines = [
        f"<b>node {node}</b> · depth {round_.depth[node]}" + (f" · {escape(drafted_by)}" if drafted_by else "")
        + f" · {OUTCOME_LABELS[outcome]}",
        f"token {escape(repr(round_.text[node]) if node < len(round_.text) else '?')} (id {round_.tokens[node]})",
    ]
    if q is None:
        lines.append(f"q_draft — (deterministic draft: q = 1) · p_target {fmt_prob(p)}")
    else:
        lines.append(f"q_draft {fmt_prob(q)} · p_target {fmt_prob(p)}")
    lines.append(_accept_test(round_, node, p, q))
    if round_.confidence is not None:
        lines.append(f"confidence {fmt_prob(round_.confidence[node])} (the drafter's estimate that the path to here "
                     "survives)")
    row = node + 1
    if row < len(round_.target_entropy):
        lines.append(f"target entropy after it {round_.target_entropy[row]:.2f} nats")
    return "<br>".join(lines)


def _accept_test(round_: Round, node: int, p: float | None, q: float | None) -> str:
    """The test this round's accept rule applies to a node: min(1, p/q) is rejection sampling's alone; greedy takes
    the target's argmax and target sampling the token it draws, so printing min(1, p/q) there would be misleading."""
    if round_.rule == "greedy":
        row = round_.parents[node] + 1
        top = round_.target_top[row][0] if row < len(round_.target_top) and round_.target_top[row] else None
        best = f": {escape(repr(top.text))}" if top is not None else ""
        return f"greedy: accepted only if it is the target's argmax here{best}"
    if round_.rule == "target-sampling":
        return f"target sampling: accepted if the target draws it, probability p = {fmt_prob(p)}"
    coins = [d for d in round_.draws if d.get("parent") == round_.parents[node] and "u" in d]
    earlier = next((i for i, d in enumerate(coins) if d.get("node") == node), 0)
    if earlier:  # tested after rejected siblings: against the residual, not the p and q shown above
        return (f"accept probability min(1, p′/q′) = {fmt_prob(coins[earlier].get('ratio'))}, against the residual "
                f"left by {earlier} rejected sibling{'s' if earlier > 1 else ''}")
    ratio = p if q is None else None if p is None else 1.0 if q <= 0 else min(1.0, p / q)
    return f"accept probability min(1, p/q) = {fmt_prob(ratio)}"


def _extra_hover(round_: Round) -> str:
    parent = round_.accepted[-1] if round_.accepted else -1
    p = _target_p(round_, parent + 1, round_.extra_token)
    kind = round_.extra_kind
    why = ("every draft child here was rejected; the target's own token replaces them" if kind == "correction"
           else "the walk reached a leaf: the target's next token comes free")
    outside = " (outside the recorded top-k)" if p is None else ""
    lines = [f"<b>{kind}</b> token {escape(repr(round_.extra_text))} (id {round_.extra_token})",
             f"p_target {fmt_prob(p)}{outside}", escape(why)]
    if kind == "correction" and round_.residual_top:
        lines.append("drawn from the residual norm(max(0, p − q))")
    if round_.extra_token not in round_.committed[len(round_.accepted):]:
        lines.append("not committed (generation ended first)")
    return "<br>".join(lines)


def _pruned_hover(node: dict, text: str) -> str:
    drafted_by = labels.pruned_label(node)
    by = f" · {escape(drafted_by)}" if drafted_by else ""
    why = escape(str(node.get("reason") or "drafted, then cut to the node budget"))
    return "<br>".join([f"<b>pruned</b> · depth {node['depth']}{by} · {why}",
                        f"token {escape(repr(text))} (id {node['token']})",
                        f"q_draft {fmt_prob(node['q'])} · confidence {fmt_prob(node['confidence'])}",
                        "never verified: the target did not see it"])


def _root_hover(round_: Round, root_text: str | None) -> str:
    lines = [f"<b>round {round_.index}</b> · rule {escape(round_.rule)}" + ("" if round_.lossless else " (LOSSY)"),
             f"drafted {len(round_.tokens)} · accepted {len(round_.accepted)} · committed {len(round_.committed)}",
             f"draft {round_.draft_ms:.1f} ms · verify {round_.verify_ms:.1f} ms · other {round_.other_ms:.1f} ms"]
    if root_text is not None:
        lines.insert(1, f"last committed token {escape(repr(root_text))}")
    schedule = round_.meta.get("schedule")
    if isinstance(schedule, dict) and isinstance(schedule.get("values"), list):
        drafted = len(round_.tokens) + len(round_.meta.get("pruned") or [])
        values = " · ".join(f"ℓ={i + 1}: {v:.2f}" for i, v in enumerate(schedule["values"]) if isinstance(v, float))
        lines.append(f"confidence schedule: verify {schedule.get('length')} of {drafted} drafts, the ℓ that maximises "
                     f"(1 + Σ survival) ÷ cost(1 + ℓ)<br>{escape(values)} (cost: {escape(str(schedule.get('curve')))})")
        bar = schedule.get("fallback_value", schedule.get("plain_value"))  # plain_value: traces before the rename
        if isinstance(bar, float):  # a drafter that may verify nothing (ngram:auto)
            fallback = escape(str(schedule.get("fallback") or "a plain step"))
            lines.append(f"ℓ=0 ({fallback}): {bar:.2f}; verified only where a prefix beats it")
    skipped = round_.meta.get("lookup_skipped")
    if isinstance(skipped, dict) and all(isinstance(skipped.get(k), int | float) for k in ("n", "value", "bar")):
        lines.append(f"lookup sat out: its {skipped['n']}-gram match was worth {skipped['value']:.3f} tokens/ms, "
                     f"under the {skipped['bar']:.3f} of {escape(str(skipped.get('against')))}")
    return "<br>".join(lines)


def tree_figure(round_: Round | None, *, root_text: str | None = None, selected: int | str | None = None,
                title: str | None = None, height: int | None = None) -> go.Figure:
    """Plotly figure of one round's draft tree. ``selected`` (a node index or ``"extra"``) gets a ring."""
    spec = tree_spec(round_, root_text=root_text, selected=selected, title=title, height=height)
    return go.Figure(spec, skip_invalid=True)


def tree_spec(round_: Round | None, *, root_text: str | None = None, selected: int | str | None = None,
              title: str | None = None, height: int | None = None) -> dict:
    """The same figure as a plain plotly JSON dict (what a streamed update sends; no validation pass)."""
    if round_ is None:
        return empty_spec(title or "no round yet")
    graph, pos = tree_layout(round_)
    outcomes = node_outcomes(round_)
    kind_of = {node: outcome for node, outcome in enumerate(outcomes)}
    kind_of[EXTRA] = Outcome(round_.extra_kind)
    path_nodes = {ROOT, *round_.accepted, EXTRA}
    drafted_by = labels.node_labels(round_)

    edges_x: list = []
    edges_y: list = []
    faint_x: list = []
    faint_y: list = []
    path_x: list = []
    path_y: list = []
    for parent, child in graph.edges:
        (x0, y0), (x1, y1) = pos[parent], pos[child]
        if parent in path_nodes and child in path_nodes:
            path_x += [x0, x1, None]
            path_y += [y0, y1, None]
        elif isinstance(child, tuple) or kind_of.get(child) is Outcome.UNREACHED:
            faint_x += [x0, x1, None]
            faint_y += [y0, y1, None]
        else:
            edges_x += [x0, x1, None]
            edges_y += [y0, y1, None]
    traces: list[dict] = [
        dict(type="scatter", x=edges_x, y=edges_y, mode="lines", hoverinfo="skip", showlegend=False,
             line=dict(color=EDGE_COLOR, width=1.5)),
        dict(type="scatter", x=faint_x, y=faint_y, mode="lines", hoverinfo="skip", showlegend=False,
             line=dict(color=EDGE_COLOR, width=1, dash="dot")),
        dict(type="scatter", x=path_x, y=path_y, mode="lines", hoverinfo="skip", name="accepted path",
             line=dict(color=OUTCOME_COLORS[Outcome.ACCEPTED], width=4)),
    ]
    if selected is not None and selected in pos:  # under the nodes: on top, the ring would cross out its label
        sx, sy = pos[selected]  # a pruned node's dot is smaller: a full-size ring crossed out its faint label
        traces.append(dict(type="scatter", x=[sx], y=[sy], mode="markers", hoverinfo="skip", showlegend=False,
                           name="selected", marker=dict(size=18 if isinstance(selected, tuple) else 28,
                                                        color="rgba(0,0,0,0)",
                                                        line=dict(color="#111111", width=2.5))))
    rows = 1 + max(y for _, y in pos.values())
    height = height or figure_height(rows)
    crowded = row_px(height, rows) < MIN_LABEL_ROW_PX
    dot = max(6, min(14, int(row_px(height, rows))))  # unlabelled dots shrink to the row pitch
    root_label = label(root_text) if root_text is not None else "▶"
    x, y = pos[ROOT]
    traces.append(dict(type="scatter", x=[x], y=[y], mode="markers+text", text=[root_label],
                       textposition="middle left", hovertext=[_root_hover(round_, root_text)], hoverinfo="text",
                       name="context", showlegend=False,
                       marker=dict(size=14, color=ROOT_COLOR, symbol="diamond")))
    for outcome in LEGEND_ORDER:
        members = [n for n, kind in kind_of.items() if kind is outcome]
        texts, hovers = [], []
        for node in members:
            if node == EXTRA:
                texts.append(label(round_.extra_text))
                hovers.append(_extra_hover(round_))
            else:
                texts.append(label(round_.text[node] if node < len(round_.text) else str(round_.tokens[node])))
                hovers.append(_node_hover(round_, node, outcome, drafted_by[node] if drafted_by else None))
        quiet = crowded and outcome is Outcome.UNREACHED
        traces.append(dict(
            type="scatter", x=[pos[n][0] for n in members], y=[pos[n][1] for n in members],
            mode="markers" if quiet else "markers+text", text=texts, textposition="middle right", hovertext=hovers,
            hoverinfo="text", name=OUTCOME_LABELS[outcome], legendgroup=outcome.value,
            marker=dict(size=[18 if n == EXTRA else dot if quiet else 14 for n in members],
                        color=OUTCOME_COLORS[outcome], symbol=["star" if n == EXTRA else "circle" for n in members],
                        line=dict(color="#ffffff", width=1)),
            textfont=dict(color="#222222", size=LABEL_PX),
        ))
    pruned = [node for node in graph.nodes if isinstance(node, tuple)]
    if pruned:
        records = round_.meta["pruned"]
        texts = [records[i].get("text", f"#{records[i]['token']}") for _, i in pruned]
        traces.append(dict(
            type="scatter", x=[pos[n][0] for n in pruned], y=[pos[n][1] for n in pruned],
            mode="markers" if crowded else "markers+text",
            text=[label(t) for t in texts], textposition="middle right", hoverinfo="text", name="pruned (not verified)",
            hovertext=[_pruned_hover(records[i], t) for (_, i), t in zip(pruned, texts, strict=True)],
            marker=dict(size=min(10, dot), color=PRUNED_COLOR, line=dict(color="#bbbbbb", width=1)),
            textfont=dict(color="#8c8c8c", size=LABEL_PX)))
    columns = max(x for x, _ in pos.values())
    column_labels = [dict(text=escape(text), x=depth, y=1.0, xref="x", yref="paper", yanchor="bottom",
                          showarrow=False, font=dict(size=LABEL_PX, color="#444444"))
                     for depth, text in labels.depth_labels(round_).items()]
    # two short lines: on a 390 px phone one line of it ran off the figure's right edge
    heading = escape(title) if title is not None else (
        f"<b>round {round_.index}</b><br>{len(round_.tokens)} drafted, {len(round_.accepted)} accepted, "
        f"+1 {escape(round_.extra_kind)}")
    lines = 1 + heading.count("<br>")
    top = LABEL_STRIP_PX + 12 + TITLE_LINE_PX * lines + (LABEL_PX + 12 if column_labels else 8)
    height += top - (64 if column_labels else 40)  # the plot area keeps the height its rows asked for
    # the title sits below the strip where gr.Plot lays its label over the figure (plotly sets a two-line title's
    # top about 15 px above its anchor: measured in Chromium, tests/browser)
    layout = dict(
        title=dict(text=heading, x=0.01, xanchor="left", y=1 - (LABEL_STRIP_PX + 20) / height, yref="container",
                   yanchor="top", font=dict(size=TITLE_PX, family="system-ui, sans-serif")),
        height=height,
        margin=dict(l=60, r=20, t=top, b=10),
        annotations=column_labels,
        showlegend=True,
        legend=dict(orientation="h", x=0, y=0, yanchor="top", font=dict(size=LABEL_PX)),
        xaxis=dict(visible=False, range=[-0.6, columns + 0.9], fixedrange=False),
        yaxis=dict(visible=False, autorange="reversed"),
        plot_bgcolor="#ffffff",
        paper_bgcolor="#ffffff",
        hovermode="closest",
        hoverlabel=dict(align="left"),
        font=dict(family="ui-monospace, SFMono-Regular, Menlo, monospace", size=LABEL_PX, color="#222222"),
    )
    return dict(data=traces, layout=layout)


def empty_spec(message: str) -> dict:
    layout = dict(height=260, margin=dict(l=10, r=10, t=40, b=10), xaxis=dict(visible=False),
                  yaxis=dict(visible=False), plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
                  annotations=[dict(text=escape(message), x=0.5, y=0.5, xref="paper", yref="paper",
                                    showarrow=False, font=dict(size=TITLE_PX, color="#555555"))])
    return dict(data=[], layout=layout)
