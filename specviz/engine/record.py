"""Building a round's view record from what the round computed: a pure function, outside the timed round.

Views need more than the loop does: the target's and the draft's top-k per verified row, entropies, token texts.
The plain baseline turns ``detail`` off and pays only for the node probabilities.
"""

from __future__ import annotations

import torch

from specviz.engine.accept import Acceptance
from specviz.engine.round import Round, TokenChoice
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree


def build_round(target: Target, config, tree: DraftTree, logits: torch.Tensor, p_target: torch.Tensor | None,
                acceptance: Acceptance, committed: list[int], finished: bool, *, index: int, start: int) -> Round:
    """The ``Round`` for one propose → verify → accept → commit step (``config`` is the ``GenerationConfig``)."""
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
    if config.detail:
        k = config.top_k_report
        target_top = top_choices(target, display, k)
        entropy = (-(display * display.clamp_min(1e-30).log()).sum(-1)).tolist()
        if tree.q_dist is not None:
            draft_top = top_choices(target, tree.q_dist.float(), k)
        if acceptance.residual is not None:
            residual_top = top_choices(target, acceptance.residual[None], k)[0]
    return Round(
        index=index,
        start=start,
        tokens=list(tree.tokens),
        parents=list(tree.parents),
        text=target.pieces(tree.tokens) if config.detail else [],
        q_draft=None if tree.q_token is None else [float(q) for q in tree.q_token],
        confidence=None if tree.confidence is None else [float(c) for c in tree.confidence],
        sampled=tree.sampled,
        p_target=p_nodes,
        target_top=target_top,
        draft_top=draft_top,
        target_entropy=entropy,
        accepted=list(acceptance.path),
        extra_token=acceptance.extra_token,
        extra_text=target.piece(acceptance.extra_token) if config.detail else "",
        extra_kind=acceptance.extra_kind,
        committed=committed,
        committed_text=target.pieces(committed) if config.detail else [],
        draws=[d.to_dict() for d in acceptance.draws],
        residual_top=residual_top,
        rule=acceptance.rule,
        lossless=acceptance.lossless,
        draft_ms=0.0,
        verify_ms=0.0,
        other_ms=0.0,
        finished=finished,
        meta=_meta(target, tree.meta, config.detail),
    )


def _meta(target: Target, meta: dict, detail: bool) -> dict:
    """The draft's own notes, with the text of drafted-then-pruned nodes when views want detail."""
    out = dict(meta)
    if detail and meta.get("pruned"):
        out["pruned"] = [{**node, "text": target.piece(node["token"])} for node in meta["pruned"]]
    return out


def top_choices(target: Target, probs: torch.Tensor, k: int) -> list[list[TokenChoice]]:
    """The ``k`` most likely tokens of each row, with probabilities and display texts."""
    k = min(k, probs.shape[-1])
    if k == 0:
        return [[] for _ in range(probs.shape[0])]
    values, ids = torch.topk(probs, k, dim=-1)
    return [
        [TokenChoice(id=i, p=round(p, 6), text=target.piece(i)) for i, p in zip(id_row, p_row)]
        for id_row, p_row in zip(ids.tolist(), values.tolist())
    ]
