"""The Lesson tab: a guided walk through a real run, one round and one step at a time, then the run's totals.

It reads a shipped recorded trace or the Playground's current run (``Session.record``: a live run, or the recorded
example the page opens on), so it teaches offline and on any live run alike. The words and numbers are
``specviz.viz.lesson``'s; this module only lays the controls out and keeps the reader's place, which lives in the
round slider and the step radio themselves (plus which record they point into, so a new run starts from its top).
"""

from __future__ import annotations

from functools import lru_cache

import gradio as gr

from specviz.errors import SpecvizError
from specviz.ui import alerts, examples
from specviz.ui.state import Session
from specviz.ui.views import RunView, plot, root_text
from specviz.viz import debugger, panels
from specviz.viz import lesson as steps
from specviz.viz.glossary import glossary_html
from specviz.viz.record import RunRecord
from specviz.viz.text import escape
from specviz.viz.tree_figure import tree_spec

PLAYGROUND = "playground"
INTRO = ("A guided lesson on a real run. Each round goes in the order the engine runs it: the context, the "
         "drafter's guesses with their q, the target's one forward with its p, each accept test with its numbers, "
         "the correction or bonus, and the cache rollback; after the last round, the run's totals. Every step has "
         "one plain sentence, its numbers, and the formula beside them. Hover a dotted term for its meaning, or "
         "open the glossary below.")
STEP_CHOICES = [(f"{i + 1} · {steps.STEP_NAMES[step]}", step) for i, step in enumerate(steps.STEPS)]
STEP_CHOICES.append((f"✓ {steps.STEP_NAMES[steps.TOTALS]}", steps.TOTALS))


def source_choices() -> list[tuple[str, str]]:
    """The Playground's run first (live, or the example it opens on), then every shipped recorded trace."""
    return [("The Playground's current run", PLAYGROUND), *examples.trace_choices()]


@lru_cache(maxsize=8)
def shipped(name: str) -> RunRecord:
    """A shipped trace, parsed once per process: the lesson only reads it (walking one re-renders at every click)."""
    return examples.load_trace(name)


def record_of(state: Session, which: str | None) -> RunRecord | None:
    """The record the lesson walks; a trace that cannot be read is one warning and no record."""
    if which == PLAYGROUND:
        return state.record
    if which not in {value for _, value in examples.trace_choices()}:
        alerts.warning(f"No such run to learn from: {which!r}. Pick one from the list.")
        return None
    try:
        return shipped(which)
    except (SpecvizError, OSError, ValueError) as error:
        alerts.warning(f"Could not read the trace {which}: {error}")
        return None


def figure(record: RunRecord, index: int, step: str):
    """The round's draft tree (the node the step is about ringed), or the run's charts for the totals."""
    if step == steps.TOTALS:
        return RunView.charts_figure(record)
    _, selected = figure_key(record, index, step)
    return plot(tree_spec(record.rounds[index], root_text=root_text(record, index),
                          selected=debugger.selected_node(selected)))


def figure_key(record: RunRecord, index: int, step: str) -> tuple:
    """What the figure at ``(index, step)`` shows: two steps with the same key draw the same figure, so moving
    between them sends none (a tree's figure is the largest part of a step's update)."""
    if step == steps.TOTALS:
        return steps.TOTALS, len(record.rounds)
    round_ = record.rounds[index]
    return index, {"accept": debugger.default_node(round_), "extra": debugger.EXTRA}.get(step)


