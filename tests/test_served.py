"""A target served by vLLM behind the ``Verifier`` seam (``specviz.engine.served``), greedy; vLLM in ``specviz bench``
(``specviz.bench.vllm_peer``).

The fixture starts a real vLLM server (``python -m vllm.entrypoints.openai.api_server``, by ``vllm_peer.start``) on
127.0.0.1 from the Python ``vllm_env.python()`` finds (``SPECVIZ_VLLM_PYTHON``, a virtual environment built before,
one built now with ``SPECVIZ_VLLM_BUILD=1``, or ``/work/vllm-venv``), serving a copy of the embedded default target's
weights; the tests skip with a one-line reason where there is none or it does not start. Output through the served
target must equal vLLM's own greedy completion of the same prompt."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import vllm_env

from specviz import api
from specviz.bench import vllm_peer
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.engine.served import ServedClient, ServedVerifier, check_tokenizer, leaf_paths, write_servable_copy
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

PROMPTS = ["Tell me a story.", "Write a Python function that reverses a string."]
NEW = 32
#: servers the tests start only to check behaviour skip vLLM's compilation (minutes on a few cores)
EAGER = ("--compilation-config", '{"mode": 0}')


def test_leaf_paths():
    assert leaf_paths(DraftTree.empty()) == [[]]
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, 0, -1])
    assert leaf_paths(tree) == [[0, 1], [0, 2], [3]]


def test_sampling_and_features_refused_in_one_line():
    class Offline(ServedClient):
        def __init__(self):
            self.base_url, self.model, self.timeout = "http://127.0.0.1:9", "m", 1.0

    verifier = ServedVerifier(Offline(), 64)
    with pytest.raises(SpecvizError, match="temperature 0"):  # the loop says how it samples when it reserves
        verifier.reserve(100, (), SamplingConfig(temperature=0.7))
    with pytest.raises(SpecvizError, match="hidden states"):
        verifier.reserve(100, (3,), SamplingConfig())


def test_the_apps_served_targets_are_the_operators(monkeypatch):
    """``SPECVIZ_SERVED_TARGETS`` adds served targets to the app's target choice; a visitor cannot run any other
    server's URL, and on a public Space the listed ones pass the allowlist."""
    from specviz.models import policy
    from specviz.ui import runner

    listed = ["vllm:http://10.0.0.5:8000#big", "vllm:https://gpu.example/v1"]
    monkeypatch.setenv("SPECVIZ_SERVED_TARGETS", " , ".join(listed))
    assert runner.target_choices()[-2:] == listed
    runner.RunRequest(prompt="hi", target=listed[0], drafter="ngram").validate()
    with pytest.raises(SpecvizError, match="one of the operator's") as error:
        runner.RunRequest(prompt="hi", target="vllm:http://10.0.0.9:1", drafter="ngram").validate()
    assert "\n" not in str(error.value)
    monkeypatch.setenv("SPACE_ID", "someone/space")
    policy.check_allowed(listed[1])
    with pytest.raises(SpecvizError, match="not allowed here"):
        policy.check_allowed("vllm:http://10.0.0.9:1")
    monkeypatch.setenv("SPECVIZ_SERVED_TARGETS", "http://10.0.0.5:8000")
    with pytest.raises(SpecvizError, match="vllm:<base url>"):
        runner.target_choices()
    monkeypatch.delenv("SPECVIZ_SERVED_TARGETS")
    with pytest.raises(SpecvizError, match="none is offered here"):
        runner.RunRequest(prompt="hi", target=listed[0], drafter="ngram").validate()


def test_bench_refuses_a_bad_vllm_option_before_loading(capsys, tmp_path):
    from specviz.cli import main

    for option, says in ((["--vllm-python", str(tmp_path / "no-python")], "is not a file"),
                         (["--vllm-url", "127.0.0.1:8000"], "base URL")):
        assert main(["bench", "--drafters", "ngram", "--quick", "--out", str(tmp_path / "out"), *option]) == 2
        said = capsys.readouterr().err.strip()
        assert says in said and len(said.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_which_vllm_the_tests_start(monkeypatch, tmp_path):
    """``SPECVIZ_VLLM_PYTHON``, else a virtual environment built before, else (opt-in) one built now, else the
    fallback; what cannot be had is one line, the skip reason."""
    for name in ("SPECVIZ_VLLM_PYTHON", "SPECVIZ_VLLM_BUILD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPECVIZ_VLLM_VENV", str(tmp_path / "venv"))
    monkeypatch.setattr(vllm_env, "FALLBACK", tmp_path / "none" / "python")
    found, why = vllm_env.python()
    assert found is None and "SPECVIZ_VLLM_BUILD=1" in why and "\n" not in why
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / ".complete").write_text(vllm_env.PACKAGE)
    assert vllm_env.python() == (str(tmp_path / "venv" / "bin" / "python"), "")
    monkeypatch.setenv("SPECVIZ_VLLM_PYTHON", str(tmp_path / "missing"))
    assert vllm_env.python() == (None, f"SPECVIZ_VLLM_PYTHON={tmp_path / 'missing'} is not a file")
    (tmp_path / "file").write_text("")  # a venv cannot be made under a file: the build fails in one line
    found, why = vllm_env.build(tmp_path / "file" / "venv")
    assert found is None and why.startswith(f"could not build {vllm_env.PACKAGE}") and "\n" not in why


