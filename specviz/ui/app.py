"""The Gradio app: its tabs over one ``Session`` per visitor; ``launch`` adds the stylesheet and Spaces bits.

On page load the Playground and the Traces tab show a recorded example run, so the page teaches before any
model is loaded; Run replaces it with a live run of the real model.
"""

from __future__ import annotations

import logging
import os

import gradio as gr

from specviz.resources import CSS
from specviz.ui import compare, debugger, examples, lesson, playground, runner, traces, zerogpu
from specviz.ui.state import Session, Visitors

#: Model-using events that may run at once (per process). 1 on ZeroGPU, where a GPU is lent per call.
CONCURRENCY = int(os.environ.get("SPECVIZ_CONCURRENCY", "1" if zerogpu.on_zero_gpu() else "2"))
QUEUE_SIZE = int(os.environ.get("SPECVIZ_QUEUE_SIZE", "32"))

#: On a phone the multi-panel figures (the charts, the confidence panel's block and reliability diagram) keep a
#: legible width and scroll sideways in their box: squeezed to the screen their titles printed over each other and
#: the left panel shrank to nothing. The selectors are the two RunViews' plots.
NARROW_CSS = """
@media (max-width: 760px) {
  #charts > div, #confidence > div, #theory > div, #replay-charts > div, #replay-confidence > div,
  #replay-theory > div { overflow-x: auto; }
  #charts .js-plotly-plot, #confidence .js-plotly-plot, #theory .js-plotly-plot, #replay-charts .js-plotly-plot,
  #replay-confidence .js-plotly-plot, #replay-theory .js-plotly-plot { min-width: 760px; }
}
"""

HEADER = """# specviz: speculative decoding, round by round
A real target model verifies real drafts. Each round the drafter proposes a chain or a tree, the target checks
every node in **one** forward pass, and the accept rule keeps a prefix plus one token of the target's own
(a *correction* after a rejection, a *bonus* when every draft survived). Speedup is **measured** against plain
decoding of the same model on this machine."""


def build_app() -> gr.Blocks:
    visitors = Visitors()
    with gr.Blocks(title="specviz: speculative decoding, round by round", fill_width=True) as demo:
        # a Session per browser session: Gradio calls the class for each; it is closed (its run stopped, its trace
        # files deleted) when the visitor leaves (``on_unload``) and again when Gradio deletes the state
        session = gr.State(Session, delete_callback=Session.close)
        gr.Markdown(HEADER, elem_id="header")
        download = gr.DownloadButton("Download trace (.jsonl)", value=None, interactive=False,
                                     elem_id="trace-download", render=False)
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Playground", id="playground", elem_id="tab-playground"):
                page = playground.build(session, download)
            with gr.Tab("Lesson", id="lesson", elem_id="tab-lesson") as lesson_tab:
                walk = lesson.build(session)
            with gr.Tab("Chain vs Tree", id="compare", elem_id="tab-compare"):
                compare.build(session, page.settings)
            with gr.Tab("Why was it rejected?", id="debugger", elem_id="tab-debugger") as debug_tab:
                debug = debugger.build(session)
            with gr.Tab("Traces", id="traces", elem_id="tab-traces") as traces_tab:
                replay = traces.build(session, download)
        lesson_tab.select(walk["on_tab"], walk["inputs"], walk["outputs"], queue=False)
        debug_tab.select(debug["on_source"], [session, debug["source"]], debug["outputs"], queue=False)
        traces_tab.select(replay["on_which"], [session, replay["which"]], download, queue=False)

        def on_load(state: Session, request: gr.Request) -> dict:
            """Show the recorded example, and register the session: writing it back to the ``gr.State`` is what
            lets Gradio call its delete callback."""
            visitors.arrive(request.session_hash, state)
            example = examples.default_choice()
            if example is None:
                return {session: state}
            state.record = examples.load_trace(example)
            updates = page.view.render(state.record, status=playground.INTRO, index=state.record.showcase_index())
            return {session: state, **updates, **replay["show"](state, examples.load_trace(example))}

        def on_unload(request: gr.Request) -> None:
            visitors.leave(request.session_hash)

        demo.load(on_load, [session], [session, *page.view.outputs, *replay["view"].outputs], queue=False)
        demo.unload(on_unload)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)
    return demo


def launch(demo: gr.Blocks | None = None, **kwargs) -> gr.Blocks:
    """Launch with the stylesheet and, on a ZeroGPU Space, the default target loaded up front."""
    demo = demo or build_app()
    if zerogpu.on_zero_gpu():  # pragma: no cover - Spaces only
        runner.load_target(runner.RunRequest(prompt="x").target)
    kwargs.setdefault("css_paths", [CSS])
    kwargs["css"] = NARROW_CSS + (kwargs.get("css") or "")
    kwargs.setdefault("show_error", True)
    _log_runs()
    demo.launch(**kwargs)
    return demo


def _log_runs() -> None:
    """Send specviz's INFO lines (each run's end, ``controller.Producer``) to stderr, the Space's log, unless the
    operator configured logging already."""
    logger = logging.getLogger("specviz")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