def build(session: gr.State) -> dict:
    """Lay the tab out; returns what app.py wires to the tab's select event (``on_tab``, ``inputs``, ``outputs``)
    and the callbacks by name, for tests."""
    gr.Markdown(INTRO, elem_id="lesson-intro")
    with gr.Row():
        source = gr.Dropdown(source_choices(), value=PLAYGROUND, label="run to learn from", elem_id="lesson-source",
                             scale=3)
        jump = gr.Dropdown([], value=None, label="jump to an interesting round", elem_id="lesson-jump", scale=2)
    with gr.Row():
        round_slider = gr.Slider(0, 1, value=0, step=1, label="round", elem_id="lesson-round", scale=1)
        step = gr.Radio(STEP_CHOICES, value=steps.STEPS[0], label="step", elem_id="lesson-step", scale=3)
    with gr.Row():
        previous = gr.Button("◀ Previous step", elem_id="lesson-prev", size="sm")
        forward = gr.Button("Next step ▶", elem_id="lesson-next", size="sm", variant="primary")
    header = gr.HTML(panels.status_html("Open the tab to start."), elem_id="lesson-header")
    with gr.Row():
        with gr.Column(scale=3):
            text = gr.HTML("", elem_id="lesson-text")
        with gr.Column(scale=2):
            formula = gr.HTML("", elem_id="lesson-formula", label="the formula, with this round's numbers")
    tree = gr.Plot(plot(tree_spec(None)), label="the round's draft tree (totals: the run's charts)",
                   elem_id="lesson-figure")
    with gr.Accordion("Glossary: every term on these pages", open=False, elem_id="lesson-glossary"):
        gr.HTML(glossary_html())
    shown = gr.State("")  # which record the slider and the radio point into
    outputs = [header, text, formula, tree, round_slider, step, jump, shown]

    def show(state: Session, which: str, index, at: str | None, key: str = "", *, reset: bool = False,
             was: tuple | None = None) -> dict:
        """Draw ``(index, at)`` of the chosen run; ``was``: the position the reader moved from, whose figure and
        jump list need not be sent again when they are the same."""
        record = record_of(state, which)
        now = f"{which}:{id(record)}" if which == PLAYGROUND else str(which)  # a new Playground run is a new record
        if record is None or not record.rounds:
            page = steps.lesson(None, 0, None)
            return {header: panels.status_html(page.title, "warning"), text: page.sentence,
                    formula: '<div class="sv-muted">The formula appears with the first round.</div>',
                    tree: plot(tree_spec(None)), round_slider: gr.Slider(0, 1, value=0),
                    step: steps.STEPS[0], jump: gr.Dropdown(choices=[], value=None), shown: now}
        moved = not reset and key == now
        if not moved:
            index, at = 0, steps.STEPS[0]
        index, at = steps.position(record, index, at)
        page = steps.lesson(record, index, at)
        same = moved and was is not None and figure_key(record, *steps.position(record, *was)) == figure_key(
            record, index, at)
        return {
            header: panels.status_html(f"{panels.run_label(record)} — {page.title}"),
            text: f'<div class="sv-subhead">{escape(page.title)}</div>{page.sentence}{page.body}',
            formula: f'<div class="sv-subhead">the formula, with these numbers</div>{page.formula}',
            tree: gr.skip() if same else figure(record, index, at),
            round_slider: gr.Slider(minimum=0, maximum=max(len(record.rounds) - 1, 1), value=index, step=1),
            step: at,
            jump: gr.skip() if moved and record.finished else gr.Dropdown(
                choices=[(label, str(i)) for label, i in steps.interesting_rounds(record)], value=None),
            shown: now,
        }

    def on_source(state: Session, which: str):
        return show(state, which, 0, None, reset=True)

    def on_tab(state: Session, which: str, index, at: str, key: str):
        return show(state, which, index, at, key)

    def on_round(state: Session, which: str, index, key: str):
        return show(state, which, index, steps.STEPS[0], key)

    def on_step(state: Session, which: str, index, at: str, key: str):
        return show(state, which, index, at, key)

    def on_next(state: Session, which: str, index, at: str, key: str):
        record = record_of(state, which)
        moved = steps.next_position(record, index, at) if record is not None and record.rounds else (0, None)
        return show(state, which, *moved, key, was=(index, at))

    def on_previous(state: Session, which: str, index, at: str, key: str):
        record = record_of(state, which)
        moved = steps.previous_position(record, index, at) if record is not None and record.rounds else (0, None)
        return show(state, which, *moved, key, was=(index, at))

    def on_jump(state: Session, which: str, chosen: str | None, key: str):
        try:
            index = int(chosen) if chosen not in (None, "") else 0
        except (TypeError, ValueError):
            alerts.warning(f"Not a round: {chosen!r}.")
            index = 0
        return show(state, which, index, steps.STEPS[0], key)

    where = [session, source, round_slider, step, shown]
    # ``select``, not ``input``: a dropdown's input fires twice per pick, and the second answer could land after a
    # Next pressed at once and send the reader back to the first step
    source.select(on_source, [session, source], outputs, queue=False)
    round_slider.input(on_round, [session, source, round_slider, shown], outputs, trigger_mode="always_last",
                       queue=False)
    step.input(on_step, where, outputs, queue=False)
    forward.click(on_next, where, outputs, queue=False)
    previous.click(on_previous, where, outputs, queue=False)
    jump.select(on_jump, [session, source, jump, shown], outputs, queue=False)
    return {"on_tab": on_tab, "inputs": where, "outputs": outputs, "on_source": on_source, "on_round": on_round,
            "on_step": on_step, "on_next": on_next, "on_previous": on_previous, "on_jump": on_jump}
