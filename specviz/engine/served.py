"""A target on a vLLM server (OpenAI-compatible ``/v1/completions``) behind the ``Verifier`` seam: greedy only.

Every round is one batched request, by one of two routes (``auto``, the default, picks by context length).
Route ``prompt-logprobs``: for each root-to-leaf path of the tree, the prompt is the committed context, the
pending token and the path's tokens, as token ids, with ``max_tokens: 1`` and ``prompt_logprobs``. The server's
prompt logprobs at the draft positions give the rows after the pending token and after every inner node; the one
token it generates after each path gives the row after that path's leaf (the bonus). Only the standard library talks
HTTP. Route ``per-node``: one prompt per row (the context plus the path to the row's node), no prompt logprobs; each
row is the token the server generates there, and every prompt reads the server's prefix cache.

What a row holds. The server returns, per position, the logprobs of its top ``k`` tokens and of the token actually
there; everything else is unknown. A row is those logprobs, every other entry ``-inf``. Its argmax is the server's
own top-1, so the greedy accept rule is exact; the views show the server's top-k (the rest of the distribution is
missing, not zero, and entropies are of the truncated row). Sampling needs the whole distribution at each position,
so a served target refuses it (one line, when the loop reserves it with the run's sampler) rather than approximate.

Cost. vLLM reads no prefix cache for a request that asks for prompt logprobs, so every round with a draft
re-runs the whole context on the server (route ``prompt-logprobs``); route ``per-node`` and a round with no draft ask
for none and hit the cache, so the server recomputes only what lies past its last cached block for each prompt (its
KV block size: 128 tokens on vLLM's CPU backend unless ``--block-size`` says otherwise, vLLM's default of 16
elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import torch

from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import ROOT, DraftTree
from specviz.engine.verifier import Scored, Verifier
from specviz.errors import SpecvizError


@dataclass
class Call:
    """One request to the server: how many prompts, how many prompt tokens in all, and the wall time it took."""

    prompts: int
    tokens: int
    seconds: float


@dataclass
class ServedStats:
    calls: list[Call] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(call.seconds for call in self.calls)


class ServedClient:
    """The few endpoints specviz needs from a vLLM OpenAI-compatible server, over ``urllib``."""

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.timeout = timeout
        self.model = model or self.models()[0]
        self._block_size: tuple[int | None] | None = None  # (the server's block size,) once read

    def _fetch(self, path: str, body: dict | None = None) -> bytes:
        """``path``'s raw answer (a POST of ``body`` as JSON when given); every failure one line."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300].replace("\n", " ")
            raise SpecvizError(f"the server at {self.base_url} answered {path} with HTTP {error.code}: {detail}") \
                from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, TimeoutError):
                raise SpecvizError(f"the server at {self.base_url} did not answer {path} within {self.timeout:g} s "
                                   f"(SPECVIZ_SERVED_TIMEOUT sets how long to wait)") from None
            raise SpecvizError(f"cannot reach the server at {self.base_url} ({path}): {reason}") from None

    def _request(self, path: str, body: dict | None = None) -> dict:
        return json.loads(self._fetch(path, body))

    def models(self) -> list[str]:
        found = [entry["id"] for entry in self._request("/v1/models").get("data", [])]
        if not found:
            raise SpecvizError(f"the server at {self.base_url} serves no model")
        return found

    def root(self) -> str:
        """Where the server loaded ``self.model`` from (a folder on its machine, or a hub id)."""
        for entry in self._request("/v1/models").get("data", []):
            if entry["id"] == self.model:
                return entry.get("root") or entry["id"]
        raise SpecvizError(f"the server at {self.base_url} does not serve {self.model!r}; it serves "
                           f"{', '.join(self.models())}")

    def counters(self) -> dict[str, float]:
        """The server's own accounting (its Prometheus ``/metrics``), each of ``COUNTERS`` summed over its labels;
        the ones it does not export are absent."""
        try:
            text = self.metrics()
        except SpecvizError:  # a server without metrics: the rounds keep their wall time only
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            name, _, rest = line.partition("{")
            for key, (metric, label) in COUNTERS.items():
                if name == metric and label in rest:
                    found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return found

    def metrics(self) -> str:
        """The server's Prometheus exposition (``/metrics``), as text."""
        return self._fetch("/metrics").decode()

    def block_size(self) -> int | None:
        """The server's KV cache block size (``vllm:cache_config_info``), read once; None where it does not say."""
        if self._block_size is None:
            try:
                self._block_size = (block_size_of(self.metrics()),)
            except SpecvizError:  # a server without metrics
                self._block_size = (None,)
        return self._block_size[0]

    def tokenize(self, text: str) -> list[int]:
        return self._request("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})["tokens"]

    def complete(self, prompts: list[list[int]], *, max_tokens: int = 1, prompt_logprobs: int | None = None,
                 logprobs: int | None = 1, **options) -> dict:
        """One ``/v1/completions`` request, greedy and to ``max_tokens`` unless ``options`` (more body fields) say
        otherwise; ``logprobs=None`` asks for none."""
        body = {"model": self.model, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0.0,
                "logprobs": logprobs, "ignore_eos": True, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False, **options}
        if prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs
        return self._request("/v1/completions", body)


def block_size_of(metrics: str) -> int | None:
    """The granularity of the server's prefix-cache hits from vLLM's ``vllm:cache_config_info`` gauge in a
    ``/metrics`` text: its ``hash_block_size`` label where that is a whole number, else its ``block_size``."""
    for line in metrics.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            for label in ("hash_block_size", "block_size"):
                found = re.search(rf'[{{,]{label}="(\d+)"', line)
                if found and int(found[1]) > 0:
                    return int(found[1])
    return None


#: what a round's record says the server did: key -> (vLLM metric, a label its sample must carry)
COUNTERS = {
    "requests": ("vllm:e2e_request_latency_seconds_count", ""),
    "request_s": ("vllm:e2e_request_latency_seconds_sum", ""),
    "prompt_tokens": ("vllm:prompt_tokens_total", ""),
    "recomputed_tokens": ("vllm:prompt_tokens_by_source_total", 'source="local_compute"'),
}


def server_split(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """One request's cost as the server accounts it: its requests' mean latency on the server, the rest of the wall
    time (transfer, HTTP, the server's front end), and the prompt tokens it computed rather than read from its prefix
    cache. Empty where the server exports no such counters."""
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    if not delta.get("requests"):
        return {}
    server_ms = 1000.0 * delta["request_s"] / delta["requests"]
    split = {"wall_ms": round(1000.0 * wall_s, 2), "server_ms": round(server_ms, 2),
             "transfer_ms": round(max(0.0, 1000.0 * wall_s - server_ms), 2)}
    for key in ("prompt_tokens", "recomputed_tokens"):
        if key in delta:
            split[key] = int(delta[key])
    return split


def _token_id(key: str) -> int:
    return int(key.split(":", 1)[1]) if key.startswith("token_id:") else int(key)


def leaf_paths(tree: DraftTree) -> list[list[int]]:
    """Every root-to-leaf path of ``tree`` as node indices (one empty path for the empty tree)."""
    if not tree.tokens:
        return [[]]
    has_child = [False] * len(tree.tokens)
    for parent in tree.parents:
        if parent != ROOT:
            has_child[parent] = True
    paths = []
    for leaf, inner in enumerate(has_child):
        if inner:
            continue
        path, node = [], leaf
        while node != ROOT:
            path.append(node)
            node = tree.parents[node]
        paths.append(path[::-1])
    return paths


class ServedVerifier(Verifier):
    """The target on a vLLM server, greedy only; ``target`` is the local copy of its tokenizer and config (vocab)."""

    device = torch.device("cpu")

    ROUTES = ("prompt-logprobs", "per-node")
    #: below this many committed tokens ``auto`` sends prompt logprobs (one prompt per leaf: less per-request work),
    #: from it one prompt per row (vLLM reads its prefix cache only without prompt logprobs, so past a short
    #: context that saves more than the extra prompts cost): measured at 192 with vLLM CPU's 128-token KV blocks
    #: (docs/bench-log/served-01.md), so one and a half of the server's blocks where it says its block size, else 192
    AUTO_PER_NODE_FROM = 192
    AUTO_PER_NODE_BLOCKS = 1.5

    def __init__(self, client: ServedClient, vocab_size: int, *, top_k: int = 1, route: str = "auto",
                 account: bool = True):
        if route != "auto" and route not in self.ROUTES:
            raise SpecvizError(f"unknown served verify route {route!r}; one of {', '.join(self.ROUTES)}")
        self.route = route
        self.client, self.vocab_size, self.top_k = client, vocab_size, max(1, top_k)
        self.name = f"vllm:{client.model}"
        #: read the server's counters after each round (one /metrics request, inside the round's time) to split its
        #: time in the record; timed runs without detail (the plain baseline, the bench) leave it off
        self.account = account
        self._counters: dict[str, float] = {}
        self._split: dict = {}
        self.last_route = route
        self.tokens: list[int] = []
        self.stats = ServedStats()
        self._tree: tuple[int, DraftTree] | None = None
        self._per_node_from: int | None = None

    @property
    def per_node_from(self) -> int:
        """Committed tokens from which ``auto`` sends one prompt per row (see ``AUTO_PER_NODE_FROM``)."""
        if self._per_node_from is None:
            block = self.client.block_size()
            self._per_node_from = (self.AUTO_PER_NODE_FROM if block is None
                                   else round(self.AUTO_PER_NODE_BLOCKS * block))
        return self._per_node_from

    def reserve(self, positions: int, layers: tuple[int, ...], sampling: SamplingConfig) -> None:
        if not sampling.greedy:
            raise SpecvizError("sampling through a served target needs the server's whole distribution at every "
                               "draft position, which it does not return here; use temperature 0 (greedy)")
        if layers:
            raise SpecvizError("a drafter that reads target hidden states (EAGLE, MTP, Medusa, DFlash, DSpark) cannot "
                               "run against a served target: the server does not return them")
        self.tokens = []

    def prefill(self, token_ids: list[int]) -> Scored:
        """Nothing to cache here: every verify sends the whole context (the server's prefix cache, where it reads
        one, is its own business)."""
        self.tokens = list(token_ids)
        if self.account:
            self._counters = self.client.counters()
        return Scored(None)

    def verify(self, tree: DraftTree, pending_token: int, past_length: int) -> Scored:
        if past_length != len(self.tokens):
            raise SpecvizError(f"served verifier out of step: {past_length} committed tokens expected, "
                               f"{len(self.tokens)} kept")
        self._tree = (pending_token, tree)
        context = [*self.tokens, pending_token]
        if self.route == "per-node" or (self.route == "auto" and len(context) >= self.per_node_from):
            self.last_route = "per-node"
            return self._verify_per_node(tree, context)
        self.last_route = "prompt-logprobs"
        paths = leaf_paths(tree)
        prompts = [context + [tree.tokens[i] for i in path] for path in paths]
        answer = self._send(prompts, prompt_logprobs=self.top_k if tree.tokens else None)
        choices = sorted(answer["choices"], key=lambda choice: choice["index"])
        if len(choices) != len(prompts):
            raise SpecvizError(f"the server answered {len(choices)} completions for {len(prompts)} prompts")
        logits = torch.full((len(tree.tokens) + 1, self.vocab_size), float("-inf"))
        done = [False] * (len(tree.tokens) + 1)
        base = len(context)  # prompt index of the first draft token of each path
        for path, choice in zip(paths, choices):
            rows = [0, *(node + 1 for node in path)]  # row r is the distribution after rows[r]'s token
            entries = choice.get("prompt_logprobs") or []
            for j, row in enumerate(rows[:-1]):
                if not done[row]:
                    self._fill(logits[row], entries[base + j])
                    done[row] = True
            if not done[rows[-1]]:
                self._fill(logits[rows[-1]], self._generated(choice))
                done[rows[-1]] = True
        return Scored(logits, meta=self._meta())

    def _verify_per_node(self, tree: DraftTree, context: list[int]) -> Scored:
        """One prompt per row (the context, then the context plus the path to each node), no prompt logprobs:
        each row is the token the server generates after its prompt, so every prompt reads the prefix cache and
        the server recomputes only what lies past the last cached block."""
        prompts = [context]
        for node in range(len(tree.tokens)):
            path, at = [], node
            while at != ROOT:
                path.append(tree.tokens[at])
                at = tree.parents[at]
            prompts.append(context + path[::-1])
        answer = self._send(prompts)
        choices = sorted(answer["choices"], key=lambda choice: choice["index"])
        if len(choices) != len(prompts):
            raise SpecvizError(f"the server answered {len(choices)} completions for {len(prompts)} prompts")
        logits = torch.full((len(prompts), self.vocab_size), float("-inf"))
        for row, choice in enumerate(choices):
            self._fill(logits[row], self._generated(choice))
        return Scored(logits, meta=self._meta())

    def _send(self, prompts: list[list[int]], prompt_logprobs: int | None = None) -> dict:
        """One batched completion request, timed; then the server's counters, read once a round, split its time."""
        start = time.perf_counter()
        answer = self.client.complete(prompts, prompt_logprobs=prompt_logprobs, logprobs=self.top_k)
        wall_s = time.perf_counter() - start
        self.stats.calls.append(Call(len(prompts), sum(map(len, prompts)), wall_s))
        if self.account:
            counters = self.client.counters()
            self._split = server_split(self._counters, counters, wall_s)
            self._counters = counters
        return answer

    def _meta(self) -> dict:
        return {"served": {"route": self.last_route, **self._split}}

    def _generated(self, choice: dict) -> dict:
        """The first generated token's top-k logprobs, as the ``{token id: {"logprob": x}}`` of a prompt entry."""
        logprobs = choice["logprobs"]
        top = logprobs["top_logprobs"][0] or {}
        found = {str(_token_id(key)): {"logprob": value} for key, value in top.items()}
        chosen = _token_id(logprobs["tokens"][0])
        found.setdefault(str(chosen), {"logprob": logprobs["token_logprobs"][0]})
        return found

    def _fill(self, row: torch.Tensor, entry: dict | None) -> None:
        if not entry:
            raise SpecvizError("the server returned no logprobs for a draft position")
        for key, value in entry.items():
            logprob = value["logprob"] if isinstance(value, dict) else value
            row[_token_id(key)] = max(float(logprob), -3.0e38)  # a -inf logprob stays below every returned one

    def keep(self, committed: int, path: list[int]) -> None:
        pending, tree = self._tree
        self.tokens = [*self.tokens, pending, *(tree.tokens[i] for i in path)]
        if len(self.tokens) != committed + len(path):
            raise SpecvizError(f"served verifier out of step: kept {len(self.tokens)} tokens, "
                               f"expected {committed + len(path)}")


PREFIX = "vllm:"


def is_served(spec: str) -> bool:
    """Whether a target spec names a served model (``vllm:<base url>[#<model>]``)."""
    return isinstance(spec, str) and spec.strip().startswith(PREFIX)


@dataclass
class ServedTarget(Target):
    """A target whose forward runs on a vLLM server: here only its tokenizer and config (for the vocabulary, the end
    tokens and the pieces the views show), loaded from where the server loaded the model. Its verifier is the
    server (``new_verifier``); there is no model in this process, so nothing reads its hidden states."""

    client: ServedClient | None = None
    model_config: object = None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def config(self):
        return self.model_config

    @property
    def vocab_size(self) -> int:
        return int(self.model_config.vocab_size)

    def new_verifier(self, *, account: bool = True) -> ServedVerifier:
        return ServedVerifier(self.client, self.vocab_size, account=account)


def served_timeout() -> float:
    """How long to wait for one answer of the server, in seconds: ``SPECVIZ_SERVED_TIMEOUT``, else 120 (a round on a
    busy CPU server takes seconds; a stalled one should not hold a run for ever)."""
    text = os.environ.get("SPECVIZ_SERVED_TIMEOUT", "").strip()
    if not text:
        return 120.0
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise SpecvizError(f"SPECVIZ_SERVED_TIMEOUT is seconds to wait for the server, a positive number; got {text!r}")
    return value


def open_target(spec: str, *, timeout: float | None = None) -> ServedTarget:
    """``vllm:<base url>[#<model>]`` as a ``ServedTarget``: the server asked which model it serves (the first, unless
    ``#<model>`` names one) and where it loaded it from; the tokenizer and config read from there (a folder this
    machine sees too, or a hub id), and checked against the server's own tokenizer. One line for each failure.
    ``timeout``: seconds to wait for each answer (default ``served_timeout()``)."""
    from transformers import AutoConfig

    from specviz.models.loader import load_tokenizer
    from specviz.models.policy import check_allowed, trust_remote_code

    check_allowed(spec.strip())  # a public Space serves only what its operator allowlists, never a visitor's URL
    url, _, model = spec.strip()[len(PREFIX):].partition("#")
    if not url.startswith(("http://", "https://")):
        raise SpecvizError(f"a served target is vllm:<base url>[#<model>], e.g. vllm:http://127.0.0.1:8000; "
                           f"got {spec!r}")
    client = ServedClient(url, model or None, timeout=served_timeout() if timeout is None else timeout)
    root = client.root()
    try:
        config = AutoConfig.from_pretrained(root, trust_remote_code=trust_remote_code())
    except (OSError, ValueError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SpecvizError(f"the served model's config is not readable here from {root} ({first}): specviz needs "
                           f"its tokenizer and config on this machine too") from None
    target = ServedTarget(model=None, tokenizer=load_tokenizer(root), name=f"{PREFIX}{client.model}",
                          source=f"{client.base_url} ({root})", forward="served", client=client,
                          model_config=config.get_text_config(decoder=True))
    check_tokenizer(client, target)
    return target


def check_tokenizer(client: ServedClient, target, text: str = "Speculative decoding, checked: 12345 héllo!") -> None:
    """Refuse, in one line, a local tokenizer that does not match the served model's."""
    local = target.tokenizer.encode(text, add_special_tokens=False)
    served = client.tokenize(text)
    if list(local) != list(served):
        raise SpecvizError(f"the local tokenizer of {target.name} does not match the served model {client.model}")


def write_servable_copy(target, directory) -> None:
    """Save ``target``'s model and tokenizer as a directory vLLM loads: ``architectures`` named and a tied
    embedding written under its own name too (vLLM otherwise leaves ``model.embed_tokens`` uninitialised)."""
    import pathlib

    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = target.model
    state = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in model.state_dict().items()}
    if "model.embed_tokens.weight" not in state and "lm_head.weight" in state:
        state["model.embed_tokens.weight"] = state["lm_head.weight"].clone()
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    (directory / "config.json").write_text(json.dumps(config, indent=2, default=str))
    target.tokenizer.save_pretrained(str(directory))
