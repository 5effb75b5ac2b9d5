"""The small Python API the CLI, the UI and the benchmark are built on.

>>> from specviz import api
>>> target = api.load_target("smollm2-135m")
>>> drafter = api.make_drafter("ngram", target)
>>> run = api.start(target, "Tell me a story.", drafter, api.DraftBudget(k=4), api.GenerationConfig(max_new_tokens=64))
>>> for round_ in run:                 # one Round per verify forward
...     print(round_.accepted, round_.committed_text)
>>> run.text, api.metrics.compute(run.rounds, run.elapsed_s).tau
"""

from __future__ import annotations

from specviz.engine.drafter import DraftBudget, Drafter
from specviz.drafters.draft_model import DraftModelDrafter, check_draft_vocab
from specviz.drafters.ngram import NgramDrafter
from specviz.drafters.quantized import check_draft_quant
from specviz.engine import metrics, trace
from specviz.engine.loop import Generation, GenerationConfig, plain_decode
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

__all__ = [
    "DRAFTER_KINDS",
    "DraftBudget",
    "DraftTree",
    "Drafter",
    "Generation",
    "GenerationConfig",
    "SamplingConfig",
    "Target",
    "header_for",
    "load_target",
    "make_drafter",
    "metrics",
    "plain_decode",
    "start",
    "summary_for",
    "trace",
]

DRAFTER_KINDS = {
    "ngram": "prompt lookup: continue with what followed the latest matching n-gram (ngram or ngram:N for max n)",
    "model:<name|dir|hub id>": "an independent draft LM with the target's tokenizer",
}


def load_target(spec: str, *, target_forward: str = "auto", **kwargs) -> Target:
    """Load a target by registry name, local directory, GGUF file or hub id (see ``specviz.models``).

    ``target_forward``: ``auto`` (the fast path where it runs), ``fast`` or ``hf`` (transformers' own forward).
    """
    from specviz.models import load_model
    from specviz.models.device import choose_target_forward

    loaded = load_model(spec, role="target", **kwargs)
    forward = choose_target_forward(target_forward, loaded.device, loaded.dtype)
    if forward == "hf":
        return Target.from_loaded(loaded)
    return Target.from_loaded(loaded, model=loaded.fast_model(), forward=forward)


def make_drafter(spec: str, target: Target, *, stochastic_tree: bool = False, draft_vocab: int = 0,
                 draft_quant: str = "off", **kwargs) -> Drafter:
    """Build a drafter from its spec: ``ngram``, ``ngram:N`` or ``model:<name|dir|hub id>``.

    ``draft_vocab`` > 0 makes a draft model draft from its first that many token ids only (see DraftModelDrafter);
    ``draft_quant="int8"`` gives it reduced-precision weights on CPU (see ``specviz.drafters.quantized``).
    """
    spec = (spec or "").strip()
    check_draft_vocab(draft_vocab)
    check_draft_quant(draft_quant)
    kind, _, argument = spec.partition(":")
    if kind == "ngram":
        if argument and not argument.isdigit():
            raise SpecvizError(f"ngram takes a maximum n-gram size, e.g. ngram:3, got {spec!r}")
        return NgramDrafter(max_ngram=int(argument) if argument else 3)
    if kind == "model" and argument:
        from specviz.models import check_same_tokenizer, load_model

        loaded = load_model(argument, role="draft", **kwargs)
        check_same_tokenizer(target, loaded)
        return DraftModelDrafter(loaded.model, target.vocab_size, name=f"model:{loaded.name}",
                                 stochastic_tree=stochastic_tree, draft_vocab=draft_vocab, draft_quant=draft_quant)
    known = ", ".join(DRAFTER_KINDS)
    raise SpecvizError(f"unknown drafter {spec!r}; use one of: {known}")


def start(
    target: Target,
    prompt: str | list[int],
    drafter: Drafter | None,
    budget: DraftBudget | None = None,
    config: GenerationConfig | None = None,
    *,
    chat: bool = False,
) -> Generation:
    """A generation ready to iterate (one ``Round`` per step); ``drafter=None`` is plain decoding."""
    prompt_ids = prompt if isinstance(prompt, list) else target.encode_prompt(prompt, chat=chat)
    return Generation(target, prompt_ids, config or GenerationConfig(), drafter, budget)


def header_for(run: Generation, prompt_text: str | None = None, chat: bool = False) -> dict:
    """The trace header describing ``run``."""
    target = run.target
    return trace.make_header(
        target={"name": target.name, "source": target.source, "vocab_size": target.vocab_size},
        drafter=run.drafter.describe() if run.drafter else None,
        config={**run.config.to_dict(), "chat": chat},
        budget=run.budget.to_dict() if run.drafter else None,
        prompt={"text": prompt_text, "token_ids": run.prompt_ids, "pieces": target.pieces(run.prompt_ids)},
    )


def summary_for(run: Generation, baseline: Generation | None = None) -> dict:
    """The trace summary: tokens, text, metrics and, with a baseline, the measured speedup."""
    measured = metrics.compute(run.rounds, run.elapsed_s)
    summary = {
        "token_ids": run.token_ids, "text": run.text, "stop_reason": run.stop_reason,
        "elapsed_s": run.elapsed_s, "prefill_ms": run.prefill_ms, "metrics": measured.to_dict(),
    }
    if baseline is not None:
        summary["baseline"] = {"token_ids": baseline.token_ids, "tokens_per_s": baseline.tokens_per_s,
                               "elapsed_s": baseline.elapsed_s}
        summary["speedup"] = metrics.speedup(run.tokens_per_s, baseline.tokens_per_s)
    return summary
