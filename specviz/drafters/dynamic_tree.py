"""EAGLE-2's dynamic draft tree, for any drafter that can score a frontier of nodes in one step.

Level by level: the ``width`` best nodes of the newest level (by cumulative draft log-probability, the path product
of draft probabilities) are expanded, each adding ``width`` children; after ``depth`` levels every drafted node is
reranked and the ``max_nodes`` best are kept. A child never scores above its parent, so parents are always kept
(ties go to the earlier node) and the kept nodes stay in topological order. A chain is the width-1 case.

Children are the drafter's top-w tokens (deterministic, verified with target sampling), or for a sampled draft
``width`` draws without replacement in draw order (Gumbel top-k), which rejection sampling needs; a sampled tree
keeps a prefix of the drafting order instead of reranking, so every sibling group stays a prefix of its draws.

Written against a drafter-supplied ``expand``, so draft models and feature-reading heads share it; the nodes drafted
and then pruned are reported in ``DraftTree.meta["pruned"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.engine.accept import argmax_rows
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig, probabilities
from specviz.engine.tree import ROOT, DraftTree


@dataclass
class Candidate:
    """A drafted node before the final selection."""

    token: int
    parent: int  # candidate index, -1 = root
    depth: int
    score: float  # cumulative log draft probability (EAGLE-2's ranking score)
    q: float  # the drafter's probability of this token at its parent


#: ``expand(frontier, candidates)`` -> ``[len(frontier), V]`` logits after each frontier candidate.
Expand = Callable[[list[int], list[Candidate]], torch.Tensor]


@dataclass
class Grown:
    """The proposal and how it was chosen: ``kept[i]`` is the candidate index of tree node i."""

    tree: DraftTree
    candidates: list[Candidate]
    kept: list[int]


def grow(root_logits: torch.Tensor, expand: Expand, budget: DraftBudget, sampling: SamplingConfig,
         generator: torch.Generator, vocab_size: int, stochastic_tree: bool = False,
         ids: torch.Tensor | None = None) -> Grown:
    """Draft a chain (``budget.tree`` false) or a dynamic tree from the root's logits ``[1, W]``.

    The root's and ``expand``'s logits score W columns: target ids 0 .. W - 1 (ids past W are impossible), or
    ``ids[c]`` for column c (a CPU tensor) where the drafter scores a reduced draft vocabulary (EAGLE-3's). Softmax
    and top-w run over those W columns alone; only the rows the tree keeps are spread over all ``vocab_size`` ids.
    """
    sampled = not sampling.greedy and (not budget.tree or stochastic_tree)
    width = budget.width if budget.tree else 1
    depth = budget.depth if budget.tree else budget.k
    max_nodes = budget.max_nodes if budget.tree else budget.k
    columns = Columns(ids, vocab_size)
    candidates: list[Candidate] = []
    rows: dict[int, torch.Tensor] = {}  # slot (candidate + 1) -> draft distribution there, over the columns
    frontier, logits = [ROOT], root_logits.reshape(1, -1)
    for level in range(1, depth + 1):
        if level > 1:
            logits = expand(frontier, candidates)
        dist = _processed(logits, sampling)
        rows.update({parent + 1: row for parent, row in zip(frontier, dist)})
        _add_children(candidates, frontier, dist, width, sampled, generator, columns)
        extendable = [i for i, c in enumerate(candidates) if c.depth == level and c.q >= budget.min_draft_prob]
        if level == depth or not extendable:
            break
        frontier = sorted(extendable, key=lambda i: (-candidates[i].score, i))[:width]
    return _select(candidates, rows, max_nodes, sampled, columns, budget.tree)


@dataclass(frozen=True)
class Columns:
    """Which target id each column of a drafter's logits scores: ``ids[c]``, or c itself where ``ids`` is None."""

    ids: torch.Tensor | None
    vocab_size: int

    def tokens(self, columns: torch.Tensor) -> list[int]:
        return (columns if self.ids is None else self.ids[columns]).tolist()

    def spread(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` ``[n, W]`` over the whole vocabulary ``[n, vocab_size]``: every other id gets probability 0."""
        if self.ids is None and rows.shape[-1] == self.vocab_size:
            return rows
        full = rows.new_zeros(rows.shape[0], self.vocab_size)
        if self.ids is None:
            full[:, : rows.shape[-1]] = rows
            return full
        return full.index_copy_(1, self.ids, rows)

    def uniforms(self, width: int, generator: torch.Generator) -> torch.Tensor:
        """One U(0, 1) draw per column: a draw per target id, so a row's draws do not depend on the columns."""
        u = torch.rand(self.vocab_size, generator=generator)
        return u[:width] if self.ids is None else u[self.ids]


def distributions(logits: torch.Tensor, sampling: SamplingConfig, vocab_size: int) -> torch.Tensor:
    """The processed draft distribution ``[n, vocab_size]`` (softmax when greedy): a narrower draft vocabulary's
    missing ids are impossible (q = 0)."""
    return Columns(None, vocab_size).spread(_processed(logits, sampling))


def _processed(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The draft distribution over the logits' own columns, on the CPU: the softmax when greedy (what children are
    ranked by and q reports), else the sampler's processed distribution (what they are drawn from)."""
    logits = logits.float().cpu()
    return logits.softmax(-1) if sampling.greedy else probabilities(logits, sampling)


def _add_children(candidates: list[Candidate], frontier: list[int], dist: torch.Tensor, width: int, sampled: bool,
                  generator: torch.Generator, columns: Columns) -> None:
    """Each frontier node's ``width`` children (its row of ``dist``): the top-w, or for a sampled draft w draws without
    replacement in draw order (Gumbel top-k), each row's draws made in frontier order."""
    if sampled:
        chosen = [_drawn(row, width, generator, columns) for row in dist]
    elif width == 1:  # a chain: numpy's argmax is far cheaper than torch.topk over a large vocabulary on CPU
        chosen = [torch.tensor([column]) for column in argmax_rows(dist)]
    else:
        chosen = list(torch.topk(dist, min(width, dist.shape[-1]), dim=-1).indices)
    for parent, row, choice in zip(frontier, dist, chosen):
        base = 0.0 if parent == ROOT else candidates[parent].score
        depth = 1 if parent == ROOT else candidates[parent].depth + 1
        q = row[choice]
        for token, log_q, q_token in zip(columns.tokens(choice), q.clamp_min(1e-30).log().tolist(), q.tolist()):
            candidates.append(Candidate(token=token, parent=parent, depth=depth, score=base + log_q, q=q_token))


def _drawn(row: torch.Tensor, width: int, generator: torch.Generator, columns: Columns) -> torch.Tensor:
    support = int((row > 0).sum())
    u = columns.uniforms(row.shape[-1], generator).clamp_(1e-12, 1.0)
    keys = row.clamp_min(1e-30).log() - (-u.log()).log()
    keys = keys.masked_fill(row <= 0, float("-inf"))
    return torch.topk(keys, min(width, support)).indices  # draws without replacement, in draw order


def _select(candidates: list[Candidate], rows: dict[int, torch.Tensor], max_nodes: int, sampled: bool,
            columns: Columns, tree: bool) -> Grown:
    if sampled:
        kept = list(range(min(max_nodes, len(candidates))))
    else:
        kept = sorted(sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, i))[:max_nodes])
    new_index = {old: new for new, old in enumerate(kept)}
    q_rows = rows[0].new_zeros(len(kept) + 1, rows[0].shape[-1])
    q_rows[0] = rows[0]
    for old, new in new_index.items():
        if old + 1 in rows:
            q_rows[new + 1] = rows[old + 1]
    meta = {"pruned": _pruned(candidates, new_index)} if tree else {}
    draft = DraftTree(
        tokens=[candidates[i].token for i in kept],
        parents=[ROOT if candidates[i].parent == ROOT else new_index[candidates[i].parent] for i in kept],
        q_token=[candidates[i].q for i in kept],
        confidence=[math.exp(candidates[i].score) for i in kept],  # path product of draft probabilities
        q_dist=columns.spread(q_rows),
        sampled=sampled,
        meta=meta,
    )
    return Grown(draft, candidates, kept)


def _pruned(candidates: list[Candidate], new_index: dict[int, int]) -> list[dict]:
    """Drafted-then-dropped nodes, parents first: ``parent`` is a kept node (-1 = root) or None, and then
    ``pruned_parent`` indexes this list; ``confidence`` is the path product of draft probabilities."""
    out: list[dict] = []
    position: dict[int, int] = {}
    for index, c in enumerate(candidates):
        if index in new_index:
            continue
        position[index] = len(out)
        kept_parent = c.parent == ROOT or c.parent in new_index
        out.append({"token": c.token, "depth": c.depth, "q": c.q, "score": c.score,
                    "confidence": math.exp(c.score),
                    "parent": (ROOT if c.parent == ROOT else new_index[c.parent]) if kept_parent else None,
                    "pruned_parent": None if kept_parent else position[c.parent]})
    return out
