"""EAGLE heads (EAGLE-1, EAGLE-3) drafting from the target's own hidden states, with EAGLE-2's dynamic tree.

A head is one Llama-shaped decoder layer that borrows the target's embedding and output layer (passed in, never
copied into the head's weights or files):

- **EAGLE-1** (``kind="eagle"``, Li et al. 2024): ``h = fc(cat(emb(x[t+1]), f[t]))`` with f the target's last
  normed hidden state ``hidden_states[L]``; a decoder layer whose input norm is absent; logits = the target's
  output layer on ``h`` directly (the head regresses a normed feature, so EAGLE applies no norm here).
- **EAGLE-3** (``kind="eagle3"``, Li et al. 2025): ``h = fc(cat(hidden_states[2], [L//2], [L-3]))`` (low -> mid
  -> high, Hugging Face numbering); the layer's attention reads ``cat(input_layernorm(emb), hidden_norm(h))``, its
  residual is ``h``; then its own final ``norm`` and an output layer over a reduced draft vocabulary
  (``target id = draft id + d2t[draft id]``), for our heads the target's output rows at those ids.

Both pair the target feature of committed position t with the next token x[t+1] (EAGLE's ``input_ids[:, 1:]``)
and predict x[t+2]; deeper draft steps feed the head's own output as the feature. The drafter keeps the head's KV
cache in step with the committed text: each committed position's pair is fed exactly once, with the target's real
feature, and the draft nodes' entries (fed with the head's own outputs) are dropped after every round, as EAGLE's
``stable_kv``. Tokens outside the draft vocabulary get q = 0, so verification stays lossless.

Heads load from our own folder or from published layouts (``specviz.drafters.eagle_layouts``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from specviz.drafters import checkpoint_files, dynamic_tree
from specviz.drafters import eagle_layouts as layouts
from specviz.drafters.eagle_layouts import HeadSpec
from specviz.drafters.feature_drafter import CommittedRowsDrafter
from specviz.drafters.head_layer import DecoderLayer, DraftNetwork
from specviz.drafters.head_parts import fresh, target_parts
from specviz.drafters.layouts import Format, build, check_draft_ids, network_shapes
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

KINDS = ("eagle", "eagle3")
TITLES = {"eagle": "EAGLE-1 head", "eagle3": "EAGLE-3 head"}
#: Each head by a plain name with one line on what it does (the Playground's drafter list).
PLAIN = {"eagle": ("EAGLE-1 head", "a one-layer network guesses the next words from the model's last layer"),
         "eagle3": ("EAGLE-3 head", "a one-layer network guesses the next words from three of the model's layers")}


class EagleHead(DraftNetwork):
    """An EAGLE-1 or EAGLE-3 head over a target's features; trainable (the borrowed tensors are not parameters).

    ``embedding``: the target's input embedding weight ``[V, H]``; ``output``: the target's output layer (a module
    whose ``weight`` is ``[V, H]``), used when the head has no ``lm_head`` of its own.
    """

    def __init__(self, spec: HeadSpec, embedding: torch.Tensor, output: nn.Module | None):
        super().__init__(spec, embedding, output, own_output=spec.own_lm_head)
        self.fc = nn.Linear(spec.fc_in, spec.hidden_size, bias=spec.fc_bias)
        if spec.fc_norm:
            self.fc_norm = nn.ModuleList(nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
                                         for _ in spec.feature_layers)
        if spec.norm_before_fc:
            self.input_norm = nn.RMSNorm(spec.fc_in, eps=spec.rms_norm_eps)
        # EAGLE-1's layer reads fc's output without an input norm; EAGLE-3's attention reads
        # cat(input_layernorm(embedding), hidden_norm(hidden)), twice as wide
        eagle3 = spec.kind == "eagle3"
        self.layer = DecoderLayer(spec, attention_in=(2 if eagle3 else 1) * spec.hidden_size, input_norm=False,
                                  two_streams=eagle3, norm_residual=spec.norm_before_residual)
        if spec.kind == "eagle3":
            self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.draft_vocab_size, bias=False) if spec.own_lm_head else None
        self.draft_vocabulary("d2t", spec.draft_vocab_size if spec.reduced_vocab else 0)  # offsets to target ids

    # ---- the pieces a trainer needs --------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.spec.feature_layers

    def draft_ids(self) -> torch.Tensor | None:
        """Target ids of the draft vocabulary (None: the whole vocabulary)."""
        return None if self.d2t is None else layouts.target_ids(self.d2t)

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, position_ids: torch.Tensor, *,
                from_target: bool = True, cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One head step over ``[B, T]`` positions; returns the layer output ``[B, T, H]`` (before ``norm``).

        ``hidden``: ``[B, T, F]``, the target features of positions t (EAGLE-3: the feature layers concatenated in
        ``feature_layers`` order; EAGLE-1: ``hidden_states[L]``) when ``from_target``, else the head's own
        ``next_hidden`` of the previous step (training-time test and deeper draft steps). ``token_ids``: x[t+1].
        ``position_ids``: ``[B, T]`` or ``[T]`` RoPE positions (t). ``cache``: anything with ``update(keys, values,
        layer_idx) -> (keys, values)`` (a ``DynamicCache``); ``mask``: bool, True = attend, broadcastable to
        ``[B, heads, T, S]``; None means causal over the new positions with everything cached visible.
        """
        hidden = hidden.to(self.dtype)
        emb = self.embed(token_ids)
        if self.spec.kind == "eagle":  # the layer reads fc's output (no input norm); EAGLE-3's reads emb beside it
            h, emb = self.fc(torch.cat([emb, hidden], dim=-1)), None
        else:
            h = self.project(hidden) if from_target else hidden
        return self.layer(h, self.rotation(position_ids, h), embedding=emb, cache=cache, mask=mask)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """EAGLE-3's ``fc`` over the concatenated target features (with the layouts' optional input norms)."""
        if self.spec.norm_before_fc:
            features = self.input_norm(features)
        if self.spec.fc_norm:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(features)

    def next_hidden(self, out: torch.Tensor) -> torch.Tensor:
        """What the next step is fed as its hidden state: ``out``, or ``norm(out)`` for heads trained that way."""
        return self.norm(out) if self.spec.feed_normed else out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., draft_vocab_size]`` of the head's outputs."""
        h = self.norm(out) if self.spec.logits_norm and self.spec.kind == "eagle3" else out
        if self._output_op is None and self.lm_head is not None:
            return self.lm_head(h)
        if self._output_op is None and self.d2t is not None:  # the target's rows at the draft ids
            return F.linear(h, self.output_weight().to(h.dtype))
        return self.project_out(h).to(h.dtype)

    def output_weight(self) -> torch.Tensor:
        """The ``[draft_vocab_size, H]`` output rows (the head's own, or the target's rows at the draft ids)."""
        if self.lm_head is not None:
            return self.lm_head.weight
        weight = self.borrowed.output.weight
        return weight if self.d2t is None else weight[self.draft_ids()]

    # ---- inference copy -----------------------------------------------------------------------------------------
    def output_rows(self) -> tuple[torch.Tensor, bool]:
        """The head's own rows (packed with its layers) or the target's at the draft ids, gathered once."""
        return self.output_weight(), self.lm_head is not None or (self.d2t is None and self.borrowed.output_packed)


