"""The Playground's lesson scenarios (#43 item 4): each opens on a shipped recording that holds exactly its settings,
its settings pass the panel's own check (what Run sends live), each lesson's claim holds in its recording, and one
pick sets the controls and shows the recording with its paragraph. Also the round view's stepping (#43 item 5).

No model runs here: the scenarios open on recorded traces.
"""

from __future__ import annotations

import os
from html import escape

import gradio as gr
import pytest

from specviz import settings as declared
from specviz.ui import examples, runner, scenario_picker, scenarios
from specviz.ui import settings as panel
from specviz.ui.scenarios import BY_KEY, SCENARIOS
from specviz.ui.state import Session
from specviz.ui.views import RunView, stepped_index
from specviz.viz import theory

CONFIG = ("max_new_tokens", "seed", "temperature", "top_p", "top_k", "chat")
BUDGET = ("tree", "k", "width", "depth", "max_nodes", "min_draft_prob")


def test_at_least_five_scenarios_each_with_its_recording():
    assert len(SCENARIOS) >= 5
    assert len({s.key for s in SCENARIOS}) == len(SCENARIOS) == len({s.title for s in SCENARIOS})
    for scenario in SCENARIOS:
        assert (examples.TRACES / scenario.trace).is_file(), f"record it: {scenario.recording_command()}"
        assert scenario.shape in examples.SHAPES and scenario.look_for.strip(), scenario.key
    assert scenarios.available() == list(SCENARIOS)
    assert [key for _, key in scenarios.choices()] == [s.key for s in SCENARIOS]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.key)
def test_the_recording_holds_the_scenarios_settings(scenario):
    """Drafter, target, prompt, sampling, length and draft shape in the trace's header are the scenario's: Run
    replays the lesson live, not something else."""
    request, record = scenario.request(), scenario.recorded()
    header = record.header
    assert header["drafter"]["name"] == scenario.drafter
    assert header["target"]["name"] == request.target == declared.default("target")
    assert header["prompt"]["text"] == request.prompt == scenario.prompt and scenario.prompt
    assert str(header["example"]["question_id"]) == scenario.question_id
    assert header["example"]["category"] == scenario.category
    assert {name: header["config"][name] for name in CONFIG} == {name: getattr(request, name) for name in CONFIG}
    assert {name: header["budget"][name] for name in BUDGET} == {name: getattr(request, name) for name in BUDGET}
    if "stochastic_tree" in header["drafter"]:
        assert header["drafter"]["stochastic_tree"] == request.stochastic_tree
    assert request.temperature == scenario.temperature
    assert record.rounds and examples.drafted_shape(record.rounds) == ("tree" if request.tree else "chain")
    assert header["example"]["machine"], "the label names the machine it was recorded on"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.key)
def test_the_settings_pass_the_panels_check(scenario):
    """The values the picker puts in the panel are what Run then checks and sends (``settings.request``)."""
    values = scenario.values()
    assert len(values) == len(panel.INPUT_NAMES)
    assert panel.request(*values) == scenario.request()
    drafters = [spec for _, spec in panel.drafter_choices(declared.default("target"))]
    assert scenario.drafter in drafters  # a plain name on the first screen, not a typed spec


def test_a_broken_setting_is_caught_by_the_same_check():
    """The check the scenarios pass is one that can fail: a shape the UI does not take is refused in one line."""
    bad = scenarios.Scenario("bad", "bad", "coding", "ngram", "chain-long", "x", max_new_tokens=10_000)
    with pytest.raises(Exception, match="max-new-tokens must be"):
        bad.request()


def tau(key: str) -> float:
    return BY_KEY[key].recorded().metrics().tau


def test_each_lesson_holds_in_its_recording():
    """What each paragraph tells the reader to look for is there in the recording it opens on."""
    # lookup pays where the answer copies its input, and barely where it does not
    assert tau("lookup-copies") > tau("weak-drafter")
    weak = BY_KEY["weak-drafter"].recorded().rounds
    empty = [r for r in weak if not r.tokens]
    first_refused = [r for r in weak if r.tokens and not r.accepted]
    assert len(empty) > len(weak) / 2 and len(first_refused) > (len(weak) - len(empty)) / 2
    # a stronger drafter on the same prompt gets more per round; the same drafter as a tree more again
    assert tau("strong-drafter") > tau("weak-drafter")
    assert tau("chain-vs-tree") > tau("strong-drafter")
    assert any(r.meta.get("pruned") for r in BY_KEY["chain-vs-tree"].recorded().rounds)  # the faded nodes
    # sampling changes the accept rule
    assert {r.rule for r in BY_KEY["strong-drafter"].recorded().rounds} == {"greedy"}
    assert {r.rule for r in BY_KEY["greedy-vs-sampling"].recorded().rounds} == {"rejection-sampling"}
    # DSpark drafts a block and verifies a prefix its confidence chose; the rest is recorded as cut
    dspark = BY_KEY["dspark-cut"].recorded().rounds
    cut = [r for r in dspark if r.meta.get("pruned") and len(r.tokens) < r.meta["block"]["drafts"]]
    assert len(cut) > len(dspark) / 2
    assert all(r.meta["schedule"]["length"] == len(r.tokens) for r in dspark)
    # too long: this machine's best draft length, from the recorded verify-cost curve, is short of the run's 12
    shown = theory.theory(BY_KEY["draft-too-long"].recorded())
    assert shown is not None and shown.costs is not None and shown.own == 12 and shown.best < 12
    assert shown.speedup_measured < max(s for s in shown.speedup if s is not None)


