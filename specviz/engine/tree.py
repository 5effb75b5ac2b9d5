"""The draft tree: the one proposal type every drafter returns.

Nodes are in topological order (``parents[i] < i``); ``-1`` means "child of the last committed token" (the root).
A chain is the tree with ``parents[i] == i - 1``. Depth, position offsets, children and the ancestor mask are
derived from ``parents`` and never stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from specviz.errors import SpecvizError

ROOT = -1


def depths(parents: list[int]) -> list[int]:
    """Depth of each node of a topologically ordered tree; children of the root have depth 1."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent == ROOT else out[parent] + 1)
    return out


def is_chain(parents: list[int]) -> bool:
    """One child per node, in order."""
    return all(parent == i - 1 for i, parent in enumerate(parents))


@dataclass
class DraftTree:
    """A proposal: token ids in topological order plus what the drafter knew about them.

    - ``q_token[i]``: the drafter's probability of node i's token (None for deterministic drafters).
    - ``q_dist``: ``[n + 1, V]`` draft distributions; row 0 is the distribution at the root, row ``i + 1`` the one at
      node i. Needed by rejection sampling; None when the drafter has no distribution (n-gram lookup).
    - ``sampled``: True when children were *drawn at random* from ``q_dist`` (in draw order, without replacement);
      False when they were chosen deterministically (argmax, top-w, lookup). The accept rule depends on it.
    - ``confidence[i]``: the drafter's own estimate that node i survives (optional).
    - ``side``: rows the verify forward carries besides the draft that are never accepted (lookahead decoding's
      Jacobi window): a forest under the root whose nodes see the committed text, the root and their own ancestors
      only, as no draft node sees them. The drafter gets their logits (``Drafter.observe_side``); output never
      depends on them.
    """

    tokens: list[int]
    parents: list[int]
    q_token: list[float] | None = None
    q_dist: torch.Tensor | None = None
    sampled: bool = False
    confidence: list[float] | None = None
    meta: dict = field(default_factory=dict)
    side: DraftTree | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"tree has {len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"tree node {i} has parent {parent}; parents must satisfy -1 <= parent < index")
        for name in ("q_token", "confidence"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.tokens):
                raise ValueError(f"tree {name} has {len(values)} entries for {len(self.tokens)} nodes")
        if self.q_dist is not None and self.q_dist.shape[0] != len(self.tokens) + 1:
            raise ValueError(f"tree q_dist has {self.q_dist.shape[0]} rows, expected {len(self.tokens) + 1}")
        if self.sampled and self.q_dist is None:
            raise ValueError("a sampled tree needs q_dist for rejection sampling")

    @classmethod
    def chain(cls, tokens: list[int], **kwargs) -> DraftTree:
        return cls(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)), **kwargs)

    @classmethod
    def empty(cls) -> DraftTree:
        return cls(tokens=[], parents=[])

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depth(self) -> list[int]:
        """Depth of each node; children of the root have depth 1."""
        return depths(self.parents)

    @cached_property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    @cached_property
    def children(self) -> dict[int, list[int]]:
        """Children of each slot in node order; key ``-1`` is the root."""
        kids: dict[int, list[int]] = {ROOT: []}
        for i, parent in enumerate(self.parents):
            kids.setdefault(parent, []).append(i)
            kids.setdefault(i, [])
        return kids

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent != ROOT:
                mask[i] = mask[parent]
            mask[i, i] = True
        return mask

    def with_side(self) -> DraftTree:
        """What the verify forward runs: the draft's nodes, then the side rows (parents shifted past the draft)."""
        if not self.side:
            return self
        n = len(self.tokens)
        return DraftTree(tokens=[*self.tokens, *self.side.tokens],
                         parents=[*self.parents, *(p if p == ROOT else p + n for p in self.side.parents)])

    def validate_against_vocab(self, vocab_size: int) -> None:
        bad = [t for t in self.tokens + (self.side.tokens if self.side else []) if not 0 <= t < vocab_size]
        if bad:
            raise SpecvizError(f"drafter proposed token ids outside the target vocabulary ({vocab_size}): {bad[:5]}")
