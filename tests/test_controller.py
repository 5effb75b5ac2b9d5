"""The run controller on a tiny random target: start, replace, step, stop, the finished record, and cleanup when
the visitor leaves. No Gradio: the controller is what the app's callbacks ask, and it imports none."""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specviz import api
from specviz.ui import controller, runner
from specviz.ui.controller import RunController, SteppedRun, StreamedRun
from specviz.ui.state import Session, Visitors
from tests import tiny

PROMPT = "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"


@pytest.fixture(scope="module", autouse=True)
def tiny_targets():
    fast = tiny.target(vocab_size=64, scale=4.0)
    slow = tiny.target(vocab_size=64, scale=4.0)
    slow.model.register_forward_pre_hook(lambda module, args: time.sleep(0.03))
    runner.preload("tiny", fast)
    runner.preload("tiny-slow", slow)
    return fast, slow


def request(**kwargs) -> runner.RunRequest:
    settings = dict(prompt=PROMPT, chat=False, target="tiny", drafter="ngram", max_new_tokens=24)
    settings.update(kwargs)
    return runner.RunRequest(**settings).validate()


def slow(max_new_tokens: int = 400) -> runner.RunRequest:
    return request(target="tiny-slow", max_new_tokens=max_new_tokens)


def rounds(run: StreamedRun, n: int) -> None:
    """Wait until ``run`` has ``n`` rounds."""
    deadline = time.time() + 30
    while len(run.record.rounds) < n and time.time() < deadline:
        time.sleep(0.01)
    assert len(run.record.rounds) >= n


def plain_ids(tiny_targets, req: runner.RunRequest) -> list[int]:
    target = tiny_targets[0]
    return api.plain_decode(target, target.encode_prompt(PROMPT, chat=False), req.config()).token_ids


def test_the_controller_imports_no_gradio():
    code = "import sys, specviz.ui.controller; print('gradio' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "False"


def test_start_runs_to_a_finished_record(tiny_targets):
    runs = RunController()
    live = runs.start(request(), name="chain")
    assert runs.current is live and live.owner == controller.PLAYGROUND
    live.join(60)
    assert live.outcome == controller.FINISHED and not live.alive and not runs.busy and runs.running is None
    record = live.record
    assert record.finished and record.stop_reason == "max_new_tokens" and record.name == "chain"
    assert record.source == "live" and record.token_ids == plain_ids(tiny_targets, request())  # greedy: lossless
    assert runs.stop() is None and live.outcome == controller.FINISHED  # nothing on: the record stays as it ended
    assert runner.active_runs() == 0


def test_a_new_run_replaces_the_one_in_flight(tiny_targets):
    """One run per visitor: starting another stops the one in flight after its round and waits for its thread
    before the new one starts; the replaced run knows what replaced it (its tab says so when another tab did)."""
    runs = RunController()
    first = runs.start(slow(), owner=controller.PLAYGROUND)
    rounds(first, 2)
    second = runs.start(request(), owner=controller.COMPARE)
    assert not first.alive and first.outcome == controller.REPLACED and first.replaced_by is second
    assert first.record.stop_reason == "stopped" and first.record.summary is not None  # a stopped run's trace
    assert 2 <= len(first.record.rounds) and first.record.new_tokens < 400
    second.join(60)
    assert second.outcome == controller.FINISHED and runs.current is second and second.record.finished
    assert runner.active_runs() == 0


def test_stop_keeps_the_rounds_so_far(tiny_targets):
    runs = RunController()
    live = runs.start(slow())
    rounds(live, 3)
    assert runs.busy and runs.running is live
    assert runs.stop() is live
    assert not live.alive and live.outcome == controller.STOPPED and live.error is None and not runs.busy
    assert live.record.stop_reason == "stopped" and live.record.summary["stop_reason"] == "stopped"
    assert 3 <= len(live.record.rounds) and live.record.new_tokens < 400
    assert runs.stop() is None  # nothing left to stop


def test_an_error_ends_the_run_in_one_line(tiny_targets):
    live = RunController().start(request(target="no-such-model"))
    live.join(30)
    assert live.outcome == controller.FAILED and "unknown model 'no-such-model'" in str(live.error)
    assert not live.record.rounds and live.record.summary is None  # nothing ran: no stopped trace either


def test_stepping_advances_one_round_per_call(tiny_targets):
    runs, req = RunController(), request(max_new_tokens=12)
    stepped = runs.stepping(req)
    assert isinstance(stepped, SteppedRun) and stepped.fresh and not runs.busy
    stepped.advance()
    assert len(stepped.record.rounds) == 1 and not stepped.fresh and stepped.outcome is None
    assert runs.stepping(req) is stepped  # the same request goes on with the same run
    runs.stepping(req).advance()
    assert len(stepped.record.rounds) == 2
    while not stepped.ended:
        stepped.advance()
    assert stepped.outcome == controller.FINISHED and stepped.record.finished
    assert stepped.record.token_ids == plain_ids(tiny_targets, req)
    assert runs.stepping(req) is not stepped  # a finished one is not stepped again: a new run