@pytest.fixture(scope="module")
def page():
    with gr.Blocks():
        session = gr.State(Session)
        picker = scenario_picker.build()
        settings = panel.Settings.build()
        view = RunView.build("s-")
        calls = scenario_picker.wire(picker, settings, view, session, cancels=[])
    return calls


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.key)
def test_a_pick_sets_the_controls_and_shows_the_recording(page, scenario):
    state = Session()
    updates = page.pick(state, scenario.key)
    assert state.record is not None and state.record.name == scenario.trace and state.record.source == "trace"
    note = updates[page.picker.note]
    assert note["visible"] is True and scenario.look_for in note["value"]
    named = {"prompt": page.settings.prompt, "drafter": page.settings.drafter, **page.settings.widgets}
    for name, value in zip(panel.INPUT_NAMES, scenario.values(), strict=True):
        assert updates[named[name]]["value"] == value, name
    assert updates[page.settings.example]["value"] == scenario.question_id
    shape = "tree" if scenario.request().tree else "chain"
    assert updates[page.settings.widgets["k"]]["visible"] == (shape == "chain")
    assert updates[page.settings.widgets["max_nodes"]]["visible"] == (shape == "tree")
    assert escape(scenario.title) in updates[page.view.status] and "Press Run" in updates[page.view.status]
    assert updates[page.view.round_slider]["value"] == state.record.showcase_index()
    assert page.session in updates and set(page.outputs) >= set(updates)


def test_an_unknown_scenario_is_one_line(page):
    with pytest.raises(gr.Error, match="No scenario"):
        page.pick(Session(), "<b>nope</b>")
    with pytest.raises(gr.Error) as raised:
        page.pick(Session(), "<b>nope</b>")
    assert "<b>" not in str(raised.value.message)  # escaped for the toast


def test_a_pick_stops_the_visitors_run(page, monkeypatch):
    state = Session()
    stopped = []
    monkeypatch.setattr(state.runs, "stop", lambda: stopped.append(True))
    page.pick(state, SCENARIOS[0].key)
    assert stopped == [True]


def test_stepping_rounds_stays_within_the_run():
    assert stepped_index(None, 1, 5) == 1 and stepped_index(0, -1, 5) == 0
    assert stepped_index(4, 1, 5) == 4 and stepped_index(2.0, -1, 5) == 1 and stepped_index(3, 1, 1) == 0
    with gr.Blocks():
        view = RunView.build("k-")
    record = SCENARIOS[0].recorded()
    updates = view.step_round(record, 3, 1)
    assert updates[view.round_slider]["value"] == 4 and "round 4 of" in updates[view.round_info]
    assert view.step_round(None, 3, 1) == {} and view.step_round(record, len(record.rounds) - 1, 1)[
        view.round_slider]["value"] == len(record.rounds) - 1


def test_the_keys_click_this_views_buttons_only_outside_text_boxes():
    from specviz.ui.views import round_keys_js

    js = round_keys_js("replay-")
    assert "'replay-round-prev'" in js and "'replay-round-next'" in js
    assert "ArrowLeft" in js and "ArrowRight" in js and "'INPUT', 'TEXTAREA', 'SELECT'" in js
    assert "offsetParent" in js  # a view on a hidden tab does not step


def test_the_recorder_names_what_the_scenarios_open():
    assert examples.trace_name("coding", "model:smollm2-135m-draft", "chain-long") == \
        "coding-smollm2-135m-draft-chain-long.jsonl"
    assert BY_KEY["draft-too-long"].trace == "coding-smollm2-135m-draft-chain-long.jsonl"
    assert runner.RunRequest(prompt="x", **examples.SHAPES["chain-long"]).validate().k == 12


def test_a_busy_machine_is_what_other_work_uses_now(monkeypatch):
    """The recorder's "not a quiet machine" note reads the CPU time other work used over a second while it waited,
    not the load average (which also counts the recorder's own previous traces)."""
    import threading
    import time

    from specviz.bench import machine
    from specviz.ui import examples

    stop = time.perf_counter() + 1.5
    spinner = threading.Thread(target=lambda: [None for _ in iter(lambda: time.perf_counter() > stop, True)])
    spinner.start()
    busy = machine.busy_cores(seconds=1.0)
    spinner.join()
    assert busy is not None and 0.5 <= busy <= (os.cpu_count() or 1) + 0.01  # the spinning thread is other work
    monkeypatch.setattr(machine, "busy_cores", lambda seconds=1.0: 0.2)
    assert examples.busy_note(machine) == ""
    monkeypatch.setattr(machine, "busy_cores", lambda seconds=1.0: 1.6)
    assert examples.busy_note(machine).startswith("not a quiet machine (other work used 1.6 of")
