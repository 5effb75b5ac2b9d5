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
         generator: torch.Generator, vocab_size: int, stochastic_tree: bool = False) -> Grown:
    """Draft a chain (``budget.tree`` false) or a dynamic tree from the root's logits ``[1, V]``."""
    sampled = not sampling.greedy and (not budget.tree or stochastic_tree)
    width = budget.width if budget.tree else 1
    depth = budget.depth if budget.tree else budget.k
    max_nodes = budget.max_nodes if budget.tree else budget.k
    candidates: list[Candidate] = []
    rows: dict[int, torch.Tensor] = {}  # slot (candidate + 1) -> draft distribution there
    frontier, logits = [ROOT], root_logits.reshape(1, -1)
    for level in range(1, depth + 1):
        if level > 1:
            logits = expand(frontier, candidates)
        for parent, row in zip(frontier, logits):
            dist, rank = distributions(row[None], sampling, vocab_size)
            rows[parent + 1] = dist[0]
            _add_children(candidates, parent, rank[0], dist[0], width, sampled, generator)
        extendable = [i for i, c in enumerate(candidates) if c.depth == level and c.q >= budget.min_draft_prob]
        if level == depth or not extendable:
            break
        frontier = sorted(extendable, key=lambda i: (-candidates[i].score, i))[:width]
    return _select(candidates, rows, max_nodes, sampled, vocab_size, budget.tree)


def distributions(logits: torch.Tensor, sampling: SamplingConfig, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, rank): the processed draft distribution, and what children are ranked by (softmax when greedy)."""
    if logits.shape[-1] < vocab_size:  # a narrower draft vocabulary: the missing ids are impossible (q = 0)
        pad = torch.full((*logits.shape[:-1], vocab_size - logits.shape[-1]), float("-inf"), device=logits.device)
        logits = torch.cat([logits, pad], dim=-1)
    logits = logits.float().cpu()
    if sampling.greedy:
        soft = logits.softmax(-1)
        return soft, soft
    q = probabilities(logits, sampling)
    return q, q


def _add_children(candidates: list[Candidate], parent: int, rank: torch.Tensor, dist: torch.Tensor, width: int,
                  sampled: bool, generator: torch.Generator) -> None:
    base = 0.0 if parent == ROOT else candidates[parent].score
    depth = 1 if parent == ROOT else candidates[parent].depth + 1
    if sampled:
        support = int((dist > 0).sum())
        u = torch.rand(dist.shape, generator=generator).clamp_(1e-12, 1.0)
        keys = dist.clamp_min(1e-30).log() - (-u.log()).log()
        keys = keys.masked_fill(dist <= 0, float("-inf"))
        choice = torch.topk(keys, min(width, support)).indices  # draws without replacement, in draw order
    elif width == 1:  # a chain: numpy's argmax is far cheaper than torch.topk over a large vocabulary on CPU
        choice = torch.tensor(argmax_rows(rank[None]))
    else:
        choice = torch.topk(rank, min(width, rank.shape[-1])).indices
    log_rank = rank[choice].clamp_min(1e-30).log()
    for token, log_p in zip(choice.tolist(), log_rank.tolist()):
        candidates.append(Candidate(token=token, parent=parent, depth=depth, score=base + log_p,
                                    q=float(dist[token])))


def _select(candidates: list[Candidate], rows: dict[int, torch.Tensor], max_nodes: int, sampled: bool,
            vocab_size: int, tree: bool) -> Grown:
    if sampled:
        kept = list(range(min(max_nodes, len(candidates))))
    else:
        kept = sorted(sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, i))[:max_nodes])
    new_index = {old: new for new, old in enumerate(kept)}
    q_dist = torch.zeros(len(kept) + 1, vocab_size)
    q_dist[0] = rows[0]
    for old, new in new_index.items():
        if old + 1 in rows:
            q_dist[new + 1] = rows[old + 1]
    meta = {"pruned": _pruned(candidates, new_index)} if tree else {}
    draft = DraftTree(
        tokens=[candidates[i].token for i in kept],
        parents=[ROOT if candidates[i].parent == ROOT else new_index[candidates[i].parent] for i in kept],
        q_token=[candidates[i].q for i in kept],
        confidence=[math.exp(candidates[i].score) for i in kept],  # path product of draft probabilities
        q_dist=q_dist,
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
