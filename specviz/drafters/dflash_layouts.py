"""DFlash / DSpark block drafters: our folder and the published layouts, declared for ``specviz.drafters.layouts``.

``zlab-dflash`` (z-lab's DFlash, SpecForge's DFlash configs: settings under ``dflash_config``, body tensors only,
block position i >= 1 predicting itself: b - 1 drafts), ``deepspec`` (DeepSpec's ``Qwen3DSparkModel``: settings at
the top level, Markov and confidence heads, copies of the target's embedding and output layer, every position
predicting the next token: b drafts) and ``specforge-dspark`` (SpecForge's ``DSparkDraftModel``: DeepSpec's
convention, settings under ``dflash_config``); docs/dflash.md describes each. ``specviz.drafters.dflash`` builds it.

Feature layers are stored as Hugging Face ``hidden_states`` indices. The published ``target_layer_ids`` mean "output
of layer id", ``hidden_states[id + 1]``: for SmolLM2's 30 layers ``build_target_layer_ids(30, 5)`` = [1, 8, 14, 20,
27] reads ``hidden_states[2], [9], [15], [21], [28]``. ``hidden_states[L]`` (after the final norm) is refused, as
DeepSpec refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.drafters.checkpoint_files import TargetShape
from specviz.drafters.head_layer import layer_shapes
from specviz.drafters.layouts import DecoderSpec, Format, Layout, fits, require
from specviz.errors import SpecvizError

#: Our config key holding the ``BlockSpec``.
SPEC_KEY = "specviz_dflash"
#: Markov head types of DeepSpec; only ``vanilla`` (logit_k += W2 W1[x_{k-1}]) is implemented.
MARKOV_TYPES = ("vanilla", "gated", "rnn")


@dataclass(frozen=True)
class BlockSpec(DecoderSpec):
    """Everything that shapes a DFlash / DSpark drafter, whatever layout it came from.

    ``anchor_predicts``: every block position predicts the next token (DeepSpec / DSpark, b drafts); otherwise block
    position i >= 1 predicts the token at that position (z-lab DFlash, b - 1 drafts). ``markov_rank`` 0 means no
    Markov head; ``confidence_head`` adds DSpark's per-position acceptance estimate, reading the Markov embedding of
    the previous token too when ``confidence_with_markov``. ``feature_layers``: ``hidden_states`` indices, in the
    order ``fc`` concatenates them. ``num_target_layers``: the depth of the target it was made for.
    """

    KEY = SPEC_KEY
    num_layers: int
    block_size: int
    mask_token_id: int
    feature_layers: tuple[int, ...]
    num_target_layers: int
    anchor_predicts: bool = False
    markov_rank: int = 0
    markov_type: str = "vanilla"
    confidence_head: bool = False
    confidence_with_markov: bool = False

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
    def layer_options(self) -> dict:
        """The ``head_layer.DecoderLayer`` options of its layers: Qwen3-style, q/k RMS norms."""
        return dict(qk_norm=True)

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
    """Hidden size, vocabulary, feature layers (raw layer outputs) and depth of ``spec`` against ``target``."""
    fits(spec, target, "the drafter is", spec.feature_layers, raw=True)
    if spec.num_target_layers != target.num_layers:
        raise SpecvizError(f"it was made for a {spec.num_target_layers}-layer target; this target has "
                           f"{target.num_layers} decoder layers")


# ---- reading and writing configs ----------------------------------------------------------------------------------
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
    require(config, "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
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


def _reader(dialect: str):
    def read(config: dict, target: TargetShape, shapes: dict | None) -> BlockSpec:
        """The ``BlockSpec`` of a published config; a one-line reason when it cannot serve ``target``."""
        _check_layers_config(config)
        settings = _settings(config, dialect)
        block = settings.get("block_size", config.get("block_size"))
        mask = settings.get("mask_token_id", config.get("mask_token_id"))
        if block is None or mask is None:
            raise SpecvizError(f"config.json lacks {'block_size' if block is None else 'mask_token_id'}")
        dspark = dialect != "zlab-dflash"
        rank = _integer(settings.get("markov_rank", 0), "markov_rank") if dspark else 0
        confidence = bool(settings.get("enable_confidence_head", False)) if dspark else False
        return BlockSpec(
            num_layers=int(config["num_hidden_layers"]), block_size=_integer(block, "block_size"),
            mask_token_id=_integer(mask, "mask_token_id"), feature_layers=_layer_ids(settings, config, target),
            num_target_layers=int(config.get("num_target_layers") or target.num_layers),
            anchor_predicts=dspark, markov_rank=rank, markov_type=str(settings.get("markov_head_type", "vanilla")),
            confidence_head=confidence,
            confidence_with_markov=confidence and rank > 0 and bool(settings.get("confidence_head_with_markov",
                                                                                  False)),
            **DecoderSpec.fields_from(config, "the drafter's"))
    return read


def _writer(dialect: str):
    def write(spec: BlockSpec, target_name: str) -> dict:
        """config.json of ``spec`` in ``dialect``; refuses what the layout cannot express (one line)."""
        if dialect == "zlab-dflash" and (spec.anchor_predicts or spec.kind == "dspark"):
            raise SpecvizError("the z-lab layout holds plain DFlash drafters whose first mask predicts the first "
                               "draft; save this one in the deepspec or specforge-dspark layout")
        if dialect != "zlab-dflash" and not spec.anchor_predicts:
            raise SpecvizError(f"the {dialect} layout predicts from the anchor; save this DFlash drafter in the "
                               f"zlab-dflash layout")
        qwen3 = {**spec.decoder_config("qwen3", spec.num_layers), "attention_bias": False,
                 "layer_types": ["full_attention"] * spec.num_layers, "use_sliding_window": False,
                 "num_target_layers": spec.num_target_layers, "block_size": spec.block_size}
        ids = [i - 1 for i in spec.feature_layers]  # hidden_states[i] = output of layer i - 1
        dspark = {"markov_rank": spec.markov_rank, "markov_head_type": spec.markov_type,
                  "enable_confidence_head": spec.confidence_head,
                  "confidence_head_with_markov": spec.confidence_with_markov}
        if dialect == "zlab-dflash":
            return {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
                    **qwen3, "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": ids}}
        if dialect == "deepspec":
            return {"architectures": ["Qwen3DSparkModel"], **qwen3, "mask_token_id": spec.mask_token_id,
                    "target_layer_ids": ids, **dspark}
        return {"architectures": ["DSparkDraftModel"], "auto_map": {"AutoModel": "dspark.DSparkDraftModel"}, **qwen3,
                "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": ids,
                                  "projector_type": "dspark", "attention_mode": "gqa", "confidence_head_alpha": 1.0,
                                  **dspark}}
    return write


# ---- the layouts ------------------------------------------------------------------------------------------------
def expected_shapes(spec: BlockSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the drafter module's ``state_dict``, the published names) and their shapes."""
    h = spec.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, len(spec.feature_layers) * h), "hidden_norm.weight": (h,),
                                          "norm.weight": (h,)}
    layer = layer_shapes(spec, **spec.layer_options)
    for i in range(spec.num_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    if spec.markov_rank:
        shapes["markov_head.markov_w1.weight"] = (spec.vocab_size, spec.markov_rank)
        shapes["markov_head.markov_w2.weight"] = (spec.vocab_size, spec.markov_rank)
    if spec.confidence_head:
        shapes["confidence_head.proj.weight"] = (1, spec.confidence_in)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


def _nested(config: dict) -> dict:
    nested = config.get("dflash_config")
    return nested if isinstance(nested, dict) else {}


def _architecture(config: dict, name: str) -> bool:
    return name in [str(a) for a in config.get("architectures") or []]


NAMES = (("markov_head.{rest}", "markov_head.{rest}"), ("confidence_head.{rest}", "confidence_head.{rest}"),
         ("markov_head.markov_{rest}", "markov_{rest}"), ("confidence_head.proj.{rest}", "confidence_proj.{rest}"),
         ("{rest}", "{rest}"))


def _layout(dialect: str, recognise, **declared) -> Layout:
    """Every published layout: names as ours (NVIDIA Model-Optimizer's flattened DSpark names read too), copies of
    the target's embedding and output layer checked where a checkpoint carries them, fused q/k/v refused."""
    return Layout(dialect, recognise=recognise, read=_reader(dialect), write=_writer(dialect),
                  names=NAMES,
                  carried=(("embed_tokens.weight", "embedding"), ("lm_head.weight", "output")),
                  refused=(("{rest}qkv_proj.{part}", "fused qkv_proj tensors ({name}) are not supported"),), **declared)


FORMAT = Format(
    what="block drafter",
    layouts=(
        Layout.own(BlockSpec, "SpecvizBlockDrafter", lambda spec: ["embedding", "output"]),
        _layout("deepspec", lambda config, keys: _architecture(config, "Qwen3DSparkModel") or (
            not _nested(config) and "target_layer_ids" in config)),  # DeepSpec's loader expects the copies
        _layout("specforge-dspark", lambda config, keys: _architecture(config, "DSparkDraftModel")
                or _nested(config).get("projector_type") == "dspark", writes_carried=False),
        _layout("zlab-dflash", lambda config, keys: _architecture(config, "DFlashDraftModel") or bool(_nested(config)),
                writes_carried=False),
    ),
    expected_shapes=expected_shapes, check_fits=check_fits,
    unknown="not a DFlash or DSpark drafter config: architectures {architectures} (expected DFlashDraftModel, "
            "DSparkDraftModel, Qwen3DSparkModel or a specviz_dflash entry)")
DIALECTS = FORMAT.names
