"""The Gradio app: four tabs over one per-session ``Session``; ``launch`` adds the queue, CSS and Spaces bits.

On page load the Playground and the Traces tab show a recorded example run, so the page teaches before any
model is loaded; Run replaces it with a live run of the real model.
"""

from __future__ import annotations

import os

import gradio as gr

from specviz.resources import CSS
from specviz.ui import compare, debugger, examples, playground, runner, traces, zerogpu
from specviz.ui.state import Session

#: Model-using events that may run at once (per process). 1 on ZeroGPU, where a GPU is lent per call.
CONCURRENCY = int(os.environ.get("SPECVIZ_CONCURRENCY", "1" if zerogpu.on_zero_gpu() else "2"))
QUEUE_SIZE = int(os.environ.get("SPECVIZ_QUEUE_SIZE", "32"))
QUEUE_POLL_S = 0.02

#: On a phone the multi-panel figures (the charts, the confidence panel's block and reliability diagram) keep a
#: legible width and scroll sideways in their box: squeezed to the screen their titles printed over each other and
#: the left panel shrank to nothing. The selectors are the two RunViews' plots.
NARROW_CSS = """
@media (max-width: 760px) {
  #charts > div, #confidence > div, #replay-charts > div, #replay-confidence > div { overflow-x: auto; }
  #charts .js-plotly-plot, #confidence .js-plotly-plot, #replay-charts .js-plotly-plot,
  #replay-confidence .js-plotly-plot { min-width: 760px; }
}
"""

HEADER = """# specviz: speculative decoding, round by round
A real target model verifies real drafts. Each round the drafter proposes a chain or a tree, the target checks
every node in **one** forward pass, and the accept rule keeps a prefix plus one token of the target's own
(a *correction* after a rejection, a *bonus* when every draft survived). Speedup is **measured** against plain
decoding of the same model on this machine."""


def build_app() -> gr.Blocks:
    with gr.Blocks(title="specviz: speculative decoding, round by round", fill_width=True) as demo:
        session = gr.State(Session())  # deep-copied per browser session (a fresh Session each)
        gr.Markdown(HEADER, elem_id="header")
        download = gr.DownloadButton("Download trace (.jsonl)", value=None, interactive=False,
                                     elem_id="trace-download", render=False)
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Playground", id="playground", elem_id="tab-playground"):
                page = playground.build(session, download)
            with gr.Tab("Chain vs Tree", id="compare", elem_id="tab-compare"):
                compare.build(session, page.settings)
            with gr.Tab("Why was it rejected?", id="debugger", elem_id="tab-debugger") as debug_tab:
                debug = debugger.build(session)
            with gr.Tab("Traces", id="traces", elem_id="tab-traces") as traces_tab:
                replay = traces.build(session, download)
        debug_tab.select(debug["on_source"], [session, debug["source"]], debug["outputs"], queue=False)
        traces_tab.select(replay["on_which"], [session, replay["which"]], download, queue=False)

        def on_load(state: Session):
            if not examples.trace_choices():
                return {}
            example = examples.DEFAULT_TRACE if (examples.TRACES / examples.DEFAULT_TRACE).is_file() else \
                examples.trace_choices()[0][1]
            state.record = examples.load_trace(example)
            updates = page.view.render(state.record, status=playground.INTRO, index=state.record.showcase_index())
            updates.update(replay["show"](state, examples.load_trace(example)))
            return updates

        demo.load(on_load, [session], [*page.view.outputs, *replay["view"].outputs], queue=False)
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)
    _calm_queue(demo)
    return demo


def _calm_queue(demo: gr.Blocks) -> None:
    """Poll Gradio's queue every 20 ms instead of every 1 ms.

    Gradio's queue loop wakes up 1000 times a second even when idle; in the process that also runs the engine
    that costs the engine the GIL and, on a busy CPU, a core: a visible share of the tokens/s on a small loaded
    machine (tools/ui_perf.py measures it; measured figures: BENCHMARKS.md). 20 ms only delays the start of an
    event by up to 20 ms.
    """
    queue = getattr(demo, "_queue", None)
    if queue is not None:
        if hasattr(queue, "sleep_when_free"):
            queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
        if hasattr(queue, "progress_update_sleep_when_free"):
            queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, QUEUE_POLL_S)


def launch(demo: gr.Blocks | None = None, **kwargs) -> gr.Blocks:
    """Launch with the stylesheet and, on a ZeroGPU Space, the default target loaded up front."""
    demo = demo or build_app()
    if zerogpu.on_zero_gpu():  # pragma: no cover - Spaces only
        runner.load_target(runner.RunRequest(prompt="x").target)
    kwargs.setdefault("css_paths", [CSS])
    kwargs["css"] = NARROW_CSS + (kwargs.get("css") or "")
    kwargs.setdefault("show_error", True)
    demo.launch(**kwargs)
    return demo