#: The head's checkpoint formats (``eagle_layouts``), its tensors named and shaped as ``EagleHead`` holds them.
FORMAT = Format(what="EAGLE head", layouts=layouts.LAYOUTS, expected_shapes=network_shapes(EagleHead),
                check_fits=layouts.check_fits, prepare=layouts.check_d2t, unknown=layouts.UNKNOWN)


# ---- building, saving and loading heads -------------------------------------------------------------------------
def spec_for(model: nn.Module, kind: str, *, draft_ids: torch.Tensor | None = None,
             feature_layers: tuple[int, ...] | None = None, fc_bias: bool | None = None) -> HeadSpec:
    """The spec of a head of ours for ``model``: the target's width, heads, MLP size, norm eps and RoPE.

    ``draft_ids``: target ids of a reduced draft vocabulary (EAGLE-3's frequent tokens); ``feature_layers``
    overrides the default (EAGLE-1: ``(L,)``; EAGLE-3: ``(2, L//2, L-3)``, Hugging Face ``hidden_states`` indices).
    """
    fields = HeadSpec.fields_like(model)
    return HeadSpec(
        kind=kind, draft_vocab_size=fields["vocab_size"] if draft_ids is None else int(draft_ids.numel()),
        feature_layers=tuple(feature_layers or layouts.default_feature_layers(kind, target_parts(model)[0].num_layers)),
        fc_bias=(kind == "eagle") if fc_bias is None else fc_bias,  # EAGLE-1's config default: bias on
        logits_norm=kind == "eagle3", **fields)


