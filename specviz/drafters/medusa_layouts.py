"""Medusa head checkpoints: our folder and the published layouts, declared for ``specviz.drafters.layouts``.

Head i is ``num_layers`` residual blocks ``x + SiLU(Linear(x))`` then an output layer, its own or the target's
(``specviz.drafters.medusa`` builds them); every layout reads ``hidden_states[L]`` (after the final norm). ``medusa``
is FasterDecoding's ``medusa_lm_head.safetensors`` / ``.pt`` (Medusa-2 full models prefix it ``medusa_head.``;
Medusa-1's legacy file has no output layers), ``vllm`` is vLLM's ``MedusaModel`` (read from vLLM's source: no
published checkpoint was at hand); docs/mtp-medusa.md lists their names and fields. Output layers equal to the
target's are not kept: the heads borrow the target's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from specviz.drafters.checkpoint_files import TargetShape
from specviz.drafters.layouts import Field, Layout, Spec, check_draft_ids, named, read_fields, write_fields
from specviz.errors import SpecvizError

SPEC_KEY = "specviz_medusa"
CHOICES_KEY = "medusa_choices"
#: FasterDecoding's head files, in the order their loaders try them.
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


@dataclass(frozen=True)
class MedusaSpec(Spec):
    """What shapes a set of Medusa heads: ``num_heads`` heads of ``num_layers`` residual blocks each.

    ``own_lm_head``: each head has its own output layer (else the target's); ``draft_vocab_size`` < ``vocab_size``:
    the heads' own output layers cover only the ids in ``token_map`` (vLLM's truncated vocabulary).
    ``feature_layer``: the ``hidden_states`` index the heads read (HF numbering; L = after the final norm).
    """

    KEY = SPEC_KEY
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    feature_layer: int
    block_bias: bool = True
    own_lm_head: bool = False
    draft_vocab_size: int = 0  # 0: the whole vocabulary
    logit_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.num_heads <= 32:
            raise SpecvizError(f"Medusa has 1 to 32 heads, this checkpoint {self.num_heads}")
        if not 0 <= self.num_layers <= 16:
            raise SpecvizError(f"a Medusa head has 0 to 16 residual blocks, this one {self.num_layers}")
        if self.draft_vocab_size and not (self.own_lm_head and 1 <= self.draft_vocab_size <= self.vocab_size):
            raise SpecvizError("a truncated Medusa vocabulary needs the heads' own output layers, within the "
                               "target's vocabulary")

    @property
    def reduced_vocab(self) -> bool:
        return 0 < self.draft_vocab_size < self.vocab_size


# ---- reading and writing configs --------------------------------------------------------------------------------
#: Each layout's config.json fields (FasterDecoding counts heads and blocks; the weights say the rest).
FIELDS = {"medusa": (Field("num_heads", "medusa_num_heads"), Field("num_layers", "medusa_num_layers")),
          "vllm": (Field("num_heads", also=("medusa_num_heads",)), Field("hidden_size"), Field("vocab_size"),
                   Field("num_layers", "num_hidden_layers", also=("medusa_num_layers",)),
                   Field("block_bias", "medusa_fc_bias", False), Field("logit_scale", default=1.0))}


def _read_medusa(config: dict, target: TargetShape, shapes: dict | None) -> MedusaSpec:
    """FasterDecoding's config counts heads and blocks; the weights say whether a head has its own output layer
    (Medusa-1's legacy file has none), whether blocks have biases and how wide they are."""
    fields = read_fields(config, FIELDS["medusa"], MedusaSpec)
    named = None if shapes is None else {k.removeprefix("medusa_head."): s for k, s in shapes.items()}
    hidden = config.get("hidden_size") or target.hidden_size
    if named is not None and "0.0.linear.weight" in named:
        hidden = named["0.0.linear.weight"][-1]
    layers = fields["num_layers"]
    return MedusaSpec(**fields, hidden_size=int(hidden), vocab_size=target.vocab_size,
                      feature_layer=target.num_layers, own_lm_head=named is None or f"0.{layers}.weight" in named,
                      block_bias=named is None or "0.0.linear.bias" in named or layers == 0)


def _read_vllm(config: dict, target: TargetShape, shapes: dict | None) -> MedusaSpec:
    fields = read_fields(config, FIELDS["vllm"], MedusaSpec, hidden_size=target.hidden_size)
    truncated = int(config.get("truncated_vocab_size") or fields["vocab_size"])
    return MedusaSpec(**fields, feature_layer=target.num_layers, own_lm_head=True,
                      draft_vocab_size=truncated if truncated < fields["vocab_size"] else 0)


def _write_medusa(spec: MedusaSpec, target_name: str) -> dict:
    if spec.reduced_vocab or spec.logit_scale != 1.0:
        raise SpecvizError("FasterDecoding's layout has no truncated vocabulary or logit scale")
    return write_fields(spec, FIELDS["medusa"], {"base_model_name_or_path": target_name, "version": "2"})


def _write_vllm(spec: MedusaSpec, target_name: str) -> dict:
    config = write_fields(spec, FIELDS["vllm"], {"architectures": ["MedusaModel"], "model_type": "medusa",
                                                 "original_lm_head": not spec.own_lm_head})
    return {**config, "truncated_vocab_size": spec.draft_vocab_size} if spec.reduced_vocab else config


def _fasterdecoding_extras(spec: MedusaSpec, heads) -> dict[str, torch.Tensor]:
    """FasterDecoding's ResBlock always has a bias (zeros where ours have none), and every head its output layer:
    heads that borrow the target's store a copy of it each (loading borrows it again)."""
    out = {f"{i}.{j}.linear.bias": torch.zeros(spec.hidden_size) for i in range(spec.num_heads)
           for j in range(spec.num_layers) if not spec.block_bias}
    if not spec.own_lm_head:
        out.update({f"{i}.{spec.num_layers}.weight": heads.borrowed.output.weight for i in range(spec.num_heads)})
    return out


def check_token_map(state: dict[str, torch.Tensor], spec: MedusaSpec) -> None:
    if "token_map" in state:
        state["token_map"] = state["token_map"].long()
        check_draft_ids(state["token_map"], spec.vocab_size)


def heads_only(config: dict, shapes: dict) -> dict:
    """A Medusa-2 full model keeps its heads under ``medusa_head.`` among the base model's weights."""
    if "medusa_num_heads" in config and any(k.startswith("medusa_head.") for k in shapes):
        return {k: s for k, s in shapes.items() if k.startswith("medusa_head.")}
    return shapes


# ---- the layouts ------------------------------------------------------------------------------------------------
LAYOUTS = (
    Layout.own(MedusaSpec, "SpecvizMedusaHeads", lambda spec: [] if spec.own_lm_head else ["output"]),
    Layout("medusa", read=_read_medusa, write=_write_medusa, extras=_fasterdecoding_extras,
           recognise=lambda config, keys: "medusa_num_heads" in config if keys is None else
           any(re.match(r"(medusa_head\.)?\d+\.\d+\.", k) for k in keys),
           names=(("heads.{rest}", "{rest}"),), prefixes=("medusa_head.",), filename=MEDUSA_FILES[0]),
    Layout("vllm", read=_read_vllm, write=_write_vllm,
           recognise=lambda config, keys: any(k.startswith(("blocks.", "medusa_heads.blocks.")) for k in keys)
           if keys is not None else config.get("model_type") == "medusa" or named(config, "MedusaModel"),
           names=(("heads.{i}.{j}.linear.{rest}", "blocks.{i}.layers.{j}.{rest}"),
                  ("heads.{i}.{N}.weight", "lm_heads.{i}.weight"),
                  ("heads.{i}.{N}.weight", "lm_head.weight"),  # original_lm_head: one for every head
                  ("{rest}", "{rest}")),
           prefixes=("medusa_heads.",),
           extras=lambda spec, heads: {} if spec.own_lm_head else {"lm_head.weight": heads.borrowed.output.weight}),
)
DIALECTS = tuple(layout.name for layout in LAYOUTS)
UNKNOWN = ("not a Medusa config: no medusa_num_heads (FasterDecoding) or model_type medusa (vLLM) (model_type "
           "{model_type})")
