"""Turn a FeatureSet into padded training batches (windows that end at the sequence end, where answers are)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.training.features import FeatureSet


@dataclass
class Batch:
    """Right-padded batch: ``input_ids``/``attention_mask`` [B, T]; per-position targets aligned with inputs.

    ``loss_mask`` [B, T] marks positions trained to predict the next token; ``topk_ids``/``topk_probs`` [B, T, k]
    hold the target's distribution there (-1 ids where the target was not run); ``labels`` [B, T] the next token.
    ``hidden`` {layer: [B, T, H]} when the feature set has hidden states.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    labels: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    hidden: dict[int, torch.Tensor]

    def to(self, device: str) -> Batch:
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.loss_mask, self.labels,
                                              self.topk_ids, self.topk_probs)),
                     {k: v.to(device) for k, v in self.hidden.items()})


def window(features: FeatureSet, index: int, seq_len: int) -> slice:
    """The last ``seq_len`` positions of a sequence (chat answers sit at the end)."""
    span = features.sequence(index)
    return slice(max(span.start, span.stop - seq_len), span.stop)


def make_batch(features: FeatureSet, indices: list[int], seq_len: int) -> Batch:
    """Collate sequences into one right-padded batch."""
    spans = [window(features, i, seq_len) for i in indices]
    width = max(s.stop - s.start for s in spans)
    k = features.topk_ids.shape[1]
    size = len(spans)
    ids = torch.zeros(size, width, dtype=torch.long)
    attn = torch.zeros(size, width, dtype=torch.long)
    loss = torch.zeros(size, width, dtype=torch.bool)
    labels = torch.zeros(size, width, dtype=torch.long)
    top_i = torch.full((size, width, k), -1, dtype=torch.long)
    top_p = torch.zeros(size, width, k)
    hidden = {layer: torch.zeros(size, width, h.shape[-1]) for layer, h in features.hidden.items()}
    for row, span in enumerate(spans):
        n = span.stop - span.start
        ids[row, :n] = features.input_ids[span]
        attn[row, :n] = 1
        loss[row, :n] = features.loss_mask[span]
        labels[row, :n - 1] = features.input_ids[span.start + 1:span.stop]
        loss[row, n - 1] = False
        top_i[row, :n] = features.topk_ids[span]
        top_p[row, :n] = features.topk_probs[span]
        for layer, h in features.hidden.items():
            hidden[layer][row, :n] = h[span]
    return Batch(ids, attn, loss, labels, top_i, top_p, hidden)


def batch_indices(features: FeatureSet, batch_size: int, rng: random.Random):
    """Endless shuffled lists of sequence indices, ``batch_size`` each; sequences with no trainable position are
    skipped. Cheap to advance, so a resumed run skips the batches it already trained on without building them."""
    usable = [i for i in range(features.num_sequences) if features.loss_mask[features.sequence(i)].any()]
    while True:
        order = usable[:]
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def collate(features: FeatureSet, indices: list[int], seq_len: int,
            featurize: Callable[[FeatureSet], FeatureSet] | None = None) -> Batch:
    """The batch of ``indices``; with ``featurize`` (live features), their sequences first go through it, which
    adds the target's hidden states (and its own top-k) that the feature set does not store."""
    if featurize is None:
        return make_batch(features, indices, seq_len)
    chosen = featurize(features.subset(indices))
    return make_batch(chosen, list(range(chosen.num_sequences)), seq_len)