def new_head(model: nn.Module, kind: str, *, draft_ids: torch.Tensor | None = None,
             feature_layers: tuple[int, ...] | None = None, seed: int | None = None,
             dtype: torch.dtype = torch.float32) -> EagleHead:
    """A freshly initialised head of ours for the target ``model`` (its embedding and output rows borrowed)."""
    spec = spec_for(model, kind, draft_ids=draft_ids, feature_layers=feature_layers)
    layouts.check_fits(spec, target_parts(model)[0])
    head = fresh(lambda: build_head(model, spec), seed)
    if draft_ids is not None:
        ids = draft_ids.to(torch.long).flatten().sort().values
        check_draft_ids(ids, spec.vocab_size)
        if spec.reduced_vocab:  # a draft vocabulary as large as the target's is the identity: no map to store
            head.d2t.copy_(ids - torch.arange(ids.numel()))
    return head.to(dtype=dtype)


def build_head(model: nn.Module, spec: HeadSpec, state: dict[str, torch.Tensor] | None = None) -> EagleHead:
    """A head for ``spec`` on ``model``'s device, borrowing its embedding and output layer; ``state`` loads weights."""
    return build(EagleHead, model, spec, state)


def save_head(head: EagleHead, folder: Path, *, target_name: str, layout: str = "specviz",
              dtype: torch.dtype | None = None) -> Path:
    """Write ``head`` as a loadable folder: our layout by default (borrowed tensors recorded, not stored, with
    the target embedding's fingerprint), or any published layout (``eagle_layouts.DIALECTS``) for interop."""
    return FORMAT.save(head, folder, layout, target_name=target_name, dtype=dtype or head.dtype)


def load_head(source: str | Path, model: nn.Module, *, kind: str | None = None) -> EagleHead:
    """A head from a folder (or a hub id, when the hub is reachable) in any supported layout, checked against the
    target ``model``: hidden size, vocabulary, feature layers, weight names and shapes, and, where the folder
    records or carries the embedding, that it is this target's. Errors are one line naming the source."""
    def finish(spec: HeadSpec, state: dict[str, torch.Tensor], config: dict) -> EagleHead:
        if kind is not None and spec.kind != kind:
            raise SpecvizError(f"it is an {TITLES[spec.kind]}, not an {TITLES[kind]}")
        return build_head(model, spec, state)  # float32 weights
    return FORMAT.load(source, model, finish)


