"""Medusa-1 heads on the frozen target (``specviz train medusa``), and tree choices derived from their accuracy.

Head h reads the target's ``hidden_states[L]`` at position t and learns the target's distribution of x[t+2+h]
(its cached top-k at row t+1+h: soft cross-entropy plus a hard term on the argmax, EAGLE's ``_draft_vocab_loss``);
head losses are weighted 0.8^h (Medusa-1). Our heads share the target's output layer (Medusa-1's legacy
arrangement) and start from zero residual weights, so each head starts as the target's own next-token head.

**Tree choices.** The CLI evaluates held-out target answers through ``predict_argmax`` before it saves;
this trainer also records there every head's top-k hits against the target's own choices (the argmax of its
output layer on each cached feature), then ``save_pretrained`` derives the static tree with Medusa's recipe
(``derive_choices``: greedily the path with the largest product of per-head accuracies) and writes the
choices and the accuracy table into the heads' config. Saved without a held-out pass, it measures on the last
training sequences instead and says so in the config.

``--layers N``: residual blocks per head (default 1). Heads: 4 (``medusa_heads`` option).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path

import torch

from specviz.drafters import medusa
from specviz.errors import SpecvizError
from specviz.training.batches import Batch
from specviz.training.features import FeatureSet
from specviz.training.trainers.base import FeatureRequest, Trainer
from specviz.training.trainers.eagle import _draft_vocab_loss

DEFAULTS = {"medusa_heads": 4, "blocks": 1, "head_decay": 0.8, "hard_weight": 0.5, "tree_nodes": 24,
            "choice_topk": 10}
#: Training sequences measured for the tree when no held-out pass ran.
FALLBACK_SEQUENCES = 32


class MedusaTrainer(Trainer):
    """``specviz train medusa``: Medusa-1 heads, frozen target."""

    kind = "medusa"
    defaults = DEFAULTS

    def __init__(self, target, options: dict | None = None) -> None:
        super().__init__(target, options)
        options = options or {}
        if options.get("layers") is not None:
            self.opts["blocks"] = int(options["layers"])
        self.spec = medusa.spec_for(target.model, int(self.opts["medusa_heads"]), int(self.opts["blocks"]))
        self._hits: list[list[float]] | None = None  # summed per-head top-k hits of held-out passes
        self._counts: list[int] | None = None
        self._train: FeatureSet | None = None

    def features(self) -> FeatureRequest:
        return FeatureRequest(layers=(self.spec.feature_layer,), topk=8)

    def prepare(self, train: FeatureSet) -> None:
        self._train = train

    def build_student(self) -> medusa.MedusaHeads:
        return medusa.new_heads(self.target.model, self.spec.num_heads, self.spec.num_layers, std=0.0)

    def load_exported(self, folder: Path) -> medusa.MedusaHeads:
        return medusa.load_heads(folder, self.target.model)[0]

    def loss(self, student: medusa.MedusaHeads, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        ids = batch.input_ids
        vocab = torch.arange(self.spec.vocab_size, device=ids.device)
        states = student.states(batch.hidden[self.spec.feature_layer])  # [B, T, heads, H]
        length = ids.shape[1]
        total, weights, stats = 0.0, 0.0, {}
        for h in range(student.num_heads):
            span = length - 1 - h
            if span <= 0:
                break
            where = slice(1 + h, 1 + h + span)  # the target's distribution of x[t+2+h] sits at row t+1+h
            valid = batch.loss_mask[:, where] & batch.attention_mask[:, where].bool()
            if not valid.any():
                continue
            logits = student.head_logits(h, states[:, :span, h][valid])
            loss, agree = _draft_vocab_loss(logits, batch.topk_ids[:, where][valid], batch.topk_probs[:, where][valid],
                                            vocab, float(self.opts["hard_weight"]))
            weight = float(self.opts["head_decay"]) ** h
            total, weights = total + weight * loss, weights + weight
            stats[f"loss{h}"], stats[f"agree{h}"] = loss.item(), agree
        if not weights:
            raise SpecvizError("a training batch had no trainable positions")
        loss = total / weights
        stats["loss"], stats["agree"] = loss.item(), stats.get("agree0", 0.0)
        return loss, stats

    @torch.no_grad()
    def predict_argmax(self, student: medusa.MedusaHeads, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Head 0: entry j is its guess for token j + 1 (from the feature of position j - 1). Also records every
        head's top-k hits on this sequence for the tree choices."""
        if not hidden:
            raise SpecvizError("Medusa heads predict from the target's hidden states; none were given")
        features = hidden[self.spec.feature_layer][0]
        logits = student(features)  # [T, heads, V]
        self._record(student, features, logits)
        guesses = logits[:-1, 0].argmax(-1)
        return torch.cat([torch.full((1,), -1, dtype=torch.long), guesses.cpu()])

    def _record(self, student: medusa.MedusaHeads, features: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        """Add this sequence's per-head top-k hits against the target's choices (its argmax on each feature)."""
        output = student.borrowed.output
        chosen = output(features.to(output.weight.dtype)).argmax(-1)
        accuracy, counts = head_accuracy(student, features, chosen, topk=int(self.opts["choice_topk"]),
                                         logits=logits)
        hits = [[a * c for a in row] for row, c in zip(accuracy, counts)]
        if self._hits is None:
            self._hits, self._counts = hits, counts
            return
        self._hits = [[a + b for a, b in zip(x, y)] for x, y in zip(self._hits, hits)]
        self._counts = [a + b for a, b in zip(self._counts, counts)]

    def tree_choices(self, student: medusa.MedusaHeads) -> tuple[medusa.Choices, list[list[float]], str]:
        """(choices, accuracy[h][r], where it was measured): held-out passes if any ran, else training text."""
        measured = "held-out target answers"
        if self._hits is None:
            if (self._train is None or not self._train.num_sequences
                    or self.spec.feature_layer not in self._train.hidden):
                raise SpecvizError("no held-out pass and no training features to measure the heads' accuracy on")
            measured = "training answers (no held-out pass ran)"
            hidden = self._train.hidden[self.spec.feature_layer]
            for i in range(max(0, self._train.num_sequences - FALLBACK_SEQUENCES), self._train.num_sequences):
                self._record(student, hidden[self._train.sequence(i)].float())
        accuracy = [[hit / max(1, count) for hit in row] for row, count in zip(self._hits, self._counts)]
        return derive_choices(accuracy, int(self.opts["tree_nodes"])), accuracy, measured

    def describe_student(self, student: medusa.MedusaHeads) -> dict:
        return student.spec.to_dict()

    def save_pretrained(self, student: medusa.MedusaHeads, folder: Path, *,
                        dtype: torch.dtype = torch.float32) -> None:
        choices, accuracy, measured = self.tree_choices(student)
        extra = {"medusa_head_accuracy": [[round(a, 5) for a in row] for row in accuracy],
                 "medusa_accuracy_measured_on": measured}
        medusa.save_heads(student.to(dtype), folder, target_name=self.options.get("target_name", "target"),
                          choices=choices, extra=extra)
        student.float()


def derive_choices(accuracy: Sequence[Sequence[float]], nodes: int) -> medusa.Choices:
    """Medusa's recipe: greedily add the path whose product of per-head accuracies is largest (``accuracy[h][r]``:
    how often head h's rank-r token was the right one on held-out text); parents always come first."""
    heads = len(accuracy)
    if not heads or nodes < 1:
        return ()
    frontier = [(-float(accuracy[0][r]), (r,)) for r in range(len(accuracy[0]))]
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < nodes:
        score, path = heapq.heappop(frontier)
        chosen.append(path)
        depth = len(path)
        if depth < heads:
            for rank, hit in enumerate(accuracy[depth]):
                heapq.heappush(frontier, (score * float(hit), path + (rank,)))
    return tuple(chosen)


@torch.no_grad()
def head_accuracy(heads: medusa.MedusaHeads, features: torch.Tensor, chosen: torch.Tensor,
                  valid: torch.Tensor | None = None, topk: int = 10,
                  logits: torch.Tensor | None = None) -> tuple[list[list[float]], list[int]]:
    """Per-head top-k accuracy on a known sequence: ``features`` ``[T, H]`` of positions 0..T-1, ``chosen``
    ``[T]`` the target's choice after each position (its argmax there), ``valid`` ``[T]`` which choices count.

    Head h on the feature of position t drafts the token after position t + 1 + h; it is right at rank r when
    its rank-r token is ``chosen[t + 1 + h]``. ``logits``: ``heads(features)`` when the caller has them already.
    Returns (accuracy[h][r], positions counted per head)."""
    valid = torch.ones_like(chosen, dtype=torch.bool) if valid is None else valid
    logits = heads(features) if logits is None else logits
    top = logits.topk(topk, dim=-1).indices  # [T, heads, k]
    accuracy, counts = [], []
    length = features.shape[0]
    for h in range(heads.num_heads):
        span = max(0, length - 1 - h)
        target, ok = chosen[1 + h: 1 + h + span], valid[1 + h: 1 + h + span]
        hits = (top[:span, h] == target[:, None]) & ok[:, None]
        total = int(ok.sum())
        counts.append(total)
        accuracy.append((hits.sum(0).float() / max(1, total)).tolist())
    return accuracy, counts
