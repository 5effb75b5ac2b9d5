"""Trainer registry: ``kind`` (as typed after ``train``) → Trainer class. New drafter families add one line."""

from __future__ import annotations

from specviz.errors import SpecvizError
from specviz.training.trainers.base import FeatureRequest, TrainConfig, Trainer, fit, warm_start
from specviz.training.trainers.dflash import DFlashTrainer, DSparkTrainer
from specviz.training.trainers.draft_lm import DraftLMTrainer
from specviz.training.trainers.eagle import Eagle3Trainer, EagleTrainer
from specviz.training.trainers.medusa import MedusaTrainer
from specviz.training.trainers.mtp import MtpTrainer

TRAINERS: dict[str, type[Trainer]] = {cls.kind: cls for cls in (DraftLMTrainer, EagleTrainer, Eagle3Trainer,
                                                                  DFlashTrainer, DSparkTrainer, MtpTrainer,
                                                                  MedusaTrainer)}


def get_trainer(kind: str) -> type[Trainer]:
    """The trainer class for ``kind``; a one-line error listing known kinds otherwise."""
    try:
        return TRAINERS[kind]
    except KeyError:
        raise SpecvizError(f"unknown drafter kind {kind!r}: known kinds are {', '.join(TRAINERS)}") from None


__all__ = ["TRAINERS", "FeatureRequest", "TrainConfig", "Trainer", "fit", "get_trainer", "warm_start"]
