"""The HTML report: speedup vs τ per prompt, per-position acceptance curves, per-category speedup bars (plotly).

One self-contained file (plotly.js inlined once) so it opens offline.
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.colors import qualitative

from specviz.bench.suite import SuiteResult
from specviz.bench.summary import FORMULAS, OVERALL, Summary, sample_speedup, sample_tau


def _color(summary: Summary, name: str) -> str:
    """One colour per configuration across all three charts."""
    palette = qualitative.Plotly + qualitative.D3
    return palette[summary.rows.index(name) % len(palette)]


def speedup_vs_tau(summary: Summary, suite: SuiteResult) -> go.Figure:
    figure = go.Figure()
    for name in summary.rows[1:]:
        points = [(sample_tau(s), sample_speedup(s), s) for s in suite.samples if s.spec == name]
        points = [p for p in points if p[0] is not None]
        if not points:
            continue
        figure.add_trace(go.Scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], mode="markers", name=name,
            marker_color=_color(summary, name),
            text=[f"{s.prompt.category} #{s.prompt.question_id}" for *_, s in points],
            hovertemplate="%{text}<br>τ=%{x:.2f}<br>speedup=%{y:.2f}×<extra>" + html.escape(name) + "</extra>"))
    figure.add_hline(y=1.0, line_dash="dash", annotation_text="plain decoding")
    figure.update_layout(title="Measured speedup vs τ (one point per prompt)", xaxis_title="τ (tokens per target "
                         "forward)", yaxis_title="speedup over plain decoding (×)")
    return figure


def acceptance_curves(summary: Summary) -> go.Figure:
    figure = go.Figure()
    for name in summary.rows[1:]:
        stats = summary.table[name][OVERALL]
        depths = list(range(1, len(stats.conditional) + 1))
        if not depths:
            continue
        color = _color(summary, name)
        figure.add_trace(go.Scatter(x=depths, y=stats.conditional, mode="lines+markers", name=f"{name} conditional",
                                    line_color=color))
        figure.add_trace(go.Scatter(x=depths, y=stats.cumulative, mode="lines+markers", line_dash="dot",
                                    line_color=color, name=f"{name} cumulative"))
    figure.update_layout(title="Per-position acceptance (all prompts)", xaxis_title="draft depth d",
                         yaxis_title="probability (solid: conditional, dotted: cumulative)",
                         yaxis_range=[0, 1.02], xaxis_dtick=1)
    return figure


def category_bars(summary: Summary) -> go.Figure:
    groups = [*summary.categories, OVERALL]
    figure = go.Figure()
    for name in summary.rows[1:]:
        values = [summary.table[name][g].speedup.median if summary.table[name][g].speedup else None for g in groups]
        figure.add_trace(go.Bar(x=groups, y=values, name=name, marker_color=_color(summary, name)))
    figure.add_hline(y=1.0, line_dash="dash")
    figure.update_layout(title="Median speedup per category", barmode="group", yaxis_title="speedup (×)")
    return figure


def write_html(path: Path, summary: Summary, suite: SuiteResult, meta: dict) -> Path:
    figures = [speedup_vs_tau(summary, suite), acceptance_curves(summary), category_bars(summary)]
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
    machine = meta["machine"]
    notes = "".join(f"<li>{html.escape(text)}</li>" for text in FORMULAS.values())
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>specviz benchmark</title></head><body>"
        f"<h1>specviz benchmark</h1><p><code>{html.escape(meta['command'])}</code></p>"
        f"<p>{html.escape(machine['cpu'])}, {machine['cores']} cores, GPU {html.escape(machine['gpu'])}, "
        f"torch {html.escape(machine['torch'])}, transformers {html.escape(machine['transformers'])}, "
        f"{html.escape(machine['date'])}</p>{''.join(parts)}<ul>{notes}</ul></body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return path
