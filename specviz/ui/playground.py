"""Playground tab: Run (streamed), Step (one round per click), Stop, and the full plain-decoding comparison.

Its first screen is Run / Step / Stop, the lesson scenarios (``scenario_picker``) and the settings panel's few lesson
controls; the rest of the settings and the full plain run are under the panel's closed "Advanced" accordion
(``settings.Settings.build``). The round view steps with its buttons or the keyboard (``RunView.wire_round_steps``).

``Callbacks`` take the visitor's ``Session`` from ``gr.State`` and return ``RunView`` updates. What runs, what it
replaces and how it ended is the session's ``RunController``'s (``controller``): Run starts a run on its engine
thread and draws it as it streams, Step advances a stepped run by one round, Stop stops whichever is on.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass

import gradio as gr

from specviz.errors import SpecvizError
from specviz.settings import default
from specviz.settings import get as declared
from specviz.ui import alerts, controller, runner, scenario_picker, settings, streaming
from specviz.ui.controller import SteppedRun, StreamedRun
from specviz.ui.state import Session
from specviz.ui.views import RunView, stepped_index
from specviz.viz import panels
from specviz.viz.record import RunRecord

log = logging.getLogger("specviz.ui")
INTRO = ("Showing a recorded example run (no model loaded yet). Press Run for a live run of the real model, or "
         "Step to advance one round at a time.")


@dataclass
class Playground:
    settings: settings.Settings
    view: RunView
    run: gr.Button
    step: gr.Button
    stop: gr.Button
    measure: gr.Button
    run_event: object = None
    step_event: object = None


def checked_request(view: RunView, values, doing: str = "The run did not start"
                    ) -> Generator[dict, None, runner.RunRequest]:
    """The panel's checked request (``request = yield from checked_request(view, values)`` in a callback). A bad
    setting first replaces the status line (an older message must not stay on show beside the new error), then
    raises its one-line error as the toast."""
    try:
        return settings.request(*values)
    except SpecvizError as error:
        yield view.render(None, status=f"{doing}: {error}", level="error")
        raise alerts.error(str(error)) from None


def build(session: gr.State, download: gr.DownloadButton) -> Playground:
    with gr.Row():
        with gr.Column(scale=4, min_width=320):
            with gr.Row():  # above the settings: the column is long, and Run is what a demo reaches for first
                # one row even on a phone (Gradio's default minimum width put each button on a line of its own)
                run_btn = gr.Button("Run", variant="primary", elem_id="run", min_width=80)
                step_btn = gr.Button("Step", elem_id="step", min_width=80)
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
            picker = scenario_picker.build()
            panel = settings.Settings.build()
            with panel.advanced:  # the lossless check: a second run, not a lesson's first step
                measure_btn = gr.Button("Measure plain decoding of this prompt (full side-by-side run)",
                                        size="sm", elem_id="measure-plain")
        with gr.Column(scale=7):
            view = RunView.build(intro="Press Run.")
    page = Playground(panel, view, run_btn, step_btn, stop_btn, measure_btn)
    calls, inputs, outputs = Callbacks(view, download), [session, *panel.inputs], [*view.outputs, download]
    # "multiple": Run during a run restarts it with the panel's current settings (the older run is replaced);
    # Gradio's default ("once") would drop the click without a word.
    page.run_event = run_btn.click(calls.run, inputs, outputs, concurrency_id="model", show_progress="hidden",
                                   api_name="run", trigger_mode="multiple")
    page.step_event = step_btn.click(calls.step, inputs, outputs, concurrency_id="model", show_progress="hidden",
                                     api_name="step")
    stop_btn.click(calls.stop, [session], outputs, cancels=[page.run_event], queue=False, api_name="stop")
    measure_btn.click(calls.measure, inputs, outputs, concurrency_id="model", show_progress="hidden",
                      api_name="measure_plain")
    view.round_slider.input(calls.pick_round, [session, view.round_slider], view.round_outputs,
                            trigger_mode="always_last", show_progress="hidden", queue=False)
    view.wire_round_steps(calls.step_round, session)
    scenario_picker.wire(picker, panel, view, session, cancels=[page.run_event])
    return page


@dataclass
class Callbacks:
    """The Playground's event handlers: each asks the session's ``RunController`` and draws what it says."""

    view: RunView
    download: gr.DownloadButton

    def run(self, state: Session, *values):
        request = yield from checked_request(self.view, values)
        live = state.runs.start(request)
        state.show(live.record)
        yield self.view.render(live.record, status=streaming.live_status(live), running=True)
        for heavy in streaming.watch(live):
            # a round the reader picked stays on show (no caret: the text scrolls to it) while newer ones stream in
            count = len(live.record.rounds)  # this frame's rounds: the engine thread appends meanwhile
            state.newest_shown = count - 1
            yield self.view.render(live.record, status=streaming.live_status(live), heavy=heavy,
                                   running=state.pinned is None, index=state.pinned, count=count)
        yield from self._ended(state, live)

    def step(self, state: Session, *values):
        request = yield from checked_request(self.view, values)
        if state.runs.busy:
            raise alerts.error("A run is in progress: press Stop first.")
        stepped = state.runs.stepping(request)  # this request's stepped run, or a new one
        state.show(stepped.record)
        if stepped.fresh:
            yield self.view.render(stepped.record, status=streaming.step_loading(request), running=True)
        stepped.advance()
        yield from self._stepped(state, stepped)

    def stop(self, state: Session) -> dict:
        stopped = state.runs.stop()
        record = state.record
        if record is None or record.source == "trace" or (stopped is None and record.source == "live"):
            alerts.info("Nothing is running.")
        if record is None or record.source == "trace":
            return {}
        message, level = streaming.final_status(record, stopped=record.stop_reason == "stopped")
        pinned, state.pinned = state.pinned, None
        updates = self.view.render(record, status=message, level=level, index=pinned)
        return {**updates, self.download: self._download(state, record)} if record.rounds else updates

    def measure(self, state: Session, *values):
        record = state.record
        if record is None or not record.rounds or record.source == "trace":
            raise alerts.error("Run a live generation first: the plain run must use the same prompt and settings.")
        if state.runs.busy:
            raise alerts.error("A run is in progress: wait for it or press Stop.")
        request = yield from checked_request(self.view, values, "Plain decoding did not start")
        recorded = runner.RunRequest(**{**request.to_dict(), **recorded_settings(record)})
        yield {self.view.status: panels.status_html(f"Plain decoding of the same prompt ({recorded.max_new_tokens} "
                                                    "new tokens, same sampler and clock)…")}
        try:
            record.plain = runner.plain_run(recorded)
        except Exception as error:
            message = streaming.one_line(error)
            yield {self.view.status: panels.status_html(f"Plain decoding failed: {message}", "error")}
            raise alerts.error(message) from None
        if record.plain.get("note"):
            alerts.warning(record.plain["note"])
        message, level = streaming.final_status(record, stopped=record.stop_reason == "stopped")
        yield {**self.view.render(record, status=message, level=level), self.download: self._download(state, record)}

    def pick_round(self, state: Session, index) -> dict:
        """Show round ``index``; during a live run, keep showing it as rounds stream in (``Session.pinned``), until
        the reader picks the newest round the page has shown again."""
        record = state.record
        if record is not None and record.source == "live" and state.runs.busy and record.rounds:
            state.pinned = None if index is None or int(index) >= state.newest_shown else int(index)
        return self.view.render_round(record, index)

    def step_round(self, state: Session, index: float | None, delta: int) -> dict:
        """The previous or next round (its buttons, ← and →), picked as the slider picks one."""
        record = state.record
        if record is None or not record.rounds:
            return {}
        shown = stepped_index(index, delta, len(record.rounds))
        return {self.view.round_slider: gr.update(value=shown), **self.pick_round(state, shown)}

    def _ended(self, state: Session, live: StreamedRun):
        """A run's last frame from its own callback: its result, or nothing where another callback draws its end."""
        record = live.record
        if live.outcome in (controller.REPLACED, controller.STOPPED, controller.CLOSED):
            if live.outcome == controller.REPLACED and live.replaced_by.owner != live.owner:  # Chain vs Tree took it
                yield self.view.render(record, status=streaming.replaced_status(record), level="warning")
            return  # else a newer Playground run draws this view, Stop drew the last frame, or the visitor left
        if live.error is not None:
            yield from self._failed(state, record, live.error, "Stopped by an error")
        message, level = streaming.final_status(record, stopped=record.stop_reason == "stopped")
        if record.run_note:
            alerts.warning(record.run_note)
        pinned, state.pinned = state.pinned, None
        opened = pinned if pinned is not None else record.showcase_index()  # the reader's pick, else the best round
        yield {**self.view.render(record, status=message, level=level, index=opened),
               self.download: self._download(state, record)}

    def _stepped(self, state: Session, stepped: SteppedRun):
        record = stepped.record
        if stepped.error is not None:
            yield from self._failed(state, record, stepped.error, "Step mode: stopped by an error", drop=True)
        if stepped.outcome == controller.FINISHED:
            message, level = streaming.final_status(record)
            yield {**self.view.render(record, status="Step mode: " + message, level=level),
                   self.download: self._download(state, record)}
        elif not stepped.ended:  # else Stop drew the last frame
            yield self.view.render(record, status=f"Step mode: round {len(record.rounds) - 1} done "
                                   f"({record.new_tokens} tokens). Press Step for the next round, Run to go on at "
                                   "full speed.")

    def _failed(self, state: Session, record: RunRecord, error: BaseException, midway: str, drop: bool = False):
        """Say what ended a run (status line and toast). One that failed before its first round leaves what was on
        show before it on show; one that failed midway keeps its rounds on show, unless ``drop``."""
        message = streaming.one_line(error)
        if record.rounds and not drop:  # its rounds so far stay on show, and in its trace (a server that died)
            yield {**self.view.render(record, status=f"{midway}: {message}", level="error"),
                   self.download: self._download(state, record)}
        elif record.rounds:
            yield self.view.render(None, status=f"{midway}: {message}", level="error")
        else:
            yield self.view.render(state.keep_previous(record), status=f"The run did not start: {message}",
                                   level="error")
        raise alerts.error(message)

    @staticmethod
    def _download(state: Session, record: RunRecord):
        try:
            return gr.DownloadButton(value=state.trace_file(record, "playground"), interactive=True)
        except OSError as error:
            log.warning("could not write the trace: %s", error)
            return gr.skip()


def recorded_settings(record: RunRecord) -> dict:
    """Prompt, sampling and the target's forward exactly as the record ran them (the panel may have changed since):
    plain decoding measured with other kernels would not be the run's baseline."""
    config = record.header.get("config") or {}
    prompt = (record.header.get("prompt") or {}).get("text")
    out = {name: config.get(name, default(name)) for name in ("max_new_tokens", "temperature", "top_p", "top_k")}
    out.update(seed=config.get("seed") or 0, chat=bool(config.get("chat", True)), target=record.target_name)
    forward = (record.header.get("target") or {}).get("forward")
    if forward in declared("target_forward").choices:
        out["target_forward"] = forward
    if prompt:
        out["prompt"] = prompt
    return out
