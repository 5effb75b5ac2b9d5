"""Chain vs Tree tab: the same prompt, seed, target and drafter drafted as a chain and as a tree, side by side.

The two runs go one after the other (running them at once would make each slow the other down and spoil the
tokens/s), both against the same cached plain-decoding calibration, optionally plus a full plain run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

from specviz.errors import SpecvizError
from specviz.ui import runner, settings, streaming
from specviz.ui.state import Session, one_line
from specviz.ui.views import plot, root_text
from specviz.viz import panels
from specviz.viz.record import RunRecord
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import tree_spec


@dataclass
class Column:
    tree: gr.Plot
    tokens: gr.HTML
    stats: gr.HTML

    @classmethod
    def build(cls, name: str) -> Column:
        gr.Markdown(f"### {name.capitalize()}")
        tree = gr.Plot(label=f"{name}: latest round", elem_id=f"compare-{name}-tree")
        stats = gr.HTML(panels.compare_stats_html(None), elem_id=f"compare-{name}-stats")
        tokens = gr.HTML(tokens_html(None, [], show_legend=False), elem_id=f"compare-{name}-tokens")
        return cls(tree, tokens, stats)

    def render(self, record: RunRecord | None, *, running: bool = False) -> dict:
        if record is None or not record.rounds:
            return {self.tree: plot(tree_spec(None)), self.stats: panels.compare_stats_html(None),
                    self.tokens: tokens_html(None, [], show_legend=False)}
        last = len(record.rounds) - 1
        return {self.tree: plot(tree_spec(record.rounds[last], root_text=root_text(record, last), height=380)),
                self.stats: panels.compare_stats_html(record),
                self.tokens: tokens_html(None, record.rounds, show_legend=False, caret=running)}


def build(session: gr.State, panel: settings.Settings, download_radio: gr.Radio | None = None) -> dict:
    gr.Markdown("Runs the Playground's prompt, target, drafter, sampling and seed twice: as a **chain** of k tokens "
                "and as a **tree** (width × depth under the node budget), one after the other on this machine.")
    with gr.Row():
        run_btn = gr.Button("Run chain vs tree", variant="primary", elem_id="compare-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="compare-stop")
        full_plain = gr.Checkbox(False, label="also measure plain decoding of this prompt in full",
                                 elem_id="compare-plain")
    status = gr.HTML(panels.status_html("Press Run chain vs tree."), elem_id="compare-status")
    verdict = gr.HTML(panels.verdict_html(None, None), elem_id="compare-verdict")
    with gr.Row():
        with gr.Column():
            chain = Column.build("chain")
        with gr.Column():
            tree = Column.build("tree")
    outputs = [status, verdict, chain.tree, chain.tokens, chain.stats, tree.tree, tree.tokens, tree.stats]

    def run(state: Session, plain: bool, *values):
        try:
            base = settings.request(*values)
        except SpecvizError as error:
            raise gr.Error(str(error), print_exception=False) from None
        state.chain = state.tree = None
        yield {**chain.render(None), **tree.render(None), verdict: panels.verdict_html(None, None)}
        records = {}
        for name, column, request in (("chain", chain, replace(base, tree=False)),
                                      ("tree", tree, replace(base, tree=True))):
            record = RunRecord(header={}, source="live", name=name)
            records[name] = record
            setattr(state, name, record)
            producer = state.start(record, lambda request=request: runner.stream(request))
            for _ in streaming.watch(producer, state):
                message = f"{name}: " + streaming.live_status(producer, request, record)
                yield {status: panels.status_html(message), **column.render(record, running=True)}
            if streaming.superseded(producer, state):
                return
            if producer.error is not None:
                raise gr.Error(one_line(producer.error), print_exception=False)
            if record.summary is None or state.stopped.is_set():  # stopped (maybe just as this run finished)
                if record.summary is None:
                    record.stop_reason = "stopped"
                    record.summary = record.trace_summary()
                yield {status: panels.status_html(f"Stopped during the {name} run.", "warning"),
                       **column.render(record)}
                return
            yield column.render(record)
        if plain:
            yield {status: panels.status_html("Plain decoding of the same prompt, in full…")}
            try:
                measured = runner.plain_run(replace(base, tree=False))
            except Exception as error:
                raise gr.Error(one_line(error), print_exception=False) from None
            for record in records.values():
                record.plain = measured
        yield {status: panels.status_html("Done: same prompt, seed, target and drafter; chain vs tree.", "ok"),
               verdict: panels.verdict_html(records["chain"], records["tree"]),
               **chain.render(records["chain"]), **tree.render(records["tree"])}

    def stop(state: Session):
        state.stop()
        return {status: panels.status_html("Stopped.", "warning")}

    event = run_btn.click(run, [session, full_plain, *panel.inputs], outputs, concurrency_id="model",
                          show_progress="hidden", api_name="compare")
    stop_btn.click(stop, [session], [status], cancels=[event], queue=False, api_name="compare_stop")
    return {"event": event}