def test_unreachable_server_is_one_line():
    with pytest.raises(SpecvizError, match="cannot reach"):
        ServedClient("http://127.0.0.1:9", timeout=2.0)


@pytest.fixture(scope="module")
def target():
    return api.load_target("smollm2-135m")


@pytest.fixture(scope="module")
def vllm_python() -> str:
    found, why = vllm_env.python()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def model_dir(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("served-model")
    write_servable_copy(target, folder)
    return folder


def start_or_skip(python: str, model, log, **options) -> vllm_peer.Server:
    try:
        return vllm_peer.start(python, model, log=log, **options)
    except SpecvizError as error:
        pytest.skip(f"the vLLM server did not start: {error}")


@pytest.fixture(scope="module")
def server_process(vllm_python, model_dir):
    started = start_or_skip(vllm_python, model_dir, model_dir / "server.log", timeout=600, extra=EAGER)
    yield started
    vllm_peer.stop(started)


@pytest.fixture(scope="module")
def server(server_process) -> ServedClient:
    return ServedClient(server_process.url, "target", timeout=60.0)


def vllm_greedy(client: ServedClient, prompt_ids: list[int], n: int) -> list[int]:
    answer = client.complete([prompt_ids], max_tokens=n, logprobs=0)
    return [int(t.split(":", 1)[1]) for t in answer["choices"][0]["logprobs"]["tokens"]]


def test_tokenizer_matches(server, target):
    check_tokenizer(server, target)


DRAFTERS = {
    "plain": (None, None),
    "ngram-chain": ("ngram", DraftBudget(k=4)),
    "model-chain": ("model:smollm2-135m", DraftBudget(k=4)),
    "model-tree": ("model:smollm2-135m", DraftBudget(tree=True, width=2, depth=3, max_nodes=6)),
}


@pytest.mark.parametrize("route", ServedVerifier.ROUTES)
@pytest.mark.parametrize("shape", list(DRAFTERS))
def test_served_greedy_equals_vllm_greedy(server, target, shape, route):
    spec, budget = DRAFTERS[shape]
    drafter = api.make_drafter(spec, target) if spec else None
    config = GenerationConfig(max_new_tokens=NEW, stop_at_eos=False)
    for prompt in PROMPTS:
        prompt_ids = target.encode_prompt(prompt, chat=True)
        verifier = ServedVerifier(server, target.vocab_size, route=route)
        run = api.start(target, prompt_ids, drafter, budget or DraftBudget(k=1), config, verifier=verifier).run()
        expected = vllm_greedy(server, prompt_ids, NEW)
        assert run.new_tokens == expected, (shape, route, prompt)
        if drafter is not None and shape != "ngram-chain":
            assert any(r.accepted for r in run.rounds), "the drafter never got a token accepted"


def test_a_served_target_spec_that_cannot_open_is_one_line(capsys, monkeypatch):
    from specviz.cli import main

    for spec, says in (("vllm:127.0.0.1:8000", "vllm:<base url>[#<model>]"),
                       ("vllm:http://127.0.0.1:9", "cannot reach the server")):
        assert main(["generate", "--target", spec, "--drafter", "ngram", "--prompt", "hi"]) == 2
        said = capsys.readouterr().err.strip()
        assert says in said and len(said.splitlines()) == 1
    monkeypatch.setenv("SPACE_ID", "someone/space")  # a public Space: only what its operator allowlists
    assert main(["generate", "--target", "vllm:http://127.0.0.1:9", "--prompt", "hi"]) == 2
    assert "is not allowed here" in capsys.readouterr().err


def test_generate_against_a_served_target(server, target, capsys):
    """``--target vllm:<url>`` from the command line: the tokenizer and config come from where the server loaded the
    model, an n-gram chain's output is vLLM's own greedy completion, a drafter that needs hidden states and sampling
    are refused in one line, and --baseline measures the same server's plain decoding."""
    from specviz.cli import main

    spec = f"vllm:{server.base_url}#target"
    served = api.load_target(spec)
    assert served.vocab_size == target.vocab_size and served.model is None
    prompt = PROMPTS[1]
    assert main(["generate", "--target", spec, "--drafter", "ngram", "--k", "4", "--prompt", prompt,
                 "--max-new-tokens", str(NEW), "--baseline", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    prompt_ids = target.encode_prompt(prompt, chat=True)
    expected = vllm_greedy(server, prompt_ids, NEW)
    assert result["token_ids"][:len(expected)] == expected[:len(result["token_ids"])]
    assert result["speedup"] > 0 and result["baseline_token_ids"] == result["token_ids"]
    split = result["served"]  # the server's time, the rest of the wall time, and what it computed again
    assert 0 < split["server_ms"] <= split["wall_ms"] and split["recomputed_tokens"] <= split["prompt_tokens"]
    plain = api.plain_decode(served, prompt_ids, GenerationConfig(max_new_tokens=4))  # a lean, timed baseline:
    assert plain.rounds and all("server_ms" not in r.meta["served"] for r in plain.rounds)  # no /metrics per token
    for extra, says in ((["--drafter", "eagle3"], "hidden states"), (["--temperature", "0.7"], "temperature 0")):
        assert main(["generate", "--target", spec, "--prompt", prompt, "--max-new-tokens", "4", *extra]) == 2
        said = capsys.readouterr().err.strip()
        assert says in said and len(said.splitlines()) == 1


def test_auto_switches_routes_at_one_and_a_half_of_the_servers_blocks():
    """``auto`` sends one prompt per row from 1.5 KV blocks of committed context: the server's block size as its
    /metrics says (vLLM's cache_config_info), else the 192 tokens measured with vLLM CPU's 128-token blocks."""
    from specviz.engine.served import block_size_of

    metrics = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
               'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0"} 1.0\n')
    assert block_size_of(metrics) == 32
    assert block_size_of(metrics.replace('engine="0"', 'engine="0",hash_block_size="64"')) == 64  # where hits land
    assert block_size_of(metrics.replace('engine="0"', 'engine="0",hash_block_size="None"')) == 32
    assert block_size_of(metrics.replace('"32"', '"None"')) is None and block_size_of("vllm:x 1") is None

    class Client(ServedClient):
        def __init__(self, text: str | None):
            self.model, self.text, self._block_size, self.reads = "m", text, None, 0

        def metrics(self) -> str:
            self.reads += 1
            if self.text is None:
                raise SpecvizError("no /metrics")
            return self.text

    for text, threshold in ((metrics, 48), (metrics.replace('"32"', '"16"'), 24), ("", 192), (None, 192)):
        client = Client(text)
        verifier = ServedVerifier(client, 64)
        assert verifier.per_node_from == threshold and verifier.per_node_from == threshold and client.reads == 1


def test_server_split_reads_the_counters_deltas():
    from specviz.engine.served import server_split

    before = {"requests": 10.0, "request_s": 4.0, "prompt_tokens": 500.0, "recomputed_tokens": 300.0}
    after = {"requests": 12.0, "request_s": 4.5, "prompt_tokens": 600.0, "recomputed_tokens": 310.0}
    assert server_split(before, after, 0.3) == {"wall_ms": 300.0, "server_ms": 250.0, "transfer_ms": 50.0,
                                                "prompt_tokens": 100, "recomputed_tokens": 10}
    assert server_split(before, before, 0.3) == {}  # no request counted: nothing to split


@pytest.mark.parametrize("route", ServedVerifier.ROUTES)
def test_each_round_records_what_the_server_did(server, target, route):
    """The server's own counters split each round: its time within the wall time, and the prompt tokens it computed
    again: every one by prompt logprobs (vLLM reads no prefix cache then), far fewer by one prompt per row (past the
    server's cache block: the prompt is a few hundred tokens)."""
    text = "Summarize this: " + " ".join(f"Day {i}: the river rose and the town moved its boats." for i in range(30))
    prompt_ids = target.encode_prompt(text, chat=True)
    assert len(prompt_ids) > 300
    verifier = ServedVerifier(server, target.vocab_size, route=route)
    run = api.start(target, prompt_ids, api.make_drafter("ngram", target), DraftBudget(k=4),
                    GenerationConfig(max_new_tokens=16, stop_at_eos=False), verifier=verifier).run()
    splits = [r.meta["served"] for r in run.rounds]
    assert all(s["route"] == route and 0 < s["server_ms"] <= s["wall_ms"] for s in splits)
    drafted = [r.meta["served"] for r in run.rounds[1:] if r.tokens]  # a round with no draft asks for no logprobs
    assert drafted, "the lookup drafted nothing: no round to check"
    computed = sum(s["recomputed_tokens"] for s in drafted) / sum(s["prompt_tokens"] for s in drafted)
    if route == "prompt-logprobs":
        assert computed == 1.0
    else:
        assert computed < 0.5
    # the app shows the split where it shows the round's and the run's time split
    from specviz.viz import panels
    from specviz.viz.record import RunRecord

    record = RunRecord(header={}, rounds=run.rounds)
    split = panels.served_split(run.rounds)
    assert split["server_ms"] == pytest.approx(sum(s["server_ms"] for s in splits) / len(splits))
    assert "verify: server · transfer" in panels.metrics_html(record)
    shown = panels.round_info_html(run.rounds[1])
    assert f"server {splits[1]['server_ms']:.1f} ms" in shown and "prompt tokens recomputed" in shown


def test_a_server_that_stops_answering_is_one_line(server_process):
    """A stalled server (its front end stopped by SIGSTOP) is a one-line timeout, not a hang."""
    client = ServedClient(server_process.url, "target", timeout=2.0)
    os.kill(server_process.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(SpecvizError, match="did not answer /v1/completions within 2 s") as error:
            client.complete([[1, 2, 3]])
        assert time.monotonic() - started < 30 and "\n" not in str(error.value)
    finally:
        os.kill(server_process.process.pid, signal.SIGCONT)
    client.complete([[1, 2, 3]])  # and it answers again


def test_a_server_that_dies_mid_run_keeps_the_rounds_so_far(vllm_python, model_dir, tmp_path, capsys):
    """The server killed after a few rounds: the CLI says so in one line (exit 2) and the trace keeps the rounds
    that were verified before it died."""
    from specviz.cli import main

    dying = start_or_skip(vllm_python, model_dir, tmp_path / "dying.log", timeout=600, extra=EAGER)
    watcher = ServedClient(dying.url, "target", timeout=10.0)

    def kill_after_a_few_rounds():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and watcher.counters().get("requests", 0) < 8:
            time.sleep(0.05)
        os.killpg(dying.process.pid, signal.SIGKILL)

    thread = threading.Thread(target=kill_after_a_few_rounds, daemon=True)
    trace = tmp_path / "run.jsonl"
    try:
        thread.start()
        code = main(["generate", "--target", f"vllm:{dying.url}#target", "--drafter", "ngram", "--prompt",
                     PROMPTS[0], "--max-new-tokens", "2000", "--trace", str(trace)])
    finally:
        thread.join(timeout=60)
        vllm_peer.stop(dying)
    said = capsys.readouterr().err.strip()
    assert code == 2 and len(said.splitlines()) == 1, said
    assert "cannot reach the server" in said and f"rounds before it are in {trace}" in said
    recorded = api.trace.read(trace)
    assert recorded.rounds and recorded.summary["stop_reason"] == "error"
    assert "cannot reach the server" in recorded.summary["error"]
    assert recorded.summary["token_ids"] == [t for r in recorded.rounds for t in r.committed]


def write_prompts(folder, count: int = 2):
    path = folder / "prompts.jsonl"
    lines = [{"question_id": i, "category": category, "turns": [text]}
             for i, (category, text) in enumerate(zip(("writing", "coding"), PROMPTS[::-1][:count]))]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_bench_against_a_served_target(server, tmp_path, capsys):
    """``bench --target vllm:<url>``: specviz's drafters verified on the server against the same server's plain
    decoding through specviz, and vLLM's own plain decoding as a row whose greedy output equals specviz's; no
    transformers rows, no verify-width table (the model is not here), vLLM's speculative rows left out in one line
    without --vllm-python."""
    from specviz.cli import main

    out = tmp_path / "out"
    assert main(["bench", "--target", f"vllm:{server.base_url}#target", "--drafters", "ngram", "--shapes", "chain",
                 "--k", "3", "--prompts", str(write_prompts(tmp_path)), "--max-new-tokens", "24",
                 "--out", str(out)]) == 0
    said = capsys.readouterr().err
    assert "transformers rows are left out" in said and "need --vllm-python" in said
    results = json.loads((out / "results.json").read_text())
    table = results["summary"]["table"]
    assert set(table) == {"plain (specviz)", "ngram chain k=3", "vllm plain"}
    for row in ("ngram chain k=3", "vllm plain"):
        assert table[row]["overall"]["exact"] == 2, row  # the served greedy output is vLLM's own
    assert results["verify_cost"] is None and "--no-hf" in results["command"]
    runs = [r for r in results["runs"] if r["config"] == "vllm plain"]
    assert len(runs) == 2 and all(r["tau"] == 1.0 and r["tokens_per_s"] > 0 for r in runs)
    assert "## vLLM beside specviz" in (out / "results.md").read_text()


def test_vllm_speculative_peers(vllm_python, server, target, tmp_path):
    """vLLM's own n-gram decoding on a server of its own, interleaved with vLLM's plain decoding: its output equals
    vLLM's plain greedy, its τ comes from the server's counters; SuffixDecoding, where this vLLM cannot run it,
    leaves a row that says why in one line."""
    from specviz.bench.prompts import load_prompts
    from specviz.bench.report import overall_table, vllm_section
    from specviz.bench.summary import add_rows, summarise

    prompts = load_prompts(write_prompts(tmp_path))
    config = GenerationConfig(max_new_tokens=24)
    with vllm_peer.Session(target, python=vllm_python, url=server.base_url, logs=tmp_path / "logs",
                           max_model_len=512, extra=EAGER) as session:
        peers = session.plan(["ngram", "retrieval"], 3, {})
        assert [p.name for p in peers] == ["vllm ngram k=3 n=3", "vllm suffix"]
        assert peers[0].speculative == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                        "prompt_lookup_min": 1}
        rows = session.run_peers(peers, {"target": target, "prompts": prompts, "config": config, "chat": True})
    ngram = rows.suites["vllm ngram k=3 n=3"]
    for sample in ngram.samples:
        assert sample.result.token_ids == sample.reference  # vLLM's speculative output is its plain output
        counted = sample.result.counters
        assert counted["generated"] == sample.result.new_tokens
        assert sample.result.forwards == sample.result.new_tokens - counted["accepted"]
        assert counted["accepted"] <= counted["draft_tokens"] <= 3 * counted["drafts"]
    suffix = next(spec for spec in rows.specs if spec.name == "vllm suffix")
    if "vllm suffix" not in rows.suites:
        assert suffix.note.startswith("did not run: ") and "\n" not in suffix.note
    summary = summarise(ngram, True)  # its plain row is vLLM's plain decoding here
    assert "| vllm ngram k=3 n=3 | " in "\n".join(vllm_section(summary, ngram))  # the counters' table
    if "vllm suffix" not in rows.suites:
        add_rows(summary, ngram, [suffix], rows.suites)
        line = next(row for row in overall_table(summary) if row.startswith("| vllm suffix |"))
        assert line.count("| – ") >= 6  # a row of dashes; the notes say why


def test_the_app_ends_a_stalled_served_run_in_one_line(server_process, monkeypatch):
    """In the app, a served run whose server stops answering (SIGSTOP, past ``SPECVIZ_SERVED_TIMEOUT``) ends as
    failed with one line (the page raises it as its gr.Error), and its record keeps the rounds so far, with a summary
    that says why, for the trace download."""
    from specviz.ui import controller, runner

    spec = f"vllm:{server_process.url}#target"
    monkeypatch.setenv("SPECVIZ_SERVED_TARGETS", spec)
    monkeypatch.setenv("SPECVIZ_SERVED_TIMEOUT", "3")
    request = runner.RunRequest(prompt=PROMPTS[0], target=spec, drafter="ngram", max_new_tokens=200).validate()
    live = controller.RunController().start(request)
    deadline = time.monotonic() + 120
    while len(live.record.rounds) < 3 and live.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(live.record.rounds) >= 3, live.error
    os.kill(server_process.process.pid, signal.SIGSTOP)
    try:
        live.join(60)
    finally:
        os.kill(server_process.process.pid, signal.SIGCONT)
    assert live.outcome == controller.FAILED and "did not answer" in str(live.error)
    assert "\n" not in str(live.error)
    record = live.record
    assert len(record.rounds) >= 3 and record.summary["stop_reason"] == "error"
    assert "did not answer" in record.summary["error"] and record.summary["token_ids"] == record.token_ids
