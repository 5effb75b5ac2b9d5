"""vLLM as a peer in ``specviz bench``: its own plain decoding and its own speculative decoding on the same prompts.

A vLLM server's speculative method is fixed when it starts, so each peer row gets a server of its own, started from
a given Python (a virtual environment with vLLM) over the same weights and stopped after its rows: ``start`` /
``stop`` here, also what ``tests/test_served.py`` starts its server with. A row's run is one completion request for
the whole answer; its τ comes from the server's own Prometheus counters (``vllm:spec_decode_*``), read before and
after the request, never from the tokens' timing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specviz.bench.configs import PLAIN, RunSpec, ngram_size
from specviz.bench.runners import RunResult
from specviz.bench.suite import SuiteResult, run_suite
from specviz.drafters import registry
from specviz.engine.drafter import Drafter
from specviz.engine.loop import GenerationConfig
from specviz.engine.served import ServedClient, ServedTarget, check_tokenizer, write_servable_copy
from specviz.engine.target import Target
from specviz.errors import SpecvizError

#: what a peer run reads from ``/metrics`` (summed over the engine's labels): key -> metric
SPEC_COUNTERS = {
    "generated": "vllm:generation_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: specviz's drafter families that vLLM runs a counterpart of (``plan``)
COUNTERPARTS = ("ngram", "retrieval", "model", "eagle3")
#: how long a server may take to start: vLLM compiles the model first (minutes on a few CPU cores)
START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Peer:
    """One vLLM row: its name, the specviz drafter it stands beside (None: plain decoding), the speculative config its
    server starts with (None: plain), and why it cannot run, where it cannot."""

    name: str
    mirrors: str | None = None
    speculative: dict | None = None
    note: str = ""
    refused: str = ""


@dataclass
class Server:
    """A vLLM server this process started: stop it with ``stop``."""

    process: subprocess.Popen
    url: str
    log: Path
    client: ServedClient


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def last_error(log: Path) -> str:
    """The line of a server's log that says why it stopped: its last exception line, else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if "Error:" in line or "Exception:" in line]
    line = (errors or lines or ["empty log"])[-1]
    return line.split("] ", 1)[-1][:300]


def start(python: str | Path, model: str | Path, *, log: Path, speculative: dict | None = None,
          served_name: str = "target", dtype: str = "float32", max_model_len: int = 2048,
          timeout: float = START_TIMEOUT_S, extra: Sequence[str] = ()) -> Server:
    """Start ``python -m vllm.entrypoints.openai.api_server`` on a free local port serving ``model`` (with
    ``speculative`` as its ``--speculative-config``, and ``extra`` arguments) and wait until it answers; a server that
    exits or does not answer in ``timeout`` seconds is one line, with the reason from its log."""
    if not Path(python).is_file():
        raise SpecvizError(f"no Python at {python}: give the interpreter of a virtual environment with vLLM")
    port = free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
               "--max-model-len", str(max_model_len)]
    if speculative:
        command += ["--speculative-config", json.dumps(speculative)]
    command += list(extra)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    what = f"the vLLM server ({speculative['method']} drafting)" if speculative else "the vLLM server"
    while True:
        if process.poll() is not None:
            raise SpecvizError(f"{what} exited ({process.returncode}) while starting: {last_error(log)}")
        try:
            client = ServedClient(url, served_name, timeout=600.0)
            client.models()  # it answers once its engine is up
            return Server(process, url, log, client)
        except SpecvizError:
            if time.monotonic() > deadline:
                stop_process(process)
                raise SpecvizError(f"{what} did not answer within {timeout:.0f} s; see {log}") from None
            time.sleep(1.0)


def stop_process(process: subprocess.Popen) -> None:
    """Terminate a server and its engine processes (its own session), killing them if they do not exit."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def stop(server: Server) -> None:
    stop_process(server.process)


def spec_counters(client: ServedClient) -> dict[str, float]:
    """The speculative-decoding counters (``SPEC_COUNTERS``, plus ``pos<i>`` per draft position), each summed over
    the server's labels; absent ones (a plain server has no ``spec_decode``) are left out."""
    found: dict[str, float] = {}
    names = {metric: key for key, metric in SPEC_COUNTERS.items()}
    for line in client.metrics().splitlines():
        name, brace, rest = line.partition("{")
        if name in names:
            key = names[name]
        elif name == PER_POSITION and 'position="' in rest:
            key = "pos" + rest.split('position="', 1)[1].split('"', 1)[0]
        else:
            continue
        found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def run_peer(client: ServedClient, prompt_ids: list[int], config: GenerationConfig) -> RunResult:
    """One answer as vLLM decodes it itself (one request), timed around the request; ``forwards`` (target steps) is
    generated − accepted tokens by the server's counters, each step committing its accepted drafts and one more token.
    A fresh cache salt keeps the server's prefix cache from earlier runs of the prompt out of this one, as every
    specviz run prefills its own prompt."""
    sampling = config.sampling
    options = {"return_token_ids": True, "ignore_eos": not config.stop_at_eos, "cache_salt": uuid.uuid4().hex,
               "temperature": sampling.temperature}
    if not sampling.greedy:
        options.update(top_p=sampling.top_p, top_k=sampling.top_k or -1, seed=config.seed or 0)
    before = spec_counters(client)
    start_s = time.perf_counter()
    answer = client.complete([prompt_ids], max_tokens=config.max_new_tokens, logprobs=None, **options)
    wall = time.perf_counter() - start_s
    after = spec_counters(client)
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    choice = answer["choices"][0]
    tokens = choice.get("token_ids")
    if tokens is None:
        raise SpecvizError(f"the server at {client.base_url} does not return token ids (return_token_ids)")
    accepted = int(delta.get("accepted", 0))
    forwards = max(1, len(tokens) - accepted) if tokens else None
    counts = {key: int(value) for key, value in delta.items()}
    return RunResult(list(tokens), wall, forwards=forwards, counters=counts)


