"""The only part of the UI that touches models: settings → a stream of events from a real generation.

``stream`` is the GPU-using generator (decorated for ZeroGPU, see ``zerogpu``). It yields plain, picklable events
(``Loaded``, ``Calibrated``, ``RoundDone``, ``Finished``) so the views never see a model, and so the generator can
run in ZeroGPU's worker process. Plain-decoding calibrations are cached per target/device/sampling settings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

from specviz import api
from specviz.drafters.draft_model import check_draft_vocab
from specviz.drafters.quantized import check_draft_quant
from specviz.engine.round import Round
from specviz.errors import SpecvizError
from specviz.ui import zerogpu

CALIBRATION_TOKENS = 32
MAX_NEW_TOKENS_UI = 512

_PRELOADED: dict[str, api.Target] = {}
_LOADED: set[str] = set()
_CALIBRATION: dict[tuple, dict] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class RunRequest:
    """Every setting of one run, validated before any model loads. Plain data so it can cross processes."""

    prompt: str
    chat: bool = True
    target: str = "smollm2-135m"
    drafter: str = "ngram"
    tree: bool = False
    k: int = 4
    width: int = 3
    depth: int = 4
    max_nodes: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    stochastic_tree: bool = False
    min_draft_prob: float = 0.0
    draft_vocab: int = 0  # draft models: first N token ids only (0 = all)
    draft_quant: str = "off"  # draft models: "int8" = int8/fp16 draft weights on CPU

    def budget(self) -> api.DraftBudget:
        return api.DraftBudget(tree=self.tree, k=self.k, width=self.width, depth=self.depth, max_nodes=self.max_nodes,
                               min_draft_prob=self.min_draft_prob)

    def config(self) -> api.GenerationConfig:
        sampling = api.SamplingConfig(temperature=self.temperature, top_p=self.top_p)
        return api.GenerationConfig(max_new_tokens=self.max_new_tokens, sampling=sampling, seed=self.seed)

    def validate(self) -> RunRequest:
        """Raise ``SpecvizError`` for anything wrong that does not need a model to know."""
        if not self.prompt or not self.prompt.strip():
            raise SpecvizError("the prompt is empty")
        if not self.target or not self.target.strip():
            raise SpecvizError("choose a target model")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_UI:
            raise SpecvizError(f"max new tokens must be in [1, {MAX_NEW_TOKENS_UI}] here, got {self.max_new_tokens}")
        kind, _, argument = (self.drafter or "").strip().partition(":")
        if kind not in {"ngram", "model"} or (kind == "model" and not argument):
            raise SpecvizError(f"unknown drafter {self.drafter!r}; use ngram, ngram:N or model:<name|dir|hub id>")
        if kind == "ngram" and argument and not argument.isdigit():
            raise SpecvizError(f"ngram takes a maximum n-gram size, e.g. ngram:3, got {self.drafter!r}")
        self.budget()
        check_draft_vocab(self.draft_vocab)
        check_draft_quant(self.draft_quant)
        self.config()
        return self

    def calibration_key(self, device: str, prompt_tokens: int) -> tuple:
        """Target, device, sampling and the prompt length rounded up to a power of two (per-token cost grows
        with the context, so a 40-token prompt must not be compared against a 450-token calibration)."""
        bucket = 1 << max(5, (max(prompt_tokens, 1) - 1).bit_length())
        return (self.target, device, self.temperature, self.top_p, bucket)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- events (plain data) ---------------------------------------------------------------------------------------
@dataclass
class Loaded:
    header: dict
    device: str
    load_s: float
    first_load: bool


@dataclass
class Calibrated:
    calibration: dict
    fresh: bool  # measured just now (False: reused from the cache)


@dataclass
class RoundDone:
    round: Round
    prefill_ms: float


@dataclass
class Finished:
    summary: dict
    stop_reason: str


@dataclass
class PlainDone:
    plain: dict


# ---- models --------------------------------------------------------------------------------------------------
def preload(name: str, target: api.Target) -> None:
    """Register an already-built target under ``name`` (tests use tiny random models this way)."""
    _PRELOADED[name] = target


def is_loaded(spec: str) -> bool:
    return spec in _PRELOADED or spec in _LOADED


def load_target(spec: str) -> tuple[api.Target, float, bool]:
    """The target for ``spec`` (cached by ``specviz.models``), the seconds it took, and whether it was a first load."""
    spec = spec.strip()
    if spec in _PRELOADED:
        return _PRELOADED[spec], 0.0, False
    first = spec not in _LOADED
    start = time.perf_counter()
    target = api.load_target(spec)
    _LOADED.add(spec)
    return target, time.perf_counter() - start, first


def drafter_choices(target: str) -> list[str]:
    """Every drafter family this project offers for ``target``: n-gram always, shipped draft models when present."""
    choices = ["ngram", "ngram:2", "ngram:4"]
    try:
        from specviz.models import drafts_for
    except ImportError:  # the models package is optional for replay-only deployments
        return choices
    for entry in drafts_for(target):
        try:
            entry.resolve_path() if entry.kind != "hub" else None
        except SpecvizError:
            continue  # registered but not shipped yet
        choices.append(f"model:{entry.name}")
    return choices


def target_choices() -> list[str]:
    try:
        from specviz.models import list_models

        return list_models(role="target")
    except ImportError:
        return ["smollm2-135m"]


# ---- calibration ---------------------------------------------------------------------------------------------
def cached_calibration(request: RunRequest, device: str, prompt_tokens: int) -> dict | None:
    with _LOCK:
        return _CALIBRATION.get(request.calibration_key(device, prompt_tokens))


def remember_calibration(calibration: dict) -> None:
    with _LOCK:
        _CALIBRATION[tuple(calibration["key"])] = calibration


def clear_calibrations() -> None:
    with _LOCK:
        _CALIBRATION.clear()


def calibrate(target: api.Target, prompt_ids: list[int], request: RunRequest, device: str) -> dict:
    """A short real plain decode of this prompt (after a warm-up), timed exactly like the speculative run."""
    api.plain_decode(target, prompt_ids[-16:], api.GenerationConfig(max_new_tokens=2))  # warm-up
    config = replace(request.config(), max_new_tokens=CALIBRATION_TOKENS, stop_at_eos=False)
    run = api.plain_decode(target, prompt_ids, config)
    decode_s = run.elapsed_s - run.prefill_ms / 1e3
    return {"tokens_per_s": run.tokens_per_s, "new_tokens": len(run.token_ids), "elapsed_s": run.elapsed_s,
            "prefill_ms": run.prefill_ms, "decode_tokens_per_s": len(run.token_ids) / decode_s if decode_s > 0 else 0,
            "key": list(request.calibration_key(device, len(prompt_ids))), "prompt_tokens": len(prompt_ids)}


# ---- the GPU-using generators ----------------------------------------------------------------------------------
@zerogpu.gpu
def stream(request: RunRequest) -> Iterator[object]:
    """Load, (calibrate,) then run speculative decoding, yielding one event per step. Errors: ``SpecvizError``."""
    request.validate()
    target, load_s, first = load_target(request.target)
    drafter = api.make_drafter(request.drafter, target, stochastic_tree=request.stochastic_tree,
                               draft_vocab=request.draft_vocab, draft_quant=request.draft_quant)
    prompt_ids = target.encode_prompt(request.prompt, chat=request.chat)
    run = api.start(target, prompt_ids, drafter, request.budget(), request.config())
    device = str(target.device)
    yield Loaded(header=api.header_for(run, request.prompt, request.chat), device=device, load_s=load_s,
                 first_load=first)
    calibration = cached_calibration(request, device, len(prompt_ids))
    if calibration is None:
        calibration = calibrate(target, prompt_ids, request, device)
        remember_calibration(calibration)
        yield Calibrated(calibration, fresh=True)
    else:
        yield Calibrated(calibration, fresh=False)
    for round_ in run:
        yield RoundDone(round_, run.prefill_ms)
    yield Finished(api.summary_for(run), run.stop_reason)


@zerogpu.gpu
def plain_run(request: RunRequest) -> dict:
    """Plain decoding of the same prompt with the same settings: the full side-by-side baseline."""
    request.validate()
    target, _, _ = load_target(request.target)
    prompt_ids = target.encode_prompt(request.prompt, chat=request.chat)
    api.plain_decode(target, prompt_ids[-16:], api.GenerationConfig(max_new_tokens=2))  # warm-up
    run = api.plain_decode(target, prompt_ids, request.config())
    return {"tokens_per_s": run.tokens_per_s, "token_ids": run.token_ids, "elapsed_s": run.elapsed_s,
            "text": run.text}
