"""The seam between the round loop and the model that verifies: the loop never touches a model or a cache itself.

A verifier holds one generation's target state (its KV cache) and does three things: fill it with the prompt, score
a draft tree in one forward (a row of logits for the newest committed token and for every node, plus the hidden
states a drafter asked for), and keep only the accepted path. ``LocalVerifier`` runs the Hugging Face model in this
process; a model on a serving engine is another implementation, with no change to the loop, the accept rules or the
views.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from specviz.engine import cache as kv
from specviz.engine.features import TargetFeatures, capture, check_layers, rows
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.engine.verify import forward_tree, prefill


@dataclass
class Scored:
    """One forward's results: ``logits`` ``[rows, V]``, and ``hidden`` (``hidden_states`` index -> ``[rows, H]``)
    for the layers the run reads."""

    logits: torch.Tensor | None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    #: what the verifier says about this forward, kept in the round's record (a served target: server time,
    #: transfer, the context tokens the server recomputed)
    meta: dict = field(default_factory=dict)

    def features(self, layers: tuple[int, ...], start: int, picked: list[int]) -> TargetFeatures:
        """Rows ``picked`` of this forward as the features of positions ``start, start + 1, ...``."""
        return rows(self.hidden, layers, start, picked)


class Verifier(ABC):
    """The target as the round loop sees it, for one generation at a time."""

    name: str = "target"

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the logits live (the loop's clock waits for it)."""

    @abstractmethod
    def reserve(self, positions: int, layers: tuple[int, ...], sampling: SamplingConfig) -> None:
        """Get ready for a generation of at most ``positions`` cached tokens whose drafter reads ``layers``, sampled
        by ``sampling`` (refused in one line when the target cannot: a cache that cannot roll back, layers it does
        not have, a sampler it cannot serve exactly)."""

    @abstractmethod
    def prefill(self, token_ids: list[int]) -> Scored:
        """Cache ``token_ids`` (the prompt minus its last token); the hidden states of their rows, no logits."""

    @abstractmethod
    def verify(self, tree: DraftTree, pending_token: int, past_length: int) -> Scored:
        """One forward over ``[pending] + tree`` after ``past_length`` cached tokens: ``[n + 1, V]`` logits (row 0
        after the committed text, row i + 1 after node i) and the rows' hidden states."""

    @abstractmethod
    def keep(self, committed: int, path: list[int]) -> None:
        """Keep the first ``committed`` cached tokens plus the accepted ``path``'s entries (tree offsets)."""


class LocalVerifier(Verifier):
    """A Hugging Face causal LM in this process, through its own forward, with a KV cache that rolls back."""

    def __init__(self, target: Target):
        self.target, self.name = target, target.name
        self.cache = None
        self._layers: tuple[int, ...] = ()

    @property
    def device(self) -> torch.device:
        return self.target.device

    def reserve(self, positions: int, layers: tuple[int, ...], sampling: SamplingConfig) -> None:
        target = self.target
        self.cache = kv.new_cache(target.model, positions, target.name, preallocate=target.preallocated_cache)
        if layers:
            check_layers(target.model, layers)
        self._layers = tuple(layers)

    def prefill(self, token_ids: list[int]) -> Scored:
        with capture(self.target.model, self._layers) as found:
            prefill(self.target.model, self.cache, token_ids)
        return Scored(None, found)

    def verify(self, tree: DraftTree, pending_token: int, past_length: int) -> Scored:
        with capture(self.target.model, self._layers) as found:
            logits = forward_tree(self.target.model, self.cache, tree, pending_token, past_length)
        return Scored(logits, found)

    def keep(self, committed: int, path: list[int]) -> None:
        kv.keep_path(self.cache, committed, path)
