"""The only part of the UI that touches models: settings → a stream of events from a real generation.

``stream`` is the GPU-using generator (decorated for ZeroGPU, see ``zerogpu``). It yields plain, picklable events
(``Loaded``, ``RoundDone``, ``BaselineMeasured``, ``Finished``) so the views never see a model, and so the generator
can run in ZeroGPU's worker process. The plain-decoding baseline is measured beside each run, between its rounds
(``specviz.engine.baseline``), and dies with it: nothing measured at another moment divides a run's tokens/s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, make_dataclass, replace

from specviz import api, settings
from specviz.drafters import registry
from specviz.drafters.suffix_store import SessionMemory
from specviz.engine import cost_curve
from specviz.engine.round import Round
from specviz.engine.served import is_served
from specviz.errors import SpecvizError
from specviz.models import policy
from specviz.ui import zerogpu
from specviz.viz import theory

log = logging.getLogger("specviz.ui")
_PRELOADED: dict[str, api.Target] = {}
_LOADED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()
_ACTIVE_RUNS = 0  # generations running in this process now (a second visitor's run shares the machine)


class _Request:
    """Every setting of one run. Plain, frozen data, so it can cross processes (ZeroGPU) and compare equal.

    The fields are the prompt, the drafter spec and every declared run setting (``specviz.settings``), with the
    declared defaults. ``validate`` checks them before any model loads and returns the request with the checked
    values (in their declared types); ``values`` checks them again where they are read (microseconds).
    """

    def values(self) -> settings.Values:
        """The run settings, checked with the UI's ranges."""
        return settings.validate({s.name: getattr(self, s.name) for s in settings.SETTINGS}, ui=True)

    def budget(self) -> api.DraftBudget:
        return api.budget_for(self.values())

    def config(self) -> api.GenerationConfig:
        return api.config_for(self.values())

    def validate(self):
        """This request with its settings checked (converted to their declared types where needed); a one-line
        ``SpecvizError`` for anything wrong that does not need a model to know."""
        if not self.prompt or not self.prompt.strip():
            raise SpecvizError("the prompt is empty")
        if not self.target or not self.target.strip():
            raise SpecvizError("choose a target model")
        served = policy.served_targets()
        if is_served(self.target) and self.target.strip() not in served:  # a visitor never types a server's URL
            raise SpecvizError(f"a served target is one of the operator's ({policy.SERVED_ENV}): "
                               f"{', '.join(served) or 'none is offered here'}")
        registry.check_ready(self.drafter, self.target.strip())
        checked = self.values()
        # the checked values in their declared types (a number box's 4.0 is k = 4)
        changed = {name: value for name, value in checked.items()
                   if type(getattr(self, name)) is not type(value) or getattr(self, name) != value}
        return replace(self, **changed) if changed else self

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
class BaselineMeasured:
    """Plain decoding measured beside the run so far (``baseline.BaselineEstimate.to_dict``), and the most runs this
    process held at once while it was measured (1: this run alone)."""

    baseline: dict


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
    """The registry's targets, then the served ones the operator offers (``SPECVIZ_SERVED_TARGETS``)."""
    try:
        from specviz.models import list_models

        local = list_models(role="target")
    except ImportError:
        local = [settings.default("target")]
    return [*local, *policy.served_targets()]


# ---- runs sharing the machine ---------------------------------------------------------------------------------
def active_runs() -> int:
    with _LOCK:
        return _ACTIVE_RUNS


def _count_run(step: int) -> None:
    global _ACTIVE_RUNS
    with _LOCK:
        _ACTIVE_RUNS += step


# ---- the GPU-using generators ----------------------------------------------------------------------------------
@zerogpu.gpu
def stream(request: RunRequest, fallback_note: str = "", memory: SessionMemory | None = None) -> Iterator[object]:
    """Load, then run speculative decoding with plain decoding stepped between its rounds, yielding one event per
    step. Errors: ``SpecvizError``.
    ``fallback_note`` (a ZeroGPU run moved to the CPU) goes into the trace header, where the run label shows it.
    ``memory``: the visitor's earlier answers, which a retrieval drafter may reuse."""
    values = request.values()
    target, load_s, first = load_target(request.target, request.target_forward, request.device)
    drafter = api.make_drafter(request.drafter, target, values, memory=memory)
    prompt_ids = target.encode_prompt(request.prompt, chat=request.chat)
    run = api.start(target, prompt_ids, drafter, request.budget(), request.config())
    header = api.header_for(run, request.prompt, request.chat)
    yield Loaded(header={**header, "note": fallback_note} if fallback_note else header, device=str(target.device),
                 load_s=load_s, first_load=first)
    plain = api.InterleavedBaseline(target, prompt_ids, request.config())
    shared = 1
    _count_run(+1)
    try:
        for round_ in run:
            yield RoundDone(round_, run.prefill_ms)
            shared = max(shared, active_runs())
            if plain.after_round() is not None:  # a plain round between two of the run's, under the same load
                yield BaselineMeasured({**plain.estimate().to_dict(), "runs_sharing": shared})
    finally:
        _count_run(-1)
    summary = api.summary_for(run)
    curve = verify_cost(target, request.budget())
    if curve is not None:
        summary["cost_curve"] = curve  # in the trace too: a replay draws the same theory panel
    yield Finished(summary, run.stop_reason)


def verify_cost(target: api.Target, budget: api.DraftBudget) -> dict | None:
    """The target's verify-cost curve on this machine, over every width the theory panel draws for this run's shape
    (``specviz.viz.theory``): timed once per machine and model, after the run so its rounds are not slowed, then read
    back. None where it cannot be timed (the panel then says the curve is missing)."""
    widest = theory.widest(budget.k, budget.tree, budget.max_nodes)
    if target.model is None:  # a served target: its forward is timed on the server, round by round
        return None
    try:
        return cost_curve.measured(target, widest).to_dict()
    except (SpecvizError, RuntimeError) as error:
        log.warning("the verify-cost curve could not be timed: %s", error)
        return None


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
