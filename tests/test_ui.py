"""UI callbacks without a browser: the runner and engine thread on tiny models, per-session isolation, errors.

The Gradio-level tests serve the real app on localhost and drive it with ``gradio_client`` (each ``Client`` is
its own browser session), with a tiny random target registered under the name ``tiny``.
"""

from __future__ import annotations

import socket
import time
from html import unescape

import pytest

from specviz import api
from specviz import settings as declared_settings
from specviz.ui import runner
from specviz.ui.controller import Producer, apply
from specviz.ui.state import Session
from specviz.viz.record import RunRecord
from tests import tiny

PROMPT_A = "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"
PROMPT_B = "w9 w8 w7 w9 w8 w7 w9 w8"


@pytest.fixture(scope="module")
def tiny_targets():
    fast = tiny.target(vocab_size=64, scale=4.0)
    slow = tiny.target(vocab_size=64, scale=4.0)
    slow.model.register_forward_pre_hook(lambda module, args: time.sleep(0.03))
    runner.preload("tiny", fast)
    runner.preload("tiny-slow", slow)
    return fast, slow


def request(prompt=PROMPT_A, **kwargs) -> runner.RunRequest:
    settings = dict(prompt=prompt, chat=False, target="tiny", drafter="ngram", max_new_tokens=24)
    settings.update(kwargs)
    return runner.RunRequest(**settings).validate()


def run_record(session: Session, req: runner.RunRequest) -> RunRecord:
    live = session.runs.start(req)
    live.join(60)
    return live.record


def test_each_browser_session_gets_its_own_session_and_closes_it():
    """The app's gr.State makes a Session per browser session (its value is the class, which Gradio calls for each)
    and closes it when Gradio deletes the state; ``demo.unload`` closes it as soon as the visitor leaves."""
    import gradio as gr

    from specviz.ui.app import build_app

    demo = build_app()
    # other states hold plain per-tab values (the Lesson's position); one holds the visitor's Session
    states = [block for block in demo.blocks.values() if isinstance(block, gr.State) and block.value is Session]
    assert len(states) == 1 and states[0].delete_callback == Session.close
    assert any(target[1] == "unload" for dep in demo.config["dependencies"] for target in dep["targets"])


def test_stream_produces_rounds_and_summary(tiny_targets):
    record = run_record(Session(), request(tree=True, width=2, depth=3, max_nodes=6))
    assert record.finished and record.rounds
    assert record.header["prompt"]["text"] == PROMPT_A
    beside = record.beside_estimate  # plain decoding timed between the run's rounds, this run's own
    assert beside.samples >= 5 and beside.low <= beside.tokens_per_s <= beside.high
    assert record.beside["runs_sharing"] == 1 and record.baseline()[2] is True
    assert record.baseline()[1].startswith("plain decoding measured beside this run")
    assert record.new_tokens == 24
    plain = api.plain_decode(tiny_targets[0], tiny_targets[0].encode_prompt(PROMPT_A, chat=False),
                             request().config())
    assert record.token_ids == plain.token_ids  # greedy: lossless


def test_two_sessions_at_once_keep_their_own_rounds(tiny_targets):
    first, second = Session(), Session()
    pa = first.runs.start(request(PROMPT_A, target="tiny-slow", max_new_tokens=16))
    pb = second.runs.start(request(PROMPT_B, target="tiny-slow", max_new_tokens=16))
    pa.join(60)
    pb.join(60)
    rec_a, rec_b = pa.record, pb.record
    assert rec_a.header["prompt"]["text"] == PROMPT_A and rec_b.header["prompt"]["text"] == PROMPT_B
    target = tiny_targets[0]
    for rec, prompt in ((rec_a, PROMPT_A), (rec_b, PROMPT_B)):
        plain = api.plain_decode(target, target.encode_prompt(prompt, chat=False), request(max_new_tokens=16).config())
        assert rec.token_ids == plain.token_ids
        assert [r.index for r in rec.rounds] == list(range(len(rec.rounds)))


def test_a_run_beside_another_says_so_and_measures_its_own_baseline(tiny_targets):
    """Each run's plain baseline is timed between its own rounds; one that ran while another was running says that
    two runs shared the machine, and a run alone afterwards says nothing of the kind."""
    long_session, short_session = Session(), Session()
    long_run = long_session.runs.start(request(target="tiny-slow", max_new_tokens=400))
    deadline = time.time() + 30
    while len(long_run.record.rounds) < 2 and time.time() < deadline:
        time.sleep(0.01)
    beside = run_record(short_session, request(PROMPT_B, max_new_tokens=12))
    assert long_session.runs.stop() is long_run and not long_run.alive
    assert beside.beside["runs_sharing"] == 2 and "2 runs shared the machine" in beside.baseline()[1]
    alone = run_record(Session(), request(PROMPT_B, max_new_tokens=12))
    assert alone.beside["runs_sharing"] == 1 and "shared" not in alone.baseline()[1]
    assert runner.active_runs() == 0


def test_stop_keeps_rounds_so_far(tiny_targets):
    session = Session()
    live = session.runs.start(request(target="tiny-slow", max_new_tokens=400))
    record = live.record
    deadline = time.time() + 30
    while len(record.rounds) < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert session.runs.stop() is live
    assert not live.alive and live.error is None and live.outcome == "stopped"
    assert 3 <= len(record.rounds) and record.new_tokens < 400 and record.stop_reason == "stopped"


