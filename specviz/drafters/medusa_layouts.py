"""Medusa head checkpoints in their published layouts, normalised into one ``MedusaSpec`` plus tensors in our names.

Pure format conversion; ``specviz.drafters.medusa`` builds the heads. Head i is ``num_layers`` residual blocks
``x + SiLU(Linear(x))`` and then an output layer, its own or the target's; every layout reads the target's last
hidden state ``hidden_states[L]`` (after the final norm: Medusa's ``base_model.model(...)[0]``, vLLM's target
output).

- ``specviz``: our folder. ``config.json`` holds ``specviz_medusa`` (the ``MedusaSpec``), the borrowed-weights
  record (``specviz_shared_weights``) and ``medusa_choices`` (the static tree); keys ``heads.{i}.{j}.linear.*``,
  ``heads.{i}.{n}.weight`` when a head has its own output layer.
- ``medusa`` (FasterDecoding/Medusa): ``medusa_lm_head.safetensors`` (or ``medusa_lm_head.pt``, read only through
  ``torch.load(weights_only=True)``), the state dict of ``ModuleList[Sequential(ResBlock x n, Linear(H, V))]``:
  ``{i}.{j}.linear.weight`` / ``.bias`` for j < n and ``{i}.{n}.weight`` (Medusa-2 checkpoints prefix them with
  ``medusa_head.``; Medusa-1's legacy ``.pt`` has no ``{i}.{n}.weight``: its heads use the base model's
  ``lm_head``); ``config.json`` ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``.
- ``vllm`` (vLLM's ``model_executor/models/medusa.py``, ``MedusaConfig``): ``blocks.{i}.layers.{j}.weight``
  (``.bias`` when ``medusa_fc_bias``), ``lm_heads.{i}.weight``, or one ``lm_head.weight`` with
  ``original_lm_head``; ``token_map`` with ``truncated_vocab_size`` for a reduced draft vocabulary; optional
  ``medusa_heads.`` prefix; config ``num_heads``, ``num_hidden_layers``, ``hidden_size``, ``vocab_size``,
  ``logit_scale``. These names were read from vLLM's source, not from a published checkpoint.

Output layers equal to the target's are not kept: the heads borrow the target's (no copy in memory).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch

from specviz.drafters.checkpoint_files import TargetShape, spec_from_dict
from specviz.errors import SpecvizError

DIALECTS = ("specviz", "medusa", "vllm")
SPEC_KEY = "specviz_medusa"
CHOICES_KEY = "medusa_choices"
#: FasterDecoding's head files, in the order their loaders try them.
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


@dataclass(frozen=True)
class MedusaSpec:
    """What shapes a set of Medusa heads: ``num_heads`` heads of ``num_layers`` residual blocks each.

    ``own_lm_head``: each head has its own output layer (else the target's); ``draft_vocab_size`` < ``vocab_size``:
    the heads' own output layers cover only the ids in ``token_map`` (vLLM's truncated vocabulary).
    ``feature_layer``: the ``hidden_states`` index the heads read (HF numbering; L = after the final norm).
    """

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MedusaSpec:
        return spec_from_dict(cls, data, SPEC_KEY)


def expected_shapes(spec: MedusaSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the heads module's ``state_dict``) and their shapes."""
    h, n = spec.hidden_size, spec.num_layers
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(spec.num_heads):
        for j in range(n):
            shapes[f"heads.{i}.{j}.linear.weight"] = (h, h)
            if spec.block_bias:
                shapes[f"heads.{i}.{j}.linear.bias"] = (h,)
        if spec.own_lm_head:
            shapes[f"heads.{i}.{n}.weight"] = (spec.draft_vocab_size or spec.vocab_size, h)
    if spec.reduced_vocab:
        shapes["token_map"] = (spec.draft_vocab_size,)
    return shapes


# ---- recognising a layout ---------------------------------------------------------------------------------------
def dialect_of(config: dict, keys: set[str] | None = None) -> str:
    if SPEC_KEY in config:
        return "specviz"
    if keys is not None:
        if any(k.startswith(("blocks.", "medusa_heads.blocks.")) for k in keys):
            return "vllm"
        if any(re.match(r"(medusa_head\.)?\d+\.\d+\.", k) for k in keys):
            return "medusa"
    if "medusa_num_heads" in config:
        return "medusa"
    if config.get("model_type") == "medusa" or "MedusaModel" in (config.get("architectures") or []):
        return "vllm"
    raise SpecvizError(f"not a Medusa config: no medusa_num_heads (FasterDecoding) or model_type medusa (vLLM) "
                       f"(model_type {config.get('model_type') or 'missing'})")


