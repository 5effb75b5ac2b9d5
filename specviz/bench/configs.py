"""What one benchmark run compares: the rows of the table, named and described before anything is loaded.

Every drafter runs as a chain and as a tree in specviz. Reference rows come from Hugging Face ``generate`` on the
same target: plain greedy ``generate``, assisted generation with the same draft model (a fixed chain of ``k``, like
specviz's chain), prompt lookup (``prompt_lookup_num_tokens = k``, the n-gram drafter's maximum n) and, for a target
whose checkpoint carries MTP layers transformers can run, its own MTP generation (``use_mtp=True``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from specviz.drafters import registry
from specviz.drafters.ngram import ngram_size as _ngram_size
from specviz.engine.drafter import DraftBudget
from specviz.errors import SpecvizError

SHAPES = ("chain", "tree")
PLAIN = "plain"


@dataclass(frozen=True)
class RunSpec:
    """One row: which engine, which drafter (None = plain decoding) and which draft shape."""

    name: str
    engine: str  # "specviz" | "hf"
    drafter: str | None = None
    shape: str = "chain"  # "chain" | "tree" | "plain"
    budget: DraftBudget | None = None
    hf_kwargs: dict = field(default_factory=dict)
    note: str = ""
    draft_quant: str = "off"  # draft models in specviz rows: "off" or "int8"

    @property
    def speculative(self) -> bool:
        return self.drafter is not None or self.shape != PLAIN

    @property
    def drafter_key(self) -> str | None:
        """Which built drafter runs this row: the drafter spec, plus its precision when that is not the default."""
        if self.drafter is None or self.draft_quant == "off":
            return self.drafter
        return f"{self.drafter} {self.draft_quant}"


def parse_shapes(text: str) -> list[str]:
    parts = [part.strip() for part in (text or "").split(",")]
    shapes = [part for part in parts if part]
    bad = [s for s in shapes if s not in SHAPES]
    if not shapes or bad or "" in parts:
        raise SpecvizError(f"--shapes takes chain, tree or chain,tree, got {text!r}")
    return list(dict.fromkeys(shapes))


def ngram_size(spec: str) -> int:
    """The maximum n of an ``ngram[:auto][:N]`` spec."""
    return _ngram_size(registry.parse(spec)[1])


def _note(drafter: str) -> str:
    """What a row's report should say about how it ran beyond its name."""
    if registry.family_of(drafter).name == "retrieval":
        return ("its session memory holds the answers of every other prompt of this run (plain decoding with this "
                "run's settings, untimed), never the prompt's own, as in an app session of those requests")
    return ""


def build_specs(
    drafters: list[str], shapes: list[str], budget: DraftBudget, *, hf: bool, hf_defaults: bool = False,
    draft_vocab: int = 0, draft_quants: tuple[str, ...] | Mapping[str, tuple[str, ...]] = ("off",),
    chain_ks: tuple[int, ...] = (), hf_mtp_layers: int = 0,
) -> list[RunSpec]:
    """The rows, in table order: specviz drafter x precision x shape (a chain per k of ``chain_ks``, default the
    budget's), then the Hugging Face references (at the budget's k). ``draft_quants``: the precisions of every family
    that reads the setting, or per drafter spec (what each built drafter resolved ``auto`` to). ``hf_mtp_layers``:
    the target's MTP layers transformers' own MTP generation drafts with (``runners.transformers_mtp_layers``)."""
    chain = replace(budget, tree=False)
    tree = replace(budget, tree=True)
    specs: list[RunSpec] = []
    for drafter in drafters:
        reads = registry.family_of(drafter).reads  # only families that read a setting get its variants
        trimmed = f" vocab<{draft_vocab}" if draft_vocab and "draft_vocab" in reads else ""
        quants = draft_quants.get(drafter, ("off",)) if isinstance(draft_quants, Mapping) else draft_quants
        for quant in quants if "draft_quant" in reads else ("off",):
            suffix = trimmed + ("" if quant == "off" else f" {quant}")
            for shape in shapes:
                budgets = [replace(chain, k=k) for k in chain_ks or (chain.k,)] if shape == "chain" else [tree]
                specs += [RunSpec(f"{drafter} {shaped.describe()}{suffix}", "specviz", drafter, shape, shaped,
                                  draft_quant=quant, note=_note(drafter)) for shaped in budgets]
    if not hf:
        return specs
    specs.append(RunSpec("hf generate (plain)", "hf", None, PLAIN, note="transformers generate, greedy/sampled"))
    if hf_mtp_layers:
        specs.append(RunSpec(
            f"hf mtp k={hf_mtp_layers}", "hf", None, "chain", None, {"use_mtp": True},
            note=f"generate(use_mtp=True): the target's own {hf_mtp_layers} MTP layer(s) draft that many tokens a "
                 f"round"))
    for drafter in drafters:
        family = registry.family_of(drafter).name
        if family == "model":
            stop = f" stop<{chain.min_draft_prob:g}" if chain.min_draft_prob else ""
            specs.append(RunSpec(
                f"hf assisted {drafter} k={chain.k}{stop}", "hf", drafter, "chain", chain,
                {"num_assistant_tokens": chain.k, "num_assistant_tokens_schedule": "constant",
                 "assistant_confidence_threshold": chain.min_draft_prob},
                note=f"assistant_model; num_assistant_tokens={chain.k}, schedule constant, "
                     + (f"confidence threshold {chain.min_draft_prob:g}" if chain.min_draft_prob
                        else "confidence stop off")))
            if hf_defaults:
                specs.append(RunSpec(
                    f"hf assisted {drafter} (defaults)", "hf", drafter, "chain", None,
                    {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                     "assistant_confidence_threshold": 0.4},
                    note="transformers 5 defaults: num_assistant_tokens=20, constant, confidence threshold 0.4"))
        elif family == "ngram":  # other families have no transformers counterpart
            n = ngram_size(drafter)
            if any(s.name == f"hf prompt lookup k={chain.k} n={n}" for s in specs):
                continue  # ngram:auto's counterpart is ngram's: the same prompt lookup, run once
            specs.append(RunSpec(
                f"hf prompt lookup k={chain.k} n={n}", "hf", drafter, "chain", chain,
                {"prompt_lookup_num_tokens": chain.k, "max_matching_ngram_size": n},
                note=f"prompt_lookup_num_tokens={chain.k}, max_matching_ngram_size={n}"))
    return specs
