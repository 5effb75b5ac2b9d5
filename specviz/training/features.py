"""Shared features from a frozen target, cached on disk for every trainer.

A ``FeatureSet`` holds token sequences and, per position ``j``, what the target predicts for token ``j+1``: its
top-k token ids and probabilities, and optionally hidden states of chosen layers.

Layer convention (HF ``output_hidden_states``): ``hidden_states[i]`` is the output of decoder layer ``i-1``;
``hidden_states[0]`` is the embedding output and ``hidden_states[L]`` is after the final norm. ``layers`` below are
indices into that tuple. Files are safetensors (never pickles) under ``.cache/specviz/features/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from specviz.errors import SpecvizError

FEATURES_VERSION = 1


@dataclass
class FeatureSet:
    """Flattened sequences plus per-position target outputs.

    ``input_ids`` [N] int64, ``starts`` [S+1] sequence boundaries, ``loss_mask`` [N] bool (position j is trained to
    predict token j+1), ``topk_ids`` [N, k] int64 (-1 where absent), ``topk_probs`` [N, k] float32,
    ``hidden`` {layer: [N, H]} optional (float16 when read from a file, float32 when just extracted), ``categories``
    one label per sequence.
    """

    input_ids: torch.Tensor
    starts: torch.Tensor
    loss_mask: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    categories: list[str] = field(default_factory=list)

    @property
    def num_sequences(self) -> int:
        return len(self.starts) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def sequence(self, i: int) -> slice:
        """Slice of the flat arrays covering sequence ``i``."""
        return slice(int(self.starts[i]), int(self.starts[i + 1]))

    def subset(self, indices: list[int]) -> FeatureSet:
        """A new FeatureSet with only the given sequences (used for train/held-out splits)."""
        parts = [self.sequence(i) for i in indices]
        cat = lambda t: torch.cat([t[s] for s in parts]) if parts else t[:0]  # noqa: E731
        lengths = torch.tensor([s.stop - s.start for s in parts], dtype=torch.long)
        starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        return FeatureSet(cat(self.input_ids), starts, cat(self.loss_mask), cat(self.topk_ids), cat(self.topk_probs),
                          {k: cat(v) for k, v in self.hidden.items()},
                          [self.categories[i] for i in indices] if self.categories else [])

    def save(self, path: Path, meta: dict | None = None) -> None:
        """Write as safetensors (compact dtypes) with the metadata in the header."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            "input_ids": self.input_ids.to(torch.int32).contiguous(),
            "starts": self.starts.to(torch.int64).contiguous(),
            "loss_mask": self.loss_mask.to(torch.uint8).contiguous(),
            "topk_ids": self.topk_ids.to(torch.int32).contiguous(),
            "topk_probs": self.topk_probs.to(torch.float16).contiguous(),
        }
        for layer, value in self.hidden.items():
            tensors[f"hidden.{layer}"] = value.to(torch.float16).contiguous()
        header = {"version": str(FEATURES_VERSION), "categories": json.dumps(self.categories),
                  "meta": json.dumps(meta or {})}
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata=header)
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path, layers: tuple[int, ...] | None = None) -> FeatureSet:
        """Read a file written by ``save``; ``layers`` reads only those hidden states (default: all)."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
            wanted = [k for k in handle.keys()
                      if not k.startswith("hidden.") or layers is None or int(k.split(".", 1)[1]) in layers]
            tensors = {k: handle.get_tensor(k) for k in wanted}
        # hidden states stay float16 as stored (half the memory of a large training set); batches widen them
        hidden = {int(k.split(".", 1)[1]): v for k, v in tensors.items() if k.startswith("hidden.")}
        return cls(tensors["input_ids"].long(), tensors["starts"].long(), tensors["loss_mask"].bool(),
                   tensors["topk_ids"].long(), tensors["topk_probs"].float(), hidden,
                   json.loads(header.get("categories", "[]")))

    @staticmethod
    def read_meta(path: Path) -> dict:
        """The ``meta`` a file was saved with, without reading its tensors."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            return json.loads((handle.metadata() or {}).get("meta", "{}"))

    @classmethod
    def concat(cls, sets: list[FeatureSet]) -> FeatureSet:
        """Join feature sets with the same k and layers."""
        sets = [s for s in sets if s.num_sequences]
        if not sets:
            raise SpecvizError("no training data: every source was empty")
        offsets, total, starts = [], 0, []
        for s in sets:
            starts.append(s.starts[:-1] + total)
            total += s.num_tokens
            offsets.append(total)
        k = min(s.topk_ids.shape[1] for s in sets)
        layers = set.intersection(*(set(s.hidden) for s in sets))
        return cls(torch.cat([s.input_ids for s in sets]),
                   torch.cat([*starts, torch.tensor([total])]),
                   torch.cat([s.loss_mask for s in sets]),
                   torch.cat([s.topk_ids[:, :k] for s in sets]),
                   torch.cat([s.topk_probs[:, :k] for s in sets]),
                   {layer: torch.cat([s.hidden[layer] for s in sets]) for layer in sorted(layers)},
                   [c for s in sets for c in (s.categories or ["text"] * s.num_sequences)])


