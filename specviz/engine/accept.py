"""Accept rules: given the target's verdict on every node, walk the tree and pick what to commit.

Every rule returns the accepted path (node indices from the root down), one extra token (a *correction* when the
walk stopped at a node whose children were all rejected, a *bonus* when it reached a leaf), and the draws it made
so the rejection debugger can show them.

- ``greedy`` (temperature 0): follow the target's argmax. Lossless: output equals plain greedy decoding.
- ``target-sampling`` (deterministic drafts: n-gram, argmax chains, top-w trees): draw y ~ p at the current node;
  descend into the child whose token is y, else emit y. Lossless because a deterministic proposal is a point mass,
  for which accepting child c with probability p(c) is exactly rejection sampling.
- ``rejection-sampling`` (drafts *drawn* from q, chain or tree): for each child in draw order accept with
  min(1, p/q); after a rejection p <- normalise(max(0, p - q)) and, since siblings are drawn without replacement,
  q(x) <- 0 renormalised (SpecInfer / Sequoia). A chain is the one-child case, i.e. Leviathan et al. 2023.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.engine import sampling
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree


@dataclass
class Draw:
    """One decision: at ``parent`` (-1 = root) the target chose ``target_token`` or a coin ``u`` met ``ratio``.

    ``p`` and ``q``: the target's and the draft's probability of the node's token that the coin was tested on; after a
    rejected sibling these are the residual's (p′ = norm(max(0, p − q)), q′ with the rejected tokens removed), which
    the round's own p and q rows do not show."""

    parent: int
    node: int | None
    accepted: bool
    target_token: int | None = None
    u: float | None = None
    ratio: float | None = None
    p: float | None = None
    q: float | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None or k == "node"}


@dataclass
class Acceptance:
    path: list[int]
    extra_token: int
    extra_kind: str  # "correction" or "bonus"
    rule: str
    draws: list[Draw] = field(default_factory=list)
    residual: torch.Tensor | None = None  # the distribution a correction was drawn from, when it is not p itself
    # Every rule here is lossless (see the module docstring); a lossy rule (e.g. typical acceptance) would set False,
    # and the views and the trace (``Round.lossless``) show it.
    lossless: bool = True


def choose_rule(tree: DraftTree, config: SamplingConfig) -> str:
    if config.greedy:
        return "greedy"
    return "rejection-sampling" if tree.sampled else "target-sampling"


def accept(
    tree: DraftTree,
    logits: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None,
    p_target: torch.Tensor | None = None,
) -> Acceptance:
    """Apply the rule that fits ``tree`` and ``config`` to the verify forward's ``[n + 1, V]`` logits.

    ``p_target`` (the processed distributions) may be passed when the caller already computed them.
    """
    rule = choose_rule(tree, config)
    if rule == "greedy":
        return walk_target_choice(tree, argmax_rows(logits), rule)
    probs = p_target if p_target is not None else sampling.probabilities(logits, config)
    if rule == "target-sampling":
        return walk_target_choice(tree, _LazyDraws(probs, generator), rule)
    return rejection_walk(tree, probs, generator)


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Row-wise argmax (first maximum on ties, like ``torch.argmax``).

    On CPU, numpy's vectorised argmax is much faster than ``torch.argmax`` over a 50k-entry vocabulary (torch 2.x),
    and at large k the argmaxes are a large part of a round's engine time (measured figures: BENCHMARKS.md).
    """
    if logits.device.type == "cpu":
        return logits.detach().float().numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


class _LazyDraws:
    """Sample the target at a row only when the walk gets there (saves draws on unreached nodes)."""

    def __init__(self, probs: torch.Tensor, generator: torch.Generator | None):
        self.probs, self.generator = probs, generator

    def __getitem__(self, row: int) -> int:
        return sampling.sample(self.probs[row], self.generator)


def walk_target_choice(tree: DraftTree, choice, rule: str) -> Acceptance:
    """Descend while the target's chosen token (``choice[row]``) is one of the children."""
    path: list[int] = []
    draws: list[Draw] = []
    node = ROOT
    while True:
        target_token = int(choice[node + 1])
        kids = tree.children[node]
        if not kids:
            return Acceptance(path, target_token, "bonus", rule, draws)
        match = next((c for c in kids if tree.tokens[c] == target_token), None)
        draws.append(Draw(parent=node, node=match, accepted=match is not None, target_token=target_token))
        if match is None:
            return Acceptance(path, target_token, "correction", rule, draws)
        path.append(match)
        node = match


def rejection_walk(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | None) -> Acceptance:
    """Recursive rejection sampling over children drawn from ``tree.q_dist`` without replacement."""
    assert tree.q_dist is not None
    path: list[int] = []
    draws: list[Draw] = []
    node = ROOT
    while True:
        kids = tree.children[node]
        p = p_target[node + 1]
        if not kids:
            return Acceptance(path, sampling.sample(p, generator), "bonus", "rejection-sampling", draws)
        q = tree.q_dist[node + 1].to(p.device, torch.float32)
        accepted_child = None
        for child in kids:
            token = tree.tokens[child]
            px, qx = float(p[token]), float(q[token])
            ratio = 1.0 if qx <= 0.0 else min(1.0, px / qx)
            u = sampling.uniform(generator)
            if u < ratio:
                accepted_child = child
                draws.append(Draw(parent=node, node=child, accepted=True, u=u, ratio=ratio, p=px, q=qx))
                break
            draws.append(Draw(parent=node, node=child, accepted=False, u=u, ratio=ratio, p=px, q=qx))
            p = sampling.residual(p, q)
            q = q.clone()
            q[token] = 0.0
            mass = float(q.sum())
            q = q / mass if mass > 0 else q
        if accepted_child is None:
            token = sampling.sample(p, generator)
            return Acceptance(path, token, "correction", "rejection-sampling", draws, residual=p)
        path.append(accepted_child)
        node = accepted_child
