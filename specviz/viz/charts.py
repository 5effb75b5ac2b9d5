"""Run-level charts (per-position acceptance, acceptance-length histogram, time split, tokens/s) and the
rejection debugger's top-k bars. Figures are built as plain dicts (no named template) because plotly's template
machinery costs more per figure than a CPU round of the target takes to verify (measured figures: BENCHMARKS.md).

When the rounds label their nodes (Medusa by head, MTP by module: ``specviz.viz.labels``), the per-position panel
adds one bar trace per label: its acceptance at each depth it drafted (``metrics.FORMULAS["per_label"]``), its
run-wide rate in the legend. Medusa's head d is depth d; MTP's modules cycle, so one module can own several depths.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from specviz.engine.metrics import Metrics, acceptance_by_label
from specviz.engine.round import Round, TokenChoice
from specviz.viz import labels
from specviz.viz.outcome import OUTCOME_COLORS, Outcome
from specviz.viz.text import label
from specviz.viz.text import plot_escape as escape

DRAFT_COLOR, VERIFY_COLOR, OTHER_COLOR = "#56B4E9", "#CC79A7", "#999999"
PLAIN_COLOR = "#555555"
#: Chart text, legible on a projector and a phone: no label below ``LABEL_PX``, panel titles at ``TITLE_PX``.
LABEL_PX, TITLE_PX = 14, 16
FONT = dict(family="system-ui, sans-serif", size=LABEL_PX, color="#222222")
#: Per-label bars (Paul Tol's muted scheme): apart from the outcome and time-split colours the other panels use.
LABEL_COLORS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")


def _axis(domain: list[float], anchor: str, title: str, **extra) -> dict:
    return dict(domain=domain, anchor=anchor, title=dict(text=title, font=dict(size=LABEL_PX)), gridcolor="#e6e6e6",
                zeroline=False, **extra)


def label_bars(rounds: Sequence[Round], key: str | None) -> list[dict]:
    """One bar trace per node label under ``meta[key]`` for the per-position panel (``[]`` for no key).

    Each bar is the label's acceptance at one depth; labels sharing a depth stand side by side (explicit x offsets,
    because the figure stacks bars for the time split).
    """
    if key is None:
        return []
    per_label = acceptance_by_label(rounds, key)
    sharing: dict[int, list] = {}  # depth -> the labels offered there
    for value, stats in per_label.items():
        for depth in stats.depths:
            sharing.setdefault(depth, []).append(value)
    bars = []
    for i, (value, stats) in enumerate(per_label.items()):
        depths = sorted(stats.depths)
        width = [0.8 / len(sharing[d]) for d in depths]
        x = [d + (sharing[d].index(value) - (len(sharing[d]) - 1) / 2) * w for d, w in zip(depths, width)]
        name = escape(labels.label_text(key, value))
        bars.append(dict(
            type="bar", x=x, y=[stats.depths[d].rate for d in depths], width=width, xaxis="x", yaxis="y",
            name=f"{name}: {stats.rate:.0%} ({stats.accepted}/{stats.offered})",
            marker=dict(color=LABEL_COLORS[i % len(LABEL_COLORS)], opacity=0.6),
            customdata=[[d, stats.depths[d].accepted, stats.depths[d].offered] for d in depths],
            hovertemplate="depth %{customdata[0]}: %{y:.2f} (%{customdata[1]} accepted of %{customdata[2]} offered)"))
    return bars


def run_charts(metrics: Metrics, rounds: Sequence[Round], *, plain_tokens_per_s: float | None = None,
               elapsed_s: Sequence[float] | None = None) -> go.Figure:
    """A 2×2 grid: per-position acceptance, acceptance-length histogram, time per round, tokens/s over the run."""
    return go.Figure(run_charts_spec(metrics, rounds, plain_tokens_per_s=plain_tokens_per_s, elapsed_s=elapsed_s),
                     skip_invalid=True)


def run_charts_spec(metrics: Metrics, rounds: Sequence[Round], *, plain_tokens_per_s: float | None = None,
                    elapsed_s: Sequence[float] | None = None) -> dict:
    """``run_charts`` as a plain plotly JSON dict.

    ``elapsed_s[i]`` is the generation's wall time after round i (for the tokens/s line); omitted → per-round time.
    """
    depths = list(range(1, len(metrics.conditional) + 1))
    accepted_color = OUTCOME_COLORS[Outcome.ACCEPTED]
    key = labels.run_label_key(rounds)
    per_label = label_bars(rounds, key)
    per_position = "Per-position acceptance" + (f" (bars: per {'label' if key == 'node_labels' else key})"
                                                if per_label else "")
    data: list[dict] = [
        dict(type="scatter", x=depths, y=metrics.conditional, mode="lines+markers", name="P(accept d | d−1 accepted)",
             line=dict(color=accepted_color), xaxis="x", yaxis="y",
             hovertemplate="depth %{x}: %{y:.2f}<extra>conditional</extra>"),
        dict(type="scatter", x=depths, y=metrics.cumulative, mode="lines+markers", name="P(accepted length ≥ d)",
             line=dict(color=accepted_color, dash="dot"), xaxis="x", yaxis="y",
             hovertemplate="depth %{x}: %{y:.2f}<extra>cumulative</extra>"),
        *per_label,
        dict(type="bar", x=list(range(len(metrics.histogram))), y=metrics.histogram, name="rounds",
             marker=dict(color=OUTCOME_COLORS[Outcome.BONUS]), xaxis="x2", yaxis="y2", showlegend=False,
             hovertemplate="%{y} rounds accepted %{x} draft tokens<extra></extra>"),
    ]
    index = [r.index for r in rounds]
    for name, values, color in (("draft", [r.draft_ms for r in rounds], DRAFT_COLOR),
                                ("verify", [r.verify_ms for r in rounds], VERIFY_COLOR),
                                ("overhead", [r.other_ms for r in rounds], OTHER_COLOR)):
        data.append(dict(type="bar", x=index, y=values, name=f"{name} ms", marker=dict(color=color),
                         xaxis="x3", yaxis="y3", hovertemplate=f"round %{{x}}: %{{y:.1f}} ms<extra>{name}</extra>"))
    produced, rates = 0, []
    clock = 0.0
    for i, r in enumerate(rounds):
        produced += len(r.committed)
        clock = elapsed_s[i] if elapsed_s is not None and i < len(elapsed_s) else clock + r.total_ms / 1e3
        rates.append(produced / clock if clock > 0 else 0.0)
    data.append(dict(type="scatter", x=index, y=rates, mode="lines", name="speculative tokens/s",
                     line=dict(color=accepted_color, width=2), xaxis="x4", yaxis="y4",
                     hovertemplate="after round %{x}: %{y:.1f} tok/s<extra></extra>"))
    if plain_tokens_per_s:
        data.append(dict(type="scatter", x=[index[0] if index else 0, index[-1] if index else 1],
                         y=[plain_tokens_per_s] * 2, mode="lines", name="plain decoding tokens/s",
                         line=dict(color=PLAIN_COLOR, dash="dash"), xaxis="x4", yaxis="y4",
                         hovertemplate="plain: %{y:.1f} tok/s<extra></extra>"))
    layout = dict(
        height=620, margin=dict(l=60, r=10, t=50, b=40), font=FONT, barmode="stack",
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        legend=dict(orientation="h", x=0, y=-0.16, font=dict(size=LABEL_PX), traceorder="normal"),
        xaxis=_axis([0, 0.45], "y", "draft depth d", dtick=1),
        yaxis=_axis([0.66, 1], "x", "acceptance", range=[0, 1.05]),
        xaxis2=_axis([0.55, 1], "y2", "accepted draft length", dtick=1),
        yaxis2=_axis([0.66, 1], "x2", "rounds"),
        xaxis3=_axis([0, 0.45], "y3", "round"),
        yaxis3=_axis([0, 0.3], "x3", "ms"),
        xaxis4=_axis([0.55, 1], "y4", "round"),
        yaxis4=_axis([0, 0.3], "x4", "tokens/s", rangemode="tozero"),
        annotations=[
            dict(text=t, x=x, y=y, xref="paper", yref="paper", showarrow=False, xanchor="left",
                 font=dict(size=TITLE_PX, color="#222222"))
            for t, x, y in ((per_position, 0, 1.07), ("Acceptance-length histogram", 0.55, 1.07),
                            ("Time per round: draft / verify / overhead", 0, 0.37),
                            ("Tokens/s: speculative vs plain", 0.55, 0.37))
        ],
    )
    return dict(data=data, layout=layout)


def topk_figure(target_top: Sequence[TokenChoice], draft_top: Sequence[TokenChoice] | None,
                residual_top: Sequence[TokenChoice] | None = None, *, highlight: int | None = None,
                highlight_text: str | None = None, highlight_p: float | None = None,
                highlight_q: float | None = None, title: str = "") -> go.Figure:
    """Grouped bars over the union of the target's and the drafter's top-k tokens (and the residual, if any).

    The highlighted token (the node under inspection) gets a dark outline so p and q can be read off directly;
    when it is outside both top-k lists its own recorded p_target / q_draft are added as an extra bar.
    """
    order: list[int] = []
    texts: dict[int, str] = {}
    for rows in (target_top, draft_top or [], residual_top or []):
        for choice in rows:
            if choice.id not in texts:
                order.append(choice.id)
                texts[choice.id] = choice.text
    if highlight is not None and highlight not in texts:
        order.append(highlight)
        texts[highlight] = highlight_text if highlight_text is not None else f"#{highlight}"
    labels = [f"{label(texts[i], 12)} <sub>{i}</sub>" for i in order]

    def series(rows: Sequence[TokenChoice] | None, own: float | None = None) -> list[float | None]:
        lookup = {c.id: c.p for c in rows or []}
        if highlight is not None and highlight not in lookup and own is not None:
            lookup[highlight] = own
        return [lookup.get(i) for i in order]

    def outline() -> dict:
        return dict(width=[3 if i == highlight else 0 for i in order], color="#111111")

    data = [dict(type="bar", x=labels, y=series(target_top, highlight_p), name="target p (top-k)",
                 marker=dict(color=OUTCOME_COLORS[Outcome.BONUS], line=outline()),
                 hovertemplate="%{x}: p = %{y:.4f}<extra>target</extra>")]
    if draft_top:
        data.append(dict(type="bar", x=labels, y=series(draft_top, highlight_q), name="draft q (top-k)",
                         marker=dict(color=DRAFT_COLOR, line=outline()),
                         hovertemplate="%{x}: q = %{y:.4f}<extra>draft</extra>"))
    if residual_top:
        data.append(dict(type="bar", x=labels, y=series(residual_top), name="residual norm(max(0, p − q))",
                         marker=dict(color=OUTCOME_COLORS[Outcome.CORRECTION], line=outline()),
                         hovertemplate="%{x}: %{y:.4f}<extra>residual</extra>"))
    layout = dict(
        title=dict(text=escape(title), x=0.01, font=dict(size=TITLE_PX)), height=340, barmode="group", font=FONT,
        margin=dict(l=50, r=10, t=50, b=70), plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        yaxis=dict(title=dict(text="probability"), range=[0, 1.02], gridcolor="#eeeeee"),
        xaxis=dict(tickfont=dict(family="ui-monospace, monospace")),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
    )
    return go.Figure(dict(data=data, layout=layout), skip_invalid=True)
