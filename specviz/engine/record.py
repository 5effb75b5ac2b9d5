"""Building a round's view record from what the round computed: a pure function, run after the round's forward
(its time counts in the round's overhead, ``other_ms``).

Views need more than the loop does: the target's and the draft's top-k per verified row, entropies, token texts.
The plain baseline turns ``detail`` off and pays only for the node probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.engine.accept import Acceptance
from specviz.engine.round import Round, TokenChoice
from specviz.engine.target import PIECE_CONTEXT, Target
from specviz.engine.tree import DraftTree


@dataclass
class Step:
    """What one round computed (the input of its view record) and where its time went, in seconds."""

    tree: DraftTree
    logits: torch.Tensor
    p_target: torch.Tensor | None
    acceptance: Acceptance
    committed: list[int]
    finished: bool
    draft_s: float
    verify_s: float
    other_s: float
    #: the committed text's last tokens before this round (the tree hangs off them): display texts depend on them
    before: list[int] = field(default_factory=list)


def build_round(target: Target, config, step: Step, *, index: int, start: int) -> Round:
    """The ``Round`` for one propose → verify → accept → commit step (``config`` is the ``GenerationConfig``; the
    loop imports this module, so it is not typed here)."""
    tree, logits, p_target, acceptance = step.tree, step.logits, step.p_target, step.acceptance
    committed = step.committed
    n = len(tree)
    display = None
    if p_target is not None:
        display = p_target
    elif n or config.detail:  # greedy: show the untempered softmax (the processed one is one-hot)
        display = logits.float().softmax(-1)  # one pass; log_softmax + exp costs far more on CPU
    p_nodes = []
    if n:
        parent_rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=logits.device)
        token_index = torch.tensor(tree.tokens, dtype=torch.long, device=logits.device)
        p_nodes = display[parent_rows, token_index].tolist()
    target_top, draft_top, entropy, residual_top = [], None, [], None
    contexts, texts, extra_text, committed_text = None, [], "", []
    if config.detail:  # display texts, each after the tokens it follows (emoji and CJK span several tokens)
        contexts = row_contexts(tree, step.before)
        extra_row = contexts[acceptance.path[-1] + 1] if acceptance.path else contexts[0]
        texts = [target.piece_after(contexts[p + 1], t) for t, p in zip(tree.tokens, tree.parents)]
        extra_text = target.piece_after(extra_row, acceptance.extra_token)
        committed_text = target.pieces(committed, before=step.before)
        k = config.top_k_report
        target_top = top_choices(target, display, k, contexts)
        entropy = (-(display * display.clamp_min(1e-30).log()).sum(-1)).tolist()
        if tree.q_dist is not None:
            draft_top = top_choices(target, tree.q_dist.float(), k, contexts)
        if acceptance.residual is not None:
            residual_top = top_choices(target, acceptance.residual[None], k, [extra_row])[0]
    return Round(
        index=index,
        start=start,
        tokens=list(tree.tokens),
        parents=list(tree.parents),
        text=texts,
        q_draft=None if tree.q_token is None else [float(q) for q in tree.q_token],
        confidence=None if tree.confidence is None else [float(c) for c in tree.confidence],
        sampled=tree.sampled,
        p_target=p_nodes,
        target_top=target_top,
        draft_top=draft_top,
        target_entropy=entropy,
        accepted=list(acceptance.path),
        extra_token=acceptance.extra_token,
        extra_text=extra_text,
        extra_kind=acceptance.extra_kind,
        committed=committed,
        committed_text=committed_text,
        draws=[d.to_dict() for d in acceptance.draws],
        residual_top=residual_top,
        rule=acceptance.rule,
        lossless=acceptance.lossless,
        draft_ms=step.draft_s * 1e3,
        verify_ms=step.verify_s * 1e3,
        other_ms=step.other_s * 1e3,
        finished=step.finished,
        meta=_meta(target, tree.meta, contexts),
    )


def row_contexts(tree: DraftTree, before: list[int]) -> list[list[int]]:
    """The last tokens before each verified row (row 0 follows ``before``, row ``i + 1`` follows node ``i``): what a
    token drafted or chosen at that row is displayed after (``Target.piece_after``)."""
    rows = [list(before[-PIECE_CONTEXT:])]
    for token, parent in zip(tree.tokens, tree.parents):
        rows.append([*rows[parent + 1], token][-PIECE_CONTEXT:])
    return rows


def _meta(target: Target, meta: dict, contexts: list[list[int]] | None) -> dict:
    """The draft's own notes, with the text of drafted-then-pruned nodes (after their kept or pruned parent) when
    views want detail (``contexts``: ``row_contexts``)."""
    out = dict(meta)
    if contexts is not None and meta.get("pruned"):
        pruned, after = [], []  # after[j]: the tokens pruned node j's children follow
        for node in meta["pruned"]:
            parent = node.get("parent")
            before = contexts[parent + 1] if parent is not None else after[node["pruned_parent"]]
            pruned.append({**node, "text": target.piece_after(before, node["token"])})
            after.append([*before, node["token"]][-PIECE_CONTEXT:])
        out["pruned"] = pruned
    return out


def top_choices(target: Target, probs: torch.Tensor, k: int, contexts: list[list[int]]) -> list[list[TokenChoice]]:
    """The ``k`` most likely tokens of each row, with probabilities and display texts (after ``contexts[row]``)."""
    k = min(k, probs.shape[-1])
    if k == 0:
        return [[] for _ in range(probs.shape[0])]
    values, ids = torch.topk(probs, k, dim=-1)
    return [
        [TokenChoice(id=i, p=round(p, 6), text=target.piece_after(before, i)) for i, p in zip(id_row, p_row)]
        for id_row, p_row, before in zip(ids.tolist(), values.tolist(), contexts)
    ]
