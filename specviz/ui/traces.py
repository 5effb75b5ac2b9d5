"""Traces tab: download a run's trace; upload one (or pick a shipped example) and replay it with every view.

Replay needs no model: ``trace.read`` validates the file (a malformed one becomes a one-line error) and the
same ``RunView`` that shows live runs renders it. "Play" re-streams the rounds at their recorded pace.
"""

from __future__ import annotations

import time

import gradio as gr

from specviz.engine import trace
from specviz.ui import alerts, examples
from specviz.ui.state import Session
from specviz.ui.views import RunView
from specviz.viz import panels
from specviz.viz.record import RunRecord

RUNS = [("Playground run", "playground"), ("Chain vs Tree: chain", "chain"), ("Chain vs Tree: tree", "tree"),
        ("Replayed trace", "replay")]
MAX_PLAY_S = 10.0  # a replay never takes longer than this, whatever the recording


def build(session: gr.State, download: gr.DownloadButton) -> dict:
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            gr.Markdown("**Download** a run as a JSON Lines trace (header, one line per round, summary).")
            which = gr.Radio(RUNS, value="playground", label="run to download", elem_id="trace-which")
            download.render()
        with gr.Column(scale=1, min_width=280):
            gr.Markdown("**Replay** a trace: upload one, or pick a recorded example (real runs of the default "
                        "target).")
            upload = gr.File(label="upload a trace (.jsonl)", file_types=[".jsonl", ".json", ".txt"],
                             type="filepath", elem_id="trace-upload")
            choices = examples.trace_choices()
            default = next((v for _, v in choices if v == examples.DEFAULT_TRACE), choices[0][1] if choices else None)
            example = gr.Dropdown(choices=choices, value=default, label="recorded example", elem_id="trace-example")
            with gr.Row():
                load_btn = gr.Button("Load example", elem_id="trace-example-load")
                play_btn = gr.Button("Play (recorded pace)", elem_id="replay-play")
    view = RunView.build("replay-", intro="Upload a trace or load an example.")
    outputs = view.outputs

    def show(state: Session, record: RunRecord, note: str = "") -> dict:
        state.replay = record
        m = record.metrics() if record.rounds else None
        summary = f" · {m.rounds} rounds, τ {m.tau:.2f}" if m else " · no rounds: the run stopped before its first"
        return view.render(record, status=f"{panels.run_label(record)}{summary}{note}", level="ok" if m else "warning",
                           index=record.showcase_index())

    def on_upload(state: Session, path: str | None):
        if not path:
            yield {}
            return
        try:
            loaded = trace.read(path)
        except trace.TraceError as error:  # the status line says it too: the last replay's summary must not stay
            message = f"Not a valid specviz trace: {error}"
            yield view.render(None, status=message, level="error")
            raise alerts.error(message) from None
        yield show(state, RunRecord.from_trace(loaded, name=_name(path)))

    def on_example(state: Session, name: str | None):
        try:
            record = examples.load_trace(name) if name else None
        except trace.TraceError as error:
            record, message = None, str(error)
        else:
            message = "No recorded example selected."
        if record is None:
            yield view.render(None, status=message, level="error")
            raise alerts.error(message)
        yield show(state, record)

    def play(state: Session):
        source = state.replay
        if source is None or not source.rounds:
            raise alerts.error("Load a trace first.")
        total = sum(r.total_ms for r in source.rounds) / 1e3
        scale = min(1.0, MAX_PLAY_S / total) if total > 0 else 1.0
        shown = RunRecord(header=source.header, prefill_ms=source.prefill_ms, calibration=source.calibration,
                          plain=source.plain, source="trace", name=source.name)
        for round_ in source.rounds:
            time.sleep(round_.total_ms / 1e3 * scale)
            shown.rounds.append(round_)
            yield view.render(shown, status=f"Replaying {source.name}: round {round_.index}", heavy=False,
                              running=True)
        yield show(state, source, " · replay finished")

    def on_which(state: Session, name: str):
        record = state.source(name)
        if record is None or not record.rounds:
            alerts.info("That run has no rounds yet.")
            return gr.DownloadButton(value=None, interactive=False)
        return gr.DownloadButton(value=state.trace_file(record, name), interactive=True)

    upload.upload(on_upload, [session, upload], outputs, show_progress="hidden", api_name="upload_trace")
    load_btn.click(on_example, [session, example], outputs, show_progress="hidden", api_name="load_example")
    play_btn.click(play, [session], outputs, show_progress="hidden", api_name="play_replay")
    which.change(on_which, [session, which], download, queue=False)
    view.round_slider.input(lambda s, i: view.render_round(s.replay, i), [session, view.round_slider],
                            view.round_outputs, trigger_mode="always_last", show_progress="hidden", queue=False)
    view.wire_round_steps(lambda s, i, delta: view.step_round(s.replay, i, delta), session)
    return {"view": view, "show": show, "which": which, "on_which": on_which, "download": download}


def _name(path: str) -> str:
    import os

    return os.path.basename(path)
