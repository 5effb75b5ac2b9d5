"""What one benchmark run compares: the rows of the table, named and described before anything is loaded.

Every drafter runs as a chain and as a tree in specviz. Reference rows come from Hugging Face ``generate`` on the
same target: plain greedy ``generate``, assisted generation with the same draft model (a fixed chain of ``k``, like
specviz's chain) and prompt lookup (``prompt_lookup_num_tokens = k``, the n-gram drafter's maximum n).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specviz.engine.drafter import DraftBudget
from specviz.drafters.quantized import check_draft_quant
from specviz.errors import SpecvizError

DRAFTER_KINDS = ("ngram", "model")
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
        return self.drafter is not None

    @property
    def drafter_key(self) -> str | None:
        """Which built drafter runs this row: the drafter spec, plus its precision when that is not the default."""
        if self.drafter is None or self.draft_quant == "off":
            return self.drafter
        return f"{self.drafter} {self.draft_quant}"


def parse_drafters(text: str) -> list[str]:
    """``"ngram,model:x"`` -> specs; unknown kinds and duplicates fail before any model is loaded."""
    specs = [part.strip() for part in (text or "").split(",")]
    if not any(specs):
        raise SpecvizError("--drafters is empty; give e.g. ngram,model:<name>")
    if "" in specs:
        raise SpecvizError(f"--drafters {text!r} has an empty entry")
    for spec in specs:
        kind, _, argument = spec.partition(":")
        if kind not in DRAFTER_KINDS or (kind == "model" and not argument):
            raise SpecvizError(f"unknown drafter {spec!r} in --drafters; use ngram, ngram:N or model:<name|dir|hub id>")
        if kind == "ngram" and argument and not argument.isdigit():
            raise SpecvizError(f"ngram takes a maximum n-gram size, e.g. ngram:3, got {spec!r}")
    duplicates = sorted({s for s in specs if specs.count(s) > 1})
    if duplicates:
        raise SpecvizError(f"drafter {duplicates[0]!r} is listed twice in --drafters")
    return specs


def parse_draft_quants(text: str) -> list[str]:
    """``"off,int8"`` -> each draft model runs once per precision (side by side in one suite)."""
    quants = [check_draft_quant(part.strip()) for part in (text or "").split(",") if part.strip()]
    if not quants:
        raise SpecvizError("--draft-quant is empty; give off, int8 or off,int8")
    return list(dict.fromkeys(quants))


def parse_shapes(text: str) -> list[str]:
    shapes = [part.strip() for part in (text or "").split(",") if part.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if not shapes or bad:
        raise SpecvizError(f"--shapes takes chain, tree or chain,tree, got {text!r}")
    return list(dict.fromkeys(shapes))


def ngram_size(spec: str) -> int:
    """The maximum n of an ``ngram[:N]`` spec (the drafter's default is 3)."""
    _, _, argument = spec.partition(":")
    return int(argument) if argument else 3


def build_specs(
    drafters: list[str], shapes: list[str], budget: DraftBudget, *, hf: bool, hf_defaults: bool = False,
    draft_vocab: int = 0, draft_quants: tuple[str, ...] = ("off",),
) -> list[RunSpec]:
    """The rows, in table order: specviz drafter x precision x shape, then the Hugging Face references."""
    chain = replace(budget, tree=False)
    tree = replace(budget, tree=True)
    specs: list[RunSpec] = []
    for drafter in drafters:
        is_model = drafter.startswith("model:")
        trimmed = f" vocab<{draft_vocab}" if draft_vocab and is_model else ""
        for quant in draft_quants if is_model else ("off",):
            suffix = trimmed + ("" if quant == "off" else f" {quant}")
            for shape in shapes:
                shaped = chain if shape == "chain" else tree
                specs.append(RunSpec(f"{drafter} {shaped.describe()}{suffix}", "specviz", drafter, shape, shaped,
                                     draft_quant=quant))
    if not hf:
        return specs
    specs.append(RunSpec("hf generate (plain)", "hf", None, PLAIN, note="transformers generate, greedy/sampled"))
    for drafter in drafters:
        if drafter.startswith("model:"):
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
        else:
            n = ngram_size(drafter)
            specs.append(RunSpec(
                f"hf prompt lookup k={chain.k} n={n}", "hf", drafter, "chain", chain,
                {"prompt_lookup_num_tokens": chain.k, "max_matching_ngram_size": n},
                note=f"prompt_lookup_num_tokens={chain.k}, max_matching_ngram_size={n}"))
    return specs