def test_a_run_whose_tab_went_away_stops(tiny_targets):
    """Gradio stops iterating the Run callback of a closed or reloaded tab; its engine thread must then stop too,
    not generate on to max-new-tokens outside the queue's concurrency limit (reloading the page once left one
    such thread per reload on the server). The app's ``demo.unload`` hands the leaving session to ``Visitors``."""
    from specviz.ui import streaming
    from specviz.ui.state import Visitors

    visitors, session = Visitors(), Session()
    visitors.arrive("tab-1", session)
    live = session.runs.start(request(target="tiny-slow", max_new_tokens=400))
    for _ in streaming.watch(live, light_s=0.01):  # the callback follows the run for a while...
        if len(live.record.rounds) >= 2:
            break  # ...then its tab goes away: nobody resumes it
    visitors.leave("tab-1")
    assert not live.alive and live.error is None and live.outcome == "closed" and len(visitors) == 0
    assert 2 <= len(live.record.rounds) and live.record.new_tokens < 400 and live.record.stop_reason == "stopped"
    unwatched = Session().runs.start(request(max_new_tokens=24))  # never watched (a test, a script): runs to its end
    unwatched.join(30)
    assert unwatched.record.finished and unwatched.record.new_tokens == 24


def test_errors_are_one_line(tiny_targets):
    with pytest.raises(Exception, match="the prompt is empty"):
        request(prompt="  ")
    with pytest.raises(Exception, match="unknown drafter"):
        request(drafter="hydra")
    live = Session().runs.start(request(target="no-such-model"))
    live.join(30)
    assert live.outcome == "failed" and "unknown model 'no-such-model'" in str(live.error)


def test_model_allowlist_error_surfaces(tiny_targets, monkeypatch):
    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", "smollm2-135m")
    producer = Producer(RunRecord(header={}), lambda: runner.stream(request(target="someone/some-model")))
    producer.join(30)
    assert "is not allowed here" in str(producer.error) and "\n" not in str(producer.error)


# ---- the served app -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_targets):
    gradio_client = pytest.importorskip("gradio_client")
    from specviz.ui.app import build_app

    demo = build_app()
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    yield gradio_client, url
    demo.close()


def settings_args(prompt=PROMPT_A, target="tiny", max_new_tokens=12, drafter="ngram"):
    """The panel's values (``settings.INPUT_NAMES`` order) for a raw-prompt chain k = 4."""
    from specviz.ui import settings

    return settings.values_for(runner.RunRequest(prompt=prompt, chat=False, target=target, drafter=drafter, k=4,
                                                 width=3, depth=4, max_nodes=16, max_new_tokens=max_new_tokens))


def test_app_two_clients_at_once_do_not_see_each_other(served):
    gradio_client, url = served
    one, two = gradio_client.Client(url, verbose=False), gradio_client.Client(url, verbose=False)
    job_one = one.submit(*settings_args(PROMPT_A, "tiny-slow"), api_name="/run")
    job_two = two.submit(*settings_args(PROMPT_B, "tiny-slow"), api_name="/run")
    out_one, out_two = job_one.result(timeout=120), job_two.result(timeout=120)
    tokens_one, tokens_two = out_one[5], out_two[5]  # the tokens panel
    assert "w1" in tokens_one and "w9" not in tokens_one
    assert "w9" in tokens_two and "w1" not in tokens_two
    assert "Done" in out_one[0] and "Done" in out_two[0]


def test_app_errors_show_as_messages(served, tmp_path):
    gradio_client, url = served
    client = gradio_client.Client(url, verbose=False)
    with pytest.raises(Exception, match="the prompt is empty"):
        client.predict(*settings_args(prompt=""), api_name="/run")
    with pytest.raises(Exception, match="unknown model 'no-such-model'"):
        client.predict(*settings_args(target="no-such-model"), api_name="/run")
    with pytest.raises(Exception, match="ngram takes a maximum n-gram size"):
        client.predict(*settings_args(drafter="ngram:x"), api_name="/run")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(Exception, match="Not a valid specviz trace: trace line 1 is not a specviz trace header"):
        client.predict(gradio_client.handle_file(str(bad)), api_name="/upload_trace")


def test_app_replays_a_trace_with_no_model(served, tmp_path):
    gradio_client, url = served
    from specviz.ui import examples

    name = examples.trace_choices()[0][1]
    client = gradio_client.Client(url, verbose=False)
    out = client.predict(gradio_client.handle_file(str(examples.TRACES / name)), api_name="/upload_trace")
    assert f"replay of {name}" in out[0]
    assert "sv-accepted" in out[5] or "sv-correction" in out[5]
    header_only = tmp_path / "header-only.jsonl"  # a run stopped before its first round: valid, and said so
    header_only.write_text((examples.TRACES / name).read_text().splitlines()[0] + "\n")
    out = client.predict(gradio_client.handle_file(str(header_only)), api_name="/upload_trace")
    assert "no rounds" in out[0]


