"""Block drafters: DFlash (with DDTree for trees) and DSpark (Markov head, confidence head, scheduled verification).

**The backbone** (z-lab's DFlash): ``fc`` and ``hidden_norm`` turn the target's hidden states of
several layers (concatenated) into one context vector per committed position. Each of N Qwen3-style decoder layers
(q/k RMS norms, grouped-query attention, SwiGLU MLP, RoPE) *injects* that context: it projects it with its own
``k_proj``/``v_proj`` into its KV cache, next to the keys of the block. One forward denoises the block
[anchor = the last committed token, mask x (b - 1)]: the block's queries attend, without a causal mask, to every
injected context position and to the whole block. A final ``norm``, then the target's own output layer. The
embedding and the output layer are the target's (borrowed, never copied into weights or files).

Two conventions (``BlockSpec.anchor_predicts``): z-lab's block position i >= 1 predicts the token at that position
(b - 1 drafts); DeepSpec / DSpark's every position predicts the *next* token, the anchor's output included (b
drafts).

**Features**: the drafter injects the features of every committed position before the anchor. The engine hands
them over after the prefill (the prompt minus its last token) and after each round (the verified pending token and
the accepted path), so at each round they are exactly the positions before the anchor: the anchor's own feature is
not known yet, as in z-lab's loop. Each round's forward appends the newly arrived positions' context KV and the
block's KV to the draft cache, then crops the block away (z-lab's ``draft_cache.crop(start)``), so between rounds the
cache holds injected context only.

**DFlash** (``DFlashDrafter``) takes each position's argmax: a deterministic (Dirac) draft, verified by the engine's
target-sampling rule, lossless at any temperature. A chain has min(k, drafts) tokens; with ``--tree`` DDTree
(``specviz.drafters.ddtree``) grows a tree from the positions' top-w marginals, best first.

**DSpark** (``DSparkDrafter``, deepseek-ai/DeepSpec): the same backbone plus a low-rank **Markov head**, which
drafts left to right within the block: logit_k = base_k + W2 W1[x_{k-1}] (x_{-1} = the anchor); argmax when
greedy, otherwise a draw from the run's processed distribution (temperature, top-k, top-p), whose rows are the
tree's ``q_dist`` so rejection sampling stays exact. A **confidence head** estimates each draft's chance of acceptance,
c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])) with h_k the normed output that the output layer reads; the prefix
survival s_i = c_1 ... c_i is the tree's ``confidence``. **Confidence-scheduled verification** keeps the prefix
length l maximising (1 + s_1 + ... + s_l) / cost(1 + l), with ``cost`` this machine's verify-cost curve of the
target (``specviz.engine.cost_curve``), scanned upward and stopped at the first non-improving l. The cut depends on
the drafted prefix only, so verification stays lossless (docs/dflash.md says why).

Loaders for our folder and the published layouts: ``specviz.drafters.dflash_layouts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from specviz.drafters import checkpoint_files, ddtree, dynamic_tree
from specviz.drafters import dflash_layouts as layouts
from specviz.drafters.confidence import OnlineCalibration, ReliabilityCurve
from specviz.drafters.dflash_layouts import BlockSpec
from specviz.drafters.feature_drafter import FeatureDrafter, rows_by_depth
from specviz.drafters.head_layer import DecoderLayer, DraftNetwork
from specviz.drafters.head_parts import fresh, target_parts
from specviz.drafters.layouts import Format, build, network_shapes
from specviz.engine import cache as kv
from specviz.engine import cost_curve
from specviz.engine.accept import argmax_rows
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig, probabilities, sample
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

KINDS = ("dflash", "dspark")
TITLES = {"dflash": "DFlash block drafter", "dspark": "DSpark block drafter"}
#: Each drafter by a plain name with one line on what it does (the Playground's drafter list).
PLAIN = {"dflash": ("Block drafter (DFlash)", "guesses a whole block of words in one pass from five of the model's "
                    "layers"),
         "dspark": ("Block drafter with confidence (DSpark)", "a DFlash block, checked only as far as its own "
                    "confidence says will pay off")}
#: SmolLM2 has no mask token. ``<empty_output>`` (id 16) is the last of its reserved code-data specials (Jupyter
#: "cell without output"): the chat template never emits it, chat answers never contain it, and it is not EOS, so
#: at a block position it can only mean "to be filled". docs/dflash.md says why this one.
MASK_TOKEN_TEXT = "<empty_output>"
SMOLLM2_MASK_TOKEN_ID = 16


# ---- the backbone -------------------------------------------------------------------------------------------------
class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: a rank-r first-order transition bias W2 W1[x_{k-1}] on the block's logits."""

    def __init__(self, spec: BlockSpec):
        super().__init__()
        self.markov_w1 = nn.Embedding(spec.vocab_size, spec.markov_rank)
        self.markov_w2 = nn.Linear(spec.markov_rank, spec.vocab_size, bias=False)

    def forward(self, previous: torch.Tensor) -> torch.Tensor:
        """The ``[..., V]`` logit bias after the tokens ``previous``."""
        return self.markov_w2(self.markov_w1(previous))


