"""``RunView``: the panel group that shows one run (tree, round picker, text, metrics, speedup, charts, theory
beside measurement, warnings).

Built twice — in the Playground for live runs, in the Traces tab for replays — from the same code, so a replayed
trace looks exactly like the live run it recorded. ``render`` only reads a ``RunRecord``; it never calls a model.
Heavy charts can be skipped on a streamed update (``heavy=False``) and are always drawn on the final one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr
import plotly.graph_objects as go

from specviz.viz import charts, diagnostics, panels, theory
from specviz.viz.confidence import confidence_spec
from specviz.viz.lookahead import window_spec
from specviz.viz.record import RunRecord
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import tree_spec

if TYPE_CHECKING:
    from specviz.ui.state import Session

#: The token panel's scroll box (``.sv-stream``, a fixed height) is redrawn on every update, which resets it to the
#: top: a streamed run's newest tokens, and a picked round, would sit below the fold. After each update this scrolls
#: to the end while a run streams (unless the reader scrolled up to read: then it keeps their place), and otherwise
#: to the selected round (``.sv-sel``). Runs in the browser via gr.HTML's ``js_on_load``/``watch``.
FOLLOW_TOKENS_JS = """
let follow = true, kept = 0;
element.addEventListener('scroll', (event) => {
  const box = event.target;
  if (!box.classList || !box.classList.contains('sv-stream')) return;
  follow = box.scrollTop + box.clientHeight >= box.scrollHeight - 24;
  kept = box.scrollTop;
}, true);
watch('value', () => {
  const box = element.querySelector('.sv-stream');
  if (!box) return;
  if (box.querySelector('.sv-caret')) { box.scrollTop = follow ? box.scrollHeight : kept; return; }
  follow = true;
  const chosen = box.querySelector('.sv-sel');
  if (chosen) {
    box.scrollTop += chosen.getBoundingClientRect().top - box.getBoundingClientRect().top - box.clientHeight / 3;
  }
});
"""


#: Keyboard stepping through rounds: ← and → (or k and j) click this view's "previous" and "next round" buttons, while
#: focus is not in a text box, number box, radio or slider (there the keys move the caret or the value) and only while
#: the view is on screen (the Playground's and the Traces tab's views both listen; the hidden tab's does nothing).
ROUND_KEYS_JS = """
const buttons = {ArrowLeft: PREV, ArrowRight: NEXT, k: PREV, j: NEXT};
document.addEventListener('keydown', (event) => {
  if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) return;
  const target = event.target;
  if (target && (target.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(target.tagName))) return;
  const id = buttons[event.key];
  const button = id && element.offsetParent !== null ? document.getElementById(id) : null;
  if (!button) return;
  event.preventDefault();
  button.click();
});
"""


def round_keys_js(prefix: str) -> str:
    """``ROUND_KEYS_JS`` bound to the buttons of the view whose elem_ids start with ``prefix``."""
    return ROUND_KEYS_JS.replace("PREV", repr(f"{prefix}round-prev")).replace("NEXT", repr(f"{prefix}round-next"))


def stepped_index(index: float | None, delta: int, count: int) -> int:
    """The round ``delta`` away from ``index`` (the slider's value, None when unset), kept within ``count`` rounds."""
    current = int(index) if isinstance(index, int | float) else 0
    return max(0, min(current + delta, count - 1))


def tokens_panel(value: str, **kwargs) -> gr.HTML:
    """A token-stream panel that keeps the newest tokens (or the selected round) in view (``FOLLOW_TOKENS_JS``)."""
    return gr.HTML(value, js_on_load=FOLLOW_TOKENS_JS, **kwargs)


def plot(spec: dict) -> go.Figure:
    """A figure spec (a plain dict, as ``specviz.viz`` builds them) as the plotly figure ``gr.Plot`` takes, with no
    template (plotly would otherwise add its default one: the specs set their own colours, and it weighs 7 kB).

    plotly validates every attribute on the way: about 4 ms a figure, where serialising the dict alone takes 0.1 ms
    (tools/ui_perf.py), on every streamed frame; what it costs to give Gradio nothing but what its API documents."""
    return go.Figure({**spec, "layout": {**spec.get("layout", {}), "template": {}}})


def root_text(record: RunRecord, index: int) -> str | None:
    """The last token committed before round ``index`` (the tree's root)."""
    if index > 0:
        previous = record.rounds[index - 1].committed_text
        return previous[-1] if previous else None
    pieces = record.prompt_pieces
    return pieces[-1] if pieces else None


def markers_js(elem_id: str) -> str:
    """Client-side toggle of the whitespace glyphs in one text panel (``sv-markers`` on its wrapper, which Gradio
    keeps across updates; specviz.css shows the glyphs in place of the whitespace): no round trip, no re-render."""
    return (f"(on) => {{ document.getElementById({elem_id!r})?.classList.toggle('sv-markers', on); "
            "return []; }")


@dataclass
class RunView:
    status: gr.HTML
    speedup: gr.HTML
    tree: gr.Plot
    round_slider: gr.Slider
    round_info: gr.HTML
    prev_round: gr.Button
    next_round: gr.Button
    tokens: gr.HTML
    metrics: gr.HTML
    charts: gr.Plot
    confidence: gr.Plot
    warnings: gr.HTML
    window: gr.Plot
    theory: gr.Plot
    theory_note: gr.Markdown

    @classmethod
    def build(cls, prefix: str = "", *, intro: str = "") -> RunView:
        """Lay the panels out in the current Blocks context; ``prefix`` keeps elem_ids unique per instance."""
        status = gr.HTML(panels.status_html(intro or "Press Run."), elem_id=f"{prefix}status")
        speedup = gr.HTML(panels.speedup_html(None), elem_id=f"{prefix}speedup")
        tree = gr.Plot(plot(tree_spec(None)), label="draft tree of the round", elem_id=f"{prefix}tree-plot")
        with gr.Row():  # one row on a phone too; the round's summary goes under it
            prev_round = gr.Button("◀ round", elem_id=f"{prefix}round-prev", size="sm", scale=0, min_width=64)
            round_slider = gr.Slider(0, 1, value=0, step=1, label="round", elem_id=f"{prefix}round-slider",
                                     scale=1, min_width=140, interactive=True)
            next_round = gr.Button("round ▶", elem_id=f"{prefix}round-next", size="sm", scale=0, min_width=64)
        round_info = gr.HTML(panels.round_info_html(None), elem_id=f"{prefix}round-info")
        gr.HTML('<div class="sv-keys">Keys: ← and → (or k and j) step through the rounds.</div>',
                js_on_load=round_keys_js(prefix), elem_id=f"{prefix}round-keys", padding=False)
        tokens = tokens_panel(tokens_html(None, []), label="text so far", elem_id=f"{prefix}tokens")
        markers = gr.Checkbox(False, label="mark spaces ␣ and line breaks ↵ (token boundaries in whitespace)",
                              elem_id=f"{prefix}markers", container=False)
        markers.change(None, [markers], None, js=markers_js(f"{prefix}tokens"))
        metrics = gr.HTML(panels.metrics_html(None), elem_id=f"{prefix}metrics")
        with gr.Accordion("Formulas (how every number is defined)", open=False, elem_id=f"{prefix}formulas"):
            gr.Markdown(panels.formulas_markdown())
        charts_plot = gr.Plot(label="acceptance, time and speed", show_label=False, elem_id=f"{prefix}charts")
        # short labels: gr.Plot lays its label over the figure's top strip, and a long one wrapped on a phone
        theory_plot = gr.Plot(plot(theory.figure_spec(None)), label="theory vs measurement",
                              elem_id=f"{prefix}theory")
        theory_note = gr.Markdown(theory.explanation(None), elem_id=f"{prefix}theory-note")
        confidence = gr.Plot(plot(confidence_spec([])), label="drafter confidence", elem_id=f"{prefix}confidence")
        warnings = gr.HTML("", elem_id=f"{prefix}warnings")
        window = gr.Plot(label="lookahead: the Jacobi window of the round", elem_id=f"{prefix}window",
                         visible=False)
        return cls(status, speedup, tree, round_slider, round_info, prev_round, next_round, tokens, metrics,
                   charts_plot, confidence, warnings, window, theory_plot, theory_note)

    @property
    def outputs(self) -> list:
        return [self.status, self.speedup, self.tree, self.round_slider, self.round_info, self.tokens, self.metrics,
                self.charts, self.confidence, self.warnings, self.window, self.theory, self.theory_note]

    @property
    def round_outputs(self) -> list:
        return [self.tree, self.round_info, self.tokens, self.confidence, self.window]

    def step_round(self, record: RunRecord | None, index: float | None, delta: int) -> dict:
        """Round ``index + delta`` of ``record`` drawn, with the slider moved to it (nothing without rounds)."""
        if record is None or not record.rounds:
            return {}
        shown = stepped_index(index, delta, len(record.rounds))
        return {self.round_slider: gr.update(value=shown), **self.render_round(record, shown)}

    def wire_round_steps(self, step: Callable[[Session, Any, int], dict], session: gr.State) -> None:
        """The previous/next round buttons (and so the keys) call ``step(state, slider value, -1 or +1)``, which
        returns ``step_round``'s updates for the record the view shows."""
        def by(delta: int):
            return lambda state, index: step(state, index, delta)

        for button, delta in ((self.prev_round, -1), (self.next_round, 1)):
            button.click(by(delta), [session, self.round_slider], [self.round_slider, *self.round_outputs],
                         queue=False, show_progress="hidden", api_visibility="private")

    def render(self, record: RunRecord | None, *, status: str | None = None, level: str = "info",
               heavy: bool = True, running: bool = False, index: int | None = None, count: int | None = None) -> dict:
        """Updates for every panel (charts, the confidence panel and warnings only when ``heavy``). ``count``: the
        rounds to show of a record still growing (default: all it has now), so that the round picker, the tree and the
        text of one frame agree while the engine thread appends."""
        updates: dict = {}
        if status is not None:
            updates[self.status] = panels.status_html(status, level)
        if record is None:
            return updates
        count = len(record.rounds) if count is None else count
        index = count - 1 if index is None else max(0, min(index, count - 1))
        updates[self.round_slider] = gr.update(minimum=0, maximum=max(count - 1, 1), value=max(index, 0), step=1)
        updates.update(self.render_round(record, index, running=running, confidence=heavy, count=count))
        updates[self.speedup] = panels.speedup_html(record)
        updates[self.metrics] = panels.metrics_html(record)
        if heavy:
            updates[self.charts] = self.charts_figure(record)
            shown = theory.theory(record)
            updates[self.theory], updates[self.theory_note] = plot(theory.figure_spec(shown)), theory.explanation(shown)
            updates[self.warnings] = diagnostics.diagnostics_html(diagnostics.diagnose(record)) if count else ""
        return updates

    def render_round(self, record: RunRecord | None, index: int, *, running: bool = False,
                     confidence: bool = True, count: int | None = None) -> dict:
        """The tree, round summary and text for round ``index`` (the text highlights that round), and with
        ``confidence`` the confidence panel (that round's block, the run's calibration); of the first ``count``
        rounds (default: all)."""
        rounds = (record.rounds if count is None else record.rounds[:count]) if record is not None else []
        if not rounds:
            updates = {self.tree: plot(tree_spec(None)), self.round_info: panels.round_info_html(None),
                       self.tokens: tokens_html(record.prompt_pieces if record else None, [], caret=running),
                       self.window: gr.update(visible=False)}
            index = 0
        else:
            index = max(0, min(int(index), len(rounds) - 1))
            round_ = rounds[index]
            updates = {
                self.tree: plot(tree_spec(round_, root_text=root_text(record, index))),
                self.round_info: panels.round_info_html(round_, len(rounds)),
                self.tokens: tokens_html(record.prompt_pieces, rounds, selected=index, caret=running),
            }
            window = window_spec(round_)  # lookahead's Jacobi window, where the round has one
            updates[self.window] = gr.update(value=plot(window), visible=True) if window else gr.update(visible=False)
        if confidence:
            drafter = record.header.get("drafter") if record else None
            curve = drafter.get("greedy_curve") if isinstance(drafter, dict) and record.greedy else None
            budget = record.header.get("budget") if record else None
            updates[self.confidence] = plot(confidence_spec(rounds, index, curve, budget))
        return updates

    @staticmethod
    def charts_figure(record: RunRecord):
        plain, _, decode_only = record.baseline()
        clock = [t - record.prefill_ms / 1e3 for t in record.elapsed] if decode_only else record.elapsed
        return plot(charts.run_charts_spec(record.metrics(), record.rounds, plain_tokens_per_s=plain,
                                           elapsed_s=clock))
