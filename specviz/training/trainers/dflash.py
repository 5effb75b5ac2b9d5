"""DFlash and DSpark block drafters trained on the frozen target's cached hidden states.

Per training sequence, ``anchors`` positions are sampled among the trained ones. Each anchor a gets the block
drafting builds, [x_a, mask, ...] at positions a .. a + b - 1, and sees what drafting after committed position a
sees: the injected context of positions < a and its own block, non-causally (``forward_blocks``, one
forward for all blocks). Draft j (0-based) predicts the token at a + 1 + j, whose target distribution is the cached
top-k at position a + j.

Losses, each weighted per draft position by exp(-j / gamma) (DFlash's position decay; gamma = round((b + 5) / 3)
gives SpecForge's 7 for blocks of 16, 5 for 10 and 4 for 8, and DeepSpec's 4 for DSpark's 7):

- **DFlash**: cross-entropy to the target's top-k, renormalised.
- **DSpark**: the Markov head teacher-forced on the true previous token (x_a for the first draft, the true token
  before each later one), then 0.1 x that cross-entropy + 0.9 x the total variation ½‖p − q‖₁ between the target's
  distribution p and the corrected draft q, plus binary cross-entropy of the confidence head against the exact
  per-step acceptance rate of rejection sampling, 1 − ½‖p − q‖₁.

Only the target's top 8 are cached, so ‖p − q‖₁ lumps everything outside them into one "rest" bucket:
Σ_{top 8} |p_i − q_i| + |p(rest) − q(rest)|, with p(rest) = 1 − Σ_{top 8} p_i. By the triangle inequality this is
a lower bound on the true distance, exact when p has no mass outside its top 8 or q spreads its rest like p does;
the confidence target 1 − ½(...) is correspondingly an upper bound on the true acceptance rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.drafters import dflash
from specviz.errors import SpecvizError
from specviz.training.batches import Batch, make_batch
from specviz.training.features import FeatureSet
from specviz.training.trainers.base import FeatureRequest, Trainer

DEFAULTS = {"block_size": None, "layers": 1, "anchors": 16, "markov_rank": 64, "mask_token_id": None,
            "ce_weight": 0.1, "tv_weight": 0.9, "confidence_weight": 1.0}


#: Positions of a held-out answer the calibration reads (its last ones: the answer).
CALIBRATION_WINDOW = 512


def position_gamma(block_size: int) -> float:
    """DFlash's decay constant by block size: 7 for 16, 5 for 10, 4 for 8 (and 4 for DSpark's 7)."""
    return float(round((block_size + 5) / 3))


def position_weights(draft_index: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each draft's loss weight exp(−j / γ) for its 0-based index j (the k-th draft: exp(−(k − 1) / γ)), γ =
    ``position_gamma(block_size)``."""
    return torch.exp(-draft_index / position_gamma(block_size))


def confidence_target(tv: torch.Tensor) -> torch.Tensor:
    """What the confidence head learns, per draft: the exact per-step acceptance rate of rejection sampling,
    1 − ½‖p − q‖₁ (``total_variation``), clamped to [0, 1] and without gradient."""
    return (1 - tv).detach().clamp(0, 1)


def confidence_loss(confidence: torch.Tensor, tv: torch.Tensor) -> torch.Tensor:
    """Per-draft binary cross-entropy of the confidence head's c (kept within [1e-6, 1 − 1e-6]) against
    ``confidence_target(tv)``."""
    return F.binary_cross_entropy(confidence.clamp(1e-6, 1 - 1e-6), confidence_target(tv), reduction="none")