def _int(config: dict, *names: str) -> int:
    for name in names:
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecvizError(f"{name} must be an integer, got {value!r}")
            return value
    raise SpecvizError(f"config.json lacks {' / '.join(names)}")


def medusa_spec(config: dict, target: TargetShape, dialect: str | None = None,
                shapes: dict[str, tuple[int, ...]] | None = None) -> MedusaSpec:
    """The ``MedusaSpec`` of a head folder's config (and tensor shapes, when known), checked against ``target``."""
    keys = set(shapes) if shapes is not None else None
    dialect = dialect or dialect_of(config, keys)
    if dialect == "specviz":
        spec = MedusaSpec.from_dict(config[SPEC_KEY])
    elif dialect == "medusa":
        heads, layers = _int(config, "medusa_num_heads"), _int(config, "medusa_num_layers")
        names = {_strip(k, "medusa_head.") for k in keys} if keys is not None else None
        own = True if names is None else f"0.{layers}.weight" in names
        bias = True if names is None else "0.0.linear.bias" in names or layers == 0
        hidden = _width(shapes, names, "0.0.linear.weight", config, target, prefix="medusa_head.")
        spec = MedusaSpec(num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=target.vocab_size,
                          feature_layer=target.num_layers, block_bias=bias, own_lm_head=own)
    else:
        heads, layers = _int(config, "num_heads", "medusa_num_heads"), _int(config, "num_hidden_layers",
                                                                               "medusa_num_layers")
        vocab = _int(config, "vocab_size")
        truncated = int(config.get("truncated_vocab_size") or vocab)
        if vocab != target.vocab_size:
            raise SpecvizError(f"vocabulary mismatch: the heads are for a {vocab}-token vocabulary, the target has "
                               f"{target.vocab_size}")
        hidden = int(config.get("hidden_size") or target.hidden_size)
        spec = MedusaSpec(num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
                          feature_layer=target.num_layers, block_bias=bool(config.get("medusa_fc_bias", False)),
                          own_lm_head=True, draft_vocab_size=truncated if truncated < vocab else 0,
                          logit_scale=float(config.get("logit_scale", 1.0)))
    check_fits(spec, target)
    return spec


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def _width(shapes, names, key: str, config: dict, target: TargetShape, prefix: str) -> int:
    """The heads' hidden size: from a block's weight shape when known, else the config's, else the target's."""
    if shapes is not None and names is not None and key in names:
        shape = shapes.get(key) or shapes.get(prefix + key)
        return int(shape[-1])
    return int(config.get("hidden_size") or target.hidden_size)


def check_fits(spec: MedusaSpec, target: TargetShape) -> None:
    if spec.hidden_size != target.hidden_size:
        raise SpecvizError(f"hidden size mismatch: the heads are for hidden size {spec.hidden_size}, the target has "
                           f"{target.hidden_size}")
    if spec.vocab_size != target.vocab_size:
        raise SpecvizError(f"vocabulary mismatch: the heads are for a {spec.vocab_size}-token vocabulary, the target "
                           f"has {target.vocab_size}")
    if not 0 <= spec.feature_layer <= target.num_layers:
        raise SpecvizError(f"the heads read hidden_states[{spec.feature_layer}], but the target has "
                           f"hidden_states[0..{target.num_layers}]")


# ---- names ------------------------------------------------------------------------------------------------------
def our_name(name: str, dialect: str, spec: MedusaSpec) -> str | None:
    """A checkpoint tensor's name in our state; None for a single shared ``lm_head`` (vLLM's original head)."""
    if dialect == "specviz":
        return name
    if dialect == "medusa":
        return "heads." + _strip(name, "medusa_head.")
    name = _strip(name, "medusa_heads.")
    if name in ("lm_head.weight",):
        return None
    found = re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", name)
    if found:
        return f"heads.{found.group(1)}.{found.group(2)}.linear.{found.group(3)}"
    found = re.fullmatch(r"lm_heads\.(\d+)\.weight", name)
    if found:
        return f"heads.{found.group(1)}.{spec.num_layers}.weight"
    return name


