""""Why was it rejected?" tab: pick a run, a round and a node; see p vs q, the draws, the residual, the entropy.

Reads whichever run the session holds (the Playground's, a replayed trace, or either half of Chain vs Tree), so
it works the same on a live run and on a trace with no model loaded.
"""

from __future__ import annotations

import gradio as gr

from specviz.engine.round import Round
from specviz.ui.state import Session
from specviz.ui.views import plot, root_text
from specviz.viz import debugger, diagnostics, panels
from specviz.viz.charts import topk_figure
from specviz.viz.record import RunRecord
from specviz.viz.tree_figure import tree_spec

SOURCES = [("Playground run", "playground"), ("Replayed trace (Traces tab)", "replay"),
           ("Chain vs Tree: chain", "chain"), ("Chain vs Tree: tree", "tree")]


def lookup_context(record: RunRecord, index: int) -> tuple[list[str] | None, int | None]:
    """The display pieces of every token before round ``index`` and how many are the prompt's, so the debugger can
    quote an n-gram lookup's match (``Round.meta["lookup"]``); (None, None) where the round has none or the record
    cannot rebuild them (no prompt pieces, rounds recorded without text)."""
    round_: Round = record.rounds[index]
    prompt = record.prompt_pieces
    if "lookup" not in round_.meta or not prompt:
        return None, None
    pieces = list(prompt)
    for earlier in record.rounds[:index]:
        pieces.extend(earlier.committed_text)
    return (pieces, len(prompt)) if len(pieces) == len(prompt) + round_.start else (None, None)


def build(session: gr.State) -> dict:
    gr.Markdown("Pick a round and a node: why the drafter proposed it, then the accept rule that judged it with the "
                "numbers that rule used (row *parent + 1* of the verify forward): the target's argmax or sampled "
                "token, or p, q and the coin u, or, for a sibling tested after rejected ones, the residual it met; "
                "the rule's actual draws; and, for a correction, the residual distribution it was sampled from.")
    with gr.Row():
        source = gr.Radio(SOURCES, value="playground", label="run", elem_id="debug-source")
        refresh = gr.Button("Refresh", size="sm", elem_id="debug-refresh")
    warnings = gr.HTML("", elem_id="debug-warnings")
    with gr.Row():
        round_slider = gr.Slider(0, 1, value=0, step=1, label="round", elem_id="debug-round")
        node = gr.Dropdown(choices=[], label="node", elem_id="debug-node")
    with gr.Row():
        with gr.Column(scale=5):
            tree = gr.Plot(label="the round (selected node ringed)", elem_id="debug-tree")
        with gr.Column(scale=6):
            topk = gr.Plot(label="target vs draft top-k", elem_id="debug-topk")
    explanation = gr.HTML(debugger.explain(None, None)[0], elem_id="debug-explain")
    outputs = [warnings, round_slider, node, tree, topk, explanation]

    def show(state: Session, which: str, index, chosen: str | None, *, reset_round: bool, reset_node: bool) -> dict:
        record = state.source(which)
        if record is None or not record.rounds:
            empty = "This run has no rounds yet: run one in the Playground or load a trace in the Traces tab."
            return {warnings: panels.status_html(empty, "warning"), round_slider: gr.Slider(0, 1, value=0),
                    node: gr.Dropdown(choices=[], value=None), tree: plot(tree_spec(None)),
                    topk: topk_figure([], None), explanation: debugger.explain(None, None)[0]}
        count = len(record.rounds)
        index = record.showcase_index() if reset_round else max(0, min(int(index or 0), count - 1))
        round_ = record.rounds[index]
        choices = debugger.node_choices(round_)
        values = {value for _, value in choices}
        if reset_node or chosen not in values:
            chosen = debugger.default_node(round_)
        context, prompt_tokens = lookup_context(record, index)
        html, figure = debugger.explain(round_, chosen, context=context, prompt_tokens=prompt_tokens)
        selected = debugger.selected_node(chosen)
        header = panels.status_html(panels.run_label(record))
        return {
            warnings: header + diagnostics.diagnostics_html(diagnostics.diagnose(record)),
            round_slider: gr.Slider(minimum=0, maximum=max(count - 1, 1), value=index, step=1),
            node: gr.Dropdown(choices=choices, value=chosen),
            tree: plot(tree_spec(round_, root_text=root_text(record, index), selected=selected)),
            topk: figure,
            explanation: html,
        }

    def on_source(state: Session, which: str):
        return show(state, which, 0, None, reset_round=True, reset_node=True)

    def on_round(state: Session, which: str, index):
        return show(state, which, index, None, reset_round=False, reset_node=True)

    def on_node(state: Session, which: str, index, chosen):
        return show(state, which, index, chosen, reset_round=False, reset_node=False)

    source.change(on_source, [session, source], outputs, queue=False)
    refresh.click(on_source, [session, source], outputs, queue=False)
    round_slider.input(on_round, [session, source, round_slider], outputs, trigger_mode="always_last", queue=False)
    node.input(on_node, [session, source, round_slider, node], outputs, queue=False)
    return {"source": source, "outputs": outputs, "on_source": on_source}