def cache_key(*parts: object) -> str:
    """A short stable hash of everything that determines a feature file."""
    blob = json.dumps([str(p) for p in parts], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@torch.no_grad()
def extract_features(model, sequences: list[list[int]], *, topk: int = 8, layers: tuple[int, ...] = (),
                     loss_masks: list[list[bool]] | None = None, categories: list[str] | None = None,
                     batch_tokens: int = 4096, desc: str | None = "target features") -> FeatureSet:
    """Run the frozen target over ``sequences`` (right-padded batches of similar length) and keep top-k + hidden.
    ``desc`` labels the progress bar (None: no bar, for the small passes live features make at every step)."""
    if any(layer < 0 or layer > model.config.num_hidden_layers for layer in layers):
        raise SpecvizError(f"feature layers {layers} out of range 0..{model.config.num_hidden_layers} "
                           f"(hidden_states index: i = output of layer i-1)")
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    n = len(sequences)
    per_seq_topk_ids: list[torch.Tensor | None] = [None] * n
    per_seq_topk_p: list[torch.Tensor | None] = [None] * n
    per_seq_hidden: list[dict[int, torch.Tensor] | None] = [None] * n
    pos = 0
    with tqdm(total=sum(len(s) for s in sequences), desc=desc, unit="tok", leave=False, disable=desc is None) as bar:
        while pos < n:
            longest = len(sequences[order[min(n - 1, pos)]])
            size = max(1, batch_tokens // max(1, longest))
            batch = order[pos:pos + size]
            longest = max(len(sequences[i]) for i in batch)
            ids = torch.zeros(len(batch), longest, dtype=torch.long)
            mask = torch.zeros(len(batch), longest, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
                mask[row, :len(sequences[i])] = 1
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=bool(layers),
                        use_cache=False)
            probs = torch.softmax(out.logits.float(), dim=-1)
            top_p, top_i = probs.topk(topk, dim=-1)
            for row, i in enumerate(batch):
                length = len(sequences[i])
                per_seq_topk_ids[i] = top_i[row, :length].cpu()
                per_seq_topk_p[i] = top_p[row, :length].cpu()
                per_seq_hidden[i] = {layer: out.hidden_states[layer][row, :length].float().cpu() for layer in layers}
            bar.update(sum(len(sequences[i]) for i in batch))
            pos += len(batch)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    masks = []
    for i, seq in enumerate(sequences):
        m = torch.tensor(loss_masks[i], dtype=torch.bool) if loss_masks else torch.ones(len(seq), dtype=torch.bool)
        m[-1] = False  # the last position has no next token to learn
        masks.append(m)
    return FeatureSet(
        input_ids=torch.tensor([t for s in sequences for t in s], dtype=torch.long),
        starts=starts,
        loss_mask=torch.cat(masks),
        topk_ids=torch.cat(per_seq_topk_ids),
        topk_probs=torch.cat(per_seq_topk_p),
        hidden={layer: torch.cat([h[layer] for h in per_seq_hidden]) for layer in layers},
        categories=categories or ["text"] * n,
    )
