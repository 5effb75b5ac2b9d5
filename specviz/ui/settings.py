"""The run settings panel (prompt, model, drafter, draft shape, sampling) and its conversion to a ``RunRequest``.

Every widget is derived from the settings' declaration (``specviz.settings``): kind, range, default, label and
info text; the drafter list comes from the drafter registry. The Playground lays it out; Chain vs Tree reuses the
same components as inputs, so both tabs always run the same prompt, seed, target and drafter.

The first screen is a lesson's few controls: the prompt, the drafter by its plain name (``registry.plain_menu``:
only the drafters that run with the chosen target) with one line on what it does, and the settings declared
``ui_basic`` (chain or tree, the draft length or the node budget, as the shape asks, the temperature), with info in
plain words. Everything else is under a closed "Advanced" accordion, the drafter specs' syntax included.
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
#: On the first screen, in declaration order (the shape, its length or budget, the temperature).
BASIC: list[Setting] = [s for s in declared.SETTINGS if s.widget and s.ui_basic]
#: The element ids shown above "Advanced": the buttons' and the scenario picker's (``playground.build``) and the
#: panel's. Tests count them.
FIRST_SCREEN: tuple[str, ...] = ("run", "step", "stop", "scenario", "example", "prompt", "drafter",
                                 *[s.elem_id for s in BASIC])
#: The panel's inputs, in the order ``request`` takes their values.
INPUT_NAMES: list[str] = ["prompt", *[s.name for s in SHOWN if s.group != "run"], "drafter",
                          *[s.name for s in SHOWN if s.group == "run"]]


def info_text(setting: Setting) -> str:
    """The widget's info line: the declared help, who reads it, the range a number takes here (a number box shows
    none of its own), and why the default is what it is. A first-screen setting's says what it does in plain words,
    and its range as "from a to b"."""
    if setting.ui_basic:
        low, high = setting.ui_range
        bounds = f" (from {_plain_number(low)} to {_plain_number(high)})" if setting.type in (int, float) else ""
        return setting.ui_info[:1].upper() + setting.ui_info[1:] + bounds
    text = setting.help
    if setting.type in (int, float):
        text += f" ({setting.describe_bounds(*setting.ui_range)})"
    if setting.drafter_only:
        text = f"{registry.reader_titles()[setting.name]} only: {text}"
    if setting.why:
        text += f". Default {to_widget(setting, setting.default)}: {setting.why}"
    return text


def _plain_number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


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


def drafter_choices(target: str) -> list[tuple[str, str]]:
    """The first screen's drafter list: (plain name, spec) for each drafter that runs with ``target``."""
    return registry.plain_menu(target or "")


def drafter_line(spec: str | None) -> str:
    """The drafter box's info: one line on what the chosen drafter does, in plain words."""
    line = registry.plain_line(spec or "")
    if not line:
        return "A drafter spec typed by hand: Advanced lists what you can type."
    return line[:1].upper() + line[1:] + "."


def drafter_for_target(target: str | None, current: str | None = None) -> gr.Dropdown:
    """The drafter box after the target changed: the drafters that run with it, on the ``current`` one where it is
    among them (a scenario sets the target and its drafter at once), else on the target's default drafter."""
    choices = drafter_choices(target or "")
    spec = current if current in [value for _, value in choices] else registry.default_for(target or "")
    return gr.Dropdown(choices=choices, value=spec, info=drafter_line(spec))


def drafter_specs() -> str:
    """Advanced's reference of the drafter specs that can be typed into the drafter box (variants, checkpoints)."""
    rows = "\n".join(f"- `{f.syntax}`: {f.title}" for f in registry.families())
    return ("**Drafter specs.** Type one into the drafter box to run a variant or another checkpoint (e.g. "
            f"`ngram:auto`, `dspark:raw`):\n{rows}\n\nDefault: {registry.default_help()}.")


