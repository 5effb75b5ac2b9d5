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
from dataclasses import fields as spec_fields
from types import SimpleNamespace

import torch

from specviz.drafters.checkpoint_files import TargetShape
from specviz.drafters.layouts import (
    DecoderSpec,
    Field,
    Layout,
    check_draft_ids,
    check_layers,
    fits,
    lookup,
    named,
    read_fields,
    write_fields,
)
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


def default_feature_layers(kind: str, num_layers: int) -> tuple[int, ...]:
    """EAGLE-1: the final norm's output ``hidden_states[L]``; EAGLE-3: ``hidden_states[2]``, ``[L//2]``, ``[L-3]``."""
    if kind == "eagle":
        return (num_layers,)
    return (2, num_layers // 2, num_layers - 3)


# ---- configs ------------------------------------------------------------------------------------------------------
IDS = "eagle_aux_hidden_state_layer_ids"
#: What each dialect's config.json holds beside the decoder layer. Feature layers: speculators ids are
#: ``hidden_states`` indices already, SpecForge's are output-of-layer ids (nested or at the top level); the official
#: layout names none (EAGLE-3's default).
EAGLE3 = (Field("draft_vocab_size"), Field("fc_norm", default=False))
LLAMA_EAGLE3 = (*EAGLE3, Field("logits_norm", "norm_output", True))
FIELDS = {
    "eagle1-official": (Field("fc_bias", "bias"),),
    "eagle3-official": LLAMA_EAGLE3,
    "eagle3-specforge": (*LLAMA_EAGLE3, Field("feature_layers", f"eagle_config.{IDS}", also=(IDS,), shift=1)),
    "eagle3-speculators": (*EAGLE3, Field("norm_before_fc", default=False), Field("feed_normed", "norm_output", False),
                           Field("norm_before_residual", default=False),
                           Field("feature_layers", IDS, also=(f"eagle_config.{IDS}",))),
}
#: EAGLE-3 options a dialect holds only where its fields say; elsewhere they must keep the spec's default.
OPTIONS = ("fc_bias", "fc_norm", "norm_before_fc", "norm_before_residual", "logits_norm", "feed_normed")
DEFAULTS = {f.name: f.default for f in spec_fields(HeadSpec)}
#: Each dialect's config.json beyond the fields: where the decoder layer's config sits (the top level where not
#: listed) and what the format always says.
LAYER_AT = {"eagle3-speculators": "transformer_layer_config"}
CONSTANTS = {
    "eagle1-official": {"architectures": ["LlamaForCausalLM"]},
    "eagle3-official": {"architectures": ["LlamaForCausalLM"]},
    "eagle3-specforge": {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"use_aux_hidden_state": True}},
    "eagle3-speculators": {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                           "target_hidden_size": None,
                           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                                  "proposal_methods": [{"proposal_type": "greedy",
                                                                        "speculative_tokens": 3}],
                                                  "verifier": {"name_or_path": None, "architectures": []}}},
}


def _reader(dialect: str):
    def read(config: dict, target: TargetShape, shapes: dict | None) -> HeadSpec:
        """The head's spec: its one Llama-style decoder layer (refused in one line where ours differ; a head for
        another target is said so first), then the dialect's fields."""
        layer = config.get(LAYER_AT[dialect]) if dialect in LAYER_AT else config
        if not isinstance(layer, dict):
            raise SpecvizError(f"the speculators config lacks {LAYER_AT[dialect]}")
        decoder = DecoderSpec.fields_from(layer, "the head's")
        fits(SimpleNamespace(**decoder), target, "the head is", ())
        check_layers(layer, "the head", style="llama" if dialect in LAYER_AT else "", count=1,
                     target_hidden=config.get("target_hidden_size"))
        if dialect == "eagle1-official":  # EAGLE's loader: no ``bias`` means a bias, unless the weights have none
            return HeadSpec(kind="eagle", draft_vocab_size=decoder["vocab_size"], feature_layers=(target.num_layers,),
                            logits_norm=False, **read_fields(config, FIELDS[dialect], HeadSpec,
                                                             fc_bias=shapes is None or "fc.bias" in shapes), **decoder)
        if lookup(config, "eagle_config.use_aux_hidden_state") is False:
            raise SpecvizError("eagle_config.use_aux_hidden_state is false (a head without target features) is not "
                               "supported")
        if dialect == "eagle3-official" and (IDS in config or lookup(config, f"eagle_config.{IDS}") is not None):
            raise SpecvizError(f"{IDS} in a LlamaForCausalLM EAGLE-3 config is ambiguous (SGLang reads "
                               f"output-of-layer ids, vLLM hidden_states ids); say LlamaForCausalLMEagle3 (SGLang) or "
                               f"convert it to the speculators format (vLLM)")
        return HeadSpec(kind="eagle3", own_lm_head=True, **read_fields(
            config, FIELDS[dialect], HeadSpec, draft_vocab_size=decoder["vocab_size"],
            feature_layers=default_feature_layers("eagle3", target.num_layers)), **decoder)
    return read


def check_fits(spec: HeadSpec, target: TargetShape) -> None:
    """Hidden size, vocabulary and feature layers of ``spec`` against ``target`` (one-line error)."""
    fits(spec, target, "the head is", spec.feature_layers, raw=spec.kind == "eagle3")