def slow_run_showing(client, text: str):
    """A long Playground run of the slow tiny target, once its status says ``text``."""
    job = client.submit(*settings_args(target="tiny-slow", max_new_tokens=500), api_name="/run")
    deadline = time.time() + 60
    while time.time() < deadline and not any(text in str(o[0]) for o in job.outputs()):
        time.sleep(0.05)
    return job


def test_app_stop_mid_run(served):
    gradio_client, url = served
    client = gradio_client.Client(url, verbose=False)
    job = slow_run_showing(client, "round")
    stopped = client.predict(api_name="/stop")
    assert "Stopped by you after" in stopped[0]
    time.sleep(1.0)  # the stopped run's own callback must not draw a last frame over Stop's (it once said "Done")
    assert not any("Done" in str(o[0]) for o in job.outputs())


def test_a_round_picked_during_a_run_stays_on_show(served):
    """Picking an earlier round mid-run keeps it on show while newer rounds stream in (each streamed frame once
    jumped back to the newest, half a second later); picking the newest follows the stream again."""
    gradio_client, url = served
    client = gradio_client.Client(url, verbose=False)
    job = slow_run_showing(client, "Generating")
    rounds = lambda: len(job.outputs()[-1][5].split("sv-first")) - 1  # noqa: E731 - rounds in the text panel
    deadline = time.time() + 60
    while rounds() < 3 and time.time() < deadline:
        time.sleep(0.05)
    client.predict(1, api_name="/pick_round")
    shown = len(job.outputs())
    time.sleep(1.5)  # several streamed frames
    later = [out[4] for out in job.outputs()[shown:]]
    assert later and all("<b>round 1 of" in info for info in later), later[-1]
    client.predict(rounds() - 1, api_name="/pick_round")  # the newest shown: following again
    time.sleep(1.5)
    assert "<b>round 1 of" not in job.outputs()[-1][4]
    client.predict(api_name="/stop")


def test_app_run_replaced_by_chain_vs_tree_says_so(served):
    """Chain vs Tree in the same session takes the engine from a streaming Playground run; that run's last frame
    must say it was stopped, not stay on "Generating" forever."""
    gradio_client, url = served
    client = gradio_client.Client(url, verbose=False)
    job = slow_run_showing(client, "Generating")
    client.predict(False, "", "", *settings_args(target="tiny-slow", max_new_tokens=6), api_name="/compare")
    last = job.result(timeout=60)[0]
    assert "another run started in this browser session" in last and "Generating" not in last


def test_run_and_compare_clicks_during_a_run_are_not_dropped():
    """Gradio drops a click on a button whose event is still pending unless trigger_mode is "multiple": Run with a
    new drafter mid-run would do nothing at all. The newer run supersedes the older one instead."""
    from specviz.ui.app import build_app

    modes = {d.get("api_name"): d.get("trigger_mode") for d in build_app().config["dependencies"]}
    assert modes["run"] == "multiple" and modes["compare"] == "multiple"


def test_token_panels_follow_the_stream():
    """The token panels' scroll box is redrawn on every update; their script scrolls it to the newest tokens (or
    the selected round), else a streamed run's new tokens sit below the fold."""
    from specviz.ui.app import build_app
    from specviz.ui.views import FOLLOW_TOKENS_JS

    components = build_app().config["components"]
    scripts = {c["props"].get("elem_id"): c["props"].get("js_on_load") for c in components}
    for elem_id in ("tokens", "replay-tokens", "compare-chain-tokens", "compare-tree-tokens"):
        assert scripts[elem_id] == FOLLOW_TOKENS_JS, elem_id
    assert "sv-caret" in FOLLOW_TOKENS_JS and "sv-sel" in FOLLOW_TOKENS_JS


def test_stopped_status_counts_in_words():
    from specviz.ui import streaming
    from tests.test_viz import make_round

    record = RunRecord(header={})
    record.rounds.append(make_round([-1], []))  # one round, one committed token
    message, level = streaming.final_status(record, stopped=True)
    assert "after 1 round (1 token)" in message and level == "warning"


def test_model_drafter_rounds_feed_every_view(tiny_targets, tmp_path):
    """A draft LM (a shallower copy of the tiny target, saved as a local model directory) at temperature 1 with a
    stochastic tree: the rounds carry q_draft, draft top-k, draws with u/ratio and residuals, and every view and
    the debugger render them."""
    from specviz.ui.views import RunView
    from specviz.viz import debugger, diagnostics, panels
    from specviz.viz.outcome import Outcome, node_outcomes

    target = tiny_targets[0]
    draft_dir = tmp_path / "draft"
    tiny.truncated(target.model, 1).save_pretrained(draft_dir)
    target.tokenizer.save_pretrained(draft_dir)
    req = request(drafter=f"model:{draft_dir}", tree=True, width=2, depth=3, max_nodes=6, temperature=1.0,
                  stochastic_tree=True, max_new_tokens=32, seed=3)
    record = run_record(Session(), req)
    assert record.finished and record.rounds
    assert all(r.q_draft is not None and r.draft_top for r in record.rounds if r.tokens)
    assert {r.rule for r in record.rounds} == {"rejection-sampling"}
    draws = [d for r in record.rounds for d in r.draws]
    assert any("u" in d and "ratio" in d for d in draws)
    for r in record.rounds:
        outcomes = node_outcomes(r)
        assert outcomes.count(Outcome.ACCEPTED) == len(r.accepted)
        for node in [str(i) for i in range(len(r.tokens))] + ["extra"]:
            html, figure = debugger.explain(r, node)
            assert "Why" in html
    rejected = next((r, i) for r in record.rounds for i, o in enumerate(node_outcomes(r)) if o is Outcome.REJECTED)
    html, figure = debugger.explain(rejected[0], str(rejected[1]))
    assert "min(1, p/q)" in html and {t.name for t in figure.data} >= {"target p (top-k)", "draft q (top-k)"}
    corrections = [r for r in record.rounds if r.extra_kind == "correction" and r.residual_top]
    if corrections:
        html, figure = debugger.explain(corrections[0], "extra")
        assert "residual" in html
    import gradio as gr

    with gr.Blocks():
        view = RunView.build("t-")
    updates = view.render(record)
    assert view.tree in updates and view.charts in updates
    assert "τ" in panels.metrics_html(record)
    diagnostics.diagnose(record)


