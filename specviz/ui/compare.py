"""Chain vs Tree tab: the same prompt, seed and target drafted as a chain and as a tree, side by side.

Each side runs the Playground's drafter unless it picks its own, so a family's chain can face another family's
tree (the MTP chain against the Medusa tree). The two runs go one after the other (running them at once would make
each slow the other down and spoil the tokens/s), both against the same cached plain-decoding calibration,
optionally plus a full plain run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

from specviz.drafters import registry
from specviz.errors import SpecvizError
from specviz.ui import runner, settings, streaming
from specviz.ui.state import Session, one_line
from specviz.ui.views import plot, root_text, tokens_panel
from specviz.viz import panels
from specviz.viz.record import RunRecord
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import tree_spec

#: A side's drafter choice meaning "whatever the Playground's drafter is".
SAME = "same as the Playground"
SIDES = (("chain", False), ("tree", True))


def side_requests(base: runner.RunRequest, chain_drafter: str | None = None, tree_drafter: str | None = None
                  ) -> dict[str, runner.RunRequest]:
    """The chain and the tree run: ``base`` (the Playground's settings) as a chain and as a tree, each with its own
    drafter when one is chosen. A bad drafter spec is a one-line ``SpecvizError`` before any model loads."""
    chosen = {"chain": chain_drafter, "tree": tree_drafter}
    requests = {}
    for name, tree in SIDES:
        drafter = (chosen[name] or "").strip()
        drafter = base.drafter if drafter in ("", SAME) else drafter
        requests[name] = replace(base, tree=tree, drafter=drafter).validate()
    return requests


def drafter_choices(target: str) -> list[tuple[str, str]]:
    return [(SAME, SAME), *runner.drafter_menu(target)]


def side_dropdown(name: str, target: gr.Dropdown | None) -> gr.Dropdown:
    return gr.Dropdown(choices=drafter_choices(target.value if target is not None else ""), value=SAME,
                       allow_custom_value=True, label=f"{name} drafter", elem_id=f"compare-{name}-drafter",
                       info=f"the Playground's drafter, or another for the {name} side (any spec: "
                            f"{', '.join(f.syntax for f in registry.families())})")


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
        tokens = tokens_panel(tokens_html(None, [], show_legend=False), elem_id=f"compare-{name}-tokens")
        return cls(tree, tokens, stats)

    def render(self, record: RunRecord | None, *, running: bool = False) -> dict:
        if record is None or not record.rounds:
            return {self.tree: plot(tree_spec(None)), self.stats: panels.compare_stats_html(None),
                    self.tokens: tokens_html(None, [], show_legend=False)}
        last = len(record.rounds) - 1
        return {self.tree: plot(tree_spec(record.rounds[last], root_text=root_text(record, last), height=380)),
                self.stats: panels.compare_stats_html(record),
                self.tokens: tokens_html(None, record.rounds, show_legend=False, caret=running)}


def build(session: gr.State, panel: settings.Settings) -> dict:
    gr.Markdown("Runs the Playground's prompt, target, sampling and seed twice: as a **chain** of k tokens and as a "
                "**tree** (width × depth under the node budget), one after the other on this machine. Each side "
                "drafts with the Playground's drafter or its own: pick `mtp` for the chain and `medusa` for the tree "
                "to compare MTP's sequential chain with Medusa's static tree.")
    target = panel.widgets.get("target")
    with gr.Row():
        drafters = [side_dropdown(name, target) for name, _ in SIDES]
    if target is not None:
        target.change(lambda t: [gr.Dropdown(choices=drafter_choices(t or ""), value=SAME)] * len(SIDES), target,
                      drafters, queue=False)
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

    def run(state: Session, plain: bool, chain_drafter: str, tree_drafter: str, *values):
        try:
            base = settings.request(*values)
            requests = side_requests(base, chain_drafter, tree_drafter)
        except SpecvizError as error:
            raise gr.Error(str(error), print_exception=False) from None
        state.chain = state.tree = None
        # the status too: a restarted comparison must not go on saying the last one's "Done" while it loads
        yield {status: panels.status_html(f"chain: starting ({requests['chain'].drafter})…"),
               **chain.render(None), **tree.render(None), verdict: panels.verdict_html(None, None)}
        records = {}
        for name, column in (("chain", chain), ("tree", tree)):
            request = requests[name]
            record = RunRecord(header={}, source="live", name=name)
            records[name] = record
            setattr(state, name, record)
            producer = state.start(record, lambda request=request: runner.stream(request))
            for _ in streaming.watch(producer, state):
                message = f"{name}: " + streaming.live_status(producer, request, record)
                yield {status: panels.status_html(message), **column.render(record, running=True)}
            if streaming.superseded(producer, state):
                if getattr(state, name) is record:  # the Playground took the engine: say so, or this stays "Generating"
                    yield {status: panels.status_html(f"{name}: " + streaming.replaced_status(record), "warning"),
                           **column.render(record)}
                return  # a newer Chain vs Tree run draws this tab now
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
        same = requests["chain"].drafter == requests["tree"].drafter
        what = ("same prompt, seed, target and drafter" if same else
                f"same prompt, seed and target; chain {requests['chain'].drafter} vs tree {requests['tree'].drafter}")
        yield {status: panels.status_html(f"Done: {what}.", "ok"),
               verdict: panels.verdict_html(records["chain"], records["tree"]),
               **chain.render(records["chain"]), **tree.render(records["tree"])}

    def stop(state: Session):
        state.stop()
        return {status: panels.status_html("Stopped.", "warning")}

    # "multiple": a second click restarts the comparison with the current settings instead of being dropped
    event = run_btn.click(run, [session, full_plain, *drafters, *panel.inputs], outputs, concurrency_id="model",
                          show_progress="hidden", api_name="compare", trigger_mode="multiple")
    stop_btn.click(stop, [session], [status], cancels=[event], queue=False, api_name="compare_stop")
    return {"event": event}