def shape_shown(shape: str) -> tuple[dict, dict]:
    """A chain shows its draft length, a tree its node budget (the widgets' visibility for the shape radio)."""
    tree = from_widget(declared.get("tree"), shape) if shape in ("chain", "tree") else True
    return gr.update(visible=not tree), gr.update(visible=tree)


@dataclass
class Settings:
    example: gr.Dropdown
    prompt: gr.Textbox
    drafter: gr.Dropdown
    widgets: dict[str, gr.components.Component] = field(default_factory=dict)
    advanced: gr.Accordion | None = None  # the closed accordion with everything a first lesson does not need

    def __getattr__(self, name: str):  # panel.k, panel.target, ...: the widget of a declared setting
        widgets = self.__dict__.get("widgets") or {}
        if name in widgets:
            return widgets[name]
        raise AttributeError(name)

    @classmethod
    def build(cls) -> Settings:
        """The first screen (example, prompt, drafter, the ``ui_basic`` settings), then "Advanced", closed."""
        choices = examples.prompt_choices()
        default_q = DEFAULT_QUESTION if any(v == DEFAULT_QUESTION for _, v in choices) else None
        example = gr.Dropdown(choices=choices, value=default_q, label="example prompt",
                              info="Prompts from Spec-Bench (Apache-2.0, hemingkx/Spec-Bench); picking one replaces "
                                   "the prompt", elem_id="example")
        prompt = gr.Textbox(value=examples.prompt_text(default_q) or "Write a haiku about the sea.", lines=5,
                            max_lines=12, label="prompt", elem_id="prompt")
        widgets: dict[str, gr.components.Component] = {}
        # the target is under Advanced but decides the drafter list: its default sets the first one
        target_setting = declared.get("target")
        drafter = _drafter_dropdown(_target_value(target_setting) if target_setting in SHOWN else "")
        _lay_out(BASIC, widgets)
        with gr.Accordion("Advanced", open=False, elem_id="advanced") as advanced:
            for section in SECTIONS:
                _lay_out([s for s in SHOWN if s.group == section and not s.ui_basic], widgets)
                if section == "model":
                    gr.Markdown(drafter_specs(), elem_id="drafter-specs")
        settings = cls(example, prompt, drafter, widgets, advanced)
        # select, not input: input also fired when the picker was typed in and left (reverting to its choice),
        # which replaced the prompt the user had typed with the example's text
        example.select(example_prompt, example, prompt, queue=False)
        drafter.change(lambda spec: gr.Dropdown(info=drafter_line(spec)), drafter, drafter, queue=False,
                       show_progress="hidden", api_visibility="private")
        if "target" in widgets:
            widgets["target"].change(drafter_for_target, [widgets["target"], drafter], drafter, queue=False,
                                     show_progress="hidden", api_visibility="private")
        if {"tree", "k", "max_nodes"} <= widgets.keys():
            widgets["tree"].change(shape_shown, widgets["tree"], [widgets["k"], widgets["max_nodes"]], queue=False,
                                   show_progress="hidden", api_visibility="private")
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


def _target_value(setting: Setting) -> str:
    targets = runner.target_choices()
    return setting.default if setting.default in targets or not targets else targets[0]


def _widget(setting: Setting) -> gr.components.Component:
    if setting.name == "target":
        return widget(setting, choices=runner.target_choices(), value=_target_value(setting))
    if setting.name in ("k", "max_nodes"):  # the shape radio shows the one its shape reads
        return widget(setting, visible=(setting.name == "max_nodes") == bool(declared.default("tree")))
    return widget(setting)


def _drafter_dropdown(target: str) -> gr.Dropdown:
    """The drafter by plain name; a spec typed into it (``ngram:auto``, ``model:<dir>``) runs as typed."""
    spec = registry.default_for(target)
    return gr.Dropdown(choices=drafter_choices(target), value=spec, allow_custom_value=True, label="drafter",
                       info=drafter_line(spec), elem_id="drafter")


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
