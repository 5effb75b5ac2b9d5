"""DFlash / DSpark block drafters in their published layouts, normalised into one ``BlockSpec`` plus tensors.

Pure format conversion: configs, key names, the feature-layer convention and weight files; the module is built in
``specviz.drafters.dflash``. Real configs of each layout are in ``shared/reference/layouts/`` (``dflash__*``,
``dspark__*``).

Dialects (``dialect_of``):

- ``specviz``: our folder. ``config.json`` holds ``specviz_dflash`` (the ``BlockSpec``) and
  ``specviz_shared_weights`` (the target whose embedding and output layer the drafter borrows, with a fingerprint);
  ``model.safetensors`` holds the published tensor names below, never the borrowed tensors.
- ``zlab-dflash`` (z-lab/dflash, also SpecForge's DFlash configs): a Qwen3 config with ``architectures
  ["DFlashDraftModel"]``, ``block_size`` at the top level (newer configs: ``dflash_config.block_size``),
  ``dflash_config.{target_layer_ids, mask_token_id}``, ``num_target_layers``. Keys ``fc``, ``hidden_norm``,
  ``layers.*`` (Qwen3 names with ``q_norm``/``k_norm``), ``norm``; no embedding, no output layer. Block position
  i >= 1 predicts itself: a block of b gives b - 1 drafts.
- ``deepspec`` (deepseek-ai/DeepSpec, ``Qwen3DSparkModel``): everything at the top level (``block_size``,
  ``mask_token_id``, ``target_layer_ids``, ``num_target_layers``, ``markov_rank`` (0: plain DFlash),
  ``markov_head_type``, ``enable_confidence_head``, ``confidence_head_with_markov``); keys as z-lab's plus
  ``markov_head.markov_w1`` / ``markov_w2``, ``confidence_head.proj`` and copies of the target's ``embed_tokens``
  and ``lm_head``, which must be the target's (checked, never kept). Every block position predicts the next token,
  the anchor included ("sample from anchor"): a block of b gives b drafts.
- ``specforge-dspark`` (SpecForge, ``DSparkDraftModel``): ``block_size`` at the top level and the DSpark settings
  nested under ``dflash_config`` with ``projector_type: "dspark"``; same keys and convention as DeepSpec (NVIDIA
  Model-Optimizer's flattened ``markov_w1`` / ``confidence_proj`` names are read too).

Feature layers are stored as Hugging Face ``hidden_states`` indices (0 = embedding output, i = output of decoder
layer i - 1, L = after the final norm). The published ``target_layer_ids`` mean "output of layer id", so they read
``hidden_states[id + 1]``: for SmolLM2's 30 layers ``build_target_layer_ids(30, 5)`` = [1, 8, 14, 20, 27] reads
``hidden_states[2], [9], [15], [21], [28]``. Reading ``hidden_states[L]`` (after the final norm) is refused, as
DeepSpec refuses it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specviz.drafters import checkpoint_files
from specviz.drafters.checkpoint_files import TargetShape, read_config, rope_of, spec_from_dict  # noqa: F401 - re-exported
from specviz.errors import SpecvizError

DIALECTS = ("specviz", "zlab-dflash", "deepspec", "specforge-dspark")
#: Our config key holding the ``BlockSpec``.
SPEC_KEY = "specviz_dflash"
#: Markov head types of DeepSpec; only ``vanilla`` (logit_k += W2 W1[x_{k-1}]) is implemented.
MARKOV_TYPES = ("vanilla", "gated", "rnn")
EMBEDDING_KEY = "embed_tokens.weight"
OUTPUT_KEY = "lm_head.weight"
#: Model-Optimizer's flattened DSpark names -> ours (DeepSpec's and SpecForge's module names).
ALIASES = {"markov_w1.weight": "markov_head.markov_w1.weight", "markov_w2.weight": "markov_head.markov_w2.weight",
           "confidence_proj.weight": "confidence_head.proj.weight", "confidence_proj.bias": "confidence_head.proj.bias"}


@dataclass(frozen=True)
class BlockSpec:
    """Everything that shapes a DFlash / DSpark drafter, whatever layout it came from.

    ``anchor_predicts``: every block position predicts the next token (DeepSpec / DSpark, b drafts); otherwise block
    position i >= 1 predicts the token at that position (z-lab DFlash, b - 1 drafts). ``markov_rank`` 0 means no
    Markov head; ``confidence_head`` adds DSpark's per-position acceptance estimate, reading the Markov embedding of
    the previous token too when ``confidence_with_markov``. ``feature_layers``: ``hidden_states`` indices, in the
    order ``fc`` concatenates them. ``num_target_layers``: the depth of the target it was made for.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    feature_layers: tuple[int, ...]
    num_target_layers: int
    anchor_predicts: bool = False
    markov_rank: int = 0
    markov_type: str = "vanilla"
    confidence_head: bool = False
    confidence_with_markov: bool = False
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.markov_type not in MARKOV_TYPES:
            raise SpecvizError(f"unknown Markov head type {self.markov_type!r}; known: {', '.join(MARKOV_TYPES)}")
        if self.markov_rank and self.markov_type != "vanilla":
            raise SpecvizError(f"the {self.markov_type!r} Markov head is not supported; only 'vanilla' is")
        if self.markov_rank < 0:
            raise SpecvizError(f"markov_rank must be >= 0, got {self.markov_rank}")
        if self.block_size < (1 if self.anchor_predicts else 2):
            raise SpecvizError(f"block size {self.block_size} drafts nothing")
        if not self.feature_layers:
            raise SpecvizError("a block drafter reads at least one target layer")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise SpecvizError(f"mask token id {self.mask_token_id} is outside the {self.vocab_size}-token vocabulary")
        if self.num_layers < 1:
            raise SpecvizError(f"a block drafter has at least one decoder layer, got {self.num_layers}")
        if self.confidence_with_markov and not (self.confidence_head and self.markov_rank):
            raise SpecvizError("confidence_with_markov needs both a confidence head and a Markov head")

    @property
    def drafts(self) -> int:
        """Tokens one block forward drafts: b from the anchor on, or b - 1 after it."""
        return self.block_size if self.anchor_predicts else self.block_size - 1

    @property
    def first_output(self) -> int:
        """The block position whose output is the first draft (0: the anchor's; 1: the first mask's)."""
        return 0 if self.anchor_predicts else 1

    @property
    def confidence_in(self) -> int:
        """Width of the confidence head's input: [h_k] or [h_k ; W1[x_{k-1}]]."""
        return self.hidden_size + (self.markov_rank if self.confidence_with_markov else 0)

    @property
    def kind(self) -> str:
        """``dspark`` when it has either DSpark head, else ``dflash``."""
        return "dspark" if self.markov_rank or self.confidence_head else "dflash"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["feature_layers"] = list(self.feature_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> BlockSpec:
        return spec_from_dict(cls, data, SPEC_KEY, ("feature_layers",))


# ---- feature layers ---------------------------------------------------------------------------------------------
def build_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """DFlash / DeepSpec's default layer ids ("output of layer id"): ``[L // 2]`` for one, else ``count`` ids
    spread evenly from 1 to L - 3 (Python's round: 7.5 -> 8, 20.5 -> 20)."""
    if count == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (count - 1))) for i in range(count)]


