"""Chain vs Tree tab: the same prompt, seed and target drafted as a chain and as a tree, side by side.

Each side runs the Playground's drafter unless it picks its own, so a family's chain can face another family's
tree (the MTP chain against the Medusa tree). The two runs go one after the other (running them at once would make
each slow the other down and spoil the tokens/s), each against plain decoding measured beside it (between its
rounds), optionally plus a full plain run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import gradio as gr

from specviz.drafters import registry
from specviz.errors import SpecvizError
from specviz.ui import alerts, controller, runner, settings, streaming
from specviz.ui.state import Session
from specviz.ui.views import plot, root_text, tokens_panel
from specviz.viz import panels
from specviz.viz.record import RunRecord
from specviz.viz.tokens import tokens_html
from specviz.viz.tree_figure import tree_spec
from specviz.viz.verdict import verdict_html

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
    """One side: a round's tree and the run's text, the side's stats, and a round picker.

    While the comparison streams, the column follows each run's newest round (``render``, the ``/compare`` outputs);
    once it is over, ``opened`` moves the picker and the view to the run's most instructive round
    (``RunRecord.showcase_index``, the round the Traces tab and the debugger open on too), not its last one, which is
    often a one-token stub cut short by max-new-tokens.
    """

    tree: gr.Plot
    round_slider: gr.Slider
    round_info: gr.HTML
    tokens: gr.HTML
    stats: gr.HTML

    @classmethod
    def build(cls, name: str) -> Column:
        gr.Markdown(f"### {name.capitalize()}")
        tree = gr.Plot(label=f"{name}: draft tree of the round", elem_id=f"compare-{name}-tree")
        with gr.Row():
            round_slider = gr.Slider(0, 1, value=0, step=1, label=f"{name} round", elem_id=f"compare-{name}-round",
                                     scale=1, interactive=False)
            round_info = gr.HTML(panels.round_info_html(None), elem_id=f"compare-{name}-round-info")
        stats = gr.HTML(panels.compare_stats_html(None), elem_id=f"compare-{name}-stats")
        tokens = tokens_panel(tokens_html(None, [], show_legend=False), elem_id=f"compare-{name}-tokens")
        return cls(tree, round_slider, round_info, tokens, stats)

    @property
    def picker(self) -> list:
        """What picking a round redraws."""
        return [self.round_slider, self.round_info, self.tree, self.tokens]

    def render(self, record: RunRecord | None, *, running: bool = False) -> dict:
        """The streamed view: the newest round's tree, the text so far and the stats."""
        newest = len(record.rounds) - 1 if record is not None else -1
        return {**self.render_round(record, newest, running=running), self.stats: panels.compare_stats_html(record)}

    def render_round(self, record: RunRecord | None, index: int, *, running: bool = False) -> dict:
        """Round ``index``'s tree, and the text with that round highlighted (``RunView.render_round``'s views)."""
        if record is None or not record.rounds:
            return {self.tree: plot(tree_spec(None)), self.tokens: tokens_html(None, [], show_legend=False)}
        index = max(0, min(int(index), len(record.rounds) - 1))
        return {self.tree: plot(tree_spec(record.rounds[index], root_text=root_text(record, index), height=380)),
                self.tokens: tokens_html(None, record.rounds, selected=None if running else index,
                                         show_legend=False, caret=running)}

    def pick(self, record: RunRecord | None, index: float | None) -> dict:
        """The round the reader picked: its tree, its summary, the text with it highlighted."""
        index = int(index or 0)
        total = len(record.rounds) if record is not None else 0
        summary = record.rounds[max(0, min(index, total - 1))] if total else None
        return {**self.render_round(record, index), self.round_info: panels.round_info_html(summary, total)}

    def locked(self) -> dict:
        """A picker with nothing to pick while a run streams into this column (the stream draws the view)."""
        return {self.round_slider: gr.update(minimum=0, maximum=1, value=0, interactive=False),
                self.round_info: panels.round_info_html(None)}

    def opened(self, record: RunRecord | None) -> dict:
        """The picker over a finished (or stopped) run, on its most instructive round."""
        if record is None or not record.rounds:
            return {**self.locked(), **self.render_round(record, 0)}
        index = record.showcase_index()
        return {self.round_slider: gr.update(minimum=0, maximum=max(len(record.rounds) - 1, 1), value=index,
                                             interactive=True),
                **self.pick(record, index)}


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
    verdict = gr.HTML(verdict_html(None, None), elem_id="compare-verdict")
    with gr.Row():
        with gr.Column():
            chain = Column.build("chain")
        with gr.Column():
            tree = Column.build("tree")
    calls = Callbacks(status, verdict, {"chain": chain, "tree": tree})
    outputs = [status, verdict, chain.tree, chain.tokens, chain.stats, tree.tree, tree.tokens, tree.stats]
    pickers = [widget for column in calls.columns.values() for widget in column.picker]
    # "multiple": a second click restarts the comparison with the current settings instead of being dropped
    event = run_btn.click(calls.run, [session, full_plain, *drafters, *panel.inputs], outputs, concurrency_id="model",
                          show_progress="hidden", api_name="compare", trigger_mode="multiple")
    # the pickers stay out of /compare's outputs (its API returns the streamed view); they open when it is over
    run_btn.click(calls.lock_rounds, None, [w for c in calls.columns.values() for w in (c.round_slider, c.round_info)],
                  queue=False, show_progress="hidden", api_visibility="private")
    event.then(calls.open_rounds, [session], pickers, queue=False, show_progress="hidden", api_name="compare_rounds")
    stop_btn.click(calls.stop, [session], [status], cancels=[event], queue=False, api_name="compare_stop").then(
        calls.open_rounds, [session], pickers, queue=False, show_progress="hidden", api_visibility="private")
    for name, column in calls.columns.items():
        column.round_slider.input(calls.picker(name), [session, column.round_slider],
                                  [column.round_info, column.tree, column.tokens], trigger_mode="always_last",
                                  show_progress="hidden", queue=False, api_name=f"compare_pick_{name}")
    return {"event": event}


