"""EAGLE head checkpoints: our folder and the published layouts, declared for ``specviz.drafters.layouts``.

``eagle1-official`` (SafeAILab EAGLE-1/2: ``fc`` over cat(embedding, feature), ``layers.0.*`` without
``input_layernorm``, the target's output layer on the unnormed output), ``eagle3-official`` and ``eagle3-specforge``
(``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``; SpecForge's EAGLE 3.1 flags) and ``eagle3-speculators``
(vLLM's format: ``layers.0.*`` and its norm flags); docs/eagle.md describes each. ``specviz.drafters.eagle`` builds
the head.

Feature layers are stored as Hugging Face ``hidden_states`` indices (0 = embedding output, L = after the final norm),
and sources differ: EAGLE-3's default (no ids) is ``hidden_states[2]``, ``[L//2]``, ``[L-3]``; speculators / vLLM ids
are such indices already; SpecForge / SGLang ids mean *output of layer id*, ``hidden_states[id + 1]`` (as DFlash's);
a ``LlamaForCausalLM`` EAGLE-3 config naming ids is refused, since SGLang and vLLM would read them differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from specviz.drafters.checkpoint_files import TargetShape
from specviz.drafters.head_layer import layer_shapes
from specviz.drafters.layouts import DecoderSpec, Format, Layout, fits
from specviz.errors import SpecvizError

#: Our config key holding the ``HeadSpec``.
SPEC_KEY = "specviz_eagle"


@dataclass(frozen=True)
class HeadSpec(DecoderSpec):
    """Everything that shapes an EAGLE head, whatever layout it came from.

    ``kind``: ``eagle`` (EAGLE-1/2: ``fc`` over cat(embedding, feature), then a decoder layer without input norm,
    logits through the target's output layer) or ``eagle3`` (``fc`` over the concatenated target features, a
    decoder layer whose attention reads cat(norm(embedding), norm(hidden)), own final ``norm``).
    ``feature_layers``: ``hidden_states`` indices the head reads, in concatenation order.
    ``draft_vocab_size`` < ``vocab_size`` means a reduced draft vocabulary (``d2t`` offsets in the weights).
    ``logits_norm``: apply ``norm`` before the output layer. ``feed_normed``: deeper draft steps get ``norm(out)``
    instead of ``out`` as their hidden state. ``own_lm_head``: the checkpoint brings its output layer; otherwise
    the head borrows the target's rows.
    """

    KEY = SPEC_KEY
    kind: str
    draft_vocab_size: int
    feature_layers: tuple[int, ...]
    fc_bias: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    logits_norm: bool = True
    feed_normed: bool = False
    own_lm_head: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("eagle", "eagle3"):
            raise SpecvizError(f"unknown EAGLE head kind {self.kind!r}; expected eagle or eagle3")
        if self.kind == "eagle" and len(self.feature_layers) != 1:
            raise SpecvizError(f"an EAGLE-1 head reads one feature layer, this spec names {list(self.feature_layers)}")
        if not self.feature_layers:
            raise SpecvizError("an EAGLE-3 head needs at least one feature layer")
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise SpecvizError(f"draft vocabulary {self.draft_vocab_size} must be in [1, {self.vocab_size}]")
        if self.fc_norm and self.norm_before_fc:
            raise SpecvizError("fc_norm and norm_before_fc are mutually exclusive")

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    @property
    def fc_in(self) -> int:
        """Width of ``fc``'s input: cat(embedding, feature) for EAGLE-1, the concatenated features for EAGLE-3."""
        return 2 * self.hidden_size if self.kind == "eagle" else len(self.feature_layers) * self.hidden_size

    @property
    def attention_in(self) -> int:
        """Width of q/k/v's input: the hidden state (EAGLE-1) or cat(norm(embedding), norm(hidden)) (EAGLE-3)."""
        return self.hidden_size if self.kind == "eagle" else 2 * self.hidden_size

    @property
    def layer_options(self) -> dict:
        """The ``head_layer.DecoderLayer`` options of the head's layer: EAGLE-1's reads ``fc``'s output without an
        input norm; EAGLE-3's attention reads cat(input_layernorm(embedding), hidden_norm(hidden))."""
        eagle3 = self.kind == "eagle3"
        return dict(attention_in=self.attention_in, input_norm=False, two_streams=eagle3,
                    norm_residual=self.norm_before_residual)


