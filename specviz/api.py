"""The small Python API the CLI, the UI and the benchmark are built on.

>>> from specviz import api
>>> target = api.load_target("smollm2-135m")
>>> drafter = api.make_drafter("ngram", target)
>>> settings = api.settings.validate({"tree": False, "k": 4, "max_new_tokens": 64})  # checked once; a chain of 4
>>> run = api.start(target, "Tell me a story.", drafter, api.budget_for(settings), api.config_for(settings))
>>> for round_ in run:                 # one Round per verify forward
...     print(round_.accepted, round_.committed_text)
>>> run.text, api.metrics.compute(run.rounds, run.elapsed_s).tau
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from specviz import settings
from specviz.drafters import registry
from specviz.drafters.retrieval import RetrievalDrafter
from specviz.drafters.suffix_store import SessionMemory
from specviz.engine import attention, metrics, served, trace
from specviz.engine.baseline import InterleavedBaseline
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.loop import Generation, GenerationConfig, plain_decode
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.engine.verifier import Verifier
from specviz.errors import SpecvizError

__all__ = [
    "DRAFTER_KINDS",
    "DraftBudget",
    "DraftTree",
    "Drafter",
    "Generation",
    "GenerationConfig",
    "InterleavedBaseline",
    "SamplingConfig",
    "Target",
    "budget_for",
    "config_for",
    "header_for",
    "load_target",
    "make_drafter",
    "metrics",
    "plain_decode",
    "registry",
    "settings",
    "start",
    "summary_for",
    "trace",
]

#: spec syntax -> description, for every registered drafter family
DRAFTER_KINDS = {family.syntax: family.description for family in registry.families()}


def load_target(spec: str, *, target_forward: str = "auto", **kwargs) -> Target:
    """Load a target by registry name, local directory, GGUF file or hub id (see ``specviz.models``), or open one a
    vLLM server serves (``vllm:<base url>[#<model>]``, ``specviz.engine.served``: greedy, drafters without target
    hidden states).

    ``target_forward``: ``auto`` (the fast path where it runs), ``fast`` or ``hf`` (transformers' own forward).
    """
    from specviz.models import load_model
    from specviz.models.device import choose_target_forward

    if not isinstance(spec, str) or not spec.strip():
        raise SpecvizError(f"the target must be a model name, folder, .gguf file or hub id, not {spec!r}")
    if served.is_served(spec):
        return served.open_target(spec)
    loaded = load_model(spec, role="target", **kwargs)
    forward = choose_target_forward(target_forward, loaded.device, loaded.dtype)
    if forward == "hf":
        return Target.from_loaded(loaded)
    return Target.from_loaded(loaded, model=loaded.fast_model(), forward=forward)


def make_drafter(spec: str, target: Target, run_settings: Mapping[str, Any] | None = None, *,
                 memory: SessionMemory | None = None, **values) -> Drafter:
    """Build a drafter from its spec (``ngram``, ``ngram:N``, ``model:<name|dir|hub id>``; see
    ``specviz.drafters.registry``) with the run settings its family reads.

    ``run_settings`` (or keywords such as ``draft_vocab=16384``, ``draft_quant="int8"``, ``device="cpu"``) are
    ``specviz.settings`` names; values that come from ``settings.validate`` are not checked again. ``memory``: the
    earlier answers a retrieval drafter may reuse (one session's; ``retrieval.session_memory``).
    """
    if target is None or isinstance(target, str):
        raise SpecvizError(f"make_drafter needs the loaded target (api.load_target(...)), not {target!r}")
    family, argument = registry.parse(spec)
    if isinstance(target, served.ServedTarget) and family.layers_for(target.config.num_hidden_layers):
        raise SpecvizError(f"{family.title} drafts from the target's hidden states, which a served target does not "
                           f"return: use a drafter that reads only tokens (ngram, retrieval, lookahead, model:<name>)")
    checked = settings.validate({**run_settings, **values} if values and run_settings else values or run_settings)
    drafter = family.build(argument, target, checked)
    if memory is not None and isinstance(drafter, RetrievalDrafter):
        drafter.memory = memory
    return drafter


def budget_for(values: Mapping[str, Any]) -> DraftBudget:
    """The draft budget of checked run settings (``settings.validate``)."""
    return DraftBudget(tree=values["tree"], k=values["k"], width=values["width"], depth=values["depth"],
                       max_nodes=values["max_nodes"], min_draft_prob=values["min_draft_prob"])


def config_for(values: Mapping[str, Any]) -> GenerationConfig:
    """The generation config (length, sampler, seed) of checked run settings."""
    sampling = SamplingConfig(temperature=values["temperature"], top_p=values["top_p"], top_k=values["top_k"])
    return GenerationConfig(max_new_tokens=values["max_new_tokens"], sampling=sampling, seed=values["seed"])


def start(
    target: Target,
    prompt: str | list[int],
    drafter: Drafter | None,
    budget: DraftBudget | None = None,
    config: GenerationConfig | None = None,
    *,
    chat: bool | None = None,
    verifier: Verifier | None = None,
) -> Generation:
    """A generation ready to iterate (one ``Round`` per step); ``drafter=None`` is plain decoding. A missing budget,
    config or ``chat`` (for a text prompt) takes the declared defaults (``specviz.settings``); a missing verifier,
    the target's model in this process."""
    if isinstance(drafter, str):
        raise SpecvizError(f"start needs a Drafter (api.make_drafter(spec, target)) or None for plain decoding, not "
                           f"{drafter!r}")
    defaults = settings.validate()
    chat = defaults["chat"] if chat is None else chat
    prompt_ids = _checked_ids(prompt, target.vocab_size) if isinstance(prompt, list) else \
        target.encode_prompt(prompt, chat=chat)
    return Generation(target, prompt_ids, config or config_for(defaults), drafter, budget or budget_for(defaults),
                      verifier)


def warm_up(target: Target, prompt_ids: list[int]) -> None:
    """One short plain decode so one-time costs (allocations, kernel selection) are not charged to a timed run."""
    plain_decode(target, prompt_ids[-16:], GenerationConfig(max_new_tokens=2))


def _checked_ids(ids: list, vocab_size: int) -> list[int]:
    """Prompt token ids given directly: whole numbers in the target's vocabulary, else one line saying which."""
    if not ids:
        raise SpecvizError("the prompt has no token ids")
    checked = []
    for position, token in enumerate(ids):
        try:
            value = None if isinstance(token, bool) else operator.index(token)  # ints, numpy ints; not 1.5 or "a"
        except TypeError:
            value = None
        if value is None or not 0 <= value < vocab_size:
            raise SpecvizError(f"prompt token {position} is {token!r}: token ids are whole numbers in "
                               f"[0, {vocab_size}) for this target")
        checked.append(value)
    return checked


def header_for(run: Generation, prompt_text: str | None = None, chat: bool = False) -> dict:
    """The trace header describing ``run``."""
    target = run.target
    return trace.make_header(
        target={"name": target.name, "source": target.source, "vocab_size": target.vocab_size,
                "forward": target.forward, **_linear_kernels(target.model)},
        attention=attention.describe(target.model) if target.model is not None else {"implementation": "served"},
        drafter=({**run.drafter.describe(), "feature_layers": list(run.drafter.feature_layers)}
                 if run.drafter else None),
        config={**run.config.to_dict(), "chat": chat},
        budget=run.budget.to_dict() if run.drafter else None,
        prompt={"text": prompt_text, "token_ids": run.prompt_ids, "pieces": target.pieces(run.prompt_ids)},
    )


def _linear_kernels(model) -> dict:
    """Which backend ran the fast path's linear products, for the trace header: its declared choice
    (``specviz.models.linear_backend``), the same at every load: ``wide`` (``thin`` or ``torch``) above
    ``plain_rows`` rows, torch's ``F.linear`` up to them."""
    choice = getattr(model, "kernel_choice", None) or {}
    if "wide" not in choice:
        return {}
    return {"linear_kernels": {"wide": choice["wide"], "plain_rows": choice["plain_rows"]}}


def summary_for(run: Generation, baseline: Generation | None = None) -> dict:
    """The trace summary: tokens, text, metrics and, with a baseline, the measured speedup."""
    measured = metrics.compute(run.rounds, run.elapsed_s)
    summary = {
        "token_ids": run.token_ids, "text": run.text, "stop_reason": run.stop_reason,
        "elapsed_s": run.elapsed_s, "prefill_ms": run.prefill_ms, "metrics": measured.to_dict(),
    }
    served = [r.meta["served"] for r in run.rounds if "served" in (r.meta or {})]
    if served:  # a served target: the server's time, the rest (transfer), the prompt tokens it computed again
        summary["served"] = {key: round(sum(split.get(key, 0) for split in served), 2)
                             for key in ("wall_ms", "server_ms", "transfer_ms", "prompt_tokens", "recomputed_tokens")}
    if baseline is not None:
        summary["baseline"] = {"token_ids": baseline.token_ids, "tokens_per_s": baseline.tokens_per_s,
                               "elapsed_s": baseline.elapsed_s}
        summary["speedup"] = metrics.speedup(run.tokens_per_s, baseline.tokens_per_s)
    return summary
