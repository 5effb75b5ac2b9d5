"""An independent draft LM (same tokenizer as the target) drafting a chain or an EAGLE-2-style dynamic tree.

Tree drafting is ``dynamic_tree.grow``: one draft forward per level over the ``width`` best frontier nodes (by
cumulative draft log-probability), each adding ``width`` children; finally the ``max_nodes`` best nodes are kept.
A chain is the width-1 case. Children are the draft's top-w tokens (deterministic), or, for a sampled draft,
``width`` draws without replacement in draw order (Gumbel top-k), which is what rejection sampling needs.

The draft keeps its own KV cache across rounds: entries of accepted nodes are kept, the rest are cropped.

``draft_vocab=N`` drafts from the first N token ids only, by running a copy of the draft whose output layer keeps
just those rows (FR-Spec's idea, Zhao et al. 2025: for a small draft the output layer over a 49k vocabulary is
most of a forward). Byte-level BPE ids are in merge order, which follows frequency, so the first ids are the common
ones. Tokens outside get q = 0; verification is unchanged, so output stays exactly the target's.

Llama-architecture drafts run through ``lean_llama`` (same weights, same logits, fewer operator calls);
``draft_quant="int8"`` gives that forward reduced-precision weights on CPU (``specviz.drafters.quantized``).
"""

from __future__ import annotations

import copy

import torch

from specviz.drafters import dynamic_tree
from specviz.drafters.lean_llama import lean_forward_for
from specviz.drafters.quantized import resolve_draft_quant
from specviz.drafters.registry import DrafterFamily, register
from specviz.engine import cache as kv
from specviz.engine.drafter import DraftBudget, Drafter, cache_capacity
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree
from specviz.engine.verify import masked_forward
from specviz.errors import SpecvizError


class DraftModelDrafter(Drafter):
    """Drafts with a small causal LM. ``vocab_size`` is the target's logits width (draft logits are cut or padded)."""

    def __init__(
        self, model: torch.nn.Module, vocab_size: int, name: str = "draft-model", stochastic_tree: bool = False,
        draft_vocab: int = 0, lean: bool = True, draft_quant: str = "off",
    ):
        weight = next(model.parameters())
        quant = resolve_draft_quant(draft_quant, weight.device, weight.dtype)
        self.source_model = model.eval()  # as loaded (transformers' assisted generation gets this one)
        drafting = trim_output_layer(model, draft_vocab) if draft_vocab else model
        # the same weights and maths with a fraction of the per-operator overhead, where the architecture allows
        lean_model = lean_forward_for(drafting, quant) if lean else None
        if lean_model is None and quant != "off":
            if draft_quant != "auto":
                raise SpecvizError(f"draft-quant {draft_quant} needs a Llama-architecture draft (the lean forward); "
                                   f"{type(model).__name__} is not one")
            quant = "off"  # "auto" where reduced precision has no forward to run in: the draft's own weights
        self.model = lean_model or drafting
        self.draft_vocab = draft_vocab
        self.draft_quant = quant
        self.vocab_size = vocab_size
        self.name = name
        self.stochastic_tree = stochastic_tree
        self._cache = None
        self._cached: list[int] = []  # tokens whose KV is in the cache, in cache order
        self._fed: dict[int, int] = {}  # node index of the last tree -> cache offset after the context
        self._context_length = 0

    def describe(self) -> dict:
        return {"name": self.name, "kind": "draft-model", "stochastic_tree": self.stochastic_tree,
                "draft_vocab": self.draft_vocab or None,
                "draft_quant": None if self.draft_quant == "off" else self.draft_quant}

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        capacity = cache_capacity(len(prompt_ids), max_new_tokens, budget)
        self._cache = kv.new_cache(self.model, capacity, self.name, preallocate=True)
        self._cached = []
        self._fed = {}

    def propose(
        self, context: list[int], budget: DraftBudget, sampling: SamplingConfig, generator: torch.Generator
    ) -> DraftTree:
        if self._cache is None or self._cached != context[: len(self._cached)]:
            self.begin(context)
        new = context[len(self._cached) :]
        start = len(self._cached)
        logits = masked_forward(self.model, self._cache, new, list(range(start, start + len(new))), None,
                                last_only=True)[-1:]
        self._cached = list(context)
        self._context_length = len(context)
        self._fed = {}
        grown = dynamic_tree.grow(logits[:, : self.vocab_size], self._expand, budget, sampling, generator,
                                  self.vocab_size, self.stochastic_tree)
        new_index = {old: new for new, old in enumerate(grown.kept)}
        self._fed = {new_index[old]: offset for old, offset in self._fed.items() if old in new_index}
        return grown.tree

    def _expand(self, frontier: list[int], nodes: list[dynamic_tree.Candidate]) -> torch.Tensor:
        """One draft forward over the frontier nodes (each sees the context, its fed ancestors and itself)."""
        cached = len(self._cached) + len(self._fed)
        visible = torch.zeros(len(frontier), cached + len(frontier), dtype=torch.bool)
        visible[:, : self._context_length] = True
        for row, node in enumerate(frontier):
            ancestor = nodes[node].parent
            while ancestor != ROOT:
                visible[row, self._context_length + self._fed[ancestor]] = True
                ancestor = nodes[ancestor].parent
            visible[row, cached + row] = True
        for row, node in enumerate(frontier):
            self._fed[node] = cached - self._context_length + row
        chain_like = len(frontier) == 1 and bool(visible.all())
        positions = [self._context_length - 1 + nodes[node].depth for node in frontier]
        tokens = [nodes[node].token for node in frontier]
        logits = masked_forward(self.model, self._cache, tokens, positions, None if chain_like else visible)
        return logits[:, : self.vocab_size]

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        """Keep the KV of accepted nodes that were fed to the draft (a prefix of the path); drop the rest."""
        kept = []
        for node in accepted:
            if node not in self._fed:
                break
            kept.append(node)
        kv.keep_path(self._cache, self._context_length, [self._fed[node] for node in kept])
        self._cached = self._cached[: self._context_length] + [tree.tokens[node] for node in kept]
        self._fed = {}