def default_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """The ``hidden_states`` indices our drafters read: ``build_target_layer_ids(L, 5)`` + 1 (SmolLM2's 30 layers:
    2, 9, 15, 21, 28). Targets under 8 layers, where that rule repeats ids, read every raw layer output instead."""
    if num_target_layers >= 8:
        return tuple(i + 1 for i in build_target_layer_ids(num_target_layers, 5))
    return tuple(range(1, num_target_layers)) or (0,)


def check_fits(spec: BlockSpec, target: TargetShape) -> None:
    """Hidden size, vocabulary, depth and feature layers of ``spec`` against ``target`` (one-line error)."""
    if spec.hidden_size != target.hidden_size:
        raise SpecvizError(f"hidden size mismatch: the drafter is {spec.hidden_size} wide, the target "
                           f"{target.hidden_size}")
    if spec.vocab_size != target.vocab_size:
        raise SpecvizError(f"vocabulary mismatch: the drafter is for a {spec.vocab_size}-token vocabulary, the target "
                           f"has {target.vocab_size}")
    if spec.num_target_layers != target.num_layers:
        raise SpecvizError(f"it was made for a {spec.num_target_layers}-layer target; this target has "
                           f"{target.num_layers} decoder layers")
    bad = [i for i in spec.feature_layers if not 0 <= i < target.num_layers]
    if bad:
        raise SpecvizError(f"it reads hidden_states{bad}, but this target's raw layer outputs are "
                           f"hidden_states[0..{target.num_layers - 1}] (hidden_states[{target.num_layers}] is after "
                           f"the final norm)")