# ---- the drafter ------------------------------------------------------------------------------------------------
class EagleDrafter(CommittedRowsDrafter):
    """Drafts with an EAGLE head from the target features the engine hands it (``observe``).

    ``vocab_size``: the target's logits width. ``stochastic_tree``: at temperature > 0 draw tree children from q
    (verified by rejection sampling) instead of taking the top-w. ``pack``: run the head through pre-packed CPU
    kernels (same weights; a separate copy of the module, the given head stays trainable). ``draft_quant="int8"``:
    its output rows in int8 (``head_parts.output_projection``).
    """

    what = "EAGLE head"

    def __init__(self, head: EagleHead, vocab_size: int, name: str | None = None, stochastic_tree: bool = False,
                 pack: bool = True, draft_quant: str = "off"):
        self.head = self.adopt(head, head.spec.vocab_size, vocab_size, pack=pack, draft_quant=draft_quant)
        self.name = name or head.kind
        self.stochastic_tree = stochastic_tree
        # the target id of each column of the head's logits (None: column c is id c): the tree is grown over the
        # draft vocabulary and only its kept rows are spread over the target's
        ids = head.draft_ids()
        self.draft_ids = None if ids is None else ids.cpu()
        super().__init__(head.feature_layers, head.device, head.dtype)

    def describe(self) -> dict:
        spec = self.head.spec
        return {**super().describe(), "kind": spec.kind,
                "draft_vocab": spec.draft_vocab_size if spec.reduced_vocab else None,
                "stochastic_tree": self.stochastic_tree}

    @property
    def head_cache(self) -> DynamicCache | None:
        """The head's KV cache: the committed pairs (f[t], x[t+1]), plus the current round's draft entries."""
        return self._caches[0] if self._caches else None

    def step_committed(self, k: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                       cache: DynamicCache) -> torch.Tensor:
        """The head on committed pairs (f[t], x[t+1]), fed the target's real features."""
        return self.runner(hidden, tokens, positions, from_target=True, cache=cache)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        self.catch_up(context)
        last = self.last_output(0, len(context))  # the head output at the last committed pair
        if last is None:  # a one-token prompt: no committed pair yet
            return DraftTree.empty()
        runner = self.runner
        output_of: dict[int, torch.Tensor] = {}  # candidate -> the head output after feeding it
        slot_of: dict[int, int] = {}  # candidate -> its entry in the head cache

        def expand(frontier: list[int], candidates: list[dynamic_tree.Candidate]) -> torch.Tensor:
            cache, mask, tokens, positions = self.draft_inputs(0, frontier, candidates, slot_of, len(context))
            parents = [candidates[node].parent for node in frontier]
            hidden = torch.stack([runner.next_hidden(last if p == ROOT else output_of[p]) for p in parents])
            out = runner(hidden[None], tokens, positions, from_target=False, cache=cache, mask=mask)
            for row, node in enumerate(frontier):
                output_of[node] = out[0, row]
            return runner.logits(out[0])

        grown = dynamic_tree.grow(runner.logits(last[None]), expand, budget, sampling, generator, self.vocab_size,
                                  self.stochastic_tree, ids=self.draft_ids)
        return grown.tree


# ---- the family -------------------------------------------------------------------------------------------------
def _loader(kind: str):
    def load(source: str | Path, target, settings, name: str) -> EagleDrafter:
        return EagleDrafter(load_head(source, target.model, kind=kind), target.vocab_size, name=name,
                            stochastic_tree=bool(settings["stochastic_tree"]), draft_quant=settings["draft_quant"])
    return load


FAMILIES = {kind: checkpoint_files.checkpoint_family(
    kind, "EAGLE head",
    title=TITLES[kind],
    plain_name=PLAIN[kind][0],
    plain_line=PLAIN[kind][1],
    description=("a one-layer head drafting from the target's last hidden state (EAGLE-1; EAGLE-2's dynamic tree, "
                 "or a chain with --chain)" if kind == "eagle" else
                 "a one-layer head drafting from three target layers, low/mid/high (EAGLE-3; EAGLE-2's dynamic "
                 "tree, or a chain with --chain)") + "; bare name: the head shipped for the target",
    load=_loader(kind),
    reads=("stochastic_tree", "min_draft_prob", "draft_quant"),
    feature_layers=lambda num_layers, kind=kind: layouts.default_feature_layers(kind, num_layers),
    features=("`hidden_states[L]` (after the final norm)" if kind == "eagle" else
              "`hidden_states[2]`, `[L//2]`, `[L-3]` (the inputs of layers 2, L//2, L-3)"),
    order=30 if kind == "eagle" else 31,  # trained by specviz.training.trainers.eagle
) for kind in KINDS}
