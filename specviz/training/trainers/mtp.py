"""MTP modules trained post hoc on the frozen target's cached hidden states (``specviz train mtp``).

DeepSeek-V3 trains its MTP modules jointly with the model; ours learn afterwards, from the target's own
``hidden_states[L]`` and distribution, which is what a drafter for an existing model can do. Module k, teacher
forced, reads at position t the token x[t+1+k] and module k-1's output at t (module 0: the target feature) and
learns the target's distribution of x[t+2+k] (``teacher_forced``, the same rows drafting computes): soft
cross-entropy to the cached top-k plus a hard term on the target's argmax (EAGLE's ``_draft_vocab_loss`` over the
whole vocabulary). The module losses are averaged, as DeepSeek-V3 averages its MTP losses over depth.

``--layers N`` sets the number of modules (default 1, as DeepSeek-V3 ships); ``--init-layers i`` starts every
module's decoder layer from the target's layer i (its weights generalise better than noise).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specviz.drafters import mtp
from specviz.errors import SpecvizError
from specviz.training.batches import Batch
from specviz.training.trainers.base import FeatureRequest, Trainer
from specviz.training.trainers.eagle import _draft_vocab_loss

DEFAULTS = {"modules": 1, "hard_weight": 0.5, "feed_normed": False}


class MtpTrainer(Trainer):
    """``specviz train mtp``: n MTP modules over the target's last hidden state."""

    kind = "mtp"
    defaults = DEFAULTS

    def __init__(self, target, options: dict | None = None) -> None:
        super().__init__(target, options)
        options = options or {}
        if options.get("layers") is not None:
            self.opts["modules"] = int(options["layers"])
        if not 1 <= int(self.opts["modules"]) <= 16:
            raise SpecvizError(f"--layers (MTP modules) must be in [1, 16], got {self.opts['modules']}")
        self.spec = mtp.spec_for(target.model, int(self.opts["modules"]), feed_normed=bool(self.opts["feed_normed"]))

    def features(self) -> FeatureRequest:
        return FeatureRequest(layers=(self.spec.feature_layer,), topk=8)

    def build_student(self) -> mtp.MtpStack:
        stack = mtp.new_stack(self.target.model, self.spec.num_modules, seed=0,
                              feed_normed=self.spec.feed_normed)
        layer = self.options.get("init_layers")
        if layer is not None and str(layer).strip():
            init_from_target_layer(stack, self.target.model, _one_layer(layer, self.spec.feature_layer))
        return stack

    def load_exported(self, folder: Path) -> mtp.MtpStack:
        return mtp.load_stack(folder, self.target.model)

    def loss(self, student: mtp.MtpStack, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        ids = batch.input_ids
        vocab = torch.arange(self.spec.vocab_size, device=ids.device)
        outs = teacher_forced(student, batch.hidden[self.spec.feature_layer], ids)
        total, used, stats = 0.0, 0, {}
        for k, out in enumerate(outs):
            span = out.shape[1]
            where = slice(1 + k, 1 + k + span)  # the target's distribution of x[t+2+k] sits at row t+1+k
            valid = batch.loss_mask[:, where] & batch.attention_mask[:, where].bool()
            if not valid.any():
                continue
            logits = student.logits(k, out[valid])
            loss, agree = _draft_vocab_loss(logits, batch.topk_ids[:, where][valid], batch.topk_probs[:, where][valid],
                                            vocab, float(self.opts["hard_weight"]))
            total, used = total + loss, used + 1
            stats[f"loss{k}"], stats[f"agree{k}"] = loss.item(), agree
        if not used:
            raise SpecvizError("a training batch had no trainable positions")
        loss = total / used
        stats["loss"], stats["agree"] = loss.item(), stats.get("agree0", 0.0)
        return loss, stats

    @torch.no_grad()
    def predict_argmax(self, student: mtp.MtpStack, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Module 0, teacher forced: entry j is its guess for token j + 1 (from the feature of position j - 1)."""
        if not hidden:
            raise SpecvizError("MTP modules predict from the target's hidden states; none were given")
        features = hidden[self.spec.feature_layer]
        length = input_ids.shape[1] - 1
        out = student.step(0, features[:, :-1], input_ids[:, 1:], torch.arange(length))
        guesses = student.logits(0, out)[0].argmax(-1)
        return torch.cat([torch.full((1,), -1, dtype=torch.long), guesses.cpu()])

    def describe_student(self, student: mtp.MtpStack) -> dict:
        return student.spec.to_dict()

    def save_pretrained(self, student: mtp.MtpStack, folder: Path, *, dtype: torch.dtype = torch.float32) -> None:
        mtp.save_stack(student.to(dtype), folder, target_name=self.options.get("target_name", "target"))
        student.float()


def teacher_forced(stack: mtp.MtpStack, features: torch.Tensor, token_ids: torch.Tensor) -> list[torch.Tensor]:
    """The training forward over a known sequence: module k at positions t = 0 .. T-2-k reads x[t+1+k] and,
    as hidden state, the target feature (k = 0) or module k-1's output at t; it predicts x[t+2+k].

    ``features`` ``[B, T, H]`` (target features of positions 0 .. T-1), ``token_ids`` ``[B, T]``. Returns one
    ``[B, T-1-k, H]`` output per module (fewer when the sequence is too short). Drafting computes the same rows
    for the committed text, and at the last position for the first n draft depths.
    """
    length = token_ids.shape[1]
    outs, hidden = [], features
    for k in range(stack.num_modules):
        span = length - 1 - k
        if span <= 0:
            break
        positions = torch.arange(span, device=token_ids.device)
        out = stack.step(k, hidden[:, :span], token_ids[:, 1 + k: 1 + k + span], positions)
        outs.append(out)
        hidden = stack.feed(k, out)
    return outs


def _one_layer(text, num_layers: int) -> int:
    try:
        layer = int(str(text).strip())
    except ValueError:
        raise SpecvizError(f"mtp --init-layers takes one target layer number, got {text!r}") from None
    if not 0 <= layer < num_layers:
        raise SpecvizError(f"--init-layers {layer} is not a decoder layer of the target (0..{num_layers - 1})")
    return layer


@torch.no_grad()
def init_from_target_layer(stack: mtp.MtpStack, model: torch.nn.Module, layer: int) -> None:
    """Copy the target's decoder layer ``layer`` into every module's block (same shapes: ``spec_for`` shapes the
    blocks like the target's layers)."""
    source = dict(model.get_decoder().layers[layer].state_dict())
    for module in stack.layers:
        own = module.block.state_dict()
        missing = [k for k in own if k not in source]
        if missing:
            raise SpecvizError(f"target layer {layer} has no {missing[0]}; it cannot initialise an MTP block")
        module.block.load_state_dict({k: source[k].to(own[k].dtype) for k in own})