def trim_output_layer(model: torch.nn.Module, rows: int) -> torch.nn.Module:
    """A shallow copy of ``model`` whose output layer keeps its first ``rows`` rows (weights shared, not copied).

    The original model is left as it is: loaded models are cached and may serve other drafters.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise SpecvizError(f"draft-vocab needs a linear output layer; {type(model).__name__} has {type(head).__name__}")
    if not 1 <= rows <= head.out_features:
        raise SpecvizError(f"draft-vocab must be in [1, {head.out_features}] for this draft, got {rows}")
    name = next(key for key, module in model.named_children() if module is head)
    trimmed_head = torch.nn.Linear(head.in_features, rows, bias=head.bias is not None, device=head.weight.device,
                                   dtype=head.weight.dtype)
    trimmed_head.weight = torch.nn.Parameter(head.weight[:rows], requires_grad=False)
    if head.bias is not None:
        trimmed_head.bias = torch.nn.Parameter(head.bias[:rows], requires_grad=False)
    trimmed = copy.copy(model)
    trimmed._modules = dict(model._modules)
    trimmed._modules[name] = trimmed_head
    return trimmed


# ---- the family ----------------------------------------------------------------------------------------------
def _build(argument: str, target, settings) -> DraftModelDrafter:
    """Load the draft (registry name, directory or hub id), check it shares the target's tokenizer, wrap it."""
    from specviz.models import check_same_tokenizer, load_model

    loaded = load_model(argument, role="draft", **({"device": settings["device"]} if settings["device"] else {}))
    check_same_tokenizer(target, loaded)
    return DraftModelDrafter(loaded.model, target.vocab_size, name=f"model:{loaded.name}",
                             stochastic_tree=settings["stochastic_tree"], draft_vocab=settings["draft_vocab"],
                             draft_quant=settings["draft_quant"])


def _check(argument: str) -> str:
    """Refuse a draft model that cannot load (unknown name, missing path, not allowlisted, unreachable hub id) before
    the target loads."""
    from specviz.models import check_spec

    check_spec(argument)
    return argument


def shipped_drafts(target: str) -> list[str]:
    """Registry names of the draft models trained for ``target`` whose files are present."""
    try:
        from specviz.models import drafts_for
    except ImportError:  # the models package is optional for replay-only deployments
        return []
    names = []
    for entry in drafts_for(target):
        try:
            entry.resolve_path()
        except SpecvizError:
            continue  # registered but not trained/shipped yet (or a hub model: nothing on disk)
        names.append(entry.name)
    return names


FAMILY = register(DrafterFamily(
    name="model",
    syntax="model:<name|dir|hub id>",
    title="draft model",
    plain_name="Small draft model",
    plain_line="a smaller language model with the same vocabulary guesses the next words",
    description="an independent small LM with the target's tokenizer drafts a chain or a dynamic tree "
                "(registry name, model directory or hub id)",
    build=_build,
    check=_check,
    reads=("stochastic_tree", "min_draft_prob", "draft_vocab", "draft_quant", "device"),
    argument_required=True,
    checkpoints=shipped_drafts,
    trainer="draft-lm",
    order=20,
))