def test_draft_options_reach_the_drafter(tiny_targets, tmp_path):
    """The panel's draft stop, vocabulary and weights reach the draft model; a bad one is one line."""
    from specviz.errors import SpecvizError
    from specviz.ui import settings

    target = tiny_targets[0]
    draft_dir = tmp_path / "draft"
    tiny.truncated(target.model, 1).save_pretrained(draft_dir)
    target.tokenizer.save_pretrained(draft_dir)
    values = [PROMPT_A, "raw", "tiny", "auto", f"model:{draft_dir}", "tree", 4, 2, 3, 8, 0.0, 1.0, 0, 24, False, 0.5,
              20, "int8"]
    assert len(values) == len(settings.INPUT_NAMES)
    req = settings.request(*values)
    assert req.min_draft_prob == 0.5 and req.draft_vocab == 20 and req.budget().min_draft_prob == 0.5
    assert req.draft_quant == "int8"
    record = run_record(Session(), req)
    assert record.finished and record.rounds
    assert max(t for r in record.rounds for t in r.tokens) < 20
    for r in record.rounds:
        assert all(r.q_draft[p] >= 0.5 for p in r.parents if p >= 0)
    assert record.header["drafter"]["draft_vocab"] == 20 and record.header["drafter"]["draft_quant"] == "int8"
    for bad in ({15: 1.0}, {16: -1}, {16: 2.5}, {17: "int4"}, {3: "turbo"}, {1: "markdown"}):
        broken = list(values)
        for index, value in bad.items():
            broken[index] = value
        with pytest.raises(SpecvizError) as error:
            settings.request(*broken)
        assert "\n" not in str(error.value)


# ---- MTP and Medusa in the app (untrained tiny modules and heads: the labels, not the acceptance, are tested) ------
@pytest.fixture(scope="module")
def mtp_medusa(tiny_targets, tmp_path_factory):
    """Specs of two MTP modules and three Medusa heads for the tiny target, saved as local folders."""
    from specviz.drafters.medusa import new_heads, save_heads
    from specviz.drafters.mtp import new_stack, save_stack

    model, folder = tiny_targets[0].model, tmp_path_factory.mktemp("drafters")
    mtp = save_stack(new_stack(model, 2, seed=1), folder / "mtp", target_name="tiny")
    medusa = save_heads(new_heads(model, 3, 1, seed=1), folder / "medusa", target_name="tiny")
    return f"mtp:{mtp}", f"medusa:{medusa}"


def test_compare_sides_pick_their_own_drafters():
    from specviz.errors import SpecvizError
    from specviz.ui import compare

    base = request(drafter="ngram:3")
    sides = compare.side_requests(base, "mtp", compare.SAME)
    assert (sides["chain"].drafter, sides["chain"].tree) == ("mtp", False)
    assert (sides["tree"].drafter, sides["tree"].tree) == ("ngram:3", True)
    assert {r.drafter for r in compare.side_requests(base).values()} == {"ngram:3"}
    with pytest.raises(SpecvizError, match="unknown drafter"):
        compare.side_requests(base, None, "hydra")


def test_mtp_run_is_labelled_by_module_and_says_it_was_trained_post_hoc(tiny_targets, mtp_medusa):
    from specviz.viz import charts, panels

    record = run_record(Session(), request(drafter=mtp_medusa[0], tree=False, k=4, max_new_tokens=12))
    assert record.finished and record.rounds
    assert all(r.meta["module"] == [0, 1, 0, 1][: len(r.tokens)] for r in record.rounds)
    line = panels.run_label(record)
    assert "trained post hoc on a frozen target" in line and "not jointly with the model" in line
    spec = charts.run_charts_spec(record.metrics(), record.rounds)
    assert [t["name"].split(":")[0] for t in spec["data"] if t["type"] == "bar" and t["xaxis"] == "x"] == [
        "module 1", "module 2"]  # the per-label bars of the per-position panel


def test_a_restarted_comparison_says_so_at_once(served):
    """The comparison's first frame clears the sides and says the new one is starting: it once left the previous
    comparison's "Done" standing while the next one loaded."""
    gradio_client, url = served
    client = gradio_client.Client(url, verbose=False)
    args = (False, "", "", *settings_args(max_new_tokens=6))
    assert "Done" in client.predict(*args, api_name="/compare")[0]
    job = client.submit(*args, api_name="/compare")
    job.result(timeout=60)
    first = str(job.outputs()[0][0])
    assert "chain: starting (ngram)" in first and "Done" not in first


