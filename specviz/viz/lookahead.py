"""Lookahead decoding's Jacobi window, drawn from one round's record (``Round.meta["lookahead"]``).

A grid of the window's guesses: one row per level (the oldest Jacobi iteration at the top), one column per future
position (offset from the newest committed token, p + level + column), each cell the guessed token's text. The
diagonals are the n-grams the round harvests into the pool. Beside it, what the verification branch held: how many
pool n-grams start with the root token and how big the pool is. Traces are read defensively: a hand-edited record
draws less, never fails.
"""

from __future__ import annotations

from specviz.engine.round import Round
from specviz.viz.charts import FONT, TITLE_PX
from specviz.viz.text import label
from specviz.viz.text import plot_escape as escape

LEVEL_COLORS = ("#DDCC77", "#88CCEE", "#CC6677", "#117733", "#332288", "#AA4499", "#44AA99", "#999933")


def window_of(round_: Round) -> dict | None:
    """The round's window record, or None when it carries none (another drafter, an old trace)."""
    meta = round_.meta.get("lookahead") if isinstance(round_.meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("levels"), list):
        return None
    levels = meta["levels"]
    if not levels or not all(isinstance(level, list) for level in levels):
        return None
    return meta


def window_spec(round_: Round) -> dict | None:
    """A plotly figure (dict) of the round's Jacobi window, or None when the round has none."""
    meta = window_of(round_)
    if meta is None:
        return None
    levels = meta["levels"]
    texts = meta.get("texts") if isinstance(meta.get("texts"), list) else None
    xs, ys, labels, hovers, colors = [], [], [], [], []
    for level, tokens in enumerate(levels):
        shown = texts[level] if texts and level < len(texts) and isinstance(texts[level], list) else None
        start = level + 1 if level == 0 else level  # level 0 follows the root; level l's column 0 sits at p + l
        for column, token in enumerate(tokens):
            text = shown[column] if shown and column < len(shown) else str(token)
            xs.append(start + column)
            ys.append(level)
            labels.append(escape(label(str(text), 8)))
            hovers.append(f"level {level} · position p+{start + column}<br>token {escape(repr(str(text)))} "
                          f"(id {token})")
            colors.append(LEVEL_COLORS[level % len(LEVEL_COLORS)])
    title = (f"Jacobi window: W={meta.get('W', '?')}, N={meta.get('N', '?')} ({len(levels)} of "
             f"{_levels_wanted(meta)} levels filled); pool {meta.get('pool', '?')} n-grams, "
             f"{meta.get('candidates', '?')} start with the last token (G={meta.get('G', '?')})")
    data = [dict(type="scatter", x=xs, y=ys, mode="markers+text", text=labels, textposition="middle center",
                 hovertext=hovers, hoverinfo="text", showlegend=False,
                 marker=dict(symbol="square", size=34, color=colors, line=dict(color="#555", width=1)))]
    layout = dict(title=dict(text=escape(title), font=dict(size=TITLE_PX)), font=FONT, height=90 + 46 * len(levels),
                  margin=dict(l=70, r=20, t=50, b=40), plot_bgcolor="white",
                  xaxis=dict(title="position after the last committed token (p + …)", dtick=1, zeroline=False),
                  yaxis=dict(title="level", autorange="reversed", tickvals=list(range(len(levels))),
                             ticktext=[f"level {i}" for i in range(len(levels))], zeroline=False))
    return dict(data=data, layout=layout)


def _levels_wanted(meta: dict) -> str:
    n = meta.get("N")
    return str(n - 1) if isinstance(n, int) and n > 1 else "?"
