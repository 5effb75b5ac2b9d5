"""DDTree (liranringel/ddtree): a draft tree built from one block's per-position marginals, best first.

A block drafter scores every draft position in one forward, so it knows each position's marginal distribution but
not how a position depends on the tokens before it. DDTree treats the marginals as independent: a path of tokens
(t_1, ..., t_d) scores log q_1(t_1) + ... + log q_d(t_d), the log of the product of marginals. Only each
position's top ``width`` tokens are candidates. Nodes are expanded best first from a heap: popping a node adds it to
the tree and pushes its next sibling (the next-ranked token at the same depth under the same parent) and its first
child (the top token of the next position). Log-probabilities are at most 0, so a node never scores above its
parent or its previous sibling: pop order is topological and children come in rank order.

The tree is deterministic given the block (ties go to the earlier push), so verifying it with the engine's
deterministic-tree rule (draw from the target, descend while the draw is a child) is lossless.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch


@dataclass
class BlockTree:
    """The chosen nodes in topological order: token, parent (-1 = root), depth (1 = first draft position), the
    token's rank at its position (0 = top), and the path's score (sum of marginal log-probabilities)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    scores: list[float]

    @property
    def confidence(self) -> list[float]:
        """Each node's path product of marginals."""
        return [math.exp(score) for score in self.scores]


def top_candidates(log_q: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position (row of ``[positions, V]`` log-probabilities) the ``width`` best (log-probability, token),
    best first; ties go to the lower token id, as the engine's argmax does."""
    width = min(width, log_q.shape[-1])
    order = torch.sort(log_q.float(), dim=-1, descending=True, stable=True)
    return order.values[:, :width], order.indices[:, :width]


def build(top_logq: torch.Tensor, top_ids: torch.Tensor, max_nodes: int) -> BlockTree:
    """Best-first expansion over the ``[depth, width]`` candidates (``top_candidates``) up to ``max_nodes`` nodes.

    Candidates with log-probability -inf (outside the draft's top-k/top-p support) are never added.
    """
    depth, width = top_logq.shape
    logq, ids = top_logq.tolist(), top_ids.tolist()
    tree = BlockTree([], [], [], [], [])
    heap: list[tuple[float, int, int, int, int, float]] = []  # (-score, push order, position, rank, parent, base)
    pushes = 0

    def push(position: int, rank: int, parent: int, base: float) -> None:
        nonlocal pushes
        if position < depth and rank < width and logq[position][rank] > -math.inf:
            heapq.heappush(heap, (-(base + logq[position][rank]), pushes, position, rank, parent, base))
            pushes += 1

    push(0, 0, -1, 0.0)
    while heap and len(tree.tokens) < max_nodes:
        negative, _, position, rank, parent, base = heapq.heappop(heap)
        node = len(tree.tokens)
        tree.tokens.append(int(ids[position][rank]))
        tree.parents.append(parent)
        tree.depths.append(position + 1)
        tree.ranks.append(rank)
        tree.scores.append(-negative)
        push(position, rank + 1, parent, base)  # the next sibling
        push(position + 1, 0, node, -negative)  # the first child
    return tree