def test_compare_pickers_open_on_each_runs_most_instructive_round(callbacks):
    """Each Chain vs Tree side has a round picker. Once the comparison is over it opens on the run's most
    instructive round (``RunRecord.showcase_index``: most accepted tokens, the earliest of equals), not the last one
    the stream ended on (often a one-token stub); a side a newer comparison is streaming into stays locked."""
    import threading

    from specviz.ui.controller import RunController
    from tests.test_viz import make_round

    def run(paths: list[list[int]]) -> RunRecord:
        rounds, start = [], 0
        for i, path in enumerate(paths):
            rounds.append(make_round([-1, 0, 1], path, index=i, start=start))
            start += len(rounds[-1].committed)
        return RunRecord(header={}, rounds=rounds, summary={"stop_reason": "max_new_tokens"})

    session = Session()
    session.chain = run([[0], [0, 1], [0, 1], []])  # rounds 1 and 2 accept the most: 1, the earlier
    session.tree = run([[0], [], [0, 1], [0]])
    shown = {c.elem_id: value for c, value in callbacks["compare_rounds"].fn(session).items()}
    for name, index in (("chain", 1), ("tree", 2)):
        slider = shown[f"compare-{name}-round"]
        assert (slider["value"], slider["maximum"], slider["interactive"]) == (index, 3, True), name
        assert f"<b>round {index} of 4</b>" in shown[f"compare-{name}-round-info"], name
        assert f'sv-sel" data-round="{index}"' in shown[f"compare-{name}-tokens"], name
        assert 'sv-sel" data-round="3"' not in shown[f"compare-{name}-tokens"], name
    picked = {c.elem_id: value for c, value in callbacks["compare_pick_tree"].fn(session, 3).items()}
    assert "<b>round 3 of 4</b>" in picked["compare-tree-round-info"]
    assert 'sv-sel" data-round="3"' in picked["compare-tree-tokens"]
    release = threading.Event()

    def streaming(request, **_):  # a run that streams until released
        release.wait(30)
        yield from ()

    session.runs = RunController(stream=streaming)
    session.tree = session.runs.start(runner.RunRequest(prompt="x"), owner="compare", name="tree").record
    try:  # a newer comparison streams the tree
        shown = {c.elem_id: value for c, value in callbacks["compare_rounds"].fn(session).items()}
    finally:
        release.set()
    assert shown["compare-tree-round"]["interactive"] is False and "compare-tree-tokens" not in shown
    assert shown["compare-chain-round"]["value"] == 1


def test_app_compares_the_mtp_chain_with_the_medusa_tree(served, mtp_medusa):
    import json

    gradio_client, url = served
    mtp, medusa = mtp_medusa
    client = gradio_client.Client(url, verbose=False)
    status, verdict, chain_tree, _, chain_stats, tree_tree, _, tree_stats = client.predict(
        False, mtp, medusa, *settings_args(max_new_tokens=12), api_name="/compare")
    assert f"chain {mtp} vs tree {medusa}" in status
    assert f"drafter {mtp}" in chain_stats and f"drafter {medusa}" in tree_stats and "Verdict" in verdict
    chain_plot, tree_plot = json.dumps(chain_tree), json.dumps(tree_tree)  # each side's latest round (its last
    assert "module 1" in chain_plot and "head 1" not in chain_plot  # round may be cut to one token: depth 1 only)
    assert "head 1" in tree_plot and "module 1" not in tree_plot


# ---- ZeroGPU: no GPU granted → the CPU, with a note -------------------------------------------------------------
def _refused(request, fallback_note=""):
    """What ``spaces.GPU``'s wrapper raises when ZeroGPU lends no GPU: a gr.Error titled "ZeroGPU …", before the
    function runs."""
    import gradio as gr

    raise gr.Error("You have exceeded your free ZeroGPU quota (120s requested vs. 0s left). Try again in 3:00:00.",
                   title="ZeroGPU quota exceeded")
    yield  # a generator, like runner.stream


def test_zero_gpu_without_a_gpu_runs_on_the_cpu_with_a_visible_note(tiny_targets):
    from specviz.ui import zerogpu
    from specviz.viz.panels import run_label

    devices = []

    def on_cpu(request, fallback_note=""):
        devices.append(request.device)
        yield from runner.stream(request, fallback_note=fallback_note)

    record = RunRecord(header={})
    for event in zerogpu.with_cpu_fallback(_refused, on_cpu)(request()):
        apply(record, event)
    assert record.finished and devices == ["cpu"]
    label = run_label(record)
    assert "ZeroGPU lent no GPU (ZeroGPU quota exceeded: You have exceeded your free ZeroGPU quota" in label
    assert "fell back to the CPU" in label and record.header["note"] in label
    plain = api.plain_decode(tiny_targets[0], tiny_targets[0].encode_prompt(PROMPT_A, chat=False), request().config())
    assert record.token_ids == plain.token_ids

    measured = zerogpu.with_cpu_fallback(lambda r: next(_refused(r)), runner.plain_run)(request())
    assert measured["token_ids"] == plain.token_ids and "fell back to the CPU" in measured["note"]