# ---- recognising a config -----------------------------------------------------------------------------------------
def dialect_of(config: dict) -> str:
    """Which layout a drafter's ``config.json`` is in; a one-line error if none."""
    if SPEC_KEY in config:
        return "specviz"
    architectures = [str(a) for a in config.get("architectures") or []]
    nested = config.get("dflash_config")
    nested = nested if isinstance(nested, dict) else {}
    if "Qwen3DSparkModel" in architectures or (not nested and "target_layer_ids" in config):
        return "deepspec"
    if "DSparkDraftModel" in architectures or nested.get("projector_type") == "dspark":
        return "specforge-dspark"
    if "DFlashDraftModel" in architectures or nested:
        return "zlab-dflash"
    raise SpecvizError(f"not a DFlash or DSpark drafter config: architectures {architectures or 'missing'} (expected "
                       f"DFlashDraftModel, DSparkDraftModel, Qwen3DSparkModel or a specviz_dflash entry)")


def _settings(config: dict, dialect: str) -> dict:
    """Where the block settings live: the top level (DeepSpec) or ``dflash_config`` (z-lab, SpecForge)."""
    if dialect == "deepspec":
        return config
    nested = config.get("dflash_config")
    if not isinstance(nested, dict):
        raise SpecvizError("config.json lacks dflash_config")
    return nested


def _integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecvizError(f"{name} must be an integer, got {value!r}")
    return value


def _layer_ids(settings: dict, config: dict, target: TargetShape) -> tuple[int, ...]:
    """``target_layer_ids`` (output-of-layer ids) as ``hidden_states`` indices; z-lab's fallback when absent."""
    ids = settings.get("target_layer_ids", config.get("target_layer_ids"))
    if ids is None:
        depth = int(config.get("num_target_layers") or target.num_layers)
        ids = build_target_layer_ids(depth, int(config["num_hidden_layers"]))
    if not isinstance(ids, list) or not ids:
        raise SpecvizError(f"target_layer_ids must be a non-empty list of integers, got {ids!r}")
    if any(_integer(i, "target_layer_ids") < -1 for i in ids):
        raise SpecvizError(f"target_layer_ids {ids} has ids below -1 (-1 is the embedding output)")
    return tuple(i + 1 for i in ids)  # output of layer id = hidden_states[id + 1]


def _check_layers_config(config: dict) -> None:
    """Refuse what our Qwen3-style layers do not implement (one line each)."""
    missing = [n for n in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                           "vocab_size") if config.get(n) is None]
    if missing:
        raise SpecvizError(f"config.json lacks {', '.join(missing)}")
    if config.get("model_type", "qwen3") != "qwen3":
        raise SpecvizError(f"draft layers of model_type {config.get('model_type')!r} are not supported; only "
                           f"Qwen3-style layers are")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecvizError(f"the drafter's activation is {config.get('hidden_act')!r}; only silu is supported")
    if config.get("attention_bias"):
        raise SpecvizError("drafters with attention biases are not supported")
    types = set(config.get("layer_types") or ["full_attention"])
    if config.get("use_sliding_window") or types != {"full_attention"}:
        raise SpecvizError("sliding-window draft layers are not supported; only full attention is")
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and int(target_hidden) != int(config["hidden_size"]):
        raise SpecvizError(f"the drafter is {config['hidden_size']} wide over {target_hidden}-wide target features; "
                           f"drafters of another width than their target are not supported")