class DFlashTrainer(Trainer):
    """``specviz train dflash`` (and, through ``DSparkTrainer``, ``specviz train dspark``)."""

    kind = "dflash"
    defaults = DEFAULTS

    def __init__(self, target, options: dict | None = None) -> None:
        super().__init__(target, options)
        mask = self.opts["mask_token_id"]
        if mask is None:
            mask = dflash.mask_token_for(target.tokenizer)
        self.model_options = dict(mask_token_id=int(mask), block_size=self.opts["block_size"],
                                  num_layers=int(self.opts["layers"]), markov_rank=int(self.opts["markov_rank"]))
        self.spec = dflash.spec_for(target.model, self.kind, **self.model_options)

    def features(self) -> FeatureRequest:
        return FeatureRequest(layers=tuple(self.spec.feature_layers), topk=8)

    def build_student(self) -> dflash.DFlashBackbone:
        return dflash.new_model(self.target.model, self.kind, seed=0, **self.model_options)

    def describe_student(self, student: dflash.DFlashBackbone) -> dict:
        return student.spec.to_dict()

    def load_exported(self, folder: Path) -> dflash.DFlashBackbone:
        return dflash.load_drafter(folder, self.target.model, kind=self.kind)

    def loss(self, student: dflash.DFlashBackbone, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        anchors, usable = sample_anchors(batch, int(self.opts["anchors"]))
        out = block_outputs(student, batch, anchors, usable)
        if not len(out.logits):
            raise SpecvizError("a training batch had no trainable draft position")
        weight = position_weights(out.draft_index, student.spec.block_size)
        logq = F.log_softmax(out.logits.float(), dim=-1)
        ce = _mean(_soft_cross_entropy(logq, out.top_ids, out.top_p), weight)
        stats = {"ce": ce.item()}
        with torch.no_grad():
            hits = out.logits.argmax(-1) == out.top_ids[:, 0]
            stats["agree"] = hits.float().mean().item()
            first = out.draft_index == 0
            stats["agree0"] = hits[first].float().mean().item() if first.any() else 0.0
        if self.kind == "dflash":
            loss = ce
        else:
            tv = total_variation(logq.exp(), out.top_ids, out.top_p)
            loss = self.opts["ce_weight"] * ce + self.opts["tv_weight"] * _mean(tv, weight)
            stats["tv"] = _mean(tv, weight).item()
            if out.confidence is not None:
                bce = confidence_loss(out.confidence, tv)
                loss = loss + self.opts["confidence_weight"] * _mean(bce, weight)
                stats["bce"] = _mean(bce, weight).item()
        stats["loss"] = loss.item()
        return loss, stats

    @torch.no_grad()
    def predict_argmax(self, student: dflash.DFlashBackbone, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Teacher-forced first drafts: entry a is the first draft of the block anchored at a (x_a pending, the target's
        features of positions < a injected), the drafter's guess for token a + 1, as ``evaluate_agreement`` compares
        it with the target's argmax at a. The last position has no next token: -1."""
        if not hidden:
            raise SpecvizError("block drafters predict from the target's hidden states; none were given")
        length = input_ids.shape[1]
        features = torch.cat([hidden[layer] for layer in student.feature_layers], dim=-1)
        anchors = torch.arange(length - 1, device=input_ids.device)[None]
        first = forward_blocks(student, features, input_ids, anchors)[:, :, 0]
        logits = student.logits(first).float()
        bias = student.markov_bias(input_ids[:, : length - 1])
        if bias is not None:
            logits = logits + bias.float()
        return torch.cat([logits[0].argmax(-1).cpu(), torch.full((1,), -1, dtype=torch.long)])

    @torch.no_grad()
    def heldout_metrics(self, student: dflash.DFlashBackbone, heldout: FeatureSet) -> dict:
        """DSpark's confidence head against what happened: every block anchored at a trained position of each held-out
        answer, the Markov head on the true previous tokens (as after accepted drafts). ``confidence_ece`` compares c
        with greedy acceptance (draft argmax == target argmax), ``confidence_ece_sampled`` with the acceptance rate
        of rejection sampling 1 − ½‖p − q‖₁ (the training target; top-8 lumped, so an upper bound)."""
        if student.confidence_head is None:
            return {}
        predicted, greedy, sampled = [], [], []
        for i in range(heldout.num_sequences):
            batch = make_batch(heldout, [i], CALIBRATION_WINDOW)
            anchors = torch.nonzero(batch.loss_mask[0, 1:]).flatten()[None] + 1
            if not anchors.numel():
                continue
            out = block_outputs(student, batch, anchors)
            predicted.append(out.confidence.float())
            greedy.append((out.logits.argmax(-1) == out.top_ids[:, 0]).float())
            sampled.append(1 - total_variation(out.logits.float().softmax(-1), out.top_ids, out.top_p))
        if not predicted:
            return {}
        c, hit, rate = torch.cat(predicted), torch.cat(greedy), torch.cat(sampled)
        return {"confidence_ece": expected_calibration_error(c, hit),
                "confidence_ece_sampled": expected_calibration_error(c, rate),
                "confidence_mean": float(c.mean()), "greedy_acceptance_mean": float(hit.mean()),
                "confidence_positions": int(c.numel())}

    def save_pretrained(self, student: dflash.DFlashBackbone, folder: Path, *,
                        dtype: torch.dtype = torch.float32) -> None:
        dflash.save_drafter(student.to(dtype), folder, target_name=self.options.get("target_name", "target"))
        student.float()


class DSparkTrainer(DFlashTrainer):
    kind = "dspark"


@dataclass
class BlockOutputs:
    """The trainable draft positions of a batch's blocks, flattened to P rows: the corrected logits ``[P, V]``, the
    target's top-k there ``[P, k]``, each row's draft index j, and the confidence head's c ``[P]`` (or None)."""

    logits: torch.Tensor
    top_ids: torch.Tensor
    top_p: torch.Tensor
    draft_index: torch.Tensor
    confidence: torch.Tensor | None


def sample_anchors(batch: Batch, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` distinct anchors per sequence among the trained positions a >= 1 (``[B, count]``) and whether each
    is real (a sequence with fewer trained positions repeats one, marked unusable)."""
    candidates = batch.loss_mask.clone()
    candidates[:, 0] = False
    scores = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, -1.0)
    count = min(count, candidates.shape[1])
    values, anchors = scores.topk(count, dim=1)
    return anchors, values >= 0


def forward_blocks(model: dflash.DFlashBackbone, features: torch.Tensor, input_ids: torch.Tensor,
                   anchors: torch.Tensor) -> torch.Tensor:
    """Training's view of drafting: one block per anchor, all in one forward.

    ``features``: ``[B, L, layers x H]`` target features of positions 0..L-1; ``input_ids``: ``[B, L]``;
    ``anchors``: ``[B, A]`` anchor positions (each < L). Block m is [x_{a_m}, mask ...] at positions
    a_m .. a_m + b - 1 and sees the context positions < a_m and its own block, exactly what drafting after
    committed position a_m sees. Returns ``[B, A, drafts, H]``: draft j of block m predicts the token at
    a_m + 1 + j.
    """
    spec, (batch, count) = model.spec, anchors.shape
    size, length, device = spec.block_size, features.shape[1], features.device
    offsets = torch.arange(size, device=device)
    block_ids = torch.full((batch, count, size), spec.mask_token_id, dtype=torch.long, device=device)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    block_positions = (anchors[..., None] + offsets).reshape(batch, -1)
    sees_context = torch.arange(length, device=device) < anchors[..., None]  # [B, A, L]
    owner = torch.arange(count, device=device).repeat_interleave(size)
    sees_block = owner[:, None] == owner[None, :]  # [A*b, A*b]
    mask = torch.cat([sees_context.repeat_interleave(size, dim=1),
                      sees_block.expand(batch, -1, -1)], dim=2)[:, None]
    out = model(features, block_ids.reshape(batch, -1), torch.arange(length, device=device), block_positions,
                mask=mask)
    return out.reshape(batch, count, size, -1)[:, :, spec.first_output:]


def block_outputs(student: dflash.DFlashBackbone, batch: Batch, anchors: torch.Tensor,
                  usable: torch.Tensor | None = None) -> BlockOutputs:
    """Run the blocks at ``anchors`` (``[B, A]``; ``usable`` marks the real ones) and gather, for every draft whose
    target distribution is known, what the losses compare; the Markov head is teacher-forced on the true tokens."""
    spec = student.spec
    ids = batch.input_ids
    batch_size, length = ids.shape
    features = torch.cat([batch.hidden[layer] for layer in spec.feature_layers], dim=-1)
    hidden = forward_blocks(student, features, ids, anchors)  # [B, A, drafts, H]
    steps = torch.arange(spec.drafts, device=ids.device)
    where = anchors[..., None] + steps  # draft j's target distribution sits at a + j
    flat = where.clamp(max=length - 1).reshape(batch_size, -1)
    k = batch.topk_ids.shape[-1]
    top_ids = batch.topk_ids.gather(1, flat[..., None].expand(-1, -1, k)).reshape(*where.shape, k)
    top_p = batch.topk_probs.gather(1, flat[..., None].expand(-1, -1, k)).reshape(*where.shape, k)
    keep = (where < length) & batch.loss_mask.gather(1, flat).reshape(where.shape) & (top_ids[..., 0] >= 0)
    if usable is not None:
        keep = keep & usable[..., None]
    previous = ids.gather(1, flat).reshape(where.shape)[keep]  # the true token before each draft (x_a first)
    hidden = hidden[keep]
    logits = student.logits(hidden)
    bias = student.markov_bias(previous)
    if bias is not None:
        logits = logits + bias
    return BlockOutputs(logits, top_ids[keep], top_p[keep], steps.expand_as(where)[keep].float(),
                        student.confidence(hidden, previous))


def expected_calibration_error(predicted: torch.Tensor, outcome: torch.Tensor, bins: int = 10) -> float:
    """Σ_b (n_b / N)·|mean predicted − mean outcome| over ``bins`` equal-width bins of the prediction."""
    index = (predicted.clamp(0, 1) * bins).long().clamp(max=bins - 1)
    total = 0.0
    for b in range(bins):
        chosen = index == b
        if chosen.any():
            total += float(chosen.sum()) * abs(float(predicted[chosen].mean()) - float(outcome[chosen].mean()))
    return total / max(1, predicted.numel())


def _soft_cross_entropy(logq: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    probs = top_p * (top_ids >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-8)
    return -(probs * logq.gather(-1, top_ids.clamp(min=0))).sum(-1)


def total_variation(q: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """½‖p − q‖₁ with p known on its top-k only: the rest of each side lumped into one bucket (a lower bound)."""
    p = top_p * (top_ids >= 0)
    q_top = q.gather(-1, top_ids.clamp(min=0)) * (top_ids >= 0)
    rest = (1 - p.sum(-1)) - (1 - q_top.sum(-1))
    return 0.5 * ((p - q_top).abs().sum(-1) + rest.abs())


def _mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (values * weight).sum() / weight.sum().clamp(min=1e-8)