def test_zero_gpu_errors_of_a_run_that_had_its_gpu_are_not_retried(tiny_targets):
    import gradio as gr

    from specviz.errors import SpecvizError
    from specviz.ui import zerogpu

    def aborted_midway(request, fallback_note=""):
        yield from runner.stream(request)
        raise gr.Error("GPU task aborted", title="ZeroGPU quota exceeded")

    def worker_error(request, fallback_note=""):
        raise gr.Error("GPU task aborted", title="ZeroGPU worker error")
        yield

    def our_error(request, fallback_note=""):
        raise SpecvizError("unknown model 'x'")
        yield

    ran_on_cpu = []

    def on_cpu(request, fallback_note=""):
        ran_on_cpu.append(fallback_note)
        yield from runner.stream(request, fallback_note=fallback_note)

    for on_gpu, expected in ((aborted_midway, "GPU task aborted"), (worker_error, "GPU task aborted"),
                             (our_error, "unknown model")):
        with pytest.raises(Exception, match=expected):
            list(zerogpu.with_cpu_fallback(on_gpu, on_cpu)(request(max_new_tokens=4)))
    assert ran_on_cpu == []
    assert zerogpu.no_gpu_granted(gr.Error("x", title="ZeroGPU queue timeout"))
    assert not zerogpu.no_gpu_granted(RuntimeError("ZeroGPU quota exceeded"))


def test_the_page_opens_on_the_default_drafter_at_the_default_settings():
    from specviz import settings
    from specviz.drafters import registry
    from specviz.ui import examples

    record = examples.load_trace(examples.DEFAULT_TRACE)  # app.py would fall back silently were it missing
    assert record.rounds and record.header["drafter"]["name"] == registry.default_for(settings.default("target"))
    assert record.header["budget"] == api.budget_for(settings.validate()).to_dict()


def test_every_shipped_trace_is_labelled_by_what_it_holds():
    """Each recorded example's label says what its rounds drafted (a tree only where a round branched), its drafter,
    budget and sampling as its header has them, the target and the machine it ran on; and its speedup was measured
    beside the run (plain rounds between its rounds), so the number it shows was taken under the run's own load."""
    from specviz.ui import examples

    choices = dict((name, text) for text, name in examples.trace_choices())
    assert len(choices) == len(list(examples.TRACES.glob("*.jsonl"))) >= 20
    for name, text in choices.items():
        record = examples.load_trace(name)
        header, budget = record.header, record.header["budget"]
        drafted = examples.drafted_shape(record.rounds)
        assert header["example"]["drafted"] == drafted, name
        sizes = (f"tree w{budget['width']} d{budget['depth']} n{budget['max_nodes']}" if drafted == "tree"
                 else f"chain k{budget['depth'] if budget['tree'] else budget['k']}")
        temperature = header["config"]["temperature"]
        expected = [header["example"]["category"], header["drafter"]["name"],
                    sizes + (f" T={temperature}" if temperature else ""), header["target"]["name"],
                    header["example"]["machine"]]
        assert text.split(" · ") == expected, name
        assert record.beside_estimate is not None and record.beside_estimate.samples >= 5, name
    tree = examples.label({"budget": {"tree": True, "width": 3, "depth": 4, "max_nodes": 16}, "drafter": None,
                           "target": {"name": "t"}, "example": {"drafted": "chain", "category": "c"}})
    assert tree == "c · plain · chain k4 · t"  # a chain drafted under a tree budget is labelled a chain


def test_plain_decoding_for_a_record_uses_the_forward_it_ran_with():
    """"Measure plain decoding" after the panel switched the target's forward must still time the run's own kernels
    (and prompt, sampling): otherwise the speedup compares two implementations."""
    from specviz.ui.playground import recorded_settings

    record = RunRecord(header={"target": {"name": "tiny", "forward": "hf"}, "prompt": {"text": "w1 w2"},
                               "config": {"max_new_tokens": 9, "temperature": 0.5, "seed": 3, "chat": False}})
    recorded = recorded_settings(record)
    assert recorded["target_forward"] == "hf" and recorded["prompt"] == "w1 w2" and recorded["max_new_tokens"] == 9
    assert runner.RunRequest(**{**request(target_forward="fast").to_dict(), **recorded}).target_forward == "hf"
    assert "target_forward" not in recorded_settings(RunRecord(header={"target": {"name": "t", "forward": "??"}}))


def test_numbers_are_bare_number_boxes_whose_range_ends_are_accepted():
    """A number is a number box with no minimum, maximum or precision: Gradio's slider clamps a value typed into its
    box in the browser (k = 0 ran as k = 1, 10**9 as 16), a box's precision 0 rounds (k = 2.5 ran as 2) and its
    minimum/maximum refuse without naming the field. The range the check takes is in the info line, and its closed
    ends are accepted."""
    import gradio as gr

    from specviz import settings as declared
    from specviz.errors import SpecvizError
    from specviz.ui import settings

    base = settings.values_for(runner.RunRequest(prompt="hi", target="tiny"))

    def panel(name, value):
        values = list(base)
        values[settings.INPUT_NAMES.index(name)] = value
        return settings.request(*values)

    for setting in settings.SHOWN:
        component = settings.widget(setting)
        assert not isinstance(component, gr.Slider), setting.name
        if setting.type not in (int, float):
            continue
        assert isinstance(component, gr.Number), setting.name
        assert (component.minimum, component.maximum, component.precision) == (None, None, None), setting.name
        low, high = setting.ui_range
        bounds = f"from {low:g} to {high:g}" if setting.ui_basic else setting.describe_bounds(low, high)
        assert bounds in component.info, setting.name  # the first screen's in words (tests/test_first_screen.py)
        for end, is_open in zip((low, high), setting.open_ends(low, high)):
            if is_open:
                with pytest.raises(SpecvizError, match=f"^{setting.cli_name} must be"):
                    panel(setting.name, end)
            else:
                assert getattr(panel(setting.name, end), setting.name) == pytest.approx(end), setting.name
    assert declared.get("top_p").open_low and declared.get("min_draft_prob").open_high  # the cases that failed


