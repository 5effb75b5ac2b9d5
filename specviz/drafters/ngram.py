"""Prompt lookup / n-gram drafting: continue the text the way it continued after the same n-gram before.

Deterministic (no draft distribution), so its proposals are verified with the target-sampling rule. An index of
every n-gram's end positions is updated incrementally on commit, so a round costs O(new tokens), not O(context).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from specviz.drafters.registry import DrafterFamily, register
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

MAX_NGRAM = 8
DEFAULT_MAX_NGRAM = 3


class NgramDrafter(Drafter):
    """Look up the latest n-gram (longest first) that ends the context; propose what followed it."""

    name = "ngram"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram <= MAX_NGRAM:
            raise SpecvizError(f"n-gram sizes must satisfy 1 <= min <= max <= {MAX_NGRAM}, "
                               f"got min={min_ngram} max={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self._indexed = 0

    def describe(self) -> dict:
        return {"name": self.name, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def begin(self, prompt_ids: list[int]) -> None:
        self._index.clear()
        self._indexed = 0
        self._extend(prompt_ids)

    def _extend(self, context: list[int]) -> None:
        """Index n-grams ending at every position not indexed yet (value = position right after the n-gram)."""
        for end in range(max(self._indexed, 1), len(context) + 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self._index[tuple(context[end - n : end])].append(end)
        self._indexed = len(context) + 1

    def continuations(self, context: list[int], depth: int, limit: int) -> list[list[int]]:
        """Up to ``limit`` distinct continuations (at most ``depth`` tokens), longest n-gram and most recent first."""
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if n > len(context):
                continue
            ends = self._index.get(tuple(context[-n:]), [])
            for end in reversed(ends):
                if end >= len(context):  # the suffix itself
                    continue
                follow = context[end : end + depth]
                if follow and tuple(follow) not in seen:
                    seen.add(tuple(follow))
                    found.append(follow)
                    if len(found) >= limit:
                        return found
        return found

    def propose(
        self, context: list[int], budget: DraftBudget, sampling: SamplingConfig, generator: torch.Generator
    ) -> DraftTree:
        if len(context) + 1 < self._indexed:  # a new, shorter context: start over
            self.begin(context)
        else:
            self._extend(context)
        if not budget.tree:
            found = self.continuations(context, budget.k, 1)
            return DraftTree.chain(found[0]) if found else DraftTree.empty()
        return _trie(self.continuations(context, budget.depth, budget.width), budget.max_nodes)

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        self._extend(context)


def _trie(continuations: list[list[int]], max_nodes: int) -> DraftTree:
    """Merge continuations into a prefix tree (shared prefixes become one branch), breadth-first under a node cap."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, ...], int] = {}
    depth = max((len(c) for c in continuations), default=0)
    for level in range(depth):
        for seq in continuations:
            if level >= len(seq):
                continue
            parent = ROOT if level == 0 else node_of.get(tuple(seq[:level]))
            if parent is None:
                continue  # its prefix was cut by the node cap
            key = tuple(seq[: level + 1])
            if key in node_of:
                continue
            if len(tokens) >= max_nodes:
                break
            node_of[key] = len(tokens)
            tokens.append(seq[level])
            parents.append(parent)
    return DraftTree(tokens=tokens, parents=parents)


# ---- the family ----------------------------------------------------------------------------------------------
def ngram_size(argument: str) -> int:
    """The maximum n of an ``ngram[:N]`` spec's argument (``""``: the default)."""
    if not argument:
        return DEFAULT_MAX_NGRAM
    if not argument.isdigit() or not 1 <= int(argument) <= MAX_NGRAM:
        raise SpecvizError(f"ngram takes a maximum n-gram size from 1 to {MAX_NGRAM}, e.g. ngram:3, "
                           f"got {'ngram:' + argument!r}")
    return int(argument)


def _check(argument: str) -> str:
    ngram_size(argument)
    return argument


FAMILY = register(DrafterFamily(
    name="ngram",
    syntax="ngram[:N]",
    title="n-gram lookup",
    description=f"prompt lookup: continue with what followed the latest match of the context's last n tokens "
                f"(n = N down to 1; N = {DEFAULT_MAX_NGRAM} by default); no model, no draft probabilities",
    build=lambda argument, target, settings: NgramDrafter(max_ngram=ngram_size(argument)),
    check=_check,
    default_spec="ngram",
    variants=("ngram:2", "ngram:4"),
    order=10,
))
