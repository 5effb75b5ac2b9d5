"""A target served by vLLM behind the ``Verifier`` seam (``specviz.engine.served``), greedy.

The fixture starts a real vLLM server (``python -m vllm.entrypoints.openai.api_server``) on 127.0.0.1 from the
virtual environment named by ``SPECVIZ_VLLM_PYTHON`` (default ``/work/vllm-venv/bin/python``), serving a copy of the
embedded default target's weights; the tests skip with a one-line reason where that is missing or does not start.
Output through the served target must equal vLLM's own greedy completion of the same prompt."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time

import pytest

from specviz import api
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.engine.served import ServedClient, ServedVerifier, check_tokenizer, leaf_paths, write_servable_copy
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

VLLM_PYTHON = os.environ.get("SPECVIZ_VLLM_PYTHON", "/work/vllm-venv/bin/python")
PROMPTS = ["Tell me a story.", "Write a Python function that reverses a string."]
NEW = 32


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


def test_unreachable_server_is_one_line():
    with pytest.raises(SpecvizError, match="cannot reach"):
        ServedClient("http://127.0.0.1:9", timeout=2.0)


@pytest.fixture(scope="module")
def target():
    return api.load_target("smollm2-135m")


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    if not pathlib.Path(VLLM_PYTHON).exists():
        pytest.skip(f"no vLLM virtual environment at {VLLM_PYTHON} (set SPECVIZ_VLLM_PYTHON)")
    model_dir = tmp_path_factory.mktemp("served-model")
    write_servable_copy(target, model_dir)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(model_dir / "server.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "VLLM_CPU_KVCACHE_SPACE": "2"}
    process = subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name",
         "target", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "2048"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                pytest.skip(f"the vLLM server exited ({process.returncode}) while starting; see {model_dir}/server.log")
            try:
                client = ServedClient(url, timeout=60.0)
                break
            except SpecvizError:
                if time.monotonic() > deadline:
                    pytest.skip("the vLLM server did not start within 600 s")
                time.sleep(1.0)
        yield client
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


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