# ---- bad settings through the callbacks the page calls -------------------------------------------------------------
HTML_TARGET = '<img src=x onerror=alert(1)><a href="https://example.com">click me</a>'


@pytest.fixture(scope="module")
def callbacks():
    """The app's event callbacks by API name (``fn`` is what Gradio calls, ``inputs``/``outputs`` its components)."""
    from specviz.ui.app import build_app

    return {f.api_name: f for f in build_app().fns.values() if f.api_name}


def panel_values(**changes) -> list:
    """The Playground panel's values (``settings.INPUT_NAMES`` order) for a tiny run, with ``changes``."""
    from specviz.ui import settings

    values = settings.values_for(runner.RunRequest(prompt=PROMPT_A, chat=False, target="tiny", drafter="ngram",
                                                   max_new_tokens=8))
    for name, value in changes.items():
        values[settings.INPUT_NAMES.index(name)] = value
    return values


def refused(callback, *values, session: Session | None = None) -> tuple[str, str]:
    """(the status line the callback last drew, its error toast's message): the callback must end in ``gr.Error``,
    having replaced the status line first."""
    import gradio as gr

    status = callback.outputs[0]
    shown = []
    with pytest.raises(gr.Error) as error:
        for update in callback.fn(session or Session(), *values):
            if status in update:
                shown.append(update[status])
    assert shown, "the status line kept its older message"
    return shown[-1], error.value.message


def bad_values(setting) -> list:
    """Out-of-range and malformed values of one panel setting, as its widget hands them to the callback."""
    if setting.type in (int, float):
        low, high = setting.ui_range
        whole = [2.5] if setting.type is int else []
        return [low - 1, high + 1, *whole, float("nan"), float("inf"), None, "four"]
    if setting.name == "target":
        return ["", None]
    return ["star", None, 3]


@pytest.mark.parametrize("name", [s.name for s in declared_settings.SETTINGS if s.widget])
def test_a_bad_setting_is_a_one_line_error_naming_it(tiny_targets, callbacks, name):
    """Every panel setting, out of range or malformed, through what Gradio does with it (the widget's ``preprocess``)
    and the Playground's Run callback: a one-line error naming the setting (and, for a number, the range it takes),
    the status line saying it too; nothing clamped, rounded or run."""
    import gradio as gr

    from specviz.ui import settings

    run = callbacks["run"]
    setting = declared_settings.get(name)
    widget = run.inputs[1 + settings.INPUT_NAMES.index(name)]
    for value in bad_values(setting):
        # what Gradio does with the value before the callback (a radio's own check is skipped: the page offers only
        # its choices, and its refusal of another value through the API is Gradio's)
        payload = value if isinstance(widget, gr.Radio) else widget.preprocess(value)
        status, message = refused(run, *panel_values(**{name: payload}))
        assert "\n" not in message and unescape(message) in unescape(status), (name, value)
        if setting.type in (int, float):
            assert message.startswith(f"{setting.cli_name} "), (name, value, message)
            assert setting.describe_bounds(*setting.ui_range) in message, (name, value, message)
        else:
            assert setting.cli_name in message or setting.label in message, (name, value, message)


def test_step_measure_and_compare_refuse_bad_settings_the_same_way(tiny_targets, callbacks):
    from specviz.ui import compare

    for callback, extra in ((callbacks["step"], ()), (callbacks["compare"], (False, compare.SAME, compare.SAME))):
        status, message = refused(callback, *extra, *panel_values(k=0))
        assert message.startswith("k must be an integer in [1, 16] here, got 0") and message in unescape(status)
    session = Session()
    session.record = run_record(session, request(max_new_tokens=8))
    session.record.source = "live"
    status, message = refused(callbacks["measure_plain"], *panel_values(temperature=-1.0), session=session)
    assert message.startswith("temperature must be a number in [0, 2] here, got -1.0") and message in unescape(status)


def test_user_text_in_an_error_is_shown_escaped(tiny_targets, callbacks):
    """Toasts render their message as HTML: a target typed as markup must come back as text (it was a real image
    and link, and cut the message short), and the status line must say the new error, not keep an older one."""
    from specviz.ui import compare

    run = callbacks["run"]
    session = Session()
    refused(run, *panel_values(k=0), session=session)  # an older error on show
    status, message = refused(run, *panel_values(target=HTML_TARGET), session=session)
    escaped = '&lt;img src=x onerror=alert(1)&gt;&lt;a href="https://example.com"&gt;click me&lt;/a&gt;'
    assert escaped in message and "<" not in message and ">" not in message
    assert "&lt;img src=x onerror=alert(1)&gt;" in status and "<img" not in status and "k must be" not in status
    status, message = refused(callbacks["compare"], False, HTML_TARGET, compare.SAME, *panel_values())  # a drafter
    assert "&lt;img src=x" in message and "<img" not in message and "<img" not in status


