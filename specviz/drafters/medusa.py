"""Medusa heads (Cai et al. 2024): extra heads on the target's last hidden state, drafting a static tree.

Head i is ``num_layers`` residual blocks ``x + SiLU(Linear(x))`` and an output layer (its own, or the target's,
borrowed); on the feature of position t it predicts x[t+2+i] (the target's own head predicts x[t+1]).

**Which feature, which head.** The engine hands over the feature of a position once a verify forward has seen
it, so when the drafter proposes after ``context`` (P = len(context) - 1 is the pending token, the target's own
choice from the last round) the newest known feature is the one of position P - 1: the position whose output the
target used to choose the pending token. That is Medusa's own arrangement: its tree root is the base model's
prediction from the last accepted position, and its heads read that same position. So depth 1 (token P + 1) is
head 0 on the feature of P - 1, and depth d is head d - 1; the heads never see the pending token, they assume
it. ``DraftTree.meta["head"]`` records the (0-based) head of each node, and
``specviz.engine.metrics.acceptance_by_label`` turns rounds into per-head acceptance.

**Trees.** A chain is the top-1 path. ``--tree`` drafts a static tree from a choices list in Medusa's format (a
list of rank paths: ``(0, 1)`` = head 0's top token, then head 1's second), the one shipped with the heads or, for
heads without one, ``default_choices``; the budget cuts it (depth, ranks below width, the first max_nodes in list
order). ``specviz.training.trainers.medusa.derive_choices`` builds a list from measured per-head top-k accuracy
(the Medusa recipe). Nodes are deterministic (top-k), so sampled verification draws from the target (lossless for
any proposal).

Loaders for the published layouts are in ``specviz.drafters.medusa_layouts``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specviz.drafters import checkpoint_files, dynamic_tree
from specviz.drafters import medusa_layouts as layouts
from specviz.drafters.feature_drafter import FeatureDrafter, rows_by_depth
from specviz.drafters.head_layer import DraftNetwork
from specviz.drafters.head_parts import inference_copy, output_projection, target_parts
from specviz.drafters.layouts import Format, build, fits, network_shapes
from specviz.drafters.medusa_layouts import MedusaSpec
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

TITLE = "Medusa heads"
Choices = tuple[tuple[int, ...], ...]


# ---- the heads --------------------------------------------------------------------------------------------------
class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))`` (Medusa's ResBlock; zero weights make it the identity)."""

    def __init__(self, size: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(size, size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(DraftNetwork):
    """``num_heads`` heads over a target's feature; ``output``: the target's output layer, borrowed (not a
    parameter, never saved) by heads without their own."""

    def __init__(self, spec: MedusaSpec, output: nn.Module | None, embedding: torch.Tensor | None = None):
        super().__init__(spec, embedding, output, own_output=spec.own_lm_head, rope=False)
        rows = spec.draft_vocab_size or spec.vocab_size
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(spec.hidden_size, spec.block_bias) for _ in range(spec.num_layers)],
                          *([nn.Linear(spec.hidden_size, rows, bias=False)] if spec.own_lm_head else []))
            for _ in range(spec.num_heads))
        self.draft_vocabulary("token_map", spec.draft_vocab_size if spec.reduced_vocab else 0)  # the target ids

    @property
    def num_heads(self) -> int:
        return self.spec.num_heads

    def states(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` target features -> ``[..., num_heads, H]``: each head's residual blocks (before the output
        layer)."""
        features = features.to(self.dtype)
        blocks = self.spec.num_layers
        return torch.stack([head[:blocks](features) for head in self.heads], dim=-2)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """``[..., num_heads, H]`` -> ``[..., num_heads, V]`` logits over the whole target vocabulary (float32; ids
        outside a truncated vocabulary get -inf)."""
        if not self.spec.own_lm_head:  # one matmul for every head
            return self.head_logits(0, states)
        return torch.stack([self.head_logits(h, states[..., h, :]) for h in range(self.num_heads)], dim=-2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.logits(self.states(features))

    def head_logits(self, h: int, state: torch.Tensor) -> torch.Tensor:
        """Head h's logits ``[..., V]`` (float32) of its block output ``state`` ``[..., H]``."""
        spec = self.spec
        if not spec.own_lm_head:
            return self.project_out(state).float() * spec.logit_scale
        out = self.heads[h][-1](state).float() * spec.logit_scale
        return out if self.token_map is None else self.widen(out, self.token_map, spec.vocab_size)

    def for_inference(self, draft_quant: str = "off") -> MedusaHeads:
        """A copy sharing every tensor whose linear layers (and the borrowed output rows) run pre-packed; the
        output layers in int8 with ``draft_quant="int8"``."""
        own = self.spec.own_lm_head
        weight = next(self.parameters(), None) if own else self.borrowed.output.weight
        fast = inference_copy(self, weight, None if own else self.borrowed.output.weight, draft_quant,
                              rows_packed=bool(self.borrowed.output_packed))
        if own and getattr(fast, "draft_quant", "off") != "off":
            for head in fast.heads:
                head[-1].forward = output_projection(head[-1].weight, fast.draft_quant)
        return fast


#: The heads' checkpoint formats (``medusa_layouts``), their tensors named and shaped as ``MedusaHeads`` holds them.
FORMAT = Format(what="Medusa heads", layouts=layouts.LAYOUTS, expected_shapes=network_shapes(MedusaHeads),
                check_fits=lambda spec, target: fits(spec, target, "the heads are", (spec.feature_layer,)),
                env=lambda spec: {"N": spec.num_layers, "i": spec.num_heads}, unknown=layouts.UNKNOWN,
                select=layouts.heads_only, prepare=layouts.check_token_map,
                pickles=(layouts.MEDUSA_FILES[1], "pytorch_model.bin"), plural=True,
                fingerprint_required=False)  # heads exported without the target at hand record no fingerprint


# ---- building, saving and loading -------------------------------------------------------------------------------
def spec_for(model: nn.Module, num_heads: int = 4, num_layers: int = 1) -> MedusaSpec:
    """Heads of ours for ``model``: reading ``hidden_states[L]``, sharing the target's output layer (the Medusa-1
    legacy arrangement; a V x H layer per head would dwarf the blocks)."""
    shape, _, _ = target_parts(model)
    return MedusaSpec(num_heads=num_heads, num_layers=num_layers, hidden_size=shape.hidden_size,
                      vocab_size=shape.vocab_size, feature_layer=shape.num_layers)


def build_heads(model: nn.Module, spec: MedusaSpec, state: dict[str, torch.Tensor] | None = None) -> MedusaHeads:
    return build(MedusaHeads, model, spec, state)


def new_heads(model: nn.Module, num_heads: int = 4, num_layers: int = 1, *, seed: int | None = None,
              std: float = 0.02) -> MedusaHeads:
    """Fresh heads of ours: block weights N(0, std) (``std=0``: Medusa's zero initialisation, each head starting
    as the target's own next-token prediction), biases zero."""
    heads = build_heads(model, spec_for(model, num_heads, num_layers))
    generator = torch.Generator().manual_seed(seed if seed is not None else 0)
    with torch.no_grad():
        for module in heads.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                if module.bias is not None:
                    module.bias.zero_()
    return heads


def save_heads(heads: MedusaHeads, folder: Path, *, target_name: str, layout: str = "specviz",
               choices: Sequence[Sequence[int]] | None = None, extra: dict | None = None,
               dtype: torch.dtype | None = None) -> Path:
    """Write ``heads`` as a loadable folder in our layout (borrowed output layer recorded with the target
    embedding's fingerprint, not stored) or a published one; ``choices`` (Medusa's format) ship with them."""
    config = {} if choices is None else {layouts.CHOICES_KEY: [list(c) for c in check_choices(choices)]}
    return FORMAT.save(heads, folder, layout, target_name=target_name, dtype=dtype or heads.dtype,
                       config={**config, **(extra or {})})


def load_heads(source: str | Path, model: nn.Module) -> tuple[MedusaHeads, Choices | None]:
    """Heads (and their shipped tree choices, if any) from a folder or hub id in any supported layout, checked
    against the target ``model``; every error is one line naming the source."""
    def finish(spec: MedusaSpec, state: dict[str, torch.Tensor], config: dict) -> tuple[MedusaHeads, Choices | None]:
        spec, state = _borrow_equal_heads(spec, state, target_parts(model)[2])
        choices = config.get(layouts.CHOICES_KEY)
        return build_heads(model, spec, state), None if choices is None else check_choices(choices)
    return FORMAT.load(source, model, finish)


def _borrow_equal_heads(spec: MedusaSpec, state: dict[str, torch.Tensor], output: nn.Module
                        ) -> tuple[MedusaSpec, dict[str, torch.Tensor]]:
    """Output layers that are copies of the target's (FasterDecoding's initialisation, vLLM's original head) are
    dropped: the heads borrow the target's instead of holding num_heads copies."""
    if not spec.own_lm_head or spec.reduced_vocab:
        return spec, state
    names = [f"heads.{i}.{spec.num_layers}.weight" for i in range(spec.num_heads)]
    mine = output.weight.detach().float().cpu()
    if all(state[n].shape == mine.shape and torch.allclose(state[n].float(), mine, rtol=1e-3, atol=1e-4)
           for n in names):
        from dataclasses import replace

        return replace(spec, own_lm_head=False), {k: v for k, v in state.items() if k not in names}
    return spec, state


# ---- tree choices -----------------------------------------------------------------------------------------------
EXAMPLE_CHOICES = "[[0], [0, 0], [1]]"


def _is_rank(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_choices(choices: Iterable[Sequence[int]]) -> Choices:
    """Medusa's format: non-empty rank paths, each one's parent path listed before it; one-line error otherwise."""
    if isinstance(choices, str | bytes) or not isinstance(choices, Iterable):
        raise SpecvizError(f"Medusa choices must be a list of lists of ranks, e.g. {EXAMPLE_CHOICES}")
    out: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for raw in choices:
        if not isinstance(raw, list | tuple) or not raw or any(not _is_rank(r) for r in raw):
            raise SpecvizError(f"Medusa choice {raw!r} is not a non-empty list of ranks >= 0 (choices are a list of "
                               f"lists of ranks, e.g. {EXAMPLE_CHOICES})")
        path = tuple(raw)
        if path in seen:
            raise SpecvizError(f"Medusa choice {list(path)} is listed twice")
        if len(path) > 1 and path[:-1] not in seen:
            raise SpecvizError(f"Medusa choice {list(path)} comes before its parent {list(path[:-1])}")
        seen.add(path)
        out.append(path)
    return tuple(out)


def default_choices(num_heads: int, width: int, depth: int, max_nodes: int) -> Choices:
    """A tree for heads that ship no choices: every path with ranks below ``width`` up to ``depth`` (no deeper than
    the heads), fewest rank steps first (the top-1 chain leads), then shallower, then lexicographic."""
    depth = min(depth, num_heads)
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    paths.sort(key=lambda p: (sum(p), len(p), p))
    return tuple(paths[:max_nodes])


def fit_choices(choices: Choices, budget: DraftBudget, num_heads: int) -> Choices:
    """The choices within the budget: depth (and the heads), ranks below width, the first max_nodes in order."""
    depth = min(budget.depth, num_heads)
    kept = [c for c in choices if len(c) <= depth and max(c) < budget.width]
    kept_set = set(kept)
    kept = [c for c in kept if all(c[:i] in kept_set for i in range(1, len(c)))]
    return tuple(kept[: budget.max_nodes])


# ---- the drafter ------------------------------------------------------------------------------------------------
class MedusaDrafter(FeatureDrafter):
    """Drafts the top-1 chain or a static tree from the heads on the newest known target feature."""

    what = "Medusa heads"

    def __init__(self, heads: MedusaHeads, vocab_size: int, name: str | None = None,
                 choices: Sequence[Sequence[int]] | None = None, pack: bool = True, draft_quant: str = "off"):
        self.heads = self.adopt(heads, heads.spec.vocab_size, vocab_size, pack=pack, draft_quant=draft_quant)
        self.name = name or "medusa"
        self.choices = None if choices is None else check_choices(choices)
        super().__init__((heads.spec.feature_layer,), None, heads.dtype)
        self.begin([])

    def describe(self) -> dict:
        return {**super().describe(), "heads": self.heads.num_heads,
                "choices": None if self.choices is None else [list(c) for c in self.choices]}

    def reset(self, prompt_ids: list[int]) -> None:
        self._feature: torch.Tensor | None = None  # the newest feature consumed ...
        self._position = -1  # ... and its position

    @torch.inference_mode()
    def head_logits(self, context: list[int]) -> torch.Tensor | None:
        """``[num_heads, V]``: the heads on the feature of position len(context) - 2 (None before there is one)."""
        if len(context) < 2:
            return None
        self.follow(context)
        rows = self.take(len(context) - 1)
        if rows is not None:
            self._feature, self._position = rows[-1], len(context) - 2
        if self._position != len(context) - 2:
            raise SpecvizError(f"the Medusa heads hold the feature of position {self._position}, drafting after "
                               f"{len(context)} tokens needs position {len(context) - 2}")
        return self.runner(self._feature[None])[0]

    @torch.inference_mode()
    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        logits = self.head_logits(context)
        if logits is None:
            return DraftTree.empty()
        heads = self.heads.num_heads
        if budget.tree:
            choices = self.choices or default_choices(heads, budget.width, budget.depth, budget.max_nodes)
            choices = fit_choices(choices, budget, heads)
        else:
            choices = tuple((0,) * d for d in range(1, min(budget.k, heads) + 1))
        if not choices:
            return DraftTree.empty()
        q = dynamic_tree.distributions(logits, sampling, self.vocab_size)  # [heads, V]
        widest = 1 + max(max(c) for c in choices)
        ranked = logits.float().cpu().topk(min(widest, logits.shape[-1]), dim=-1).indices.tolist()
        return static_tree(choices, ranked, q, budget.min_draft_prob)


def static_tree(choices: Choices, ranked: list[list[int]], q: torch.Tensor, min_draft_prob: float = 0.0
                ) -> DraftTree:
    """The draft tree of ``choices``: the node of path c is head (len(c) - 1)'s rank-c[-1] token (``ranked[h]``:
    head h's tokens best first; ``q[h]``: its distribution). Paths under a node below ``min_draft_prob`` are not
    drafted; confidence is the path product of the heads' probabilities."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, q_token, confidence, head = [], [], [], [], []
    for path in sorted(choices, key=lambda c: (len(c), c)):  # Medusa's buffer order: by depth, then ranks
        parent = index.get(path[:-1], ROOT) if len(path) > 1 else ROOT
        if len(path) > 1 and (path[:-1] not in index or q_token[parent] < min_draft_prob):
            continue
        h = len(path) - 1
        if path[-1] >= len(ranked[h]):
            continue
        token = ranked[h][path[-1]]
        p = float(q[h, token])
        index[path] = len(tokens)
        tokens.append(token)
        parents.append(parent)
        q_token.append(p)
        confidence.append(p * (1.0 if parent == ROOT else confidence[parent]))
        head.append(h)
    return DraftTree(tokens=tokens, parents=parents, q_token=q_token, q_dist=rows_by_depth(q, [h + 1 for h in head]),
                     sampled=False, confidence=[max(0.0, min(1.0, c)) if math.isfinite(c) else 0.0 for c in confidence],
                     meta={"head": head})


# ---- the family -------------------------------------------------------------------------------------------------
def _load(source: str | Path, target, settings, name: str) -> MedusaDrafter:
    heads, choices = load_heads(source, target.model)
    return MedusaDrafter(heads, target.vocab_size, name=name, choices=choices, draft_quant=settings["draft_quant"])


FAMILY = checkpoint_files.checkpoint_family(
    "medusa", "Medusa heads", load=_load, plural=True,
    title=TITLE,
    plain_name="Medusa heads",
    plain_line="small extra outputs on the model guess the 2nd, 3rd, ... word ahead at once",
    description=("Medusa heads on the target's last hidden state, head i predicting the token i + 2 after it: the "
                 "static tree of the heads' choices list cut to the node budget (depth d = head d - 1 in 0-based "
                 "numbering), or the top-1 chain with --chain; loads FasterDecoding and vLLM checkpoints; bare "
                 "name: the heads shipped for the target"),
    reads=("min_draft_prob", "draft_quant"),
    feature_layers=lambda num_layers: (num_layers,),
    features="`hidden_states[L]` (after the final norm, as Medusa reads the base model's output)",
    order=34,  # trained by specviz.training.trainers.medusa
)