def _writer(dialect: str):
    kind = "eagle" if dialect == "eagle1-official" else "eagle3"

    def write(spec: HeadSpec, target_name: str) -> dict:
        """config.json in ``dialect``; refuses what the layout cannot express (one line)."""
        if spec.kind != kind:
            raise SpecvizError(f"a {spec.kind} head cannot be written in the {dialect} layout")
        if kind == "eagle" and spec.reduced_vocab:
            raise SpecvizError("EAGLE-1's layout has no draft vocabulary; save this head in the specviz layout")
        held = {entry.ours for entry in FIELDS[dialect]}
        unheld = [f"{name}={getattr(spec, name)}" for name in (OPTIONS if kind == "eagle3" else ())
                  if name not in held and getattr(spec, name) != DEFAULTS[name]]
        if unheld:
            raise SpecvizError(f"the {dialect} layout cannot express {', '.join(unheld)}")
        layers = spec.feature_layers
        if dialect == "eagle3-official" and layers != default_feature_layers("eagle3", layers[-1] + 3):
            raise SpecvizError("the official EAGLE-3 layout cannot name feature layers other than the default "
                               "(2, L//2, L-3); use eagle3-specforge or eagle3-speculators")
        llama = spec.decoder_config("llama", 1)
        config = {**CONSTANTS[dialect], **({LAYER_AT[dialect]: llama} if dialect in LAYER_AT else llama)}
        return write_fields(spec, FIELDS[dialect], config)
    return write


# ---- tensors ----------------------------------------------------------------------------------------------------
def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Draft id -> target id from EAGLE-3's offsets (``target = draft + d2t[draft]``)."""
    return torch.arange(d2t.shape[0], device=d2t.device) + d2t


def check_d2t(state: dict[str, torch.Tensor], spec: HeadSpec) -> None:
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
def _eagle3_config(config: dict) -> bool:
    return any(k in config for k in ("draft_vocab_size", "eagle_config", IDS, "target_hidden_size"))


def _speculators(config: dict, keys) -> bool:
    architectures = [str(a) for a in config.get("architectures") or []]
    kind = config.get("speculators_model_type")
    if kind is None and "transformer_layer_config" not in config and not any("Speculator" in a for a in architectures):
        return False
    if kind == "eagle3" or "Eagle3Speculator" in architectures:
        return True
    raise SpecvizError(f"speculators format {kind or architectures} is not an EAGLE-3 head; for EAGLE-1/HASS heads "
                       f"load the original EAGLE checkpoint")


HASS = tuple((f"{name}.{{rest}}", "HASS-style extra layernorms ({name}) are not supported")
             for name in ("embed_layernorm", "post_embedding_layernorm"))


def _layout(dialect: str, recognise, names: tuple[tuple, ...], refused: tuple[tuple[str, str], ...] = ()) -> Layout:
    """Every published layout: the target's embedding stored beside the head (checked, never loaded), buffers and
    checks-only tensors ignored, HASS's extra layernorms refused; EAGLE-3's ``lm_head`` and ``t2d`` written."""
    return Layout(dialect, recognise=recognise, read=_reader(dialect), write=_writer(dialect), names=names,
                  carried=(("embed_tokens.weight", "embedding"),), refused=HASS + refused,
                  ignored=("t2d", "verifier_lm_head.weight", "verifier_norm.weight", "{rest}rotary_emb.inv_freq"),
                  extras=None if dialect == "eagle1-official" else _eagle3_extras)


#: EAGLE-3's decoder layer is ``midlayer`` (``layers.0`` as vLLM renames it); vLLM's ``draft_id_to_target_id`` is d2t.
EAGLE3_NAMES = (("layer.{rest}", "midlayer.{rest}"), ("layer.{rest}", "layers.0.{rest}"), ("d2t", "d2t"),
                ("d2t", "draft_id_to_target_id"), ("{rest}", "{rest}"))
LAYOUTS = (
    Layout.own(HeadSpec, "SpecvizEagleHead", lambda spec: ["embedding"] + ([] if spec.own_lm_head else ["output"])),
    _layout("eagle3-speculators", _speculators, EAGLE3_NAMES[1:]),
    _layout("eagle3-specforge", lambda config, keys: named(config, "LlamaForCausalLMEagle3"), EAGLE3_NAMES),
    _layout("eagle3-official", lambda config, keys: named(config, "LlamaForCausalLM") and (
        _eagle3_config(config) if keys is None else any(k.startswith("midlayer.") for k in keys)
        or bool({"d2t", "norm.weight"} & keys)), EAGLE3_NAMES),
    _layout("eagle1-official", lambda config, keys: named(config, "LlamaForCausalLM") and not _eagle3_config(config)
            and (keys is None or "fc.weight" in keys), (("layer.{rest}", "layers.0.{rest}"), ("{rest}", "{rest}")),
            refused=(("layers.0.input_layernorm.weight", "EAGLE-1's first layer has no input_layernorm; this "
                      "checkpoint has one (not EAGLE-1)"),)),
)
DIALECTS = tuple(layout.name for layout in LAYOUTS)
UNKNOWN = ("not an EAGLE head config: architectures {architectures} (expected LlamaForCausalLM, "
           "LlamaForCausalLMEagle3 or a speculators eagle3 config)")