def test_typing_in_the_example_picker_keeps_the_typed_prompt():
    """Only picking an example replaces the prompt: the picker's "input" event also fired when it was typed in and
    left (it reverts to its choice), which overwrote the prompt the user had typed with the example's text."""
    import gradio as gr

    from specviz.ui import examples, settings
    from specviz.ui.app import build_app

    config = build_app().config
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    triggers = [tuple(t) for d in config["dependencies"] if d["outputs"] == [ids["prompt"]] for t in d["targets"]]
    assert triggers == [(ids["example"], "select")]
    assert settings.example_prompt("243") == examples.prompt_text("243")
    assert isinstance(settings.example_prompt(None), type(gr.skip()))
    assert isinstance(settings.example_prompt("not an example"), type(gr.skip()))


def test_chain_vs_tree_with_dflash_compares_its_block_with_ddtree(tiny_targets, served, tmp_path):
    """DFlash in Chain vs Tree: the same ``dflash:<folder>`` drafter on both sides drafts its block as a chain on
    one and DDTree on the other (the sides the tab's run streams, ``compare.side_requests``), both greedy outputs
    equal to plain decoding; the served tab runs the pair to its verdict."""
    from test_dflash import fit

    from specviz.drafters.dflash import new_model, save_drafter
    from specviz.ui import compare

    net = tiny_targets[0].model
    model = fit(new_model(net, "dflash", mask_token_id=63, seed=1), net)  # partly right: some drafts accepted
    spec = f"dflash:{save_drafter(model, tmp_path / 'dflash', target_name='tiny')}"
    sides = compare.side_requests(request(drafter="ngram", k=4, width=3, depth=4, max_nodes=12, max_new_tokens=24),
                                  spec, spec)
    records = {name: run_record(Session(), side) for name, side in sides.items()}
    plain = api.plain_decode(tiny_targets[0], tiny_targets[0].encode_prompt(PROMPT_A, chat=False),
                             request().config())
    for name, record in records.items():
        assert record.finished and record.rounds, name
        assert record.token_ids == plain.token_ids, name  # greedy: lossless on either side
        assert record.header["drafter"]["name"].startswith("dflash"), name
        assert any(r.accepted for r in record.rounds), name
    chain, tree = records["chain"].rounds, records["tree"].rounds
    assert all(r.is_chain and "block" in r.meta and "ddtree" not in r.meta for r in chain)
    assert all(len(r.tokens) <= 4 for r in chain)
    assert all("ddtree" in r.meta and len(r.tokens) <= 12 for r in tree)
    assert any(not r.is_chain for r in tree)  # branching: DDTree, not the block's argmax
    gradio_client, url = served
    status, verdict, *_ = gradio_client.Client(url, verbose=False).predict(
        False, compare.SAME, compare.SAME, *settings_args(drafter=spec, max_new_tokens=12), api_name="/compare")
    assert "Done" in status and "Verdict" in verdict


def test_a_lookahead_run_shows_its_window_and_other_runs_hide_it(tiny_targets):
    """The page's window panel: drawn, with the round's levels, for a live lookahead run; hidden for any other."""
    import gradio as gr

    from specviz.ui.views import RunView

    with gr.Blocks():
        view = RunView.build("w-")
    lookahead = run_record(Session(), request(drafter="lookahead", tree=True, max_new_tokens=16))
    assert lookahead.finished and all("lookahead" in r.meta for r in lookahead.rounds)
    shown = view.render_round(lookahead, len(lookahead.rounds) - 1)[view.window]
    assert shown["visible"] is True and shown["value"] is not None
    other = run_record(Session(), request(drafter="ngram", max_new_tokens=8))
    assert view.render_round(other, 0)[view.window] == {"__type__": "update", "visible": False}


def test_a_frame_of_a_growing_run_shows_one_count_of_rounds():
    """A live frame is drawn while the engine thread appends rounds: given the count it read, the round picker, the
    round's summary, the text and the confidence panel all stop there (the text once ran a round ahead of the picker,
    whose maximum then refused the newest round the text showed)."""
    import gradio as gr

    from specviz.engine import trace
    from specviz.resources import EXAMPLES
    from specviz.ui.views import RunView

    with gr.Blocks():
        view = RunView.build("count-")
    record = RunRecord.from_trace(trace.read(EXAMPLES / "traces" / "coding-eagle3-chain.jsonl"))
    every, count = len(record.rounds), len(record.rounds) - 2
    assert count >= 3
    frame = view.render(record, count=count)
    assert frame[view.round_slider]["maximum"] == count - 1 and frame[view.round_slider]["value"] == count - 1
    assert f"of {count}" in frame[view.round_info] and frame[view.tokens].count("sv-first") == count
    whole = view.render(record)
    assert whole[view.round_slider]["maximum"] == every - 1 and whole[view.tokens].count("sv-first") == every