def default_feature_layers(kind: str, num_layers: int) -> tuple[int, ...]:
    """EAGLE-1: the final norm's output ``hidden_states[L]``; EAGLE-3: ``hidden_states[2]``, ``[L//2]``, ``[L-3]``."""
    if kind == "eagle":
        return (num_layers,)
    return (2, num_layers // 2, num_layers - 3)


# ---- reading configs ----------------------------------------------------------------------------------------------
def _aux_ids(config: dict) -> list[int] | None:
    """``eagle_aux_hidden_state_layer_ids`` at the top level or nested under ``eagle_config`` (SpecForge)."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    nested = config.get("eagle_config") or {}
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecvizError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, got {ids!r}")
    return ids


def _head_fields(layer: dict | None, target: TargetShape, dialect: str) -> dict:
    """The decoder layer's fields (speculators nest them under ``transformer_layer_config``), refusing in one line
    what a one-layer Llama-style head of the target's width does not have."""
    if not isinstance(layer, dict):
        raise SpecvizError("the speculators config lacks transformer_layer_config")
    if dialect == "eagle3-speculators" and layer.get("model_type", "llama") != "llama":
        raise SpecvizError(f"speculators heads with {layer.get('model_type')!r} layers (q/k norms) are not supported; "
                           f"only Llama-style layers are")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise SpecvizError(f"the head has {layer.get('num_hidden_layers')} decoder layers; only one-layer EAGLE heads "
                           f"are supported")
    if layer.get("hidden_act", "silu") != "silu":
        raise SpecvizError(f"the head's activation is {layer.get('hidden_act')!r}; only silu is supported")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        raise SpecvizError("heads with attention or MLP biases are not supported")
    fields = DecoderSpec.fields_from(layer, "the head's")
    fits(SimpleNamespace(**fields), target, "the head is", ())  # a head for another target: say so first
    return fields


def _read_eagle1(config: dict, target: TargetShape, shapes: dict | None) -> HeadSpec:
    """EAGLE's loader: ``bias`` absent means a bias, unless the weights (when known) have no ``fc.bias``."""
    bias = config.get("bias", True if shapes is None else "fc.bias" in shapes)
    fields = _head_fields(config, target, "eagle1-official")
    return HeadSpec(kind="eagle", draft_vocab_size=fields["vocab_size"], feature_layers=(target.num_layers,),
                    fc_bias=bool(bias), logits_norm=False, **fields)


def _eagle3_reader(dialect: str):
    def read(config: dict, target: TargetShape, shapes: dict | None) -> HeadSpec:
        target_hidden = config.get("target_hidden_size")
        layer = config.get("transformer_layer_config") if dialect == "eagle3-speculators" else config
        fields = _head_fields(layer, target, dialect)
        if target_hidden is not None and int(target_hidden) != fields["hidden_size"]:
            raise SpecvizError(f"the head is {fields['hidden_size']} wide over {target_hidden}-wide target features "
                               f"(target_hidden_size); heads of another width than their target are not supported")
        ids = _aux_ids(config)
        nested = config.get("eagle_config") or {}
        if isinstance(nested, dict) and nested.get("use_aux_hidden_state") is False:
            raise SpecvizError("eagle_config.use_aux_hidden_state is false (a head without target features) is not "
                               "supported")
        flags = dict(fc_norm=bool(config.get("fc_norm", False)))
        if dialect == "eagle3-official":
            if ids is not None:
                raise SpecvizError("eagle_aux_hidden_state_layer_ids in a LlamaForCausalLM EAGLE-3 config is "
                                   "ambiguous (SGLang reads output-of-layer ids, vLLM hidden_states ids); say "
                                   "LlamaForCausalLMEagle3 (SGLang) or convert it to the speculators format (vLLM)")
            flags["logits_norm"] = bool(config.get("norm_output", True))
        elif dialect == "eagle3-specforge":  # SGLang: output of layer id = hidden_states[id + 1]
            flags["logits_norm"] = bool(config.get("norm_output", True))
            ids = None if ids is None else [i + 1 for i in ids]
        else:  # speculators: hidden_states indices already
            flags.update(norm_before_fc=bool(config.get("norm_before_fc", False)),
                         norm_before_residual=bool(config.get("norm_before_residual", False)),
                         feed_normed=bool(config.get("norm_output", False)))
        return HeadSpec(kind="eagle3", draft_vocab_size=int(config.get("draft_vocab_size") or fields["vocab_size"]),
                        feature_layers=tuple(ids or default_feature_layers("eagle3", target.num_layers)),
                        own_lm_head=True, **flags, **fields)
    return read


def check_fits(spec: HeadSpec, target: TargetShape) -> None:
    """Hidden size, vocabulary and feature layers of ``spec`` against ``target`` (one-line error)."""
    fits(spec, target, "the head is", spec.feature_layers, raw=spec.kind == "eagle3")


# ---- writing configs ----------------------------------------------------------------------------------------------
def _write_eagle1(spec: HeadSpec, target_name: str) -> dict:
    if spec.kind != "eagle":
        raise SpecvizError(f"a {spec.kind} head cannot be written in the eagle1-official layout")
    if spec.reduced_vocab:
        raise SpecvizError("EAGLE-1's layout has no draft vocabulary; save this head in the specviz layout")
    return {"architectures": ["LlamaForCausalLM"], **spec.decoder_config("llama", 1), "bias": spec.fc_bias}


def _eagle3_writer(dialect: str):
    def write(spec: HeadSpec, target_name: str) -> dict:
        """config.json in ``dialect``; refuses what the layout cannot express (one line)."""
        if spec.kind != "eagle3":
            raise SpecvizError(f"a {spec.kind} head cannot be written in the {dialect} layout")
        if spec.fc_bias:
            raise SpecvizError(f"the {dialect} layout has no fc bias")
        llama, layers = spec.decoder_config("llama", 1), spec.feature_layers
        if dialect == "eagle3-speculators":
            if not spec.logits_norm:
                raise SpecvizError("the speculators layout always applies norm before lm_head")
            return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                    "transformer_layer_config": llama, "draft_vocab_size": spec.draft_vocab_size,
                    "norm_before_residual": spec.norm_before_residual, "norm_before_fc": spec.norm_before_fc,
                    "fc_norm": spec.fc_norm, "norm_output": spec.feed_normed, "target_hidden_size": None,
                    "eagle_aux_hidden_state_layer_ids": list(layers),
                    "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                           "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                           "verifier": {"name_or_path": None, "architectures": []}}}
        if spec.feed_normed or spec.norm_before_residual or spec.norm_before_fc:
            raise SpecvizError(f"the {dialect} layout cannot express feed_normed / norm_before_residual / "
                               f"norm_before_fc")
        out = {**llama, "draft_vocab_size": spec.draft_vocab_size, "fc_norm": spec.fc_norm,
               "norm_output": spec.logits_norm}
        if dialect == "eagle3-specforge":  # SGLang numbering: output of layer id
            return {"architectures": ["LlamaForCausalLMEagle3"], **out,
                    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],
                                     "use_aux_hidden_state": True}}
        if len(layers) != 3 or layers != default_feature_layers("eagle3", layers[2] + 3):
            raise SpecvizError("the official EAGLE-3 layout cannot name feature layers other than the default "
                               "(2, L//2, L-3); use eagle3-specforge or eagle3-speculators")
        return {"architectures": ["LlamaForCausalLM"], **out}
    return write