def block_spec(config: dict, target: TargetShape, dialect: str | None = None) -> BlockSpec:
    """The ``BlockSpec`` of a drafter config, checked against ``target``; a one-line reason when it cannot serve it."""
    dialect = dialect or dialect_of(config)
    if dialect == "specviz":
        spec = BlockSpec.from_dict(config[SPEC_KEY])
        check_fits(spec, target)
        return spec
    _check_layers_config(config)
    settings = _settings(config, dialect)
    block = settings.get("block_size", config.get("block_size"))
    mask = settings.get("mask_token_id", config.get("mask_token_id"))
    if block is None or mask is None:
        raise SpecvizError(f"config.json lacks {'block_size' if block is None else 'mask_token_id'}")
    rope, head_dim, max_positions = rope_of(config, "the drafter's")
    dspark = dialect != "zlab-dflash"
    rank = _integer(settings.get("markov_rank", 0), "markov_rank") if dspark else 0
    confidence = bool(settings.get("enable_confidence_head", False)) if dspark else False
    heads = int(config["num_attention_heads"])
    spec = BlockSpec(
        hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads), head_dim=head_dim,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), vocab_size=int(config["vocab_size"]),
        block_size=_integer(block, "block_size"), mask_token_id=_integer(mask, "mask_token_id"),
        feature_layers=_layer_ids(settings, config, target),
        num_target_layers=int(config.get("num_target_layers") or target.num_layers),
        anchor_predicts=dspark, markov_rank=rank,
        markov_type=str(settings.get("markov_head_type", "vanilla")),
        confidence_head=confidence,
        confidence_with_markov=confidence and rank > 0 and bool(settings.get("confidence_head_with_markov", False)),
        rope=rope, max_position_embeddings=max_positions)
    check_fits(spec, target)
    return spec


def verdict(config: dict, target: TargetShape) -> tuple[str, str | None]:
    """(dialect, None) when the drafter fits ``target``, else (dialect, the reason); unknown layouts raise."""
    dialect = dialect_of(config)
    try:
        block_spec(config, target, dialect)
    except SpecvizError as error:
        return dialect, str(error)
    return dialect, None


# ---- tensors ----------------------------------------------------------------------------------------------------
def expected_shapes(spec: BlockSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the drafter module's ``state_dict``, the published names) and their shapes."""
    h, m = spec.hidden_size, spec.intermediate_size
    q, kv, d = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, len(spec.feature_layers) * h), "hidden_norm.weight": (h,),
                                          "norm.weight": (h,)}
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (m, h), p + "mlp.up_proj.weight": (m, h), p + "mlp.down_proj.weight": (h, m),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
    if spec.markov_rank:
        shapes["markov_head.markov_w1.weight"] = (spec.vocab_size, spec.markov_rank)
        shapes["markov_head.markov_w2.weight"] = (spec.vocab_size, spec.markov_rank)
    if spec.confidence_head:
        shapes["confidence_head.proj.weight"] = (1, spec.confidence_in)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


def to_state(tensors: dict[str, torch.Tensor], spec: BlockSpec) -> tuple[dict[str, torch.Tensor], dict]:
    """(our state dict, the borrowed tensors a published checkpoint carries) from a checkpoint's tensors, checked for
    missing, unexpected and misshapen entries."""
    state: dict[str, torch.Tensor] = {}
    borrowed: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name in (EMBEDDING_KEY, OUTPUT_KEY):
            borrowed[name] = value
            continue
        state[ALIASES.get(name, name)] = value
    shapes = expected_shapes(spec)
    unexpected = sorted(k for k in state if k not in shapes)
    if unexpected:
        kind = "fused qkv_proj (not supported)" if any("qkv_proj" in k for k in unexpected) else "unexpected"
        raise SpecvizError(f"{kind} tensors for this {spec.kind} config: {', '.join(unexpected[:3])}")
    missing = [k for k in shapes if k not in state]
    if missing:
        raise SpecvizError(f"missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                                              else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise SpecvizError(f"tensor {name} has shape {list(state[name].shape)}, expected {list(shape)} for this "
                               f"config")
    return state, borrowed


