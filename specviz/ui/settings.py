"""The run settings panel (prompt, model, drafter, draft shape, sampling) and its conversion to a ``RunRequest``.

Every widget is derived from the settings' declaration (``specviz.settings``): kind, range, default, label and
info text; the drafter list comes from the drafter registry, grouped by family. The Playground lays it out; Chain
vs Tree reuses the same components as inputs, so both tabs always run the same prompt, seed, target and drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from specviz import settings as declared
from specviz.drafters import registry
from specviz.errors import SpecvizError
from specviz.settings import Setting
from specviz.ui import examples, runner

DEFAULT_QUESTION = "243"  # Spec-Bench summarization: input-grounded, where n-gram drafting shines
SECTIONS = ("prompt", "model", "run")  # the panel's order; the drafter comes right after the model section

SHOWN: list[Setting] = [s for section in SECTIONS for s in declared.SETTINGS if s.widget and s.group == section]
#: The panel's inputs, in the order ``request`` takes their values.
INPUT_NAMES: list[str] = ["prompt", *[s.name for s in SHOWN if s.group != "run"], "drafter",
                          *[s.name for s in SHOWN if s.group == "run"]]


def info_text(setting: Setting) -> str:
    """The widget's info line: the declared help, who reads it, the range a number takes here (a number box shows
    none of its own), and why the default is what it is."""
    text = setting.help
    if setting.type in (int, float):
        text += f" ({setting.describe_bounds(*setting.ui_range)})"
    if setting.drafter_only:
        text = f"{registry.reader_titles()[setting.name]} only: {text}"
    if setting.why:
        text += f". Default {to_widget(setting, setting.default)}: {setting.why}"
    return text


def to_widget(setting: Setting, value) -> Any:
    """A setting's value as its widget shows it (a bool on a radio by its label)."""
    for label, option in setting.ui_options:
        if option == value:
            return label
    return value


def from_widget(setting: Setting, value) -> Any:
    """A widget's value as the setting's (a radio label back to its bool); the check itself is the declaration's."""
    if not setting.ui_options:
        return value
    for label, option in setting.ui_options:
        if label == value:
            return option
    labels = " or ".join(label for label, _ in setting.ui_options)
    raise SpecvizError(f"{setting.label} must be {labels}, got {value!r}")


def widget(setting: Setting, **overrides) -> gr.components.Component:
    """The Gradio component for one declared setting."""
    common = {"label": setting.label, "info": info_text(setting), "elem_id": setting.elem_id, **overrides}
    value = common.pop("value", to_widget(setting, setting.default))
    kind = setting.widget
    if kind == "number":
        # No minimum/maximum and no precision: with them Gradio refuses a value without naming the field, or rounds
        # it (precision 0 ran k = 2.5 as 2), and a slider clamps what is typed into its box in the browser. What
        # the user typed reaches ``request``, whose check names the setting and its range.
        step = setting.ui_step or (1 if setting.type is int else 0.01)
        return gr.Number(value=value, step=step, **common)
    if kind == "checkbox":
        return gr.Checkbox(value, **common)
    if kind == "radio":
        choices = [label for label, _ in setting.ui_options] or list(setting.choices)
        return gr.Radio(choices, value=value, **common)
    if kind == "dropdown":
        return gr.Dropdown(value=value, allow_custom_value=True, **common)
    raise ValueError(f"no widget kind {kind!r} (setting {setting.name})")


def example_prompt(question_id: str | None):
    """The picked example's text for the prompt box; anything else leaves what the user typed there."""
    return examples.prompt_text(question_id) or gr.skip()


def drafter_info() -> str:
    families = "; ".join(f"{f.syntax}: {f.title}" for f in registry.families())
    return f"{families}. Default: {registry.default_help()}"


