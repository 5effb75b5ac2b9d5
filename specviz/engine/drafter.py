"""The drafter contract, owned by the engine: each family proposes a ``DraftTree`` and hears what was committed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch

from specviz.engine.features import TargetFeatures
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError
from specviz.settings import BY_NAME as _SETTINGS

LIMITS = {name: (_SETTINGS[name].low, _SETTINGS[name].high) for name in ("k", "width", "depth", "max_nodes")}


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

    def __post_init__(self) -> None:
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise SpecvizError(f"{name.replace('_', '-')} must be an integer in [{low}, {high}], got {value!r}")
        stop = self.min_draft_prob
        if isinstance(stop, bool) or not isinstance(stop, int | float) or not 0.0 <= stop < 1.0:
            raise SpecvizError(f"min-draft-prob must be a number in [0, 1), got {stop!r}")

    @property
    def max_depth(self) -> int:
        return self.depth if self.tree else self.k

    def capped(self, remaining: int) -> DraftBudget:
        """Never draft deeper than the tokens still to generate."""
        remaining = max(1, remaining)
        return replace(self, k=min(self.k, remaining), depth=min(self.depth, remaining))

    def describe(self) -> str:
        shape = f"tree w={self.width} d={self.depth} n<={self.max_nodes}" if self.tree else f"chain k={self.k}"
        return f"{shape} stop<{self.min_draft_prob:g}" if self.min_draft_prob else shape

    def to_dict(self) -> dict:
        return {"tree": self.tree, "k": self.k, "width": self.width, "depth": self.depth, "max_nodes": self.max_nodes,
                "min_draft_prob": self.min_draft_prob}


class Drafter(ABC):
    """Proposes drafts. One instance serves one generation at a time (it may keep a cache between rounds).

    The engine calls ``begin`` once, then per round ``propose`` → (verify, accept) → ``observe`` → ``commit``.
    """

    name: str = "drafter"
    #: Target hidden states this drafter reads, as Hugging Face ``hidden_states`` indices (0 = embedding output,
    #: i = output of decoder layer i - 1, L = after the final norm); empty: none, and none are captured.
    feature_layers: tuple[int, ...] = ()

    def begin(self, prompt_ids: list[int]) -> None:
        """Called once before the first round with the prompt's token ids."""

    def observe(self, features: TargetFeatures) -> None:
        """The target's hidden states (``feature_layers``) at newly committed positions: after the prefill (the
        prompt minus its last token), then after each round (the verified pending token and the accepted path)."""

    @abstractmethod
    def propose(
        self, context: list[int], budget: DraftBudget, sampling: SamplingConfig, generator: torch.Generator
    ) -> DraftTree:
        """Draft continuations of ``context`` (every committed token so far)."""

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        """Called after each round with the new context and the accepted node indices (to update caches)."""

    def describe(self) -> dict:
        return {"name": self.name}