# ---- files ------------------------------------------------------------------------------------------------------
def write(folder: Path, spec: BlockSpec, state: dict[str, torch.Tensor], dialect: str, *,
          extra_config: dict | None = None, borrowed: dict[str, torch.Tensor] | None = None) -> Path:
    """Save ``state`` (our names) in ``dialect``; refuses what the layout cannot express (one line).

    ``extra_config`` is merged into config.json (ours: the shared-weights record); ``borrowed`` (``embed_tokens`` /
    ``lm_head`` copies) is written by the DeepSpec layout, whose loader expects them (``checkpoint_files.write`` copies
    a tied target's one tensor into both).
    """
    config = config_for(spec, dialect)
    tensors = dict(state)
    if dialect == "deepspec":
        if not borrowed or set(borrowed) != {EMBEDDING_KEY, OUTPUT_KEY}:
            raise SpecvizError("the deepspec layout stores embed_tokens and lm_head; pass the target's")
        tensors.update(borrowed)
    return checkpoint_files.write(folder, {**config, **(extra_config or {})}, tensors)


def config_for(spec: BlockSpec, dialect: str) -> dict:
    """config.json of ``spec`` in ``dialect``."""
    if dialect not in DIALECTS:
        raise SpecvizError(f"unknown layout {dialect!r}; known: {', '.join(DIALECTS)}")
    if dialect == "specviz":
        return {"architectures": ["SpecvizBlockDrafter"], "model_type": "specviz-dflash", SPEC_KEY: spec.to_dict()}
    if dialect == "zlab-dflash" and (spec.anchor_predicts or spec.kind == "dspark"):
        raise SpecvizError("the z-lab layout holds plain DFlash drafters whose first mask predicts the first draft; "
                           "save this one in the deepspec or specforge-dspark layout")
    if dialect != "zlab-dflash" and not spec.anchor_predicts:
        raise SpecvizError(f"the {dialect} layout predicts from the anchor; save this DFlash drafter in the "
                           f"zlab-dflash layout")
    scaling = {k: v for k, v in spec.rope.items() if k != "rope_theta"}
    qwen3 = {"model_type": "qwen3", "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
             "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
             "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "hidden_act": "silu",
             "rms_norm_eps": spec.rms_norm_eps, "vocab_size": spec.vocab_size, "attention_bias": False,
             "rope_theta": spec.rope.get("rope_theta", 10000.0),
             "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
             "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": False,
             "layer_types": ["full_attention"] * spec.num_layers, "use_sliding_window": False,
             "num_target_layers": spec.num_target_layers, "block_size": spec.block_size}
    ids = [i - 1 for i in spec.feature_layers]  # hidden_states[i] = output of layer i - 1
    dspark = {"markov_rank": spec.markov_rank, "markov_head_type": spec.markov_type,
              "enable_confidence_head": spec.confidence_head,
              "confidence_head_with_markov": spec.confidence_with_markov}
    if dialect == "zlab-dflash":
        return {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, **qwen3,
                "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": ids}}
    if dialect == "deepspec":
        return {"architectures": ["Qwen3DSparkModel"], **qwen3, "mask_token_id": spec.mask_token_id,
                "target_layer_ids": ids, **dspark}
    return {"architectures": ["DSparkDraftModel"], "auto_map": {"AutoModel": "dspark.DSparkDraftModel"}, **qwen3,
            "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": ids, "projector_type": "dspark",
                              "attention_mode": "gqa", "confidence_head_alpha": 1.0, **dspark}}
