"""Distillation losses shared by trainers: soft cross-entropy to the target's top-k plus hard CE on its argmax."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distill_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor, labels: torch.Tensor,
                 *, hard_weight: float = 0.5) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss over selected positions: logits [P, V], topk_ids/probs [P, k] (-1 = no target output), labels [P].

    With target outputs: ``-Σ p̂_i log q(i)`` over the renormalised top-k (p̂) plus ``hard_weight`` × CE on the
    target's argmax, which is the token greedy verification accepts. Without: CE on the text's next token.
    """
    logq = F.log_softmax(logits.float(), dim=-1)
    has_target = topk_ids[:, 0] >= 0
    hard_label = torch.where(has_target, topk_ids[:, 0].clamp(min=0), labels)
    hard = -logq.gather(1, hard_label[:, None]).squeeze(1)
    probs = topk_probs * (topk_ids >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-8)
    soft = -(probs * logq.gather(1, topk_ids.clamp(min=0))).sum(-1)
    per_position = torch.where(has_target, soft + hard_weight * hard, hard)
    loss = per_position.mean()
    with torch.no_grad():
        agree = (logits.argmax(-1) == hard_label).float().mean().item()
    return loss, {"loss": loss.item(), "hard_ce": hard.mean().item(), "agree": agree}