@dataclass
class Settings:
    example: gr.Dropdown
    prompt: gr.Textbox
    drafter: gr.Dropdown
    widgets: dict[str, gr.components.Component] = field(default_factory=dict)

    def __getattr__(self, name: str):  # panel.k, panel.target, ...: the widget of a declared setting
        widgets = self.__dict__.get("widgets") or {}
        if name in widgets:
            return widgets[name]
        raise AttributeError(name)

    @classmethod
    def build(cls) -> Settings:
        choices = examples.prompt_choices()
        default_q = DEFAULT_QUESTION if any(v == DEFAULT_QUESTION for _, v in choices) else None
        example = gr.Dropdown(choices=choices, value=default_q, label="Spec-Bench example prompt",
                              info="Spec-Bench (Apache-2.0, hemingkx/Spec-Bench)", elem_id="example")
        prompt = gr.Textbox(value=examples.prompt_text(default_q) or "Write a haiku about the sea.", lines=5,
                            max_lines=12, label="prompt", elem_id="prompt")
        widgets: dict[str, gr.components.Component] = {}
        drafter = None
        for section in SECTIONS:
            if section == "run":
                drafter = _drafter_dropdown(widgets.get("target"))
            _lay_out([s for s in SHOWN if s.group == section], widgets)
        settings = cls(example, prompt, drafter, widgets)
        # select, not input: input also fired when the picker was typed in and left (reverting to its choice),
        # which replaced the prompt the user had typed with the example's text
        example.select(example_prompt, example, prompt, queue=False)
        if "target" in widgets:
            widgets["target"].change(
                lambda t: gr.Dropdown(choices=runner.drafter_menu(t or ""), value=registry.default_for(t or "")),
                widgets["target"], drafter, queue=False)
        return settings

    @property
    def inputs(self) -> list:
        """Components in the order ``request`` takes them."""
        named = {"prompt": self.prompt, "drafter": self.drafter, **self.widgets}
        return [named[name] for name in INPUT_NAMES]


def _lay_out(shown: list[Setting], widgets: dict) -> None:
    """One widget per setting, in declaration order; neighbours with the same ``ui_row`` share a row."""
    index = 0
    while index < len(shown):
        row = shown[index].ui_row
        group = [shown[index]]
        while row and index + len(group) < len(shown) and shown[index + len(group)].ui_row == row:
            group.append(shown[index + len(group)])
        if row:
            with gr.Row():
                for setting in group:
                    widgets[setting.name] = _widget(setting)
        else:
            widgets[group[0].name] = _widget(group[0])
        index += len(group)


def _widget(setting: Setting) -> gr.components.Component:
    if setting.name == "target":
        targets = runner.target_choices()
        value = setting.default if setting.default in targets or not targets else targets[0]
        return widget(setting, choices=targets, value=value)
    return widget(setting)


def _drafter_dropdown(target: gr.Dropdown | None) -> gr.Dropdown:
    name = target.value if target is not None else ""
    return gr.Dropdown(choices=runner.drafter_menu(name), value=registry.default_for(name), allow_custom_value=True,
                       label="drafter", info=drafter_info(), elem_id="drafter")


def request(*values) -> runner.RunRequest:
    """A checked ``RunRequest`` from the panel's values (in ``INPUT_NAMES`` order; missing trailing ones take
    their defaults); bad settings raise a one-line ``SpecvizError``."""
    if len(values) > len(INPUT_NAMES):
        raise SpecvizError(f"the panel has {len(INPUT_NAMES)} settings, got {len(values)} values")
    given = dict(zip(INPUT_NAMES, values))
    fields = {"prompt": given.pop("prompt", "") or "", "drafter": (given.pop("drafter", None) or "").strip()}
    for name, value in given.items():
        fields[name] = from_widget(declared.get(name), value)
    return runner.RunRequest(**fields).validate()


def values_for(req: runner.RunRequest) -> list:
    """The panel's values that give ``req`` (the inverse of ``request``; for API clients and tests)."""
    return [getattr(req, name) if name in ("prompt", "drafter") else to_widget(declared.get(name), getattr(req, name))
            for name in INPUT_NAMES]
