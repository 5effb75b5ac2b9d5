"""Views: pure functions from ``Round`` records (live or replayed) to plotly figures and escaped HTML.

Nothing here loads or calls a model, so every view works the same on a live run and on a trace file.
"""

from specviz.viz.outcome import OUTCOME_COLORS, OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import tree_figure, tree_layout

__all__ = [
    "OUTCOME_COLORS",
    "OUTCOME_LABELS",
    "Outcome",
    "node_outcomes",
    "tokens_html",
    "tree_figure",
    "tree_layout",
]