def test_other_settings_a_run_or_stop_end_a_stepped_run(tiny_targets):
    runs = RunController()
    stepped = runs.stepping(request())
    stepped.advance()
    other = runs.stepping(request(k=3))
    assert other is not stepped and stepped.outcome == controller.REPLACED and stepped.replaced_by is other
    assert stepped.record.stop_reason == "stopped"
    other.advance()
    live = runs.start(request())
    assert other.outcome == controller.REPLACED and other.replaced_by is live
    live.join(60)
    third = runs.stepping(request())
    third.advance()
    assert runs.stop() is third and third.outcome == controller.STOPPED and third.record.stop_reason == "stopped"
    third.advance()  # a stopped run goes no further
    assert len(third.record.rounds) == 1


def test_whole_steps_run_once_and_reveal_a_round_per_call(tiny_targets):
    """ZeroGPU cannot hold a GPU between clicks: the first Step runs the generation, each Step shows one round."""
    calls = []

    def stream(req, **kwargs):
        calls.append(req)
        return runner.stream(req, **kwargs)

    stepped = RunController(stream=stream, whole_steps=True).stepping(request(max_new_tokens=12))
    stepped.advance()
    stepped.advance()
    assert len(stepped.record.rounds) == 2 and len(calls) == 1 and runner.active_runs() == 0


def test_a_fresh_controller_copies_like_data_and_a_used_one_refuses():
    """gr.State deep-copies each session's initial value: a controller that never ran is plain data; one holding a
    thread is not copied into something that only looks like it."""
    fresh = Session()
    copied = copy.deepcopy(fresh)
    assert copied is not fresh and copied.runs is not fresh.runs and copied.record is None
    fresh.runs.start(request()).join(60)
    with pytest.raises(TypeError):
        copy.deepcopy(fresh)


def test_a_leaving_visitor_s_run_stops_and_their_files_go(tiny_targets, caplog):
    """``demo.unload`` (``Visitors.leave``) and Gradio's state delete (``Session.close``) end a visitor's run at once
    and delete their trace files; the other visitors' runs go on. The operator's log says how each run ended and how
    many were left on the machine."""
    caplog.set_level("INFO", logger="specviz.ui")
    visitors, leaving, staying = Visitors(), Session(), Session()
    visitors.arrive("a", leaving)
    visitors.arrive("b", staying)
    done = leaving.runs.start(request(max_new_tokens=8))
    done.join(60)
    trace = Path(leaving.trace_file(done.record, "playground"))
    live, other = leaving.runs.start(slow()), staying.runs.start(slow())
    rounds(live, 2)
    visitors.leave("a")
    visitors.leave("nobody")  # a session that never loaded the page
    assert live.outcome == controller.CLOSED and not live.alive and not trace.parent.exists()
    assert other.alive and other.outcome is None and len(visitors) == 1
    staying.close()  # what gr.State's delete callback does, an hour after the tab closed
    assert other.outcome == controller.CLOSED and not other.alive
    staying.close()  # twice is harmless
    assert runner.active_runs() == 0
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run ")]
    assert ended[0] == f"run finished after {len(done.record.rounds)} rounds; runs on the machine now: 0", ended
    assert ended[1].startswith("run stopped after") and ended[1].endswith("runs on the machine now: 1"), ended
    assert ended[2].startswith("run stopped after") and ended[2].endswith("runs on the machine now: 0"), ended


def test_finished_answers_join_the_visitors_memory_and_retrieval_reuses_them(tiny_targets):
    """Cache reuse: a visitor's second retrieval run drafts from their first answer; another visitor's memory stays
    empty (no text of one visitor reaches another)."""
    runs, other = RunController(), RunController()
    first = runs.start(request(drafter="retrieval", max_new_tokens=12))
    first.join()
    assert first.outcome == "finished" and len(runs.memory) == 1
    answer = [t for r in first.record.rounds for t in r.committed]
    assert runs.memory.index().forward[: len(answer)].tolist() == answer
    second = runs.start(request(drafter="retrieval", max_new_tokens=12))
    second.join()
    sources = {label for r in second.record.rounds for label in r.meta.get("node_labels", [])}
    assert "answer 1 of this session" in sources
    assert len(other.memory) == 0 and other.memory is not runs.memory
    copied = copy.deepcopy(Session())  # a fresh visitor's state still copies like data
    assert len(copied.runs.memory) == 0
