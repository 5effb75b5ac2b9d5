"""Timed single runs: specviz (speculative or plain) and Hugging Face ``generate`` references.

Every run is timed the same way: one wall clock (synchronised on accelerators) around the whole call, prefill
included, after a garbage collection so a pause from a previous run is not charged to this one.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specviz.drafters import checkpoint_files
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.loop import Clock, Generation, GenerationConfig
from specviz.engine.round import Round
from specviz.engine.target import Target
from specviz.errors import SpecvizError


@dataclass
class RunResult:
    """What one timed run produced."""

    token_ids: list[int]
    wall_s: float
    rounds: list[Round] = field(default_factory=list)  # specviz runs only
    prefill_ms: float | None = None  # specviz runs only
    forwards: int | None = None  # target forwards (specviz: rounds; hf: counted with a hook; None if unknown)
    counters: dict = field(default_factory=dict)  # vLLM peers: what its spec-decoding counters counted in this run

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


def run_specviz(
    target: Target,
    prompt_ids: list[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
    budget: DraftBudget | None = None,
) -> RunResult:
    """One specviz generation (``drafter=None``: plain decoding, the same loop with an empty draft)."""
    clock = Clock(target.device)
    gc.collect()
    start = clock()
    run = Generation(target, prompt_ids, config.lean(), drafter, budget).run()  # timing does not pay for views' detail
    wall = clock() - start
    return RunResult(list(run.token_ids), wall, run.rounds, run.prefill_ms, len(run.rounds))


def run_hf(
    target: Target,
    prompt_ids: list[int],
    config: GenerationConfig,
    assistant: torch.nn.Module | None = None,
    assistant_settings: dict | None = None,
    **generate_kwargs,
) -> RunResult:
    """One ``model.generate`` call on the same target (``assistant`` = assisted generation with that draft model)."""
    model, clock = target.model, Clock(target.device)
    kwargs = {**_sampling_kwargs(config), **generate_kwargs, "max_new_tokens": config.max_new_tokens}
    eos = sorted(target.eos_ids)
    if eos:
        kwargs.update(eos_token_id=eos if len(eos) > 1 else eos[0], pad_token_id=eos[0])
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    shared = assistant is model  # a target drafting for itself: its forwards cannot be told apart
    with _counting(model) as calls, _settings(assistant, assistant_settings or {}), _quiet_transformers():
        gc.collect()
        if not config.sampling.greedy:
            torch.manual_seed(config.seed or 0)
        start = clock()
        input_ids = torch.tensor([prompt_ids], device=target.device)
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        wall = clock() - start
    tokens = output[0, len(prompt_ids):].tolist()
    return RunResult(tokens, wall, forwards=None if shared else calls[0])


def transformers_mtp_layers(model: torch.nn.Module) -> int:
    """How many MTP layers ``generate(use_mtp=True)`` drafts with on this target: its config's ``num_mtp_layers``
    where the installed transformers has MTP generation, the model class names its MTP tensors and the checkpoint
    holds some (a class default of 1 with no MTP tensors saved would draft with random layers); 0 otherwise."""
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:  # transformers before its MTP generation
        return 0
    config = model.config.get_text_config()
    layers = getattr(config, "num_mtp_layers", None) or 0
    source = str(getattr(model.config, "_name_or_path", "") or "")
    if not layers or not source:
        return 0
    try:
        pattern = MtpModel.get_mtp_weights_regex(model)
        folder, _ = checkpoint_files.resolve_source(source, "target")
        names, _ = checkpoint_files.tensor_index(folder, pickles=())
    except (ValueError, SpecvizError):  # no MTP tensor names for this class, or no safetensors to look in
        return 0
    shared = [re.compile(p) for p in getattr(model, "_keys_shared_with_mtp", None) or ()]  # base tensors MTP reads
    own = [name for name in names if pattern.search(name) and not any(s.search(name) for s in shared)]
    return int(layers) if own else 0


def _sampling_kwargs(config: GenerationConfig) -> dict:
    """Our sampler's settings in ``generate``'s terms (top_k=0 is off in both; greedy is do_sample=False)."""
    sampling = config.sampling
    if sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}


@contextmanager
def _counting(model: torch.nn.Module) -> Iterator[list[int]]:
    """Count forward calls of ``model`` (one per target forward in ``generate``)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


@contextmanager
def _settings(assistant: torch.nn.Module | None, settings: dict) -> Iterator[None]:
    """Assisted generation reads its knobs from the *assistant's* generation config; set them, then restore."""
    if assistant is None or not settings:
        yield
        return
    config = assistant.generation_config
    saved = {key: getattr(config, key, None) for key in settings}
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Assisted generation warns about its own internal ``generate`` call on every round; keep stderr readable."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
