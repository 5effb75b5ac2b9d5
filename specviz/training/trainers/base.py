"""The trainer interface every drafter family implements, and the one training loop they all share.

A trainer says which target features it needs (layers, top-k), builds its student, computes a loss on a batch,
predicts argmaxes for evaluation and saves a folder ``specviz.models.load_model`` (or its drafter adapter) loads.
The loop owns the rest: AdamW, warmup + cosine schedule, gradient clipping, tqdm, checkpoints and resume.
"""

from __future__ import annotations

import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from specviz.errors import SpecvizError
from specviz.training.batches import Batch, batch_indices, collate
from specviz.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from specviz.training.features import FeatureSet


@dataclass
class TrainConfig:
    """Hyper-parameters common to every trainer."""

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 50
    log_every: int = 10
    resume: bool = False
    device: str = "cpu"
    autocast: str | None = None  # "bf16": mixed-precision forward/backward, fp32 weights and optimizer
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FeatureRequest:
    """What a trainer needs from the frozen target: ``layers`` (hidden_states indices; i = output of layer i-1)."""

    layers: tuple[int, ...] = ()
    topk: int = 8


class Trainer(ABC):
    """One drafter family's training recipe."""

    kind: str = ""
    #: the family's own options and their defaults (``specviz train --set KEY=VALUE``)
    defaults: dict = {}

    def __init__(self, target, options: dict | None = None) -> None:
        self.target = target
        self.options = options or {}
        #: the family's options: its defaults, overridden by the options given (None means "not given")
        self.opts = {**self.defaults, **{k: v for k, v in self.options.items() if k in self.defaults and v is not None}}

    def features(self) -> FeatureRequest:
        """Target features this family trains on."""
        return FeatureRequest()

    def prepare(self, train: FeatureSet) -> None:
        """Look at the training data before the student is built (e.g. to choose a draft vocabulary)."""

    def describe_student(self, student: torch.nn.Module) -> dict:
        """The student's architecture, for metrics.json and the model card."""
        return student.config.to_dict()

    @abstractmethod
    def build_student(self) -> torch.nn.Module:
        """A freshly initialised student (trainable)."""

    def load_exported(self, folder: Path) -> torch.nn.Module:
        """A drafter of this family as exported by an earlier run, loaded and checked against the target
        (``--init-from``); families without one refuse."""
        raise SpecvizError(f"--init-from is not supported for {self.kind}: train it from scratch")

    def resumed(self, student: torch.nn.Module) -> None:
        """A checkpoint has just restored ``student``: rebuild what the trainer derived from its fresh init (a
        resumed run keeps the student's own choices, such as EAGLE-3's draft vocabulary, even on new data)."""

    @abstractmethod
    def loss(self, student: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss on one batch and floats to log."""

    @abstractmethod
    def predict_argmax(self, student: torch.nn.Module, input_ids: torch.Tensor,
                       hidden: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Teacher-forced argmax at each position of ``input_ids`` [1, T] → [T] (what the drafter would propose)."""

    def heldout_metrics(self, student: torch.nn.Module, heldout: FeatureSet) -> dict:
        """Family-specific figures on held-out target answers, beside the agreement every family reports."""
        return {}

    @abstractmethod
    def save_pretrained(self, student: torch.nn.Module, folder: Path, *, dtype: torch.dtype = torch.float32) -> None:
        """Write a loadable folder (config + safetensors + tokenizer)."""


def warm_start(trainer: Trainer, student: torch.nn.Module, source: torch.nn.Module, folder: Path) -> None:
    """``--init-from``: give a fresh ``student`` the weights of ``source``, a drafter its family exported before (the
    shipped one, say, loaded by ``trainer.load_exported``), so a later session continues training without the
    earlier run folder. The two must be the same architecture, every setting included (block size, mask token,
    feature layers: a student built with other options would silently train something else). AdamW and the
    schedule start anew; a checkpoint in the run folder, when resuming, still wins."""
    ours, theirs = trainer.describe_student(student), trainer.describe_student(source)
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            raise SpecvizError(f"--init-from {folder}: its {key} is {theirs.get(key)!r}, the student's "
                               f"{ours.get(key)!r} (give the same --layers, --hidden and --set options it was "
                               f"trained with)")
    mine, loaded = student.state_dict(), source.state_dict()
    differing = sorted(set(mine) ^ set(loaded))
    if differing:
        side = "the student has" if differing[0] in mine else "it has"
        raise SpecvizError(f"--init-from {folder}: its weights are not this student's ({side} {differing[0]})")
    for key, value in mine.items():
        if value.shape != loaded[key].shape:
            raise SpecvizError(f"--init-from {folder}: {key} is {list(loaded[key].shape)}, the student's "
                               f"{list(value.shape)}")
    student.load_state_dict({k: v.to(mine[k].dtype) for k, v in loaded.items()}, strict=True)
    trainer.resumed(student)


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio × lr``."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = min(1.0, (step - config.warmup) / max(1, config.steps - config.warmup))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(trainer: Trainer, student: torch.nn.Module, train: FeatureSet, config: TrainConfig, run_dir: Path,
        *, log=print, featurize: Callable[[FeatureSet], FeatureSet] | None = None) -> dict:
    """Train ``student`` for ``config.steps`` steps with checkpoints in ``run_dir/checkpoints``; return the log.
    ``featurize`` gives each batch's sequences the target's hidden states as it is drawn (live features)."""
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    student.to(config.device).train()
    decay = [p for n, p in student.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in student.named_parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
    ckpt_root = run_dir / "checkpoints"
    start = 0
    history: list[dict] = []
    if config.resume and (found := latest_checkpoint(ckpt_root)) is not None:
        state = load_checkpoint(found, student, optimizer)
        trainer.resumed(student)
        start = state["step"]
        history = state["extra"].get("history", [])
        log(f"resumed from {found} at step {start}")
    # the data order is a function of (seed, step) so a resumed run sees the same batches
    stream = batch_indices(train, config.batch_size, random.Random(config.seed))
    for _ in range(start):
        next(stream)
    running: dict[str, float] = {}
    began = time.perf_counter()
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc=f"train {trainer.kind}")
    for step in bar:
        batch = collate(train, next(stream), config.seq_len, featurize).to(config.device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        with torch.autocast(torch.device(config.device).type, dtype=torch.bfloat16,
                            enabled=config.autocast == "bf16"):
            loss, stats = trainer.loss(student, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), config.grad_clip)
        optimizer.step()
        for key, value in stats.items():
            running[key] = 0.9 * running.get(key, value) + 0.1 * value
        bar.set_postfix({k: f"{v:.3f}" for k, v in running.items()})
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            entry = {"step": step + 1, "lr": lr_at(step, config), "seconds": time.perf_counter() - began, **stats}
            history.append(entry)
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()))
        if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
            save_checkpoint(ckpt_root / f"step-{step + 1:06d}", step + 1, student, optimizer, {"history": history})
    student.eval()
    return {"history": history, "steps": config.steps, "resumed": start > 0}
