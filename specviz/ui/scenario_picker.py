"""The Playground's scenario picker: one pick sets every control to a lesson's settings and shows its recorded run,
with the paragraph on what to look for; Run then runs the same settings live.

The scenarios themselves are data (``specviz.ui.scenarios``); this module is their widgets and the pick callback.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from specviz.engine import trace
from specviz.errors import SpecvizError
from specviz.ui import alerts, examples, scenarios
from specviz.ui import settings as panel
from specviz.ui.state import Session
from specviz.ui.views import RunView
from specviz.viz.record import RunRecord


@dataclass
class Picker:
    """The first screen's scenario box and the paragraph under it."""

    dropdown: gr.Dropdown
    note: gr.Markdown


def build() -> Picker:
    """The picker and its (hidden until a pick) paragraph, in the current layout context."""
    choices = scenarios.choices()
    dropdown = gr.Dropdown(choices=choices, value=None, label="lesson scenario", elem_id="scenario",
                           info="Pick one: it sets the controls below and opens its recorded run; Run runs it live",
                           visible=bool(choices))
    note = gr.Markdown("", elem_id="scenario-note", visible=False)
    return Picker(dropdown, note)


def note_markdown(scenario: scenarios.Scenario) -> str:
    """The paragraph under the box: the scenario's title, then what to look for."""
    return f"**{scenario.title}**\n\n{scenario.look_for}"


def status(scenario: scenarios.Scenario, record: RunRecord) -> str:
    """The status line over a scenario's recording: what it is, where it ran, and that Run runs it live."""
    return (f"Scenario {scenario.title}: a recorded run ({examples.label(record.header)}). Press Run to run it live "
            "with these settings, or Step to go round by round.")


def control_updates(scenario: scenarios.Scenario, settings: panel.Settings) -> dict:
    """Every panel control set to the scenario's request (those it leaves alone at their defaults), the example
    picker on its prompt, and the draft length or node budget shown as its shape asks."""
    values = dict(zip(panel.INPUT_NAMES, scenario.values(), strict=True))
    named = {"prompt": settings.prompt, "drafter": settings.drafter, **settings.widgets}
    updates = {named[name]: gr.update(value=value) for name, value in values.items()}
    updates[settings.drafter] = gr.update(value=values["drafter"], info=panel.drafter_line(values["drafter"]))
    if {"k", "max_nodes", "tree"} <= settings.widgets.keys():
        k, budget = panel.shape_shown(values["tree"])  # the radio's label, "chain" or "tree"
        updates[settings.widgets["k"]] = gr.update(value=values["k"], visible=k["visible"])
        updates[settings.widgets["max_nodes"]] = gr.update(value=values["max_nodes"], visible=budget["visible"])
    updates[settings.example] = gr.update(value=scenario.question_id)
    return updates


@dataclass
class Callbacks:
    """The pick: stop the visitor's run (its rounds would draw over the recording), set the controls and show the
    recorded run on its most instructive round, with the paragraph."""

    picker: Picker
    settings: panel.Settings
    view: RunView
    session: gr.State

    @property
    def outputs(self) -> list:
        named = [self.settings.example, self.settings.prompt, self.settings.drafter, *self.settings.widgets.values()]
        return [self.session, self.picker.note, *named, *self.view.outputs]

    def pick(self, state: Session, key: str | None) -> dict:
        scenario = scenarios.BY_KEY.get(key or "")
        if scenario is None:
            raise alerts.error(f"No scenario {key!r}: pick one from the list.")
        try:
            record = scenario.recorded()
            controls = control_updates(scenario, self.settings)
        except (OSError, trace.TraceError, SpecvizError) as error:
            raise alerts.error(f"Scenario {scenario.title} cannot open: {error}") from None
        state.runs.stop()
        state.show(record)
        return {self.session: state, self.picker.note: gr.update(value=note_markdown(scenario), visible=True),
                **controls, **self.view.render(record, status=status(scenario, record), index=record.showcase_index())}


def wire(picker: Picker, settings: panel.Settings, view: RunView, session: gr.State, cancels: list) -> Callbacks:
    """Wire the pick; ``cancels`` are the events that stream a live run (the pick stops it)."""
    calls = Callbacks(picker, settings, view, session)
    picker.dropdown.select(calls.pick, [session, picker.dropdown], calls.outputs, cancels=cancels, queue=False,
                           show_progress="hidden", api_visibility="private")
    return calls
