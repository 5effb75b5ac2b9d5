"""The drafter contract, owned by the engine: each family proposes a ``DraftTree`` and hears what was committed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

import torch

from specviz import settings
from specviz.engine.features import TargetFeatures
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError
from specviz.settings import BY_NAME as _SETTINGS

LIMITS = {name: (_SETTINGS[name].low, _SETTINGS[name].high) for name in ("k", "width", "depth", "max_nodes")}
#: Slack in a drafter's own cache beyond what its budget can feed in one round.
ROOM_SLACK = 8


@dataclass(frozen=True)
class DraftBudget:
    """How much to draft per round: a chain of ``k`` tokens, or a tree of ``width`` x ``depth`` under ``max_nodes``.

    ``min_draft_prob`` > 0 stops a branch early: a node the drafter gave less than that probability is kept but not
    extended (transformers' ``assistant_confidence_threshold`` rule), so an unsure draft does not spend draft
    forwards and verify width on tokens that will mostly be rejected. Drafters without probabilities ignore it.
    """

    # A chain unless asked (``DraftBudget(k=3)`` is a chain of 3); the sizes default to the run settings' (declared
    # once, in settings.py), whose default shape, a small tree, is what ``api.budget_for`` passes for a run.
    tree: bool = False
    k: int = _SETTINGS["k"].default
    width: int = _SETTINGS["width"].default
    depth: int = _SETTINGS["depth"].default
    max_nodes: int = _SETTINGS["max_nodes"].default
    min_draft_prob: float = _SETTINGS["min_draft_prob"].default
    #: the tokens still to generate, where the engine capped the budget to them (``capped``); not a setting
    left: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:  # the ranges the settings declare, for API callers who bypass them
        for name in (*LIMITS, "min_draft_prob"):
            settings.check_exact(name, getattr(self, name))

    @property
    def max_depth(self) -> int:
        return self.depth if self.tree else self.k

    @property
    def widest(self) -> int:
        """The most nodes a draft within this budget holds (a chain's k or a tree's node budget)."""
        return self.max_nodes if self.tree else self.k

    @property
    def longest_chain(self) -> int:
        """The most nodes one chain may hold: ``widest``, since a chain of n costs the verify what any n nodes do
        (``depth`` bounds how deep a drafter grows a tree, not a single chain), and never past the tokens left."""
        return self.widest if self.left is None else min(self.widest, self.left)

    @property
    def draft_room(self) -> int:
        """KV positions a drafter's own cache may need in one round beyond the committed text: a dynamic tree feeds
        every frontier node it expands (up to width per level, depth levels; more than the node budget keeps)."""
        return (self.width * self.depth if self.tree else self.k) + ROOM_SLACK

    def check_fits(self, tree: DraftTree, drafter: str) -> None:
        """One line when ``drafter`` proposed more, or deeper, than this budget: the verify forward's positions and the
        target's cache are sized by it."""
        deepest = max(tree.depth, default=0)
        if len(tree) > self.widest or deepest > (self.longest_chain if tree.is_chain else self.max_depth):
            raise SpecvizError(f"drafter {drafter} proposed {len(tree)} nodes {deepest} deep, beyond its budget "
                               f"({self.describe()})")

    def capped(self, remaining: int) -> DraftBudget:
        """Never draft deeper than the tokens still to generate."""
        remaining = max(1, remaining)
        return replace(self, k=min(self.k, remaining), depth=min(self.depth, remaining), left=remaining)

    def describe(self) -> str:
        shape = f"tree w={self.width} d={self.depth} n<={self.max_nodes}" if self.tree else f"chain k={self.k}"
        return f"{shape} stop<{self.min_draft_prob:g}" if self.min_draft_prob else shape

    def to_dict(self) -> dict:
        return {"tree": self.tree, "k": self.k, "width": self.width, "depth": self.depth, "max_nodes": self.max_nodes,
                "min_draft_prob": self.min_draft_prob}


#: The widest any run may draft: a drafter begun without its run's budget sizes its caches for this one.
WIDEST = DraftBudget(tree=True, k=LIMITS["k"][1], width=LIMITS["width"][1], depth=LIMITS["depth"][1],
                     max_nodes=LIMITS["max_nodes"][1])


def cache_capacity(prompt_length: int, max_new_tokens: int | None = None, budget: DraftBudget | None = None) -> int:
    """Positions a drafter's own cache needs for a run: the prompt, every new token, and one round's draft room.
    Unknown (None) parts are sized for the most any run allows."""
    most = settings.get("max_new_tokens").high if max_new_tokens is None else max_new_tokens
    return prompt_length + most + (budget or WIDEST).draft_room


class Drafter(ABC):
    """Proposes drafts. One instance serves one generation at a time (it may keep a cache between rounds).

    The engine calls ``begin`` once, then per round ``propose`` → (verify, accept) → ``observe`` → ``commit``.
    """

    name: str = "drafter"
    #: The most side rows (``DraftTree.side``) one of its rounds adds to the verify forward: the target's cache is
    #: sized for them.
    side_room: int = 0
    #: Target hidden states this drafter reads, as Hugging Face ``hidden_states`` indices (0 = embedding output,
    #: i = output of decoder layer i - 1, L = after the final norm); empty: none, and none are captured.
    feature_layers: tuple[int, ...] = ()

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        """Called once before the first round with the prompt's token ids, the run's most new tokens and its draft
        budget (what a drafter's caches are sized from: ``cache_capacity``; None when the caller does not know)."""

    def observe(self, features: TargetFeatures) -> None:
        """The target's hidden states (``feature_layers``) at newly committed positions: after the prefill (the
        prompt minus its last token), then after each round (the verified pending token and the accepted path)."""

    @abstractmethod
    def propose(
        self, context: list[int], budget: DraftBudget, sampling: SamplingConfig, generator: torch.Generator
    ) -> DraftTree:
        """Draft continuations of ``context`` (every committed token so far)."""

    def observe_side(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """The target's logits of the whole verify forward of a ``tree`` that carried side rows (``DraftTree.side``):
        row 0 after the committed text, rows 1 … n after the draft's nodes, then one row per side node."""

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        """Called after each round with the new context and the accepted node indices (to update caches)."""

    def describe(self) -> dict:
        return {"name": self.name}
