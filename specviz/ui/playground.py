"""Playground tab: Run (streamed), Step (one round per click), Stop, and the full plain-decoding comparison.

Callbacks take the session's ``Session`` from ``gr.State`` and return ``RunView`` updates; all model work goes
through ``runner`` (on the session's engine thread for Run, inline for Step).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass

import gradio as gr

from specviz.errors import SpecvizError
from specviz.settings import default
from specviz.settings import get as declared
from specviz.ui import alerts, runner, settings, streaming, zerogpu
from specviz.ui.state import Session, apply, one_line
from specviz.ui.views import RunView
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
                run_btn = gr.Button("Run", variant="primary", elem_id="run")
                step_btn = gr.Button("Step", elem_id="step")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
            panel = settings.Settings.build()
            measure_btn = gr.Button("Measure plain decoding of this prompt (full side-by-side run)",
                                    size="sm", elem_id="measure-plain")
        with gr.Column(scale=7):
            view = RunView.build(intro="Press Run.")
    page = Playground(panel, view, run_btn, step_btn, stop_btn, measure_btn)
    outputs = [*view.outputs, download]

    def run(state: Session, *values):
        request = yield from checked_request(view, values)
        previous, record = state.record, RunRecord(header={}, source="live")
        state.record, state.pinned = record, None
        producer = state.start(record, lambda: runner.stream(request))
        yield view.render(record, status=streaming.live_status(producer, request, record), running=True)
        for heavy in streaming.watch(producer, state):
            # a round the reader picked stays on show (no caret: the text scrolls to it) while newer ones stream in
            state.newest_shown = len(record.rounds) - 1
            yield view.render(record, status=streaming.live_status(producer, request, record), heavy=heavy,
                              running=state.pinned is None, index=state.pinned)
        if streaming.superseded(producer, state):
            if state.record is record:  # Chain vs Tree took the engine: nobody else draws this run's last frame
                yield view.render(record, status=streaming.replaced_status(record), level="warning")
            return  # a newer Playground run draws this view now
        if state.stopped.is_set():
            return  # Stop drew the last frame: drawing this run's "Done" over it would be stale
        if producer.error is not None:
            message = one_line(producer.error)
            if record.rounds:
                yield view.render(record, status=f"Stopped by an error: {message}", level="error")
            else:  # nothing ran: keep showing what was there before
                state.record = previous if previous is not None else record
                yield view.render(previous, status=f"The run did not start: {message}", level="error")
            raise alerts.error(message)
        stopped = record.summary is None
        if stopped:
            record.stop_reason = "stopped"
            record.summary = record.trace_summary()
        message, level = streaming.final_status(record, stopped=stopped)
        if record.run_note:
            alerts.warning(record.run_note)
        pinned, state.pinned = state.pinned, None
        opened = pinned if pinned is not None else record.showcase_index()  # the reader's pick, else the best round
        yield {**view.render(record, status=message, level=level, index=opened), download: _download(state, record)}

    def step(state: Session, *values):
        request = yield from checked_request(view, values)
        if state.busy:
            raise alerts.error("A run is in progress: press Stop first.")
        record = previous = state.record
        fresh = (state.stepper is None or state.step_request != request or record is None
                 or record.source != "step" or record.finished)
        if fresh:
            state.close_stepper()
            record = RunRecord(header={}, source="step")
            state.record = record
            events = runner.stream(request)
            state.stepper, state.step_request = events, request
            first = not runner.is_loaded(request.target, request.target_forward, request.device)
            loading = f"Loading {request.target}…" if first else "Preparing the first round…"
            yield view.render(record, status=loading, running=True)
            if zerogpu.on_zero_gpu():  # a ZeroGPU worker cannot be held between clicks: run once, reveal per Step
                state.stepper = iter(list(events))
        try:
            for event in state.stepper:
                apply(record, event)
                if isinstance(event, (runner.RoundDone, runner.Finished)):
                    break
        except Exception as error:
            state.close_stepper()
            message = one_line(error)
            if not record.rounds and previous is not None and previous is not record:
                state.record = previous
                yield view.render(previous, status=f"The run did not start: {message}", level="error")
            else:
                done = "Step mode: stopped by an error" if record.rounds else "The run did not start"
                yield view.render(None, status=f"{done}: {message}", level="error")
            raise alerts.error(message) from None
        if record.finished:
            state.close_stepper()
            message, level = streaming.final_status(record)
            yield {**view.render(record, status="Step mode: " + message, level=level),
                   download: _download(state, record)}
            return
        n = len(record.rounds)
        yield view.render(record, status=f"Step mode: round {n - 1} done ({record.new_tokens} tokens). Press Step "
                                         "for the next round, Run to go on at full speed.")

    def stop(state: Session):
        was_running = state.stop()
        record = state.record
        if record is None or record.source == "trace":
            alerts.info("Nothing is running.")
            return {}
        if not record.finished and record.source == "live":
            record.stop_reason = "stopped"
            record.summary = record.trace_summary()
        if record.source == "step" and state.stepper is not None:
            state.close_stepper()
            if not record.finished:
                record.stop_reason = "stopped"
                record.summary = record.trace_summary()
        if not was_running and record.source == "live":
            alerts.info("Nothing is running.")
        message, level = streaming.final_status(record, stopped=record.stop_reason == "stopped")
        pinned, state.pinned = state.pinned, None
        updates = view.render(record, status=message, level=level, index=pinned)
        if record.rounds:
            updates[download] = _download(state, record)
        return updates

    def measure(state: Session, *values):
        record = state.record
        if record is None or not record.rounds or record.source == "trace":
            raise alerts.error("Run a live generation first: the plain run must use the same prompt and settings.")
        if state.busy:
            raise alerts.error("A run is in progress: wait for it or press Stop.")
        request = yield from checked_request(view, values, "Plain decoding did not start")
        recorded = runner.RunRequest(**{**request.to_dict(), **recorded_settings(record)})
        yield {view.status: _status(f"Plain decoding of the same prompt ({recorded.max_new_tokens} new tokens, "
                                    "same sampler and clock)…")}
        try:
            record.plain = runner.plain_run(recorded)
        except Exception as error:
            message = one_line(error)
            yield {view.status: _status(f"Plain decoding failed: {message}", "error")}
            raise alerts.error(message) from None
        if record.plain.get("note"):
            alerts.warning(record.plain["note"])
        message, level = streaming.final_status(record, stopped=record.stop_reason == "stopped")
        yield {**view.render(record, status=message, level=level), download: _download(state, record)}

    # "multiple": Run during a run restarts it with the panel's current settings (the older run is superseded);
    # Gradio's default ("once") would drop the click without a word.
    page.run_event = run_btn.click(run, [session, *panel.inputs], outputs, concurrency_id="model",
                                   show_progress="hidden", api_name="run", trigger_mode="multiple")
    page.step_event = step_btn.click(step, [session, *panel.inputs], outputs, concurrency_id="model",
                                     show_progress="hidden", api_name="step")
    stop_btn.click(stop, [session], outputs, cancels=[page.run_event], queue=False, api_name="stop")
    measure_btn.click(measure, [session, *panel.inputs], outputs, concurrency_id="model", show_progress="hidden",
                      api_name="measure_plain")

    def pick_round(state: Session, index):
        """Show round ``index``; during a live run, keep showing it as rounds stream in (``Session.pinned``), until
        the reader picks the newest round the page has shown again."""
        record = state.record
        if record is not None and record.source == "live" and state.busy and record.rounds:
            state.pinned = None if index is None or int(index) >= state.newest_shown else int(index)
        return view.render_round(record, index)

    view.round_slider.input(pick_round, [session, view.round_slider],
                            view.round_outputs, trigger_mode="always_last", show_progress="hidden", queue=False)
    return page


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


def _status(message: str, level: str = "info") -> str:
    from specviz.viz.panels import status_html

    return status_html(message, level)


def _download(state: Session, record: RunRecord):
    try:
        return gr.DownloadButton(value=state.trace_file(record, "playground"), interactive=True)
    except OSError as error:
        log.warning("could not write the trace: %s", error)
        return gr.skip()
