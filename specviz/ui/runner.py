"""The only part of the UI that touches models: settings → a stream of events from a real generation.

``stream`` is the GPU-using generator (decorated for ZeroGPU, see ``zerogpu``). It yields plain, picklable events
(``Loaded``, ``Calibrated``, ``RoundDone``, ``Finished``) so the views never see a model, and so the generator can
run in ZeroGPU's worker process. Plain-decoding calibrations are cached per target, its forward, device, sampling
settings and prompt-length bucket (``RunRequest.calibration_key``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, make_dataclass, replace

from specviz import api, settings
from specviz.drafters import registry
from specviz.engine.round import Round
from specviz.errors import SpecvizError
from specviz.ui import zerogpu

CALIBRATION_TOKENS = 32

_PRELOADED: dict[str, api.Target] = {}
_LOADED: set[tuple[str, str]] = set()
_CALIBRATION: dict[tuple, dict] = {}
_LOCK = threading.Lock()


class _Request:
    """Every setting of one run, checked before any model loads. Plain data so it can cross processes.

    The fields are the prompt, the drafter spec and every declared run setting (``specviz.settings``), with the
    declared defaults; ``validate`` checks them once (with the UI's ranges) and keeps the checked values.
    """

    def values(self) -> settings.Values:
        """The run settings, checked (once per request)."""
        return self.validate().__dict__["_checked"]

    def budget(self) -> api.DraftBudget:
        return api.budget_for(self.values())

    def config(self) -> api.GenerationConfig:
        return api.config_for(self.values())

    def validate(self):
        """This request with its settings checked (converted to their declared types where needed); a one-line
        ``SpecvizError`` for anything wrong that does not need a model to know."""
        if "_checked" in self.__dict__:
            return self
        if not self.prompt or not self.prompt.strip():
            raise SpecvizError("the prompt is empty")
        if not self.target or not self.target.strip():
            raise SpecvizError("choose a target model")
        registry.check_ready(self.drafter, self.target.strip())
        checked = settings.validate({s.name: getattr(self, s.name) for s in settings.SETTINGS}, ui=True)
        # the checked values in their declared types (a slider's 4.0 is k = 4)
        changed = {name: value for name, value in checked.items()
                   if type(getattr(self, name)) is not type(value) or getattr(self, name) != value}
        result = replace(self, **changed) if changed else self
        for request in {id(self): self, id(result): result}.values():
            object.__setattr__(request, "_checked", checked)
        return result

    def calibration_key(self, device: str, prompt_tokens: int) -> tuple:
        """Target, its forward, device, sampling and the prompt length rounded up to a power of two (per-token
        cost grows with the context, so a 40-token prompt must not be compared against a 450-token calibration)."""
        bucket = 1 << max(5, (max(prompt_tokens, 1) - 1).bit_length())
        return (self.target, self.target_forward, device, self.temperature, self.top_p, self.top_k, bucket)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


RunRequest = make_dataclass(
    "RunRequest",
    [("prompt", str), ("drafter", str, field(default=registry.DEFAULT_SPEC)),
     *[(s.name, s.type | None if s.optional else s.type, field(default=s.default)) for s in settings.SETTINGS]],
    bases=(_Request,), frozen=True,
)
RunRequest.__module__, RunRequest.__doc__ = __name__, _Request.__doc__  # picklable as specviz.ui.runner.RunRequest


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


# ---- models --------------------------------------------------------------------------------------------------
def preload(name: str, target: api.Target) -> None:
    """Register an already-built target under ``name`` (tests use tiny random models this way)."""
    _PRELOADED[name] = target


def is_loaded(spec: str, target_forward: str = settings.default("target_forward"),
              device: str | None = None) -> bool:
    return spec in _PRELOADED or (spec, target_forward, device) in _LOADED


def load_target(spec: str, target_forward: str = settings.default("target_forward"),
                device: str | None = None) -> tuple[api.Target, float, bool]:
    """The target for ``spec`` (cached by ``specviz.models``), the seconds it took, and whether it was a first load.
    ``device`` None is the best available one."""
    spec = spec.strip()
    if spec in _PRELOADED:
        return _PRELOADED[spec], 0.0, False
    first = (spec, target_forward, device) not in _LOADED
    start = time.perf_counter()
    target = api.load_target(spec, target_forward=target_forward, device=device)
    _LOADED.add((spec, target_forward, device))
    return target, time.perf_counter() - start, first


def drafter_menu(target: str) -> list[tuple[str, str]]:
    """(label, spec) for the drafter dropdown, grouped by family: the label names the family."""
    return [(f"{title}: {spec}", spec) for title, specs in registry.menu(target) for spec in specs]


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


def calibrate(target: api.Target, prompt_ids: list[int], request: RunRequest, device: str) -> dict:
    """A short real plain decode of this prompt (after a warm-up), timed exactly like the speculative run."""
    api.warm_up(target, prompt_ids)
    config = replace(request.config(), max_new_tokens=CALIBRATION_TOKENS, stop_at_eos=False)
    run = api.plain_decode(target, prompt_ids, config)
    decode_s = run.elapsed_s - run.prefill_ms / 1e3
    return {"tokens_per_s": run.tokens_per_s, "new_tokens": len(run.token_ids), "elapsed_s": run.elapsed_s,
            "prefill_ms": run.prefill_ms, "decode_tokens_per_s": len(run.token_ids) / decode_s if decode_s > 0 else 0,
            "key": list(request.calibration_key(device, len(prompt_ids))), "prompt_tokens": len(prompt_ids)}


# ---- the GPU-using generators ----------------------------------------------------------------------------------
@zerogpu.gpu
def stream(request: RunRequest, fallback_note: str = "") -> Iterator[object]:
    """Load, (calibrate,) then run speculative decoding, yielding one event per step. Errors: ``SpecvizError``.
    ``fallback_note`` (a ZeroGPU run moved to the CPU) goes into the trace header, where the run label shows it."""
    values = request.values()
    target, load_s, first = load_target(request.target, request.target_forward, request.device)
    drafter = api.make_drafter(request.drafter, target, values)
    prompt_ids = target.encode_prompt(request.prompt, chat=request.chat)
    run = api.start(target, prompt_ids, drafter, request.budget(), request.config())
    device = str(target.device)
    header = api.header_for(run, request.prompt, request.chat)
    yield Loaded(header={**header, "note": fallback_note} if fallback_note else header, device=device,
                 load_s=load_s, first_load=first)
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
def plain_run(request: RunRequest, fallback_note: str = "") -> dict:
    """Plain decoding of the same prompt with the same settings: the full side-by-side baseline."""
    request.validate()
    target, _, _ = load_target(request.target, request.target_forward, request.device)
    prompt_ids = target.encode_prompt(request.prompt, chat=request.chat)
    api.warm_up(target, prompt_ids)
    run = api.plain_decode(target, prompt_ids, request.config())
    return {"tokens_per_s": run.tokens_per_s, "token_ids": run.token_ids, "elapsed_s": run.elapsed_s,
            "text": run.text, "note": fallback_note}