# ---- tensors ----------------------------------------------------------------------------------------------------
def expected_shapes(spec: HeadSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the head module's ``state_dict``) and their shapes."""
    h = spec.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, spec.fc_in)}
    if spec.fc_bias:
        shapes["fc.bias"] = (h,)
    shapes.update(layer_shapes(spec, "layer.", **spec.layer_options))
    if spec.kind == "eagle3":
        shapes["norm.weight"] = (h,)
        for i in range(len(spec.feature_layers) if spec.fc_norm else 0):
            shapes[f"fc_norm.{i}.weight"] = (h,)
        if spec.norm_before_fc:
            shapes["input_norm.weight"] = (spec.fc_in,)
    if spec.own_lm_head:
        shapes["lm_head.weight"] = (spec.draft_vocab_size, h)
    if spec.reduced_vocab:
        shapes["d2t"] = (spec.draft_vocab_size,)
    return shapes


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Draft id -> target id from EAGLE-3's offsets (``target = draft + d2t[draft]``)."""
    return torch.arange(d2t.shape[0], device=d2t.device) + d2t


def check_draft_ids(ids: torch.Tensor, vocab_size: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SpecvizError(f"the draft vocabulary maps to ids outside the target's [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise SpecvizError("the draft vocabulary maps two draft ids to the same target id")


def _check_d2t(state: dict[str, torch.Tensor], spec: HeadSpec) -> None:
    """A full-vocabulary ``d2t`` is all zeros (anything else is a bug); a reduced one must map into the target's."""
    if "d2t" in state and not spec.reduced_vocab and bool(state.pop("d2t").ne(0).any()):
        raise SpecvizError("d2t maps a full draft vocabulary to other ids; the checkpoint is inconsistent")
    if "d2t" in state:
        state["d2t"] = state["d2t"].long()
        check_draft_ids(target_ids(state["d2t"]), spec.vocab_size)


def _eagle3_extras(spec: HeadSpec, head) -> dict[str, torch.Tensor]:
    """EAGLE-3's loaders expect an ``lm_head`` (ours may borrow the target's rows) and ``t2d`` (the draft ids)."""
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[target_ids(head.d2t) if spec.reduced_vocab else slice(None)] = True
    return {"t2d": t2d, **({} if spec.own_lm_head else {"lm_head.weight": head.output_weight()})}


# ---- the layouts ------------------------------------------------------------------------------------------------
def _llama(config: dict) -> bool:
    return "LlamaForCausalLM" in (config.get("architectures") or [])


def _eagle3_config(config: dict) -> bool:
    return any(k in config for k in ("draft_vocab_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
                                     "target_hidden_size"))


def _speculators(config: dict, keys) -> bool:
    architectures = [str(a) for a in config.get("architectures") or []]
    kind = config.get("speculators_model_type")
    if kind is None and "transformer_layer_config" not in config and not any("Speculator" in a for a in architectures):
        return False
    if kind == "eagle3" or "Eagle3Speculator" in architectures:
        return True
    raise SpecvizError(f"speculators format {kind or architectures} is not an EAGLE-3 head; for EAGLE-1/HASS heads "
                       f"load the original EAGLE checkpoint")


#: Every published layout: the target's embedding stored beside the head (checked, never loaded), buffers and
#: checks-only tensors ignored.
PUBLISHED = dict(carried=(("embed_tokens.weight", "embedding"),),
                 ignored=("t2d", "verifier_lm_head.weight", "verifier_norm.weight", "{rest}rotary_emb.inv_freq"))
HASS = tuple((f"{name}.{{rest}}", "HASS-style extra layernorms ({name}) are not supported")
             for name in ("embed_layernorm", "post_embedding_layernorm"))
#: EAGLE-3's decoder layer is ``midlayer`` (``layers.0`` as vLLM renames it); vLLM's ``draft_id_to_target_id`` is d2t.
EAGLE3_NAMES = (("layer.{rest}", "midlayer.{rest}"), ("layer.{rest}", "layers.0.{rest}"), ("d2t", "d2t"),
                ("d2t", "draft_id_to_target_id"), ("{rest}", "{rest}"))
FORMAT = Format(
    what="EAGLE head",
    layouts=(
        Layout.own(HeadSpec, "SpecvizEagleHead", lambda spec: ["embedding"] + ([] if spec.own_lm_head else ["output"])),
        Layout("eagle3-speculators", recognise=_speculators, read=_eagle3_reader("eagle3-speculators"),
               write=_eagle3_writer("eagle3-speculators"), names=EAGLE3_NAMES[1:], extras=_eagle3_extras,
               refused=HASS, **PUBLISHED),
        Layout("eagle3-specforge", recognise=lambda config, keys: "LlamaForCausalLMEagle3" in (
            config.get("architectures") or []), read=_eagle3_reader("eagle3-specforge"),
               write=_eagle3_writer("eagle3-specforge"), names=EAGLE3_NAMES, extras=_eagle3_extras, refused=HASS,
               **PUBLISHED),
        Layout("eagle3-official", read=_eagle3_reader("eagle3-official"), write=_eagle3_writer("eagle3-official"),
               recognise=lambda config, keys: _llama(config) and (_eagle3_config(config) if keys is None else any(
                   k.startswith("midlayer.") for k in keys) or bool({"d2t", "norm.weight"} & keys)),
               names=EAGLE3_NAMES, extras=_eagle3_extras, refused=HASS, **PUBLISHED),
        Layout("eagle1-official", read=_read_eagle1, write=_write_eagle1,
               recognise=lambda config, keys: _llama(config) and not _eagle3_config(config) and (
                   keys is None or "fc.weight" in keys),
               names=(("layer.{rest}", "layers.0.{rest}"), ("{rest}", "{rest}")),
               refused=HASS + (("layers.0.input_layernorm.weight", "EAGLE-1's first layer has no input_layernorm; "
                                "this checkpoint has one (not EAGLE-1)"),), **PUBLISHED),
    ),
    expected_shapes=expected_shapes, check_fits=check_fits, prepare=_check_d2t,
    unknown="not an EAGLE head config: architectures {architectures} (expected LlamaForCausalLM, "
            "LlamaForCausalLMEagle3 or a speculators eagle3 config)")
DIALECTS = FORMAT.names