def _ngram(spec: str, k: int) -> Peer:
    n = ngram_size(spec)
    return Peer(f"vllm ngram k={k} n={n}", spec,
                {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": 1},
                note=f"vLLM's own prompt lookup: speculative_config method ngram, num_speculative_tokens {k}, "
                     f"prompt_lookup_max {n}, prompt_lookup_min 1")


def plan(specs: list[str], k: int, drafters: Mapping[str, Drafter], export: Path, tokenizer) -> list[Peer]:
    """The speculative peer rows for the drafters of a run: vLLM's ngram beside ``ngram``, its suffix decoding beside
    ``retrieval``, its draft-model decoding beside ``model:<name>`` and its EAGLE-3 beside ``eagle3`` (the same
    weights, written where vLLM reads them: ``export``). A drafter with no vLLM counterpart has no peer; one whose
    weights cannot be written for vLLM has a row that says why."""
    peers: dict[str, Peer] = {}
    for spec in specs:
        family = registry.family_of(spec).name
        if family == "ngram":
            peer = _ngram(spec, k)
        elif family == "retrieval":
            peer = Peer("vllm suffix", spec, {"method": "suffix"},
                        note="vLLM's SuffixDecoding (Arctic Inference) with its defaults: a tree up to 24 deep, spec "
                             "factor 1, tokens under probability 0.1 left out; its cache holds the server's earlier "
                             "requests")
        elif family in ("model", "eagle3"):
            method = "draft_model" if family == "model" else "eagle3"
            label = f"draft model {spec.partition(':')[2]}" if family == "model" else "eagle3"
            built = drafters.get(spec) or next((d for key, d in drafters.items() if key.split(" ")[0] == spec), None)
            peer = _exported(f"vllm {label} k={k}", spec, method, k, built, tokenizer, export / method)
        else:
            continue
        peers.setdefault(peer.name, peer)
    return list(peers.values())


def _exported(name: str, spec: str, method: str, k: int, drafter: Drafter | None, tokenizer, folder: Path) -> Peer:
    """A peer whose drafter's weights are written for vLLM first; the row says why where they cannot be."""
    try:
        if method == "draft_model":
            _write_draft_model(drafter, tokenizer, folder)
        else:
            _write_eagle3(drafter, folder)
    except (SpecvizError, OSError, ValueError, AttributeError) as error:
        return Peer(name, spec, refused=f"its weights cannot be written for vLLM: {error}")
    return Peer(name, spec, {"method": method, "model": str(folder), "num_speculative_tokens": k},
                note=f"vLLM's own {method} decoding with specviz's {spec} weights, num_speculative_tokens {k}")


def _write_draft_model(drafter: Drafter | None, tokenizer, folder: Path) -> None:
    """The draft LM as loaded (its borrowed embedding and output layer written in), with the target's tokenizer."""
    model = getattr(drafter, "source_model", None)
    if model is None:
        raise SpecvizError("the drafter has no model to write")
    write_servable_copy(dataclasses.make_dataclass("Copy", ["model", "tokenizer"])(model, tokenizer), folder)


def _write_eagle3(drafter: Drafter | None, folder: Path) -> None:
    """The head in the speculators layout, the one vLLM loads for ``method: eagle3``."""
    from specviz.drafters.eagle import save_head

    head = getattr(drafter, "head", None)
    if head is None:
        raise SpecvizError("the drafter has no EAGLE-3 head to write")
    save_head(head, folder, target_name="target", layout="eagle3-speculators")


PLAIN_NAME = "vllm plain"


def plain_spec() -> RunSpec:
    return RunSpec(PLAIN_NAME, "vllm", None, PLAIN,
                   note="vLLM's own plain decoding of the same prompt: one completion request for the whole answer, "
                        "its prefix cache salted per run (each run prefills, as specviz's do)")


def peer_spec(peer: Peer) -> RunSpec:
    note = peer.note or peer.refused
    if peer.refused:
        note = f"did not run: {peer.refused}"
    elif peer.speculative:
        note += "; speedup and exact against vLLM's own plain decoding, interleaved"
    return RunSpec(peer.name, "vllm", peer.mirrors, "chain", note=note)


@dataclass
class PeerRows:
    """The speculative peer rows of a run: their specs in table order, the suite each server ran (by row name)."""

    specs: list[RunSpec] = dataclasses.field(default_factory=list)
    suites: dict[str, SuiteResult] = dataclasses.field(default_factory=dict)


class Session:
    """The vLLM side of a bench run, as a context manager: its plain decoding (a given server, the served target's
    own, or one started here), then one server per speculative peer, started, run and stopped in turn. Servers
    started here serve ``model`` (the served target's folder, or a copy of the local target's weights written in a
    temporary folder), and write their logs into ``logs``."""

    def __init__(self, target: Target, *, python: str | None, url: str | None, logs: Path, max_model_len: int,
                 log: Callable[[str], None] = lambda line: None, extra: Sequence[str] = ()):
        self.target, self.python, self.url, self.logs, self.log = target, python, url, logs, log
        self.extra = tuple(extra)  # more arguments for the servers started here
        self.max_model_len = max(2048, max_model_len)
        self._servers: list[Server] = []
        self._temporary: tempfile.TemporaryDirectory | None = None
        self._model: str | None = None
        self.plain: ServedClient | None = None

    def __enter__(self) -> Session:
        try:
            self.plain = self._plain()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_) -> None:
        for server in self._servers:
            stop(server)
        self._servers.clear()
        if self._temporary is not None:
            self._temporary.cleanup()
            self._temporary = None

    @property
    def served(self) -> bool:
        return isinstance(self.target, ServedTarget)

    def _plain(self) -> ServedClient | None:
        """The server of vLLM's own plain decoding: ``url``, else the served target's, else one started here."""
        if self.url:
            client = ServedClient(self.url)
            check_tokenizer(client, self.target)
            return client
        if self.served:
            return self.target.client
        if not self.python:
            return None
        self.log("bench: starting a vLLM server for its own plain decoding")
        server = start(self.python, self.model(), log=self.logs / "plain.log", max_model_len=self.max_model_len,
                       extra=self.extra)
        self._servers.append(server)
        return server.client

    def scratch(self) -> Path:
        """A temporary folder for the weights written for vLLM, removed when the session ends."""
        if self._temporary is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="specviz-vllm-")
        return Path(self._temporary.name)

    def model(self) -> str:
        """What started servers serve: the served target's own folder, else the local target written once."""
        if self._model is None:
            if self.served:
                self._model = self.target.client.root()
            else:
                write_servable_copy(self.target, self.scratch() / "target")
                self._model = str(self.scratch() / "target")
        return self._model

    def plan(self, specs: list[str], k: int, drafters: Mapping[str, Drafter]) -> list[Peer]:
        """The speculative peers of a run's drafters (``plan``), their weights written into ``scratch``; none
        without a Python to start their servers with (said once, where the drafters have counterparts)."""
        if not self.python:
            if any(registry.family_of(spec).name in COUNTERPARTS for spec in specs):
                self.log("bench: vLLM's own speculative rows need --vllm-python (a Python with vLLM) to start their "
                         "servers; left out")
            return []
        return plan(specs, k, drafters, self.scratch(), self.target.tokenizer)

    def run_plain(self, ids: list[int], config: GenerationConfig) -> RunResult:
        return run_peer(self.plain, ids, config)

    def run_peers(self, peers: list[Peer], suite_args: Mapping[str, Any]) -> PeerRows:
        """Each speculative peer on every prompt, interleaved with vLLM's own plain decoding: its server started,
        the suite run (``suite_args``: ``run_suite``'s), the server stopped. A server that does not start, or stops
        answering, leaves a row that says why and the run goes on."""
        rows = PeerRows()
        for peer in peers:
            if peer.refused:
                rows.specs.append(peer_spec(peer))
                continue
            self.log(f"bench: starting a vLLM server for {peer.name}")
            slug = "".join(c if c.isalnum() else "-" for c in peer.name)
            try:
                server = start(self.python, self.model(), log=self.logs / f"{slug}.log", speculative=peer.speculative,
                               max_model_len=self.max_model_len, extra=self.extra)
            except SpecvizError as error:
                rows.specs.append(peer_spec(dataclasses.replace(peer, refused=str(error))))
                continue
            spec = peer_spec(peer)
            try:
                rows.suites[spec.name] = run_suite(
                    **suite_args, specs=[spec], drafters={}, plain=self.run_plain,
                    given={spec.name: lambda ids, config, client=server.client: run_peer(client, ids, config)})
            except SpecvizError as error:
                spec = peer_spec(dataclasses.replace(peer, refused=f"its server stopped answering: {error}"))
            finally:
                stop(server)
            rows.specs.append(spec)
        return rows
