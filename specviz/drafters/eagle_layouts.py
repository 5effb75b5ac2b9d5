"""EAGLE head checkpoints in their published layouts, normalised into one ``HeadSpec`` plus tensors in our names.

Pure format conversion: configs, key names, feature-layer conventions and weight files. No module is built here
(``specviz.drafters.eagle`` builds the head); that keeps this file readable next to the layouts it describes, whose
real configs and key lists are in ``shared/reference/layouts/``.

Dialects (``dialect_of``):

- ``specviz``: our own folder. ``config.json`` holds ``specviz_eagle`` (the ``HeadSpec``) and, like the draft LM's,
  ``specviz_shared_weights`` (the target whose embedding and output layer the head borrows, with a fingerprint).
- ``eagle1-official`` (SafeAILab EAGLE-1/2): a Llama config with one layer; keys ``fc.weight`` [H, 2H] over
  cat(embedding, feature), optional ``fc.bias`` (the config's ``bias``; EAGLE's loader defaults it to true when
  absent), ``layers.0.*`` without ``input_layernorm``. The head uses the target's output layer on its own output,
  with no norm: it regresses the target's last *normed* hidden state, ``hidden_states[L]``.
- ``eagle3-official`` (SafeAILab EAGLE-3, ``LlamaForCausalLM``) and ``eagle3-specforge``
  (``LlamaForCausalLMEagle3``): ``midlayer.*`` (``layers.0.*`` accepted too, as vLLM renames it), ``fc``, ``norm``,
  ``lm_head`` [draft vocab, H], ``d2t`` (offsets: target id = draft id + d2t[draft id]), ``t2d`` (ignored).
  SpecForge's "EAGLE 3.1" adds ``fc_norm`` (an RMSNorm per feature before ``fc``) and ``norm_output`` (SpecForge's
  meaning: apply ``norm`` before ``lm_head``; default true).
- ``eagle3-speculators`` (vLLM's speculators format, ``speculators_model_type: eagle3``): ``layers.0.*``, ``d2t``
  (or vLLM's ``draft_id_to_target_id``), and flags ``norm_before_residual``, ``norm_before_fc``, ``fc_norm`` and
  ``norm_output`` (speculators' meaning: feed the *normed* output back as the next step's hidden state).

Feature layers, always stored as Hugging Face ``hidden_states`` indices (0 = embedding output, i = output of
decoder layer i - 1, L = after the final norm). Sources differ, and this is where mistakes happen:

- EAGLE-3's default, read by every dialect when no ids are given: the inputs of layers 2, L//2 and L - 3, which are
  ``hidden_states[2]``, ``[L//2]``, ``[L-3]``, concatenated low -> mid -> high.
- speculators / vLLM ``eagle_aux_hidden_state_layer_ids``: already ``hidden_states`` indices (vLLM captures the
  input of layer id).
- SpecForge / SGLang ``eagle_aux_hidden_state_layer_ids`` (top level or under ``eagle_config``): *output-of-layer*
  ids, so ``hidden_states[id + 1]`` (SGLang captures the input of layer id + 1; DeepSeek-V3's [1, 29, 57] are the
  EAGLE default for 61 layers). DeepSpec / DFlash ``target_layer_ids`` use the same output-of-layer convention.
- A ``LlamaForCausalLM`` EAGLE-3 config that names ids is refused: SGLang and vLLM would read them differently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specviz.drafters import checkpoint_files
from specviz.drafters.checkpoint_files import (  # noqa: F401 - read_* and rope_of re-exported
    TargetShape,
    read_config,
    read_tensors,
    rope_of,
    spec_from_dict,
)
from specviz.errors import SpecvizError

DIALECTS = ("specviz", "eagle1-official", "eagle3-official", "eagle3-specforge", "eagle3-speculators")
#: Our config key holding the ``HeadSpec``.
SPEC_KEY = "specviz_eagle"
#: Checkpoint tensors that are read for checks only (or not at all), never loaded into the head.
IGNORED = ("t2d", "verifier_lm_head.weight", "verifier_norm.weight")
EMBEDDING_KEY = "embed_tokens.weight"


@dataclass(frozen=True)
class HeadSpec:
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

    kind: str
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    feature_layers: tuple[int, ...]
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 8192
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

    def to_dict(self) -> dict:
        data = asdict(self)
        data["feature_layers"] = list(self.feature_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> HeadSpec:
        return spec_from_dict(cls, data, SPEC_KEY, ("feature_layers",))


def default_feature_layers(kind: str, num_layers: int) -> tuple[int, ...]:
    """EAGLE-1: the final norm's output ``hidden_states[L]``; EAGLE-3: ``hidden_states[2]``, ``[L//2]``, ``[L-3]``."""
    if kind == "eagle":
        return (num_layers,)
    return (2, num_layers // 2, num_layers - 3)


# ---- recognising a config ---------------------------------------------------------------------------------------
def dialect_of(config: dict, keys: set[str] | None = None) -> str:
    """Which layout a head's ``config.json`` (and, when given, its tensor names) is in; one-line error if none."""
    if SPEC_KEY in config:
        return "specviz"
    architectures = [str(a) for a in config.get("architectures") or []]
    kind = config.get("speculators_model_type")
    if kind is not None or "transformer_layer_config" in config or any("Speculator" in a for a in architectures):
        if kind == "eagle3" or "Eagle3Speculator" in architectures:
            return "eagle3-speculators"
        raise SpecvizError(f"speculators format {kind or architectures} is not an EAGLE-3 head; for EAGLE-1/HASS "
                           f"heads load the original EAGLE checkpoint")
    if "LlamaForCausalLMEagle3" in architectures:
        return "eagle3-specforge"
    if not any(a == "LlamaForCausalLM" for a in architectures):
        raise SpecvizError(f"not an EAGLE head config: architectures {architectures or 'missing'} (expected "
                           f"LlamaForCausalLM, LlamaForCausalLMEagle3 or a speculators eagle3 config)")
    eagle3_config = any(k in config for k in ("draft_vocab_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
                                              "target_hidden_size"))
    if keys is not None:
        if any(k.startswith("midlayer.") for k in keys) or "d2t" in keys or "norm.weight" in keys:
            return "eagle3-official"
        if "fc.weight" in keys and not eagle3_config:
            return "eagle1-official"
    return "eagle3-official" if eagle3_config else "eagle1-official"


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


def _require(config: dict, *names: str) -> None:
    missing = [n for n in names if config.get(n) is None]
    if missing:
        raise SpecvizError(f"config.json lacks {', '.join(missing)}")


def head_spec(config: dict, target: TargetShape, dialect: str | None = None,
              keys: set[str] | None = None) -> HeadSpec:
    """The ``HeadSpec`` of a head config, checked against ``target``; a one-line reason when it cannot serve it.

    ``keys`` (the checkpoint's tensor names, when known) settle what the config leaves open: an EAGLE-1 config
    without ``bias`` means a bias (EAGLE's loader default) unless the weights have no ``fc.bias``.
    """
    dialect = dialect or dialect_of(config, keys)
    if dialect == "specviz":
        spec = HeadSpec.from_dict(config[SPEC_KEY])
        check_fits(spec, target)
        return spec
    layer = config.get("transformer_layer_config") if dialect == "eagle3-speculators" else config
    if not isinstance(layer, dict):
        raise SpecvizError("the speculators config lacks transformer_layer_config")
    _require(layer, "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
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
    hidden = int(layer["hidden_size"])
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and int(target_hidden) != hidden:
        raise SpecvizError(f"the head is {hidden} wide over {target_hidden}-wide target features "
                           f"(target_hidden_size); heads of another width than their target are not supported")
    rope, head_dim, max_positions = rope_of(layer, "the head's")
    vocab = int(layer["vocab_size"])
    common = dict(hidden_size=hidden, intermediate_size=int(layer["intermediate_size"]),
                  num_heads=int(layer["num_attention_heads"]),
                  num_kv_heads=int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
                  head_dim=head_dim, rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), vocab_size=vocab,
                  rope=rope, max_position_embeddings=max_positions)
    if dialect == "eagle1-official":
        _check_shape(hidden, vocab, target)
        bias = config.get("bias", True if keys is None else "fc.bias" in keys)
        spec = HeadSpec(kind="eagle", draft_vocab_size=vocab, feature_layers=(target.num_layers,),
                        fc_bias=bool(bias), logits_norm=False, **common)
        check_fits(spec, target)
        return spec
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    ids = _aux_ids(config)
    nested = config.get("eagle_config") or {}
    if isinstance(nested, dict) and nested.get("use_aux_hidden_state") is False:
        raise SpecvizError("eagle_config.use_aux_hidden_state is false (a head without target features) is not "
                           "supported")
    flags = dict(fc_norm=bool(config.get("fc_norm", False)))
    if dialect == "eagle3-official":
        if ids is not None:
            raise SpecvizError("eagle_aux_hidden_state_layer_ids in a LlamaForCausalLM EAGLE-3 config is ambiguous "
                               "(SGLang reads output-of-layer ids, vLLM hidden_states ids); say "
                               "LlamaForCausalLMEagle3 (SGLang) or convert it to the speculators format (vLLM)")
        flags["logits_norm"] = bool(config.get("norm_output", True))
        layers = None
    elif dialect == "eagle3-specforge":
        flags["logits_norm"] = bool(config.get("norm_output", True))
        layers = None if ids is None else tuple(i + 1 for i in ids)  # SGLang: output of layer id = hidden_states[id+1]
    else:  # speculators: hidden_states indices already
        flags.update(norm_before_fc=bool(config.get("norm_before_fc", False)),
                     norm_before_residual=bool(config.get("norm_before_residual", False)),
                     feed_normed=bool(config.get("norm_output", False)))
        layers = None if ids is None else tuple(ids)
    _check_shape(hidden, vocab, target)
    layers = layers or default_feature_layers("eagle3", target.num_layers)
    spec = HeadSpec(kind="eagle3", draft_vocab_size=draft_vocab, feature_layers=layers, own_lm_head=True,
                    **flags, **common)
    check_fits(spec, target)
    return spec


def _check_shape(hidden: int, vocab: int, target: TargetShape) -> None:
    if hidden != target.hidden_size:
        raise SpecvizError(f"hidden size mismatch: the head is for hidden size {hidden}, the target has "
                           f"{target.hidden_size}")
    if vocab != target.vocab_size:
        raise SpecvizError(f"vocabulary mismatch: the head is for a {vocab}-token vocabulary, the target has "
                           f"{target.vocab_size}")


def check_fits(spec: HeadSpec, target: TargetShape) -> None:
    """Hidden size, vocabulary and feature layers of ``spec`` against ``target`` (one-line error)."""
    _check_shape(spec.hidden_size, spec.vocab_size, target)
    bad = [i for i in spec.feature_layers if not 0 <= i <= target.num_layers]
    if bad:
        raise SpecvizError(f"the head reads hidden_states{bad}, but the target has "
                           f"hidden_states[0..{target.num_layers}] ({target.num_layers} decoder layers)")
    if spec.kind == "eagle3" and target.num_layers in spec.feature_layers:
        raise SpecvizError(f"EAGLE-3 reads raw layer outputs; hidden_states[{target.num_layers}] is after the final "
                           f"norm (a layer-numbering mistake?)")


def verdict(config: dict, target: TargetShape, keys: set[str] | None = None) -> tuple[str, str | None]:
    """(dialect, None) when the head fits ``target``, else (dialect, the reason); unknown layouts raise."""
    dialect = dialect_of(config, keys)
    try:
        head_spec(config, target, dialect, keys)
    except SpecvizError as error:
        return dialect, str(error)
    return dialect, None


# ---- tensors ----------------------------------------------------------------------------------------------------
def expected_shapes(spec: HeadSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the head module's ``state_dict``) and their shapes."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    m = spec.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, spec.fc_in)}
    if spec.fc_bias:
        shapes["fc.bias"] = (h,)
    a = spec.attention_in
    shapes.update({
        "layer.self_attn.q_proj.weight": (q, a), "layer.self_attn.k_proj.weight": (kv, a),
        "layer.self_attn.v_proj.weight": (kv, a), "layer.self_attn.o_proj.weight": (h, q),
        "layer.mlp.gate_proj.weight": (m, h), "layer.mlp.up_proj.weight": (m, h), "layer.mlp.down_proj.weight": (h, m),
        "layer.post_attention_layernorm.weight": (h,),
    })
    if spec.kind == "eagle3":
        shapes.update({"layer.input_layernorm.weight": (h,), "layer.hidden_norm.weight": (h,), "norm.weight": (h,)})
        for i in range(len(spec.feature_layers) if spec.fc_norm else 0):
            shapes[f"fc_norm.{i}.weight"] = (h,)
        if spec.norm_before_fc:
            shapes["input_norm.weight"] = (spec.fc_in,)
    if spec.own_lm_head:
        shapes["lm_head.weight"] = (spec.draft_vocab_size, h)
    if spec.reduced_vocab:
        shapes["d2t"] = (spec.draft_vocab_size,)
    return shapes


def _layer_prefix(dialect: str, keys: set[str]) -> str:
    if dialect == "specviz":
        return "layer."
    if dialect in ("eagle3-official", "eagle3-specforge") and any(k.startswith("midlayer.") for k in keys):
        return "midlayer."
    return "layers.0."


def to_head_state(tensors: dict[str, torch.Tensor], spec: HeadSpec, dialect: str) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors renamed to our names, checked for missing, unexpected and misshapen entries."""
    prefix = _layer_prefix(dialect, set(tensors))
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for name, value in tensors.items():
        if name in IGNORED or name == EMBEDDING_KEY or name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "draft_id_to_target_id":
            name = "d2t"
        if name.startswith(prefix):
            name = "layer." + name[len(prefix):]
        elif name.startswith(("layers.", "midlayer.")):
            unexpected.append(name)
            continue
        state[name] = value
    shapes = expected_shapes(spec)
    if "d2t" in state and not spec.reduced_vocab:  # a full-vocabulary d2t is all zeros; anything else is a bug
        if bool(state.pop("d2t").ne(0).any()):
            raise SpecvizError("d2t maps a full draft vocabulary to other ids; the checkpoint is inconsistent")
    if dialect == "eagle1-official" and "layer.input_layernorm.weight" in state:
        raise SpecvizError("EAGLE-1's first layer has no input_layernorm; this checkpoint has one (not EAGLE-1)")
    hass = [k for k in state if "embed_layernorm" in k or "post_embedding_layernorm" in k]
    if hass:
        raise SpecvizError(f"HASS-style extra layernorms ({', '.join(hass)}) are not supported")
    unexpected += [k for k in state if k not in shapes]
    if unexpected:
        raise SpecvizError(f"unexpected tensors for a {spec.kind} head in the {dialect} layout: "
                           f"{', '.join(sorted(unexpected)[:3])}")
    missing = [k for k in shapes if k not in state]
    if missing:
        shown = [k.replace("layer.", prefix, 1) if k.startswith("layer.") else k for k in missing]
        raise SpecvizError(f"missing tensor {shown[0]}" + (f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise SpecvizError(f"tensor {name} has shape {list(state[name].shape)}, expected {list(shape)} for this "
                               f"config")
    if spec.reduced_vocab:
        state["d2t"] = state["d2t"].long()
        check_draft_ids(target_ids(state["d2t"]), spec.vocab_size)
    return state


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Draft id -> target id from EAGLE-3's offsets (``target = draft + d2t[draft]``)."""
    return torch.arange(d2t.shape[0], device=d2t.device) + d2t


def check_draft_ids(ids: torch.Tensor, vocab_size: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SpecvizError(f"the draft vocabulary maps to ids outside the target's [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise SpecvizError("the draft vocabulary maps two draft ids to the same target id")


# ---- files ------------------------------------------------------------------------------------------------------
def write(folder: Path, spec: HeadSpec, state: dict[str, torch.Tensor], dialect: str, *,
          extra_config: dict | None = None, embedding: torch.Tensor | None = None) -> Path:
    """Save ``state`` (our names; ``lm_head.weight`` present for the published EAGLE-3 layouts) in ``dialect``.

    ``extra_config`` is merged into config.json (our format: the shared-weights record); ``embedding`` is written as
    ``embed_tokens.weight`` in the published layouts (their loaders expect it, and ours checks it is the target's).
    """
    if dialect not in DIALECTS:
        raise SpecvizError(f"unknown layout {dialect!r}; known: {', '.join(DIALECTS)}")
    config, prefix = _config_for(spec, dialect), _layer_prefix(dialect, {"midlayer."})
    tensors: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if name.startswith("layer."):
            name = prefix + name[len("layer."):]
        tensors[name] = value.detach().contiguous().cpu()
    if dialect != "specviz":
        if spec.kind == "eagle3" and "lm_head.weight" not in tensors:
            raise SpecvizError(f"the {dialect} layout stores lm_head.weight; pass the head's output rows")
        if spec.kind == "eagle3":
            t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
            t2d[target_ids(state["d2t"]) if spec.reduced_vocab else slice(None)] = True
            tensors["t2d"] = t2d
        if embedding is not None:
            tensors[EMBEDDING_KEY] = embedding.detach().contiguous().cpu()
    return checkpoint_files.write(folder, {**config, **(extra_config or {})}, tensors)


def _config_for(spec: HeadSpec, dialect: str) -> dict:
    """config.json of ``spec`` in ``dialect``; refuses what the layout cannot express (one line)."""
    if dialect == "specviz":
        return {"architectures": ["SpecvizEagleHead"], "model_type": "specviz-eagle", SPEC_KEY: spec.to_dict()}
    if (dialect == "eagle1-official") != (spec.kind == "eagle"):
        raise SpecvizError(f"a {spec.kind} head cannot be written in the {dialect} layout")
    llama = {"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
             "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
             "head_dim": spec.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
             "rms_norm_eps": spec.rms_norm_eps, "vocab_size": spec.vocab_size, "model_type": "llama",
             "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": False,
             "rope_theta": spec.rope.get("rope_theta", 10000.0)}
    scaling = {k: v for k, v in spec.rope.items() if k != "rope_theta"}
    llama["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    if dialect == "eagle1-official":
        if spec.reduced_vocab:
            raise SpecvizError("EAGLE-1's layout has no draft vocabulary; save this head in the specviz layout")
        return {"architectures": ["LlamaForCausalLM"], **llama, "bias": spec.fc_bias}
    if spec.fc_bias:
        raise SpecvizError(f"the {dialect} layout has no fc bias")
    layers = spec.feature_layers
    default = len(layers) == 3 and layers == default_feature_layers("eagle3", layers[2] + 3)
    if dialect == "eagle3-speculators":
        if not spec.logits_norm:
            raise SpecvizError("the speculators layout always applies norm before lm_head")
        return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "transformer_layer_config": llama, "draft_vocab_size": spec.draft_vocab_size,
                "norm_before_residual": spec.norm_before_residual, "norm_before_fc": spec.norm_before_fc,
                "fc_norm": spec.fc_norm, "norm_output": spec.feed_normed, "target_hidden_size": None,
                "eagle_aux_hidden_state_layer_ids": list(spec.feature_layers),
                "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": None, "architectures": []}}}
    if spec.feed_normed or spec.norm_before_residual or spec.norm_before_fc:
        raise SpecvizError(f"the {dialect} layout cannot express feed_normed / norm_before_residual / norm_before_fc")
    out = {**llama, "draft_vocab_size": spec.draft_vocab_size, "fc_norm": spec.fc_norm,
           "norm_output": spec.logits_norm}
    if dialect == "eagle3-official":
        if not default:
            raise SpecvizError("the official EAGLE-3 layout cannot name feature layers other than the default "
                               "(2, L//2, L-3); use eagle3-specforge or eagle3-speculators")
        return {"architectures": ["LlamaForCausalLM"], **out}
    return {"architectures": ["LlamaForCausalLMEagle3"], **out,  # SGLang numbering: output of layer id
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in spec.feature_layers],
                             "use_aux_hidden_state": True}}
