"""The Playground's first screen (#43 item 3): a lesson's few controls, plain words, and the rest under "Advanced".

The app is built as the page serves it (``build_app``) and its layout read from ``demo.config``; the drafter choices
run on a tiny random target registered under the name ``tiny`` (as in ``tests/test_ui.py``).
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from specviz import settings as declared
from specviz.drafters import registry
from specviz.ui import runner
from specviz.ui import settings as panel
from specviz.ui.state import Session
from tests import tiny

#: What a newcomer sees beside the pictures: Run, Step, Stop, the lesson scenarios (#43 item 4: one pick sets all of
#: these), the example picker, the prompt, the drafter, chain or tree, the node budget (the draft length instead for a
#: chain) and the temperature.
FIRST_SCREEN = ["run", "step", "stop", "scenario", "example", "prompt", "drafter", "shape", "max-nodes",
                "temperature"]
#: Spec or CLI syntax that has no place in a first screen's words.
SYNTAX = re.compile(r":<|\||\[|--|`|<[a-z]|[a-z]+:[a-z0-9]")
CONTROLS = {"button", "textbox", "dropdown", "radio", "number", "checkbox", "slider", "uploadbutton",
            "downloadbutton", "file"}


@pytest.fixture(scope="module")
def config() -> dict:
    from specviz.ui.app import build_app

    return build_app().config


def settings_column(config: dict) -> tuple[dict, dict]:
    """(the Playground's settings column, the components by id): the column that holds the Run button."""
    components = {c["id"]: c for c in config["components"]}

    def ids(node) -> list:
        return [node["id"], *[i for child in node.get("children", []) for i in ids(child)]]

    def find(node):  # the innermost column holding the Run button: children first
        for child in node.get("children", []):
            found = find(child)
            if found:
                return found
        holds_run = any(components.get(i, {}).get("props", {}).get("elem_id") == "run" for i in ids(node))
        return node if components.get(node["id"], {}).get("type") == "column" and holds_run else None

    column = find(config["layout"])
    assert column is not None
    return column, components


def controls(config: dict) -> tuple[list[str], list[str], list[str], dict]:
    """(visible controls outside Advanced, hidden ones outside it, controls inside it, the Advanced accordion), by
    elem_id, in page order."""
    column, components = settings_column(config)
    shown, hidden, advanced, accordion = [], [], [], {}

    def walk(node, inside: bool) -> None:
        component = components.get(node["id"], {})
        props = component.get("props", {})
        if component.get("type") == "accordion" and props.get("label") == "Advanced":
            accordion.update(props)
            inside = True
        if component.get("type") in CONTROLS:
            name = props.get("elem_id") or f"{component['type']}:{props.get('label') or props.get('value')}"
            if inside:
                advanced.append(name)
            else:
                (shown if props.get("visible", True) is not False else hidden).append(name)
        for child in node.get("children", []):
            walk(child, inside)

    walk(column, False)
    return shown, hidden, advanced, accordion


def test_the_first_screen_shows_a_lessons_few_controls(config):
    shown, hidden, advanced, _ = controls(config)
    assert shown == FIRST_SCREEN  # 10 controls before the first picture (there were 23 in this column)
    assert hidden == ["k"]  # the chain's draft length, shown instead of the node budget when chain is picked
    assert list(panel.FIRST_SCREEN) == ["run", "step", "stop", "scenario", "example", "prompt", "drafter", "shape",
                                        "k", "max-nodes", "temperature"]


def test_everything_else_is_under_a_closed_advanced_accordion(config):
    shown, hidden, advanced, accordion = controls(config)
    assert accordion and accordion.get("open") is False
    rest = [s.elem_id for s in panel.SHOWN if not s.ui_basic]
    assert set(rest) <= set(advanced) and "measure-plain" in advanced, (rest, advanced)
    for elem_id in ("target", "target-forward", "width", "depth", "top-p", "seed", "max-new-tokens", "mode",
                    "min-draft-prob", "draft-vocab", "draft-quant", "stochastic-tree"):
        assert elem_id in advanced and elem_id not in shown + hidden, elem_id
    specs = [c["props"]["value"] for c in config["components"] if c["props"].get("elem_id") == "drafter-specs"]
    assert specs and "ngram[:auto][:N]" in specs[0]  # the spec syntax stays, for power users, under Advanced


def test_the_shape_shows_its_length_or_its_budget():
    k, budget = panel.shape_shown("chain")
    assert (k["visible"], budget["visible"]) == (True, False)
    k, budget = panel.shape_shown("tree")
    assert (k["visible"], budget["visible"]) == (False, True)


def test_first_screen_info_is_plain_words(config):
    by_id = {c["props"].get("elem_id"): c["props"] for c in config["components"]}
    texts = {elem_id: by_id[elem_id].get("info") or "" for elem_id in FIRST_SCREEN if elem_id in by_id}
    texts.update({s.elem_id: panel.info_text(s) for s in panel.BASIC})
    for target in (declared.default("target"), "tiny"):
        texts.update({f"drafter {spec}": panel.drafter_line(spec) for _, spec in panel.drafter_choices(target)})
    for where, text in texts.items():
        assert not SYNTAX.search(text), (where, text)
    for setting in panel.BASIC:  # each says what it does (not the CLI help) and, for a number, its range in words
        assert setting.ui_info and setting.ui_info[1:] in texts[setting.elem_id], setting.name
        if setting.type in (int, float):
            assert re.search(r"\(from [\d.]+ to [\d.]+\)$", texts[setting.elem_id]), setting.name
    # what it replaced would fail: the drafter's old info was every family's spec syntax
    assert SYNTAX.search("; ".join(f"{f.syntax}: {f.title}" for f in registry.families()))
    assert SYNTAX.search(panel.info_text(replace(declared.get("k"), ui_basic=False)))  # "an integer in [1, 16]"


def test_drafter_choices_are_plain_names_of_specs_that_run_with_the_target():
    target = declared.default("target")
    choices = panel.drafter_choices(target)
    names = [name for name, _ in choices]
    assert len(set(names)) == len(names) and "Prompt lookup (n-gram)" in names
    for name, spec in choices:
        assert not SYNTAX.search(name) and name != spec, (name, spec)
        family, _ = registry.check_ready(spec, target)  # a bare name needing a shipped checkpoint has it
        assert spec in family.ready(target), spec
        assert panel.drafter_line(spec).endswith(".") and len(panel.drafter_line(spec)) < 120, spec
    assert registry.default_for(target) in [spec for _, spec in choices]
    every_ready = {spec for family in registry.families() for spec in family.ready(target)}
    assert {spec for _, spec in choices} == every_ready


def test_the_drafter_list_follows_the_target(config):
    tiny_specs = [spec for _, spec in panel.drafter_choices("tiny")]
    default_specs = [spec for _, spec in panel.drafter_choices(declared.default("target"))]
    # a target with no shipped checkpoints lists only the drafters that need none
    assert tiny_specs and all(registry.family_of(spec).default_spec == spec for spec in tiny_specs)
    assert "eagle3" in default_specs and "eagle3" not in tiny_specs
    updated = panel.drafter_for_target("tiny")
    assert [spec for _, spec in updated.choices] == tiny_specs and updated.value == registry.default_for("tiny")
    assert updated.info == panel.drafter_line(updated.value)
    # a drafter that runs with the new target stays (a scenario sets both at once); one that does not is replaced
    assert panel.drafter_for_target("tiny", "ngram").value == "ngram"
    assert panel.drafter_for_target("tiny", "eagle3").value == registry.default_for("tiny")
    assert panel.drafter_for_target(declared.default("target"), "eagle3").value == "eagle3"
    # wired: a change of the target (under Advanced) redraws the drafter box
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    wired = [d for d in config["dependencies"] if [ids["target"], "change"] in [list(t) for t in d["targets"]]]
    assert any(d["outputs"] == [ids["drafter"]] and d["inputs"] == [ids["target"], ids["drafter"]] for d in wired)
    drafter = next(c for c in config["components"] if c["props"].get("elem_id") == "drafter")
    assert [tuple(choice) for choice in drafter["props"]["choices"]] == panel.drafter_choices(
        declared.default("target"))


def test_a_typed_spec_still_runs_as_typed():
    """The box takes a spec typed by hand (a variant, a checkpoint), which the request passes on unchanged."""
    values = panel.values_for(runner.RunRequest(prompt="hi", target="tiny", drafter="ngram:auto"))
    assert panel.request(*values).drafter == "ngram:auto"
    assert "Advanced" in panel.drafter_line("no-such-family:x")


@pytest.fixture(scope="module")
def tiny_target():
    runner.preload("tiny", tiny.target(vocab_size=64, scale=4.0))


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_every_choice_for_a_target_runs_on_it(tiny_target, shape):
    """Each first-screen drafter for the tiny target, picked as the page sends it, runs to the end, lossless."""
    from specviz import api

    for name, spec in panel.drafter_choices("tiny"):
        values = panel.values_for(runner.RunRequest(prompt="w1 w2 w3 w4 w1 w2 w3 w4 w1 w2", chat=False,
                                                    target="tiny", drafter=spec, max_new_tokens=12))
        values[panel.INPUT_NAMES.index("tree")] = shape
        request = panel.request(*values)
        live = Session().runs.start(request)
        live.join(60)
        record = live.record
        assert live.error is None and record.finished and record.rounds, (name, spec, live.error)
        target = runner.load_target("tiny")[0]
        plain = api.plain_decode(target, target.encode_prompt(request.prompt, chat=False), request.config())
        assert record.token_ids == plain.token_ids, (name, spec)


def test_every_family_has_a_plain_name_and_line():
    """Written once, with the family's registration: a newcomer's list never falls back on a title like
    "lookup + model" or a description full of spec syntax."""
    for family in registry.families():
        assert family.plain_name and family.plain_line, family.name
        assert not SYNTAX.search(family.plain_name + " " + family.plain_line), family.name
