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
from specviz.drafters.layouts import (
    REQUIRED,
    DecoderSpec,
    Field,
    Layout,
    check_layers,
    fits,
    named,
    read_fields,
    require,
    write_fields,
)
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
def _fields(nested: bool, dspark: bool) -> tuple[Field, ...]:
    """A dialect's block settings: under ``dflash_config`` (z-lab, SpecForge) or at the top level (DeepSpec), the
    other place read too; DSpark's heads where the dialect has them. Layer ids count "output of layer id"."""
    def setting(ours: str, theirs: str, default=REQUIRED, shift: int = 0) -> Field:
        places = (f"dflash_config.{theirs}", theirs)[:: 1 if nested else -1]
        return Field(ours, places[0], default, also=places[1:], shift=shift)
    block = (Field("num_layers", "num_hidden_layers"), Field("block_size", also=("dflash_config.block_size",)),
             Field("num_target_layers"), setting("mask_token_id", "mask_token_id"),
             setting("feature_layers", "target_layer_ids", shift=1))
    heads = (setting("markov_rank", "markov_rank", 0), setting("markov_type", "markov_head_type", "vanilla"),
             setting("confidence_head", "enable_confidence_head", False),
             setting("confidence_with_markov", "confidence_head_with_markov", False))
    return block + heads if dspark else block


FIELDS = {"zlab-dflash": _fields(True, False), "deepspec": _fields(False, True),
          "specforge-dspark": _fields(True, True)}
#: What each dialect's config.json always says (Transformers' remote code, SpecForge's projector).
CONSTANTS = {"zlab-dflash": {"architectures": ["DFlashDraftModel"],
                             "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}},
             "deepspec": {"architectures": ["Qwen3DSparkModel"]},
             "specforge-dspark": {"architectures": ["DSparkDraftModel"],
                                  "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
                                  "dflash_config": {"projector_type": "dspark", "attention_mode": "gqa",
                                                    "confidence_head_alpha": 1.0}}}


def _reader(dialect: str):
    def read(config: dict, target: TargetShape, shapes: dict | None) -> BlockSpec:
        """The ``BlockSpec`` of a published config; a one-line reason when it cannot serve ``target``."""
        require(config, "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
        check_layers(config, "the drafter", style="qwen3", target_hidden=config.get("target_hidden_size"))
        depth = int(config.get("num_target_layers") or target.num_layers)  # z-lab's fallback: one id per layer
        ids = build_target_layer_ids(depth, int(config["num_hidden_layers"]))
        fields = read_fields(config, FIELDS[dialect], BlockSpec, num_target_layers=target.num_layers,
                             feature_layers=tuple(i + 1 for i in ids))
        fields["confidence_with_markov"] = bool(fields.get("confidence_with_markov") and fields.get("confidence_head")
                                                and fields.get("markov_rank"))
        return BlockSpec(**fields, anchor_predicts=dialect != "zlab-dflash",
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
                 "layer_types": ["full_attention"] * spec.num_layers, "use_sliding_window": False}
        return write_fields(spec, FIELDS[dialect], {**CONSTANTS[dialect], **qwen3})
    return write


# ---- the layouts ------------------------------------------------------------------------------------------------
def _nested(config: dict) -> dict:
    nested = config.get("dflash_config")
    return nested if isinstance(nested, dict) else {}


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


LAYOUTS = (
    Layout.own(BlockSpec, "SpecvizBlockDrafter", lambda spec: ["embedding", "output"]),
    _layout("deepspec", lambda config, keys: named(config, "Qwen3DSparkModel") or (
        not _nested(config) and "target_layer_ids" in config)),  # DeepSpec's loader expects the copies
    _layout("specforge-dspark", lambda config, keys: named(config, "DSparkDraftModel")
            or _nested(config).get("projector_type") == "dspark", writes_carried=False),
    _layout("zlab-dflash", lambda config, keys: named(config, "DFlashDraftModel") or bool(_nested(config)),
            writes_carried=False),
)
DIALECTS = tuple(layout.name for layout in LAYOUTS)
UNKNOWN = ("not a DFlash or DSpark drafter config: architectures {architectures} (expected DFlashDraftModel, "
           "DSparkDraftModel, Qwen3DSparkModel or a specviz_dflash entry)")