def published_name(name: str, dialect: str, spec: MedusaSpec) -> str:
    """Our tensor name in ``dialect``."""
    if dialect == "specviz":
        return name
    rest = name.removeprefix("heads.")
    if dialect == "medusa":
        return rest
    found = re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", rest)
    if found:
        return f"blocks.{found.group(1)}.layers.{found.group(2)}.{found.group(3)}"
    found = re.fullmatch(r"(\d+)\.(\d+)\.weight", rest)
    if found:
        return f"lm_heads.{found.group(1)}.weight"
    return name


def to_state(tensors: dict[str, torch.Tensor], spec: MedusaSpec, dialect: str) -> dict[str, torch.Tensor]:
    """A checkpoint's head tensors in our names (a shared ``lm_head`` copied to every head), checked."""
    shapes = expected_shapes(spec)
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for name, value in tensors.items():
        ours = our_name(name, dialect, spec)
        if ours is None:  # vLLM's original_lm_head: one output layer for every head
            state.update({f"heads.{i}.{spec.num_layers}.weight": value for i in range(spec.num_heads)})
        elif ours in shapes:
            state[ours] = value
        else:
            unexpected.append(name)
    if unexpected:
        raise SpecvizError(f"unexpected tensors for {spec.num_heads} heads of {spec.num_layers} blocks in the "
                           f"{dialect} layout: {', '.join(sorted(unexpected)[:3])}")
    missing = [k for k in shapes if k not in state]
    if missing:
        shown = published_name(missing[0], dialect, spec)
        raise SpecvizError(f"missing tensor {shown}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise SpecvizError(f"tensor {published_name(name, dialect, spec)} has shape {list(state[name].shape)}, "
                               f"expected {list(shape)} for this config")
    if "token_map" in state:
        ids = state["token_map"].long()
        if int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size or ids.unique().numel() != ids.numel():
            raise SpecvizError("token_map holds ids outside the target's vocabulary or repeats one")
        state["token_map"] = ids
    return state


def config_for(spec: MedusaSpec, dialect: str, target_name: str) -> dict:
    """config.json of ``spec`` in ``dialect`` (refusing what the layout cannot express)."""
    if dialect == "specviz":
        return {"architectures": ["SpecvizMedusaHeads"], "model_type": "specviz-medusa", SPEC_KEY: spec.to_dict()}
    if dialect == "medusa":
        if spec.reduced_vocab or spec.logit_scale != 1.0:
            raise SpecvizError("FasterDecoding's layout has no truncated vocabulary or logit scale")
        return {"medusa_num_heads": spec.num_heads, "medusa_num_layers": spec.num_layers,
                "base_model_name_or_path": target_name, "version": "2"}
    if dialect != "vllm":
        raise SpecvizError(f"unknown Medusa layout {dialect!r}; known: {', '.join(DIALECTS)}")
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": spec.hidden_size,
              "vocab_size": spec.vocab_size, "num_heads": spec.num_heads, "num_hidden_layers": spec.num_layers,
              "medusa_fc_bias": spec.block_bias, "logit_scale": spec.logit_scale,
              "original_lm_head": not spec.own_lm_head}
    if spec.reduced_vocab:
        config["truncated_vocab_size"] = spec.draft_vocab_size
    return config


def from_state(state: dict[str, torch.Tensor], spec: MedusaSpec, dialect: str,
               output: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Our state in ``dialect``'s names; ``output``: the target's output rows, stored where the layout needs an
    output layer the heads borrow (FasterDecoding: per head; vLLM: ``lm_head`` with ``original_lm_head``)."""
    out = {published_name(k, dialect, spec): v.detach().contiguous().cpu() for k, v in state.items()}
    if dialect == "medusa":
        for i in range(spec.num_heads):
            for j in range(spec.num_layers):  # FasterDecoding's ResBlock always has a bias
                out.setdefault(f"{i}.{j}.linear.bias", torch.zeros(spec.hidden_size, dtype=state[
                    f"heads.{i}.{j}.linear.weight"].dtype))
            if not spec.own_lm_head:
                out[f"{i}.{spec.num_layers}.weight"] = output.detach().cpu().clone()
    elif dialect == "vllm" and not spec.own_lm_head:
        out["lm_head.weight"] = output.detach().contiguous().cpu()
    return out
