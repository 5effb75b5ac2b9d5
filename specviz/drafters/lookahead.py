"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead Decoding";
hao-ai-lab/LookaheadDecoding): Jacobi iterations fill an n-gram pool, and the pool's n-grams are the drafts.

One target forward per round carries two branches beside the newest committed token (the root):

- the **lookahead branch**: a window of ``W`` future positions over ``N - 1`` levels, the trajectories of past
  Jacobi iterations. Level 0 is a chain of ``W - 1`` guesses after the root; the level-ℓ guess in column i hangs under
  the level-(ℓ-1) guess of its column, so it sees the root, level 0 up to column i and its own column above it, at
  position p + ℓ + i (the paper's staircase mask, as a tree). These are side rows (``DraftTree.side``): verified,
  never accepted. The argmax at the last level's rows is the next Jacobi iteration: it becomes the new last level,
  and every column's diagonal (its level-0 token, then one token per later level, then the new one) is an n-gram
  harvested into the pool, keyed by its first token. The window moves one level per round whatever was accepted
  (the reference's ``ALWAYS_FWD_ONE``).
- the **verification branch**: up to ``G`` pool n-grams that start with the root token, merged into a prefix tree,
  verified like any deterministic draft (greedy: the target's argmax; sampled: the target-sampling rule).

Only drafts are ever accepted, and drafts depend on the committed text and on the target's argmax at earlier
rounds, never on this round's draws: output is exactly the target's, greedy or sampled. The pool also starts with
the prompt's n-grams and takes every n-gram of the committed text (``minimal.py``'s ``POOL_FROM_PROMPT``), and the
window starts from prompt tokens chosen by a fixed seed, so runs replay.

The spec ``lookahead[:W:N:G]`` declares the three sizes (defaults ``WINDOW``, ``NGRAM``, ``GUESSES``); the verify
forward holds (W - 1) + (N - 2)·W window rows beside the root and the drafts (``window_rows``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import torch

from specviz.drafters.registry import DrafterFamily, register
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

#: The defaults: a narrow window and short n-grams, since every window row widens a CPU's verify forward.
WINDOW, NGRAM, GUESSES = 4, 3, 4
LIMITS = {"W": (2, 16), "N": (2, 8), "G": (1, 32)}
#: The window's guesses are drawn from the prompt's tokens with this seed, so the same run replays.
SEED = 0


class NgramPool:
    """Up to ``size`` n-grams per first token, least recently seen dropped first (the reference's LRU lists)."""

    def __init__(self, size: int):
        self.size = size
        self.entries: dict[int, list[tuple[int, ...]]] = {}
        self.origin: dict[tuple[int, ...], str] = {}  # (key, *rest) -> where it was harvested, for the views

    def add(self, gram: tuple[int, ...], origin: str) -> None:
        key, rest = gram[0], tuple(gram[1:])
        kept = self.entries.setdefault(key, [])
        if rest in kept:
            kept.remove(rest)
        kept.append(rest)
        self.origin[(key, *rest)] = origin
        if len(kept) > self.size:
            dropped = kept.pop(0)
            self.origin.pop((key, *dropped), None)

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The n-grams' continuations after ``key``, most recently seen first."""
        return self.entries.get(key, [])[::-1]

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())


class LookaheadDrafter(Drafter):
    """Jacobi window + n-gram pool (see the module). ``piece``: a token's display text, for the window's view."""

    name = "lookahead"

    def __init__(self, window: int = WINDOW, ngram: int = NGRAM, guesses: int = GUESSES, *,
                 piece: Callable[[int], str] | None = None, name: str | None = None, seed: int = SEED):
        check_sizes(window, ngram, guesses)
        self.window, self.ngram, self.guesses, self.seed = window, ngram, guesses, seed
        self.piece = piece
        self.name = name or self.name
        self.pool = NgramPool(guesses)
        self.levels: list[list[int]] = []
        self._root = -1
        self._rounds = 0
        self._pooled = 0  # context tokens whose n-grams are in the pool

    def describe(self) -> dict:
        return {"name": self.name, "kind": "lookahead", "W": self.window, "N": self.ngram, "G": self.guesses,
                "window_rows": self.window_rows}

    @property
    def window_rows(self) -> int:
        """Side rows a steady-state round verifies: level 0's W - 1 guesses and W per later level."""
        return self.window - 1 + (self.ngram - 2) * self.window

    @property
    def side_room(self) -> int:
        return self.window_rows

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        rng = random.Random(self.seed)
        self.pool = NgramPool(self.guesses)
        self.levels = [[int(rng.choice(prompt_ids)) for _ in range(self.window - 1)]] if prompt_ids else [[]]
        self._rounds, self._pooled = 0, 0
        self._harvest_text(prompt_ids, "the prompt")

    def _harvest_text(self, context: list[int], origin: str) -> None:
        """Every n-gram of the committed text not pooled yet."""
        for end in range(max(self._pooled, self.ngram), len(context) + 1):
            self.pool.add(tuple(context[end - self.ngram: end]), origin)
        self._pooled = max(self._pooled, len(context))

    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        if not self.levels or self._pooled > len(context):
            self.begin(context)
        self._root = int(context[-1])
        tree = self._drafts(self.pool.candidates(self._root), budget)
        tree.side = self._window_rows()
        tree.meta["lookahead"] = self._window_meta(len(self.pool.candidates(self._root)))
        return tree

    def _drafts(self, candidates: list[tuple[int, ...]], budget: DraftBudget) -> DraftTree:
        """The pool's n-grams after the root, most recent first, merged into a prefix tree within the budget."""
        tokens, parents, origins = [], [], []
        node_of: dict[tuple[int, ...], int] = {}
        width = budget.width if budget.tree else 1
        for gram in candidates:
            parent, path = ROOT, ()
            for token in gram[: budget.max_depth]:
                path = (*path, token)
                if path not in node_of:
                    siblings = sum(1 for p in parents if p == parent)
                    if len(tokens) >= budget.widest or siblings >= width:
                        break
                    node_of[path] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    origins.append(self.pool.origin.get((self._root, *gram), "?"))
                parent = node_of[path]
            if not budget.tree and tokens:
                break  # a chain: the most recent n-gram only
        return DraftTree(tokens=tokens, parents=parents,
                         meta={"node_labels": ["pool n-gram"] * len(tokens), "pool_origin": origins} if tokens
                         else {})

    def _window_rows(self) -> DraftTree:
        """Level 0 as a chain under the root, each later level's column i under the level above's column i."""
        tokens, parents = list(self.levels[0]), list(range(-1, len(self.levels[0]) - 1))
        above = [ROOT, *range(len(self.levels[0]))]  # block A's columns: the root, then level 0's guesses
        for level in self.levels[1:]:
            row = []
            for column, token in enumerate(level):
                row.append(len(tokens))
                tokens.append(token)
                parents.append(above[column])
            above = row
        return DraftTree(tokens=tokens, parents=parents)

    def observe_side(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """The next Jacobi iteration from the last level's rows; harvest each column's diagonal; move one level."""
        argmax = logits.argmax(dim=-1).tolist()
        side = argmax[len(tree) + 1:]
        if len(self.levels) == 1:  # block A's rows: the root's (the verify's row 0), then level 0's
            new = [argmax[0], *side[: len(self.levels[0])]]
        else:
            new = side[-len(self.levels[-1]):]
        self._rounds += 1
        if len(self.levels) < self.ngram - 1:
            self.levels.append(new)  # still filling the window: one more level
            return
        block = [self._root, *self.levels[0]]
        for column in range(self.window):
            gram = (block[column], *(level[column] for level in self.levels[1:]), new[column])
            self.pool.add(gram, f"the window, round {self._rounds}")
        self.levels = [self.levels[1][1:], *self.levels[2:], new] if len(self.levels) > 1 else [new[1:]]

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        self._harvest_text(context, "the text")

    def _window_meta(self, candidates: int) -> dict:
        """What the view draws: the window's levels (ids and texts), the pool's size and the root's candidates."""
        meta = {"W": self.window, "N": self.ngram, "G": self.guesses, "levels": [list(lv) for lv in self.levels],
                "pool": len(self.pool), "candidates": candidates}
        if self.piece is not None:
            meta["texts"] = [[self.piece(t) for t in level] for level in self.levels]
        return meta


def check_sizes(window: int, ngram: int, guesses: int) -> None:
    for name, value in (("W", window), ("N", ngram), ("G", guesses)):
        low, high = LIMITS[name]
        if not low <= value <= high:
            raise SpecvizError(f"lookahead {name} must be an integer in [{low}, {high}], got {value}")


def parse_argument(argument: str) -> tuple[int, int, int]:
    """(W, N, G) of a ``lookahead[:W:N:G]`` spec's argument (``""``: the defaults)."""
    if not argument:
        return WINDOW, NGRAM, GUESSES
    parts = argument.split(":")  # colons, as ngram:auto:3 (a comma separates specs in bench --drafters)
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise SpecvizError(f"lookahead takes W:N:G (window, n-gram size, guesses), e.g. lookahead:{WINDOW}:{NGRAM}:"
                           f"{GUESSES}; got {'lookahead:' + argument!r}")
    window, ngram, guesses = (int(p) for p in parts)
    check_sizes(window, ngram, guesses)
    return window, ngram, guesses


def _check(argument: str) -> str:
    parse_argument(argument)
    return argument


def _build(argument: str, target: Target, settings: Mapping[str, Any]) -> LookaheadDrafter:
    window, ngram, guesses = parse_argument(argument)
    return LookaheadDrafter(window, ngram, guesses, piece=target.piece,
                            name=f"lookahead:{argument}" if argument else None)


FAMILY = register(DrafterFamily(
    name="lookahead",
    syntax="lookahead[:W:N:G]",
    title="lookahead (Jacobi) decoding",
    plain_name="Lookahead (Jacobi)",
    plain_line="guesses several words ahead at once and keeps the word runs that keep coming back",
    description=f"Jacobi iterations over a W-wide window of N-1 levels, verified in the same forward as the drafts, "
                f"fill an n-gram pool; up to G pool n-grams that start with the last token are the draft (defaults "
                f"W={WINDOW}, N={NGRAM}, G={GUESSES}); no model, no draft probabilities",
    build=_build,
    check=_check,
    default_spec="lookahead",
    order=81,
))