@dataclass
class Callbacks:
    """Chain vs Tree's event handlers: two runs through the session's ``RunController``, one after the other."""

    status: gr.HTML
    verdict: gr.HTML
    columns: dict[str, Column]

    def run(self, state: Session, plain: bool, chain_drafter: str, tree_drafter: str, *values):
        try:
            base = settings.request(*values)
            requests = side_requests(base, chain_drafter, tree_drafter)
        except SpecvizError as error:  # the status line says it too: the last comparison's "Done" must not stay
            yield {self.status: panels.status_html(f"The comparison did not start: {error}", "error")}
            raise alerts.error(str(error)) from None
        state.chain = state.tree = None
        # the status too: a restarted comparison must not go on saying the last one's "Done" while it loads
        yield {self.status: panels.status_html(f"chain: starting ({requests['chain'].drafter})…"),
               **self._render(None, None), self.verdict: verdict_html(None, None)}
        records = {}
        for name in self.columns:
            records[name] = yield from self._side(state, name, requests[name])
            if records[name] is None:
                return
        if plain:
            yield from self._plain(list(records.values()), replace(base, tree=False))
        chain, tree = requests["chain"].drafter, requests["tree"].drafter
        what = ("same prompt, seed, target and drafter" if chain == tree else
                f"same prompt, seed and target; chain {chain} vs tree {tree}")
        yield {self.status: panels.status_html(f"Done: {what}.", "ok"), **self._render(*records.values()),
               self.verdict: verdict_html(*records.values())}

    def stop(self, state: Session) -> dict:
        state.runs.stop()
        return {self.status: panels.status_html("Stopped.", "warning")}

    def lock_rounds(self) -> dict:
        return {update: value for column in self.columns.values() for update, value in column.locked().items()}

    def open_rounds(self, state: Session) -> dict:
        """Each side's picker on its run's most instructive round once the comparison is over; a side that a newer
        comparison is streaming into keeps following its newest round."""
        running = state.runs.running
        live = running.record if running is not None else None
        updates: dict = {}
        for name, column in self.columns.items():
            record = getattr(state, name)
            updates.update(column.locked() if record is not None and record is live else column.opened(record))
        return updates

    def picker(self, name: str) -> Callable[[Session, float | None], dict]:
        """The ``name`` side's round picker: that round of the side's run."""
        def pick(state: Session, index: float | None) -> dict:
            return self.columns[name].pick(getattr(state, name), index)
        return pick

    def _side(self, state: Session, name: str, request: runner.RunRequest):
        """Run and draw one side; returns (``yield from``) its record when it finished, None when it ended the
        comparison early (Stop, an error, another run)."""
        column = self.columns[name]
        live = state.runs.start(request, owner=controller.COMPARE, name=name)
        setattr(state, name, live.record)
        for _ in streaming.watch(live):
            yield {self.status: panels.status_html(f"{name}: " + streaming.live_status(live)),
                   **column.render(live.record, running=True)}
        if live.outcome == controller.FINISHED:
            yield column.render(live.record)
            return live.record
        if live.outcome == controller.REPLACED:
            if live.replaced_by.owner != live.owner:  # the Playground took the engine: say so (not "Generating")
                yield {self.status: panels.status_html(f"{name}: " + streaming.replaced_status(live.record),
                                                       "warning"), **column.render(live.record)}
            return None  # else a newer Chain vs Tree run draws this tab now
        if live.error is not None:
            message = streaming.one_line(live.error)
            yield {self.status: panels.status_html(f"{name}: stopped by an error: {message}", "error")}
            raise alerts.error(message)
        # stopped (maybe just as the run finished), or the visitor left
        yield {self.status: panels.status_html(f"Stopped during the {name} run.", "warning"),
               **column.render(live.record)}
        return None

    def _plain(self, records: list[RunRecord], request: runner.RunRequest):
        """The full plain run of the same prompt, for both sides."""
        yield {self.status: panels.status_html("Plain decoding of the same prompt, in full…")}
        try:
            measured = runner.plain_run(request)
        except Exception as error:
            message = streaming.one_line(error)
            yield {self.status: panels.status_html(f"Plain decoding failed: {message}", "error")}
            raise alerts.error(message) from None
        for record in records:
            record.plain = measured

    def _render(self, chain: RunRecord | None, tree: RunRecord | None) -> dict:
        return {**self.columns["chain"].render(chain), **self.columns["tree"].render(tree)}