class ConfidenceHead(nn.Module):
    """DSpark's confidence head: one linear unit over [h_k] or [h_k ; W1[x_{k-1}]], through a sigmoid."""

    def __init__(self, spec: BlockSpec):
        super().__init__()
        self.proj = nn.Linear(spec.confidence_in, 1)


class DFlashBackbone(DraftNetwork):
    """The DFlash backbone over a target's features; a DSpark drafter is this backbone with its ``markov_head``
    and ``confidence_head`` attached (so the state dict keeps the published flat names).

    ``embedding``: the target's input embedding weight ``[V, H]``; ``output``: the target's output layer (a module
    whose ``weight`` is ``[V, H]``), both borrowed.
    """

    def __init__(self, spec: BlockSpec, embedding: torch.Tensor, output: nn.Module):
        super().__init__(spec, embedding, output, whole_embedding=True)
        self.fc = nn.Linear(len(spec.feature_layers) * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(spec, layer_idx=i, qk_norm=True)  # Qwen3-style
                                    for i in range(spec.num_layers))
        self.norm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.markov_head = MarkovHead(spec) if spec.markov_rank else None
        self.confidence_head = ConfidenceHead(spec) if spec.confidence_head else None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.spec.feature_layers

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``hidden_norm(fc(features))``: the injected context of ``[B, C, layers x H]`` target features."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def forward(self, context: torch.Tensor | None, block_ids: torch.Tensor, context_positions: torch.Tensor,
                block_positions: torch.Tensor, *, cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One block forward; returns the final-normed outputs ``[B, T, H]`` at the block's T positions.

        ``context``: ``[B, C, layers x H]`` target features of positions not injected yet (C may be 0: None);
        ``block_ids``: ``[B, T]`` tokens of the block ([anchor, mask, ...]); ``*_positions``: their RoPE positions,
        ``[B, C]`` / ``[B, T]`` or unbatched. ``cache``: anything with ``update(keys, values, layer_idx)`` (a
        ``DynamicCache``) holding earlier injected context. ``mask``: bool, True = attend, broadcastable to
        ``[B, heads, T, cached + C + T]``; None lets the block see everything (DFlash's non-causal block).
        """
        h = self.embed(block_ids)
        batch, length, _ = h.shape
        ctx = self.project(context) if context is not None and context.shape[1] else h[:, :0]
        positions = block_positions.reshape(-1, length).expand(batch, -1)
        if ctx.shape[1]:
            positions = torch.cat([context_positions.reshape(-1, ctx.shape[1]).expand(batch, -1), positions], dim=1)
        rotation = self.rotation(positions, h)  # of [context ; block]: KV injection, the block's queries last
        for layer in self.layers:
            h = layer(h, rotation, context=ctx, cache=cache, mask=mask, causal=False)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits ``[..., V]`` of normed outputs, through the target's output layer."""
        return self.project_out(hidden).to(hidden.dtype)

    def markov_bias(self, previous: torch.Tensor) -> torch.Tensor | None:
        """W2 W1[previous] (None without a Markov head)."""
        return None if self.markov_head is None else self.markov_head(previous.to(self.device))

    def confidence(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor | None:
        """c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])) (``[...]``, None without a confidence head)."""
        if self.confidence_head is None:
            return None
        if self.spec.confidence_with_markov:
            hidden = torch.cat([hidden, self.markov_head.markov_w1(previous.to(hidden.device))], dim=-1)
        return torch.sigmoid(self.confidence_head.proj(hidden).squeeze(-1).float())

    def output_rows(self) -> tuple[torch.Tensor, bool]:
        """The target's output layer, run as the target runs it (unless ``draft_quant="int8"``)."""
        return self.borrowed.output.weight, True


#: The drafter's checkpoint formats (``dflash_layouts``), its tensors named and shaped as ``DFlashBackbone`` holds them.
FORMAT = Format(what="block drafter", layouts=layouts.LAYOUTS, expected_shapes=network_shapes(DFlashBackbone),
                check_fits=layouts.check_fits, unknown=layouts.UNKNOWN)


# ---- building, saving and loading ---------------------------------------------------------------------------------
def mask_token_for(tokenizer) -> int:
    """The mask id for a target: its tokenizer's mask token, else SmolLM2's ``<empty_output>`` where the
    vocabulary has it; a one-line error otherwise (give ``mask_token_id``)."""
    mask = getattr(tokenizer, "mask_token_id", None)
    if isinstance(mask, int):
        return mask
    found = tokenizer.convert_tokens_to_ids(MASK_TOKEN_TEXT) if hasattr(tokenizer, "convert_tokens_to_ids") else None
    if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None):
        return found
    raise SpecvizError(f"this target's tokenizer has no mask token and no {MASK_TOKEN_TEXT}; choose an unused token id "
                       f"and pass it as mask_token_id")


def spec_for(model: nn.Module, kind: str, *, mask_token_id: int, block_size: int | None = None, num_layers: int = 1,
             feature_layers: tuple[int, ...] | None = None, anchor_predicts: bool | None = None,
             markov_rank: int = 64, confidence_head: bool = True) -> BlockSpec:
    """The spec of a drafter of ours for ``model``: the target's width, heads, MLP size, norm eps and RoPE.

    ``kind`` ``dflash``: z-lab's convention (block 8: 7 drafts), no heads. ``dspark``: DeepSpec's convention
    (block 7: 7 drafts), a Markov head of rank ``markov_rank`` and a confidence head reading it.
    """
    if kind not in KINDS:
        raise SpecvizError(f"unknown block drafter kind {kind!r}; expected one of {', '.join(KINDS)}")
    layers, dspark = target_parts(model)[0].num_layers, kind == "dspark"
    return BlockSpec(
        num_layers=num_layers, block_size=block_size or (7 if dspark else 8), mask_token_id=mask_token_id,
        feature_layers=tuple(feature_layers or layouts.default_feature_layers(layers)), num_target_layers=layers,
        anchor_predicts=dspark if anchor_predicts is None else anchor_predicts,
        markov_rank=markov_rank if dspark else 0, confidence_head=dspark and confidence_head,
        confidence_with_markov=dspark and confidence_head and markov_rank > 0, **BlockSpec.fields_like(model))


def build_model(model: nn.Module, spec: BlockSpec, state: dict[str, torch.Tensor] | None = None) -> DFlashBackbone:
    """A drafter for ``spec`` on ``model``'s device, borrowing its embedding and output layer; ``state`` loads
    weights (float32)."""
    return build(DFlashBackbone, model, spec, state)


def new_model(model: nn.Module, kind: str, *, seed: int | None = None, dtype: torch.dtype = torch.float32,
              **spec_options) -> DFlashBackbone:
    """A freshly initialised drafter of ours for the target ``model`` (``spec_options``: see ``spec_for``)."""
    spec = spec_for(model, kind, **spec_options)
    layouts.check_fits(spec, target_parts(model)[0])
    drafter = fresh(lambda: build_model(model, spec), seed, embeddings=True)
    return drafter.to(dtype=dtype)


def save_drafter(drafter: DFlashBackbone, folder: Path, *, target_name: str, layout: str = "specviz",
                 dtype: torch.dtype | None = None) -> Path:
    """Write ``drafter`` as a loadable folder: our layout by default (borrowed tensors recorded, not stored, with the
    target embedding's fingerprint), or a published layout (``dflash_layouts.DIALECTS``) for interop. A greedy
    calibration curve the drafter carries (``GREEDY_CALIBRATION_KEY``) is written into config.json in every layout
    (their loaders ignore the key)."""
    curve = getattr(drafter, "greedy_calibration", None)
    return FORMAT.save(drafter, folder, layout, target_name=target_name, dtype=dtype or drafter.dtype,
                       config={} if curve is None else {GREEDY_CALIBRATION_KEY: curve.to_dict()})


#: Our key in a DSpark config.json: the confidence head's ``ReliabilityCurve`` under greedy verification, fitted on
#: training prompts (``python -m specviz.training.calibrate``); a greedy ``dspark`` run starts its calibration there.
GREEDY_CALIBRATION_KEY = "specviz_greedy_calibration"


def load_drafter(source: str | Path, model: nn.Module, *, kind: str | None = None) -> DFlashBackbone:
    """A drafter from a folder (or a hub id, when the hub is reachable) in any supported layout, checked against the
    target ``model``: hidden size, vocabulary, depth, feature layers, weight names and shapes, and, where the folder
    records or carries them, that the embedding and output layer are this target's. One-line errors naming the
    source."""
    def finish(spec: BlockSpec, state: dict[str, torch.Tensor], config: dict) -> DFlashBackbone:
        if kind is not None and spec.kind != kind:
            raise SpecvizError(f"it is a {TITLES[spec.kind]}, not a {TITLES[kind]}; load it as {spec.kind}:")
        built = build_model(model, spec, state)
        if config.get(GREEDY_CALIBRATION_KEY) is not None:
            curve = ReliabilityCurve.from_dict(config[GREEDY_CALIBRATION_KEY])
            if curve.rule != "greedy":
                raise SpecvizError(f"its {GREEDY_CALIBRATION_KEY} was fitted under {curve.rule!r}, not greedy")
            built.greedy_calibration = curve
        return built
    return FORMAT.load(source, model, finish)


# ---- the drafters -------------------------------------------------------------------------------------------------
class BlockDrafter(FeatureDrafter):
    """What DFlash and DSpark share: the injected-context cache and one block forward per round.

    ``vocab_size``: the target's logits width. ``pack``: run the drafter through pre-packed CPU kernels (same
    weights; a separate copy of the module, the given one stays trainable). ``draft_quant="int8"``: the output
    layer in int8 for drafting (``head_parts.output_projection``).
    """

    kind = "dflash"

    def __init__(self, model: DFlashBackbone, vocab_size: int, name: str | None = None, pack: bool = True,
                 draft_quant: str = "off"):
        self.what = f"{self.kind} drafter"
        self.model = self.adopt(model, model.spec.vocab_size, vocab_size, pack=pack, draft_quant=draft_quant,
                                exact=True)
        self.spec = model.spec
        self.name = name or self.kind
        super().__init__(model.feature_layers, model.device, model.dtype)
        self._cache: DynamicCache | None = None
        self._injected = 0  # context positions 0 .. injected - 1 are in the draft cache

    @property
    def draft_cache(self) -> DynamicCache | None:
        return self._cache

    def describe(self) -> dict:
        spec = self.spec
        return {**super().describe(), "kind": self.kind, "block_size": spec.block_size, "drafts": spec.drafts,
                "anchor_predicts": spec.anchor_predicts, "mask_token_id": spec.mask_token_id,
                "draft_layers": spec.num_layers}

    def extra_room(self) -> int:
        return self.spec.block_size + 1

    def reset(self, prompt_ids: list[int]) -> None:
        self._cache = self.new_cache(self.spec.num_layers)
        self._injected = 0

    @torch.inference_mode()
    def block(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Denoise the block after ``context``: (``[drafts, H]`` normed outputs, ``[drafts, V]`` float32 base logits).

        Injects the context features that arrived since the last round (every position before the anchor), then
        crops the block's entries away so the cache holds injected context only.
        """
        self.follow(context)
        anchor = len(context) - 1
        pending = self.take(anchor)
        block_ids = torch.full((1, self.spec.block_size), self.spec.mask_token_id, device=self._device)
        block_ids[0, 0] = context[-1]
        out = self.runner(None if pending is None else pending[None], block_ids,
                          torch.arange(self._injected, anchor, device=self._device),
                          torch.arange(anchor, anchor + self.spec.block_size, device=self._device), cache=self._cache)
        kv.crop_to(self._cache, anchor)
        self._injected = anchor
        hidden = out[0, self.spec.first_output:]
        return hidden, self.runner.logits(hidden).float()

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        """Nothing to roll back: the block's entries were cropped right after its forward."""
        if self._cache is not None:
            kv.crop_to(self._cache, self._injected)

    def _block_meta(self, tokens: list[int], q: list[float]) -> dict:
        """What the views draw for the block: its size and each position's draft token and probability."""
        return {"size": self.spec.block_size, "drafts": self.spec.drafts, "anchor_predicts": self.spec.anchor_predicts,
                "tokens": tokens, "q": [round(p, 6) for p in q]}


class DFlashDrafter(BlockDrafter):
    """DFlash: the block's argmax as a chain, or DDTree over its marginals with ``--tree``; deterministic drafts."""

    kind = "dflash"

    @torch.inference_mode()
    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        _, logits = self.block(context)
        q = dynamic_tree.distributions(logits, sampling, self.vocab_size)  # softmax when greedy, else processed
        best = argmax_rows(logits)
        meta = {"block": self._block_meta(best, q[torch.arange(len(best)), best].tolist())}
        if budget.tree:
            return self._ddtree(q, budget, meta)
        tokens = best[: min(budget.k, self.spec.drafts)]
        q_token = [float(q[i, t]) for i, t in enumerate(tokens)]
        return DraftTree.chain(tokens, q_token=q_token, q_dist=rows_by_depth(q, range(1, len(tokens) + 1)),
                               sampled=False, confidence=cost_curve.survival(q_token), meta=meta)

    def _ddtree(self, q: torch.Tensor, budget: DraftBudget, meta: dict) -> DraftTree:
        depth = min(budget.depth, self.spec.drafts)
        top_logq, top_ids = ddtree.top_candidates(q[:depth].log(), budget.width)
        built = ddtree.build(top_logq, top_ids, budget.max_nodes)
        meta["ddtree"] = {"width": budget.width, "depth": depth, "ranks": built.ranks}
        return DraftTree(tokens=built.tokens, parents=built.parents,
                         q_token=[float(q[d - 1, t]) for d, t in zip(built.depths, built.tokens)],
                         q_dist=rows_by_depth(q, built.depths),
                         sampled=False, confidence=built.confidence, meta=meta)


class DSparkDrafter(BlockDrafter):
    """DSpark: Markov-corrected drafts left to right within the block, confidence-scheduled verification.

    ``schedule``: cut each round's chain at the length the confidence schedule chooses (False: verify every draft
    the budget allows). ``cost_curve``: the target's verify cost per width (``CostCurve``; None: flat, which keeps
    every draft with a positive survival). Under ``--tree`` it still drafts a chain, which may fill the node budget
    (``DraftBudget.longest_chain``; DDTree is DFlash's).
    """

    kind = "dspark"

    def __init__(self, model: DFlashBackbone, vocab_size: int, name: str | None = None, *, schedule: bool = True,
                 cost_curve: CostCurve | None = None, pack: bool = True, draft_quant: str = "off",
                 calibrate: bool = True):
        super().__init__(model, vocab_size, name, pack, draft_quant)
        self.schedule = schedule
        self.cost_curve = cost_curve or CostCurve.flat("flat (no curve given)")
        self.calibrate = calibrate
        #: where a greedy run's calibration starts (the shipped curve, when the checkpoint has one)
        self.greedy_prior: ReliabilityCurve | None = getattr(model, "greedy_calibration", None)
        self.calibration: OnlineCalibration | None = None
        self._judged: list[float] = []  # raw confidences of the drafts the last round verified

    def describe(self) -> dict:
        spec = self.spec
        return {**super().describe(), "markov_rank": spec.markov_rank, "markov_type": spec.markov_type,
                "confidence_head": spec.confidence_head, "schedule": self.schedule,
                "confidence_calibration": ("off" if not self.calibrate else "online" if self.greedy_prior is None
                                           else f"online (a greedy run starts from a curve fitted on "
                                                f"{self.greedy_prior.samples} drafts)"),
                "greedy_curve": self.greedy_prior.to_dict() if self.calibrate and self.greedy_prior else None,
                "cost_curve": self.cost_curve.to_dict()}

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self.calibration = OnlineCalibration() if self.calibrate else None
        self._judged = []

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        super().commit(context, tree, accepted)
        if self.calibration is not None and self._judged:
            self.calibration.record(self._judged, accepted=len(accepted))
        self._judged = []

    @torch.inference_mode()
    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        if self.calibration is not None and sampling.greedy:
            # the shipped curve fits greedy verification only, and begin() does not know the run's rule yet
            self.calibration.prior = self.greedy_prior
        hidden, base = self.block(context)
        cap = min(budget.longest_chain, self.spec.drafts)
        scan = cost_curve.PrefixScan(self.cost_curve, cap) if self.schedule else None
        tokens, rows, raw, estimates = self._draft(context[-1], hidden, base, cap, sampling, generator, scan)
        q_token = [float(rows[i, t]) for i, t in enumerate(tokens)]
        survival = cost_curve.survival(estimates)
        plan = scan.schedule if scan is not None else None
        length = plan.length if plan is not None else cap
        heads = raw if self.runner.confidence_head is not None else None
        self._judged = raw[:length]
        meta = {"block": self._block_meta(tokens, q_token), "survival": [round(s, 6) for s in survival],
                "calibrated": None if self.calibration is None else [round(c, 6) for c in estimates],
                "pruned": cost_curve.cut_tail(tokens, q_token, survival, length),
                "confidence_head": None if heads is None else [round(c, 6) for c in heads],
                "verify_length": length, "schedule": None if plan is None else
                {**plan.to_dict(), "curve": self.cost_curve.source, "cap": cap}}
        return DraftTree.chain(tokens[:length], q_token=q_token[:length],
                               q_dist=rows_by_depth(rows, range(1, length + 1)), sampled=not sampling.greedy,
                               confidence=survival[:length], meta=meta)

    def _draft(self, anchor: int, hidden: torch.Tensor, base: torch.Tensor, count: int, sampling: SamplingConfig,
               generator: torch.Generator, scan: cost_curve.PrefixScan | None
               ) -> tuple[list[int], torch.Tensor, list[float], list[float]]:
        """Left to right: x_k from base_k + W2 W1[x_{k-1}] (x_{-1} = anchor), argmax or drawn, until ``scan`` (the
        confidence schedule) is over or ``count`` are drafted. Returns the tokens, the distributions they came from
        (softmax when greedy), each one's raw confidence and the estimate ĉ_k the schedule used (the raw one
        recalibrated on this run's outcomes so far, or itself without calibration).

        ĉ_k must not depend on x_k itself, or cutting on it would bias sampled output: the confidence head reads
        [h_k ; W1[x_{k-1}]]; without one, the mode's probability of the row x_k is drawn from stands in. The draft
        that ends the scan is still drawn (the views show it, cut), the ones after it never are.
        """
        model = self.runner
        tokens: list[int] = []
        rows = torch.zeros(count, self.vocab_size)
        raw: list[float] = []
        estimates: list[float] = []
        survival, previous = 1.0, anchor
        for k in range(count):
            prev = torch.tensor(previous, device=self._device)
            logits = base[k]
            bias = model.markov_bias(prev)
            if bias is not None:
                logits = logits + bias.float()
            head = model.confidence(hidden[k], prev)
            if sampling.greedy:
                rows[k] = logits.float().cpu().softmax(-1)
                previous = argmax_rows(logits[None])[0]
            else:
                rows[k] = probabilities(logits.cpu(), sampling)
                previous = sample(rows[k], generator)
            tokens.append(previous)
            raw.append(float(head) if head is not None else float(rows[k].max()))
            estimates.append(self.calibration(raw[-1]) if self.calibration is not None else raw[-1])
            survival *= estimates[-1]
            if scan is not None and scan.add(survival):
                break
        return tokens, rows[: len(tokens)], raw, estimates


# ---- the families -----------------------------------------------------------------------------------------------
#: DSpark's modes, a prefix of the spec's argument: ``dspark:fixed[:<source>]`` verifies every draft the budget
#: allows (no schedule); ``dspark:raw[:<source>]`` schedules on the confidence head's own values; plain ``dspark``
#: schedules on them recalibrated online to this run's verification (``confidence.OnlineCalibration``).
FIXED, RAW = "fixed", "raw"


def _loader(kind: str):
    def load(source: str | Path, target: Target, settings: Mapping[str, Any], name: str, mode: str | None = None
             ) -> BlockDrafter:
        model = load_drafter(source, target.model, kind=kind)
        quant = settings["draft_quant"]
        if kind == "dflash":
            return DFlashDrafter(model, target.vocab_size, name=name, draft_quant=quant)
        scheduled = mode != FIXED
        curve = cost_curve.measured(target, model.spec.drafts + 1) if scheduled else None
        return DSparkDrafter(model, target.vocab_size, name=name, schedule=scheduled, cost_curve=curve,
                             draft_quant=quant, calibrate=mode is None)
    return load


FEATURES = ("`hidden_states[id + 1]` for DFlash's `build_target_layer_ids(L, 5)` ids (L = 30: `hidden_states[2]`, "
            "`[9]`, `[15]`, `[21]`, `[28]`)")
DESCRIPTIONS = {
    "dflash": "drafts a whole block in one forward from five target layers injected into its KV cache (z-lab "
              "DFlash), grown into DDTree from the block's marginals (or the block's argmax chain with --chain); "
              "bare name: the drafter shipped for the target",
    "dspark": "DFlash's block plus a Markov head (left-to-right correction) and a confidence head whose prefix "
              "survival chooses how many drafts to verify on this machine's verify-cost curve (DSpark), the "
              "confidences recalibrated online to the run's verification (a greedy run starts from the checkpoint's "
              "fitted greedy curve where it ships one); dspark:raw[:<dir|hub id>] schedules on the "
              "head's own values, dspark:fixed[:<dir|hub id>] verifies every draft; bare name: the drafter shipped for "
              "the target",
}

FAMILIES = {kind: checkpoint_files.checkpoint_family(
    kind, "block drafter", load=_loader(kind), modes=(FIXED, RAW) if kind == "dspark" else (),
    title=TITLES[kind],
    plain_name=PLAIN[kind][0],
    plain_line=PLAIN[kind][1],
    description=DESCRIPTIONS[kind],
    reads=("draft_quant",),
    feature_layers=layouts.default_feature_layers,
    features=FEATURES,
    order=40 if kind == "dflash" else 41,  # trained by specviz.training.trainers.dflash
) for kind in KINDS}
