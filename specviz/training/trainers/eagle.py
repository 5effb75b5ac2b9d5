"""EAGLE-1 and EAGLE-3 heads trained on the frozen target's cached hidden states, with training-time test.

The head pairs the target feature of position t with the next token x[t+1] and learns the target's distribution
of x[t+2] (soft cross-entropy to the cached top-k, renormalised over the head's draft vocabulary, plus a hard term
on the target's argmax, which is what greedy verification accepts).

**Training-time test** (EAGLE-3): at draft time every step after the first is fed the head's own output instead of
a target feature, so training unrolls ``steps`` such steps. Step i at index t continues step i - 1 at index t:
its input is the previous step's output there with the true token x[t+1+i], at position t + i, and it learns the
target's distribution of x[t+2+i]. Attention matches drafting: step i at index t sees the real-feature entries
(step 0) at indices <= t and its own chain's entries of steps 1..i at index t, and nothing else. Step losses are
weighted 0.8^i.

EAGLE-3's draft vocabulary is the ``draft_vocab`` most frequent tokens of the training data (``d2t``); the head's
output rows are the target's output rows at those ids (borrowed, not trained).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.drafters import eagle
from specviz.errors import SpecvizError
from specviz.training.batches import Batch
from specviz.training.features import FeatureSet
from specviz.training.trainers.base import FeatureRequest, Trainer

DEFAULTS = {"ttt_steps": 3, "step_decay": 0.8, "hard_weight": 0.5, "draft_vocab": 16384}


class EagleTrainer(Trainer):
    """``specviz train eagle`` (EAGLE-1) and ``specviz train eagle3`` (EAGLE-3)."""

    kind = "eagle"
    defaults = DEFAULTS

    def __init__(self, target, options: dict | None = None) -> None:
        super().__init__(target, options)
        self.spec = eagle.spec_for(target.model, self.kind)
        self._draft_ids: torch.Tensor | None = None
        self._t2d: torch.Tensor | None = None

    def features(self) -> FeatureRequest:
        return FeatureRequest(layers=tuple(self.spec.feature_layers), topk=8)

    def prepare(self, train: FeatureSet) -> None:
        """EAGLE-3: the draft vocabulary from token frequencies in the training data (EAGLE-1 drafts from all)."""
        if self.kind != "eagle3":
            return
        counts = torch.bincount(train.input_ids, minlength=self.spec.vocab_size).float()
        top = train.topk_ids[:, 0]
        counts += torch.bincount(top[top >= 0], minlength=self.spec.vocab_size).float()
        size = min(int(self.opts["draft_vocab"]), self.spec.vocab_size)
        self._draft_ids = draft_ids_from_counts(counts, size)

    def build_student(self) -> eagle.EagleHead:
        if self.kind == "eagle3" and self._draft_ids is None:
            raise SpecvizError("the EAGLE-3 trainer needs prepare(train set) before build_student")
        head = eagle.new_head(self.target.model, self.kind, draft_ids=self._draft_ids, seed=0)
        self.resumed(head)
        return head

    def resumed(self, student: eagle.EagleHead) -> None:
        """The loss's target → draft id map, from the head's own draft vocabulary (a checkpoint's, on resume)."""
        ids = student.draft_ids()
        if ids is None:
            self._t2d = torch.arange(self.spec.vocab_size)
            return
        t2d = torch.full((self.spec.vocab_size,), -1, dtype=torch.long)
        t2d[ids.cpu()] = torch.arange(ids.numel())
        self._t2d = t2d

    def _features(self, head: eagle.EagleHead, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        return torch.cat([hidden[layer] for layer in head.feature_layers], dim=-1)

    def load_exported(self, folder: Path) -> eagle.EagleHead:
        return eagle.load_head(folder, self.target.model, kind=self.kind)

    def loss(self, student: eagle.EagleHead, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        ids = batch.input_ids
        length = ids.shape[1] - 1
        t2d = self._t2d.to(ids.device)
        outs = unroll(student, self._features(student, batch.hidden), ids, int(self.opts["ttt_steps"]))
        total, weights, stats = 0.0, 0.0, {}
        for step, out in enumerate(outs):
            span = length - step  # indices t with a target for x[t+2+step]
            where = slice(1 + step, 1 + step + span)  # the target's distribution of x[t+2+step] sits at t+1+step
            valid = batch.loss_mask[:, where] & batch.attention_mask[:, where].bool()
            if not valid.any():
                continue
            logits = student.logits(out[:, :span])[valid]
            loss, agree = _draft_vocab_loss(logits, batch.topk_ids[:, where][valid], batch.topk_probs[:, where][valid],
                                            t2d, self.opts["hard_weight"])
            weight = float(self.opts["step_decay"]) ** step
            total, weights = total + weight * loss, weights + weight
            stats[f"loss{step}"], stats[f"agree{step}"] = loss.item(), agree
        if not weights:
            raise SpecvizError("a training batch had no trainable positions")
        loss = total / weights
        stats["loss"] = loss.item()
        stats["agree"] = stats.get("agree0", 0.0)
        return loss, stats

    @torch.no_grad()
    def predict_argmax(self, student: eagle.EagleHead, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Teacher-forced first-step argmax: entry j is the head's guess for token j + 1 (from the pair at j - 1)."""
        if not hidden:
            raise SpecvizError("EAGLE heads predict from the target's hidden states; none were given")
        features = self._features(student, hidden)
        length = input_ids.shape[1] - 1
        out = student(features[:, :-1], input_ids[:, 1:], torch.arange(length))
        draft = student.logits(out)[0].argmax(-1)
        ids = student.draft_ids()
        guesses = draft if ids is None else ids.to(draft.device)[draft]
        return torch.cat([torch.full((1,), -1, dtype=torch.long), guesses.cpu()])

    def describe_student(self, student: eagle.EagleHead) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(student.spec).items()}

    def save_pretrained(self, student: eagle.EagleHead, folder: Path, *, dtype: torch.dtype = torch.float32) -> None:
        eagle.save_head(student.to(dtype), folder, target_name=self.options.get("target_name", "target"))
        student.float()


class Eagle3Trainer(EagleTrainer):
    kind = "eagle3"


def unroll(head: eagle.EagleHead, features: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Training-time test over a batch: ``unroll_steps`` on the pairs (f[t], x[t+1]) of ``features`` ``[B, T, F]``
    and ``ids`` ``[B, T]``; step i's output at index t is trained on the target's distribution of x[t+2+i].

    Tokens past the sequence end are padding; the positions that read them carry no loss.
    """
    steps = min(steps, ids.shape[1] - 1)
    return unroll_steps(head, features[:, :-1], F.pad(ids[:, 1:], (0, steps - 1)), steps)


def unroll_steps(head: eagle.EagleHead, features: torch.Tensor, token_ids: torch.Tensor,
                 steps: int) -> list[torch.Tensor]:
    """Training-time test (EAGLE-3): ``steps`` head steps over a teacher-forced sequence, each step after the
    first fed the previous step's ``next_hidden``, exactly as drafting feeds deeper tree levels.

    ``features``: ``[B, T, F]`` target features of positions 0..T-1; ``token_ids``: ``[B, T + steps - 1]``, the
    tokens x[1], x[2], ... (step i at position t reads x[t+1+i], at RoPE position t+i). Returns one ``[B, T, H]``
    output per step; step i's output at position t predicts x[t+2+i] (through ``logits``). Attention: step 0 is
    causal over step 0; step i > 0 also sees, at each position, that position's keys of steps 1..i (its draft
    ancestors), as ``ttt_mask`` says.
    """
    length = features.shape[1]
    if token_ids.shape[1] != length + steps - 1:
        raise SpecvizError(f"unroll over {length} positions and {steps} steps needs {length + steps - 1} tokens, "
                           f"got {token_ids.shape[1]}")
    keys = _StackedKV()
    positions = torch.arange(length, device=features.device)
    outputs, hidden = [], features
    for step in range(steps):
        out = head(hidden, token_ids[:, step: step + length], positions + step, from_target=step == 0,
                   cache=keys, mask=ttt_mask(length, step, device=features.device))
        outputs.append(out)
        hidden = head.next_hidden(out)
    return outputs


def ttt_mask(length: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[T, T * (step + 1)]`` visibility of training-time-test step ``step``: causal over step 0's keys, then each
    position's own keys of steps 1..step (a draft node sees the committed prefix and its ancestors)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


class _StackedKV:
    """Keys and values of successive unrolled steps side by side (``ttt_mask``'s column order); keeps gradients."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int = 0):
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=-2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


def draft_ids_from_counts(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent target ids (ties: lower id), sorted by id as EAGLE-3's ``d2t`` expects."""
    if not 1 <= size <= counts.numel():
        raise SpecvizError(f"draft vocabulary size must be in [1, {counts.numel()}], got {size}")
    order = sorted(range(counts.numel()), key=lambda i: (-float(counts[i]), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def _draft_vocab_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor, t2d: torch.Tensor,
                      hard_weight: float) -> tuple[torch.Tensor, float]:
    """Soft CE to the target's top-k restricted to the draft vocabulary, plus CE on its argmax where it is in it."""
    logq = F.log_softmax(logits.float(), dim=-1)
    draft = torch.where(topk_ids >= 0, t2d[topk_ids.clamp(min=0)], torch.full_like(topk_ids, -1))
    probs = topk_probs * (draft >= 0)
    mass = probs.sum(-1, keepdim=True)
    soft = -((probs / mass.clamp(min=1e-8)) * logq.gather(1, draft.clamp(min=0))).sum(-1)
    has_soft = mass[:, 0] > 0
    has_hard = draft[:, 0] >= 0
    hard = -logq.gather(1, draft[:, :1].clamp(min=0)).squeeze(1)
    per_position = torch.where(has_soft, soft, 0.0) + hard_weight * torch.where(has_hard, hard, 0.0)
    loss = per_position.sum() / has_soft.sum().clamp(min=1)
    with torch.no_grad():
        agree = (logits.argmax(-1) == draft[:, 0]).float().mean().item()
    return loss, agree
