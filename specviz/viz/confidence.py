"""The drafter's confidence: one round's block as a row of positions, and the run's reliability diagram.

Left: the round's chain drafts position by position (the verified ones and, for DSpark, the ones its schedule cut
before verification, from ``Round.meta["pruned"]``): each position's draft probability q as a bar coloured by what
the target did, the drafter's own confidence ĉ_k in the token given the ones before it, and the prefix survival
s_k = ĉ_1 ⋯ ĉ_k. A scheduled round (``meta["schedule"]``) adds the cut ℓ and, on the right axis, the two curves the
choice weighed: the verify cost cost(1 + ℓ) relative to ℓ = 1 and the expected tokens per millisecond
(1 + Σ s) ÷ cost(1 + ℓ) relative to its best. Rounds come from live runs and from uploaded traces alike, so every
field is read defensively: a hand-edited trace with odd values draws less, never fails.

Right: every judged draft of the run so far, predicted confidence against realised acceptance in ten bins, with
the expected calibration error (``specviz.engine.metrics.calibration``; the formula is ``FORMULAS["calibration"]``),
and, for a greedy DSpark run whose checkpoint ships one, the curve its calibration started from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specviz.engine.metrics import Calibration, calibration
from specviz.engine.round import Round
from specviz.viz.charts import FONT, LABEL_PX, TITLE_PX, _axis
from specviz.viz.outcome import OUTCOME_COLORS, OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.text import label
from specviz.viz.text import plot_escape as escape

CUT_COLOR = "#e4e4e4"
#: Height of the label strip gr.Plot lays over the figure's top-left corner: the panel titles sit below it.
LABEL_STRIP_PX = 28
TITLE_LINE_PX = 20
CONFIDENCE_COLOR, SURVIVAL_COLOR, COST_COLOR, VALUE_COLOR = "#332288", "#AA4499", "#999999", "#117733"


def _number(value) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _at(values, index: int) -> float | None:
    return _number(values[index]) if isinstance(values, list) and index < len(values) else None


def _meta(round_: Round) -> dict:
    return round_.meta if isinstance(round_.meta, dict) else {}


def block_positions(round_: Round) -> list[dict]:
    """The round's chain, verified drafts then cut ones: ``{"depth", "token", "text", "q", "c", "s", "outcome"}``.

    ``c`` is the ĉ the survival multiplies: DSpark's confidence head recalibrated on the run (``meta["calibrated"]``,
    with the head's own value in ``head``), or the head's where it was not recalibrated (``meta["confidence_head"]``),
    else the ratio of consecutive survivals; ``outcome`` is an ``Outcome`` value, or ``"cut"`` for a draft never
    verified (only a confidence-scheduled round's cut tail: other drafters' pruned nodes are siblings, drawn in the
    tree).
    """
    meta = _meta(round_)
    outcomes = node_outcomes(round_)
    rows = [{"depth": i + 1, "token": token, "text": round_.text[i] if i < len(round_.text) else str(token),
             "q": _at(round_.q_draft, i), "s": _at(round_.confidence, i), "outcome": outcomes[i].value}
            for i, token in enumerate(round_.tokens)]
    cut = meta.get("pruned") if isinstance(meta.get("schedule"), dict) and isinstance(meta.get("pruned"), list) else []
    tail = {}
    for node in cut:
        depth = _number(node.get("depth")) if isinstance(node, dict) else None
        if depth is not None and depth == int(depth) and depth > len(rows):
            tail[int(depth)] = node
    for depth in sorted(tail):
        if depth != len(rows) + 1:
            break  # a gap: not a tail hanging off the chain
        node = tail[depth]
        rows.append({"depth": depth, "token": node.get("token"), "text": str(node.get("text", f"#{node.get('token')}")),
                     "q": _number(node.get("q")), "s": _number(node.get("confidence")), "outcome": "cut"})
    heads, used = meta.get("confidence_head"), meta.get("calibrated")
    for i, row in enumerate(rows):
        row["recalibrated"] = isinstance(used, list)
        row["head"] = _at(heads, i) if isinstance(used, list) else None  # shown beside the recalibrated ĉ
        row["c"] = _at(used, i) if isinstance(used, list) else _at(heads, i)
        if row["c"] is None:
            above = 1.0 if i == 0 else rows[i - 1]["s"]
            row["c"] = row["s"] / above if row["s"] is not None and above else None
    return rows


def budget_cap(budget) -> int | None:
    """The most drafts a round of this budget (a trace header's ``budget``) may verify: a chain's k, a tree's depth
    or node budget, whichever is smaller; None when the budget is unknown."""
    if not isinstance(budget, dict):
        return None
    sizes = [budget.get("depth"), budget.get("max_nodes")] if budget.get("tree") else [budget.get("k")]
    sizes = [size for size in sizes if isinstance(size, int) and not isinstance(size, bool)]
    return min(sizes) if sizes else None


def schedule_cap_note(round_: Round, budget=None) -> str:
    """Where something capped the schedule below the block's drafts, the schedule could not weigh the rest: say
    what. The run's budget (``budget``, the header's) suggests a longer chain; the tokens left to generate, near the
    end of a run, cap it under any budget, and a longer chain would not help."""
    meta = _meta(round_)
    block, schedule = meta.get("block"), meta.get("schedule")
    drafts = block.get("drafts") if isinstance(block, dict) else None
    cap = schedule.get("cap") if isinstance(schedule, dict) else None
    if not isinstance(drafts, int) or not isinstance(cap, int) or not 0 < cap < drafts:
        return ""
    own = budget_cap(budget)
    if own is not None and cap < own:
        return (f"only {cap} token{'' if cap == 1 else 's'} left to generate: ℓ capped at {cap} of the block's "
                f"{drafts} drafts")
    return (f"the run's chain length (or tree depth) capped ℓ at {cap} of the block's {drafts} drafts;<br>"
            f"a chain of k = {drafts} lets the schedule weigh them all")


def greedy_curve_points(curve) -> list[tuple[float, float]]:
    """The (raw ĉ, expected acceptance) points of a drafter's shipped greedy curve (``describe()["greedy_curve"]``
    in a trace header), read defensively: anything malformed gives none."""
    points = curve.get("points") if isinstance(curve, dict) else None
    if not isinstance(points, list):
        return []
    pairs = [(_number(p[0]), _number(p[1])) for p in points if isinstance(p, (list, tuple)) and len(p) == 2]
    return [(x, y) for x, y in pairs if x is not None and y is not None and 0 <= x <= 1 and 0 <= y <= 1]


def confidence_spec(rounds: Sequence[Round], index: int | None = None, greedy_curve=None, budget=None) -> dict:
    """The two panels as a plain plotly dict: round ``index``'s block (default: the last) and the run's calibration;
    ``greedy_curve`` (a greedy run's header ``drafter.greedy_curve``) adds the curve its calibration started from;
    ``budget`` (the header's) tells what capped a schedule (``schedule_cap_note``)."""
    data: list[dict] = []
    notes: list[tuple[str, float, float, str]] = []  # text, x, y, xref
    shapes: list[dict] = []
    round_ = rounds[index if index is not None else -1] if rounds else None
    ticks: dict = {"dtick": 1}
    block_title = "Block of the round:<br>q, confidence ĉ and survival s"
    if round_ is None or round_.confidence is None:
        notes.append(("this drafter sets no confidence" if round_ is not None else "no round yet", 0.25, 0.5, "paper"))
    elif not round_.is_chain:
        notes.append(("a tree round: its nodes' confidence<br>is in the tree's hover text", 0.25, 0.5, "paper"))
    else:
        block_title = f"Round {round_.index}:<br>q, confidence ĉ and survival s per position"
        rows = block_positions(round_)
        data += _block_traces(rows)
        # each position's token under its number: inside a short bar plotly drops the text, and q is often small
        ticks = dict(tickvals=[row["depth"] for row in rows],
                     ticktext=[f"{row['depth']}<br>{label(row['text'], 8)}" for row in rows], automargin=True)
        schedule = _meta(round_).get("schedule")
        if isinstance(schedule, dict) and isinstance(schedule.get("length"), int):
            data += _schedule_traces(schedule)
            cut = schedule["length"] + 0.5
            shapes.append(dict(type="line", xref="x", yref="paper", x0=cut, x1=cut, y0=0, y1=1,
                               line=dict(color="#333333", dash="dash", width=1)))
            notes.append((f"verify ℓ = {schedule['length']}", cut, 1.04, "x"))
            capped = schedule_cap_note(round_, budget)
            if capped:
                block_title += f"<br><span style='font-size:{LABEL_PX}px;color:#555555'>{capped}</span>"
    result, own = calibration(rounds), calibration(rounds, head=True)
    recalibrated = bool(own.samples) and any(isinstance(_meta(r).get("calibrated"), list) for r in rounds)
    data += _calibration_traces(result, "realised per bin (recalibrated ĉ)" if recalibrated else "realised per bin")
    if recalibrated:
        data += _calibration_traces(own, "realised per bin (the head's own ĉ)", dash="dot")[1:]
    curve = greedy_curve_points(greedy_curve)
    if curve:
        data.append(dict(type="scatter", x=[x for x, _ in curve], y=[y for _, y in curve], mode="lines",
                         name="shipped greedy curve: the head's ĉ → acceptance on training prompts", xaxis="x3",
                         yaxis="y3", line=dict(color=SURVIVAL_COLOR, dash="dash", width=1.5),
                         hovertemplate="head's ĉ %{x:.2f} → %{y:.2f} expected<extra>shipped curve</extra>"))
    calibration_title = ("Run calibration: no drafts with a confidence yet" if not result.samples else
                         f"Run calibration: ECE {result.ece:.3f} recalibrated,<br>{own.ece:.3f} the head's own; "
                         f"{result.samples} drafts" if recalibrated else
                         f"Run calibration: ECE {result.ece:.3f}, {result.samples} drafts")
    annotations = [dict(text=t, x=x, y=y, xref=xref, yref="paper", showarrow=False, xanchor="center",
                        font=dict(size=LABEL_PX, color="#444444")) for t, x, y, xref in notes]
    annotations += [dict(text=t, x=x, y=1.07, xref="paper", yref="paper", showarrow=False, xanchor="left",
                         yanchor="bottom", align="left",
                         font=dict(size=TITLE_PX, color="#222222"))
                    for t, x in ((block_title, 0), (calibration_title, 0.62))]
    title_lines = 1 + max(block_title.count("<br>"), calibration_title.count("<br>"))
    top = LABEL_STRIP_PX + 40 + TITLE_LINE_PX * title_lines
    layout = dict(
        height=LABEL_STRIP_PX + 400 + TITLE_LINE_PX * title_lines, margin=dict(l=50, r=50, t=top, b=40), font=FONT,
        plot_bgcolor="#ffffff",
        paper_bgcolor="#ffffff", barmode="overlay",
        legend=dict(orientation="h", x=0, y=-0.2, font=dict(size=LABEL_PX)),
        xaxis=_axis([0, 0.5], "y", "draft position k", **ticks),
        yaxis=_axis([0, 1], "x", "probability", range=[0, 1.05]),
        yaxis2=dict(overlaying="y", side="right", anchor="x", rangemode="tozero", showgrid=False, zeroline=False,
                    title=dict(text="relative", font=dict(size=LABEL_PX))),
        xaxis3=_axis([0.62, 1], "y3", "predicted confidence", range=[0, 1]),
        yaxis3=_axis([0, 1], "x3", "realised acceptance", range=[0, 1.05]),
        shapes=shapes, annotations=annotations,
    )
    if "ticktext" in ticks:  # the labels say "k, token" themselves; an axis title would sit across the legend
        layout["xaxis"]["title"]["text"] = ""
        layout["legend"]["y"] = -0.25
    return dict(data=data, layout=layout)


def _block_traces(rows: list[dict]) -> list[dict]:
    depth = [row["depth"] for row in rows]
    colors = [CUT_COLOR if row["outcome"] == "cut" else OUTCOME_COLORS[Outcome(row["outcome"])] for row in rows]
    names = ["cut before verification" if row["outcome"] == "cut" else OUTCOME_LABELS[Outcome(row["outcome"])]
             for row in rows]
    texts = [row["text"] for row in rows]
    hover = [f"position {row['depth']} · {escape(repr(text))} · {name}" for row, text, name in zip(rows, texts, names)]
    recalibrated = any(row.get("recalibrated") for row in rows)
    with_head = any(row.get("head") is not None for row in rows)
    return [
        dict(type="bar", x=depth, y=[row["q"] for row in rows], name="draft probability q", xaxis="x", yaxis="y",
             marker=dict(color=colors, line=dict(color="#777777", width=[1 if c == CUT_COLOR else 0 for c in colors])),
             hovertext=hover, hovertemplate="%{hovertext}<br>q = %{y:.3f}<extra></extra>"),
        dict(type="scatter", x=depth, y=[row["c"] for row in rows], mode="lines+markers",
             name="confidence ĉ_k (recalibrated on this run)" if recalibrated else "confidence ĉ_k",
             line=dict(color=CONFIDENCE_COLOR), xaxis="x", yaxis="y",
             hovertemplate="position %{x}: ĉ = %{y:.3f}<extra></extra>"),
        *([dict(type="scatter", x=depth, y=[row["head"] for row in rows], mode="markers",
                name="confidence head's own ĉ_k", marker=dict(color=CONFIDENCE_COLOR, symbol="circle-open", size=9),
                xaxis="x", yaxis="y", hovertemplate="position %{x}: the head's ĉ = %{y:.3f}<extra></extra>")]
          if with_head else []),
        dict(type="scatter", x=depth, y=[row["s"] for row in rows], mode="lines+markers", name="survival s_k",
             line=dict(color=SURVIVAL_COLOR, dash="dot"), xaxis="x", yaxis="y",
             hovertemplate="position %{x}: s = %{y:.3f}<extra></extra>"),
    ]


def _schedule_traces(schedule: dict) -> list[dict]:
    values = [v for v in schedule.get("values") or [] if isinstance(v, (int, float))]
    costs = [c for c in schedule.get("cost_ms") or [] if isinstance(c, (int, float))]
    traces = []
    if costs and costs[0] > 0:
        lengths = list(range(1, len(costs) + 1))
        traces.append(dict(type="scatter", x=lengths, y=[c / costs[0] for c in costs], mode="lines+markers",
                           name="verify cost(1 + ℓ) ÷ cost(2) (right axis)", xaxis="x", yaxis="y2",
                           line=dict(color=COST_COLOR, dash="dash"), customdata=costs,
                           hovertemplate="ℓ = %{x}: %{customdata:.1f} ms<extra>cost</extra>"))
    if values and max(values) > 0:
        best = max(values)
        traces.append(dict(type="scatter", x=list(range(1, len(values) + 1)), y=[v / best for v in values],
                           mode="lines+markers", name="(1 + Σ s) ÷ cost, ÷ best (right axis)", xaxis="x", yaxis="y2",
                           line=dict(color=VALUE_COLOR, dash="dashdot"), customdata=values,
                           hovertemplate="ℓ = %{x}: %{customdata:.4f} tokens/ms<extra>schedule</extra>"))
    return traces


def _calibration_traces(result: Calibration, name: str, dash: str = "solid") -> list[dict]:
    diagonal = dict(type="scatter", x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", xaxis="x3",
                    yaxis="y3", line=dict(color="#bbbbbb", dash="dot"), hoverinfo="skip", showlegend=False)
    if not result.bins:
        return [diagonal]
    largest = max(b.count for b in result.bins)
    return [diagonal, dict(
        type="scatter", x=[b.predicted for b in result.bins], y=[b.realised for b in result.bins],
        mode="markers+lines", name=name, xaxis="x3", yaxis="y3", line=dict(color=CONFIDENCE_COLOR, dash=dash),
        marker=dict(size=[6 + 14 * (b.count / largest) ** 0.5 for b in result.bins], color=CONFIDENCE_COLOR,
                    symbol="circle" if dash == "solid" else "circle-open"),
        customdata=[[b.low, b.high, b.count] for b in result.bins],
        hovertemplate="predicted %{customdata[0]:.1f}–%{customdata[1]:.1f} (mean %{x:.2f}): "
                      f"%{{y:.2f}} accepted of %{{customdata[2]}}<extra>{escape(name)}</extra>")]
