"""MTP module checkpoints in their published layouts, normalised into one ``MtpSpec`` plus tensors in our names.

Pure format conversion (configs, key names, conventions, weight files); ``specviz.drafters.mtp`` builds the
modules. The real configs and key lists these layouts are checked against are in ``shared/reference/layouts/``.

Every layout stores, per MTP module k, the same computation (``specviz.drafters.mtp``): two RMSNorms (on the
token embedding and on the incoming hidden state), a projection of their concatenation, one decoder layer, and a
final RMSNorm before the target's own output layer. They differ in names, in the concatenation order and in what
the next draft step reads (``MtpSpec``):

- ``specviz``: our folder. ``config.json`` holds ``specviz_mtp`` (the ``MtpSpec``) and the borrowed-weights record
  (``specviz_shared_weights``); keys ``layers.{k}.{enorm,hnorm,eh_proj,norm,block.*}``.
- ``deepseek-v3`` (also GLM-4.5): ``model.layers.{L+k}.{enorm,hnorm,eh_proj,shared_head.norm,shared_head.head,
  embed_tokens}`` plus the decoder layer's own keys under the same prefix, where L = ``num_hidden_layers`` and
  ``num_nextn_predict_layers`` modules follow the main layers. ``embed_tokens`` and ``shared_head.head`` are stored
  copies of the target's embedding and output layer: checked against the target, never loaded. The projection
  reads cat(embedding, hidden); the next step reads the module's output before ``shared_head.norm`` (as vLLM's
  ``deepseek_mtp`` runs it).
- ``qwen3-next`` (Qwen3-Next, Qwen3.5): ``mtp.{pre_fc_norm_embedding,pre_fc_norm_hidden,fc,norm}`` shared by every
  step, and ``mtp.layers.{k}.*`` (``mtp_num_hidden_layers`` blocks; step k uses block k mod n). Its RMSNorms are
  zero-centred (the stored weight w scales by 1 + w). cat(embedding, hidden); the next step reads the *normed*
  output (vLLM's ``qwen3_next_mtp`` returns ``norm(h)``).
- ``mimo`` (Xiaomi MiMo): ``model.mtp_layers.{k}.{token_layernorm,hidden_layernorm,input_proj,final_layernorm}``
  plus the decoder layer's keys under the same prefix, ``num_nextn_predict_layers``. Its concatenation order is
  reversed: ``input_proj(cat(hidden, embedding))``, so its two column halves are swapped into our
  ``eh_proj`` (cat(embedding, hidden)) on loading and back on saving; the next step reads the normed output
  (vLLM's ``mimo_mtp``).

Target feature: every published module reads ``hidden_states[L]`` (HF numbering: after the target's final norm),
because that is what vLLM (which serves them) and Megatron-LM's MTP training hand the first module; see
docs/mtp-medusa.md for the evidence and how it differs from DeepSeek-V3's figure.

Blocks: Llama-, Qwen2- (q/k/v bias) and Qwen3-shaped (q/k RMSNorm) dense decoder layers load. DeepSeek-V3's MLA
attention, MoE MLPs (DeepSeek-V3, GLM-4.5, Qwen3-Next), Qwen3-Next's gated attention and partial RoPE are refused
with one line each.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specviz.drafters import checkpoint_files
from specviz.drafters.checkpoint_files import (  # noqa: F401 - the file helpers re-exported for MTP's callers
    TargetShape,
    read_config,
    spec_from_dict,
    tensor_index,
    write,
)
from specviz.errors import SpecvizError

DIALECTS = ("specviz", "deepseek-v3", "qwen3-next", "mimo")
SPEC_KEY = "specviz_mtp"
#: Per-module part names (ours) that are not in the decoder layer.
OWN_PARTS = ("enorm", "hnorm", "eh_proj", "norm")
_PUBLISHED_PARTS = {
    "deepseek-v3": {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"},
    "mimo": {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
             "norm": "final_layernorm"},
    "qwen3-next": {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc", "norm": "norm"},
}
#: DeepSeek-V3 stores copies of the target's embedding and output layer in each MTP layer.
DEEPSEEK_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


@dataclass(frozen=True)
class MtpSpec:
    """Everything that shapes a stack of MTP modules, whatever layout it came from.

    ``feature_layer``: the target ``hidden_states`` index the first module reads (HF numbering; L = after the
    final norm). ``attention_bias``: q/k/v biases (Qwen2, MiMo); ``qk_norm``: per-head RMSNorm on q and k (Qwen3).
    The projection always reads cat(embedding, hidden) here (MiMo's reversed order is a column swap on loading).
    ``feed_normed``: the next step reads ``norm(h')`` instead of ``h'`` (vLLM's Qwen3-Next and MiMo).
    ``origin``: ``post-hoc`` for modules trained by specviz on a frozen target, ``joint`` for published layers
    trained with their model.
    """

    num_modules: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    feature_layer: int
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 8192
    attention_bias: bool = False
    qk_norm: bool = False
    feed_normed: bool = False
    origin: str = "post-hoc"

    def __post_init__(self) -> None:
        if not 1 <= self.num_modules <= 16:
            raise SpecvizError(f"an MTP stack has 1 to 16 modules, this one {self.num_modules}")
        if self.num_heads % self.num_kv_heads:
            raise SpecvizError(f"{self.num_heads} attention heads do not group into {self.num_kv_heads} KV heads")
        if self.origin not in ("post-hoc", "joint"):
            raise SpecvizError(f"MTP origin must be post-hoc or joint, got {self.origin!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> MtpSpec:
        return spec_from_dict(cls, data, SPEC_KEY)


def expected_shapes(spec: MtpSpec) -> dict[str, tuple[int, ...]]:
    """Our tensor names (the stack module's ``state_dict``) and their shapes."""
    h, m = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for k in range(spec.num_modules):
        p = f"layers.{k}."
        shapes.update({p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
                       p + "norm.weight": (h,), p + "block.input_layernorm.weight": (h,),
                       p + "block.post_attention_layernorm.weight": (h,),
                       p + "block.self_attn.q_proj.weight": (q, h), p + "block.self_attn.k_proj.weight": (kv, h),
                       p + "block.self_attn.v_proj.weight": (kv, h), p + "block.self_attn.o_proj.weight": (h, q),
                       p + "block.mlp.gate_proj.weight": (m, h), p + "block.mlp.up_proj.weight": (m, h),
                       p + "block.mlp.down_proj.weight": (h, m)})
        if spec.attention_bias:
            shapes.update({p + "block.self_attn.q_proj.bias": (q,), p + "block.self_attn.k_proj.bias": (kv,),
                           p + "block.self_attn.v_proj.bias": (kv,)})
        if spec.qk_norm:
            shapes.update({p + "block.self_attn.q_norm.weight": (spec.head_dim,),
                           p + "block.self_attn.k_norm.weight": (spec.head_dim,)})
    return shapes


# ---- recognising a layout ---------------------------------------------------------------------------------------
def flat_config(config: dict) -> dict:
    """A config with a nested ``text_config`` (multimodal Qwen3.5) read as one dict."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def module_count_field(config: dict) -> int | None:
    """The published module count: ``num_nextn_predict_layers`` (DeepSeek-V3, GLM-4.5, MiMo) or
    ``mtp_num_hidden_layers`` (Qwen3-Next, Qwen3.5)."""
    config = flat_config(config)
    for name in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SpecvizError(f"{name} must be a non-negative integer, got {value!r}")
            return value
    return None


def is_mtp_key(name: str, num_layers: int | None) -> bool:
    """Whether a checkpoint key belongs to MTP layers in any published layout (``num_layers``: the main layers)."""
    if name.startswith(("mtp.", "model.mtp_layers.")):
        return True
    found = re.match(r"model\.layers\.(\d+)\.", name)
    return bool(found and num_layers is not None and int(found.group(1)) >= num_layers)


def dialect_of(config: dict, keys: set[str] | None = None) -> str:
    """Which layout a folder (its ``config.json`` and, when known, its tensor names) is in; one line if none."""
    if SPEC_KEY in config:
        return "specviz"
    flat = flat_config(config)
    if keys is not None:
        if any(k.startswith("mtp.") for k in keys):
            return "qwen3-next"
        if any(k.startswith("model.mtp_layers.") for k in keys):
            return "mimo"
        if any(re.fullmatch(r"model\.layers\.\d+\.eh_proj\.weight", k) for k in keys):
            return "deepseek-v3"
    model_type = str(flat.get("model_type", ""))
    if model_type.startswith(("qwen3_next", "qwen3_5")) or "mtp_num_hidden_layers" in flat:
        return "qwen3-next"
    if model_type == "mimo":
        return "mimo"
    if "num_nextn_predict_layers" in flat:
        return "deepseek-v3"
    what = "no MTP tensors and " if keys is not None else ""
    raise SpecvizError(f"not an MTP checkpoint: {what}no num_nextn_predict_layers / mtp_num_hidden_layers in "
                       f"config.json (model_type {model_type or 'missing'})")


def _refusal(config: dict, dialect: str, keys: set[str] | None, count: int, q_rows: int | None) -> str | None:
    """Why the published MTP block cannot be built here (MLA, MoE, gated attention, partial RoPE), or None.

    ``q_rows``: the MTP block's q_proj output width when the tensor shapes are known (Qwen3-Next's gated attention
    doubles it)."""
    flat = flat_config(config)
    mtp_keys = {k for k in keys or () if is_mtp_key(k, flat.get("num_hidden_layers"))}
    if flat.get("kv_lora_rank") or flat.get("q_lora_rank") or any("kv_a_proj_with_mqa" in k for k in mtp_keys):
        return "its MTP block uses multi-head latent attention (MLA), which is not supported"
    if any(".mlp.experts." in k or k.endswith(".mlp.gate.weight") or "shared_expert" in k for k in mtp_keys):
        return "its MTP block has a mixture-of-experts MLP, which is not supported"
    if keys is None and _moe_config(flat, dialect, count):
        return "its MTP block has a mixture-of-experts MLP, which is not supported"
    if dialect == "qwen3-next" and (keys is None or _gated(flat, q_rows)):
        return "Qwen3-Next's gated attention (q_proj carries a gate) is not supported"
    factor = flat.get("partial_rotary_factor") or (flat.get("rope_parameters") or {}).get("partial_rotary_factor")
    if factor not in (None, 1, 1.0):
        return f"partial rotary embeddings (partial_rotary_factor {factor}) are not supported"
    if flat.get("hidden_act", "silu") != "silu":
        return f"the block's activation is {flat.get('hidden_act')!r}; only silu is supported"
    return None


def _moe_config(flat: dict, dialect: str, count: int) -> bool:
    """From the config alone: is the MTP block (layer L + k) a MoE layer?"""
    if dialect == "deepseek-v3" and flat.get("n_routed_experts"):
        first = int(flat.get("first_k_dense_replace", 0) or 0)
        frequency = int(flat.get("moe_layer_freq", 1) or 1)
        layers = int(flat.get("num_hidden_layers", 0))
        return any(i >= first and i % frequency == 0 for i in range(layers, layers + count))
    return bool(flat.get("num_experts")) and dialect == "qwen3-next"


def _gated(flat: dict, q_rows: int | None) -> bool:
    """Qwen3-Next's q_proj is twice as wide as the heads (query and gate), which the tensor shapes show."""
    heads = int(flat["num_attention_heads"])
    head_dim = int(flat.get("head_dim") or int(flat["hidden_size"]) // heads)
    return q_rows == 2 * heads * head_dim


def mtp_spec(config: dict, target: TargetShape, dialect: str | None = None,
             shapes: dict[str, tuple[int, ...]] | None = None) -> MtpSpec:
    """The ``MtpSpec`` of a folder's config (and tensor shapes, when known), checked against ``target``."""
    keys = set(shapes) if shapes is not None else None
    dialect = dialect or dialect_of(config, keys)
    if dialect == "specviz":
        spec = MtpSpec.from_dict(config[SPEC_KEY])
        check_fits(spec, target)
        return spec
    flat = flat_config(config)
    missing = [n for n in ("hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers") if
               flat.get(n) is None]
    if missing:
        raise SpecvizError(f"config.json lacks {', '.join(missing)}")
    count = _count(flat, dialect, keys)
    q_rows = next((s[0] for k, s in (shapes or {}).items() if k.endswith("self_attn.q_proj.weight") and
                   is_mtp_key(k, int(flat["num_hidden_layers"]))), None)
    reason = _refusal(flat, dialect, keys, count, q_rows)
    if reason:
        raise SpecvizError(reason)
    if int(flat["num_hidden_layers"]) != target.num_layers:
        raise SpecvizError(f"the MTP layers follow {flat['num_hidden_layers']} main layers, the target has "
                           f"{target.num_layers}")
    rope, head_dim, max_positions = checkpoint_files.rope_of(flat, "the MTP block's")
    rope = {k: v for k, v in rope.items() if k != "partial_rotary_factor"}
    block = _block_flags(flat, dialect, keys)
    if flat.get("intermediate_size") is None:
        raise SpecvizError("config.json lacks intermediate_size")
    heads = int(flat["num_attention_heads"])
    spec = MtpSpec(num_modules=count, hidden_size=int(flat["hidden_size"]),
                   intermediate_size=int(flat["intermediate_size"]), num_heads=heads,
                   num_kv_heads=int(flat.get("num_key_value_heads") or heads), head_dim=head_dim,
                   rms_norm_eps=float(flat.get("rms_norm_eps", 1e-6)), vocab_size=int(flat["vocab_size"]),
                   feature_layer=target.num_layers, rope=rope, max_position_embeddings=max_positions,
                   feed_normed=dialect in ("mimo", "qwen3-next"), origin="joint",
                   **block)
    check_fits(spec, target)
    return spec


def _count(flat: dict, dialect: str, keys: set[str] | None) -> int:
    """The module count: the config's field, checked against (or, for Qwen3-Next, read from) the tensor names."""
    declared = module_count_field(flat)
    found = None
    if keys is not None:
        if dialect == "qwen3-next":
            found = len({int(m.group(1)) for k in keys if (m := re.match(r"mtp\.layers\.(\d+)\.", k))})
        elif dialect == "mimo":
            found = len({int(m.group(1)) for k in keys if (m := re.match(r"model\.mtp_layers\.(\d+)\.", k))})
        else:
            found = len({int(m.group(1)) for k in keys if (m := re.fullmatch(r"model\.layers\.(\d+)\.eh_proj\.weight",
                                                                             k))})
    if declared is None and found is None:
        raise SpecvizError("config.json does not say how many MTP layers there are")
    if declared is not None and found is not None and declared != found:
        raise SpecvizError(f"config.json declares {declared} MTP layers, the weights hold {found}")
    count = declared if declared is not None else found
    if not count:
        raise SpecvizError("the checkpoint declares no MTP layers (num_nextn_predict_layers is 0)")
    return count


def _block_flags(flat: dict, dialect: str, keys: set[str] | None) -> dict:
    """q/k/v bias and q/k norm: from the tensor names when known, else from the config."""
    if keys is not None:
        mtp = [k for k in keys if is_mtp_key(k, int(flat["num_hidden_layers"]))]
        return {"attention_bias": any(k.endswith("self_attn.q_proj.bias") for k in mtp),
                "qk_norm": any(k.endswith("self_attn.q_norm.weight") for k in mtp)}
    model_type = str(flat.get("model_type", ""))
    return {"attention_bias": bool(flat.get("attention_bias", model_type in ("qwen2", "mimo"))),
            "qk_norm": model_type in ("qwen3", "qwen3_next") or model_type.startswith("qwen3_5")}


def check_fits(spec: MtpSpec, target: TargetShape) -> None:
    """Hidden size, vocabulary and feature layer of ``spec`` against ``target`` (one-line error)."""
    if spec.hidden_size != target.hidden_size:
        raise SpecvizError(f"hidden size mismatch: the MTP modules are for hidden size {spec.hidden_size}, the target "
                           f"has {target.hidden_size}")
    if spec.vocab_size != target.vocab_size:
        raise SpecvizError(f"vocabulary mismatch: the MTP modules are for a {spec.vocab_size}-token vocabulary, the "
                           f"target has {target.vocab_size}")
    if not 0 <= spec.feature_layer <= target.num_layers:
        raise SpecvizError(f"the MTP modules read hidden_states[{spec.feature_layer}], but the target has "
                           f"hidden_states[0..{target.num_layers}]")


def verdict(config: dict, target: TargetShape, shapes: dict[str, tuple[int, ...]] | None = None
            ) -> tuple[str, str | None]:
    """(dialect, None) when the MTP layers fit ``target``, else (dialect, the reason); unknown layouts raise."""
    dialect = dialect_of(config, set(shapes) if shapes is not None else None)
    try:
        mtp_spec(config, target, dialect, shapes)
    except SpecvizError as error:
        return dialect, str(error)
    return dialect, None


# ---- names ------------------------------------------------------------------------------------------------------
def published_name(name: str, dialect: str, num_layers: int) -> str:
    """Our tensor name in ``dialect`` (``num_layers``: the target's main layers, for DeepSeek's numbering)."""
    if dialect == "specviz":
        return name
    found = re.match(r"layers\.(\d+)\.(.+)", name)
    if not found:
        raise SpecvizError(f"not an MTP tensor name: {name}")
    k, rest = int(found.group(1)), found.group(2)
    part, _, tail = rest.partition(".")
    if dialect == "qwen3-next":
        prefix = "mtp." if part in OWN_PARTS else f"mtp.layers.{k}."
    else:
        prefix = f"model.layers.{num_layers + k}." if dialect == "deepseek-v3" else f"model.mtp_layers.{k}."
    if part in OWN_PARTS:
        return prefix + _PUBLISHED_PARTS[dialect][part] + "." + tail
    return prefix + rest.removeprefix("block.")


def our_names(name: str, dialect: str, num_layers: int, count: int) -> list[str]:
    """The names a published tensor fills in our state (several for Qwen3-Next's shared fc and norms); [] when
    it is not part of the modules (shared target copies, rotary buffers)."""
    if dialect == "specviz" or name.endswith("rotary_emb.inv_freq"):
        return [] if name.endswith("rotary_emb.inv_freq") else [name]
    if dialect == "qwen3-next":
        found = re.match(r"mtp\.layers\.(\d+)\.(.+)", name)
        if found:
            return [f"layers.{found.group(1)}.block.{found.group(2)}"]
        rest = name.removeprefix("mtp.")
        part, _, tail = rest.partition(".")
        ours = {v: k for k, v in _PUBLISHED_PARTS[dialect].items()}.get(part)
        return [f"layers.{k}.{ours}.{tail}" for k in range(count)] if ours else [name]
    pattern = r"model\.layers\.(\d+)\.(.+)" if dialect == "deepseek-v3" else r"model\.mtp_layers\.(\d+)\.(.+)"
    found = re.match(pattern, name)
    if not found:
        return [name]
    k = int(found.group(1)) - (num_layers if dialect == "deepseek-v3" else 0)
    rest = found.group(2)
    if dialect == "deepseek-v3" and rest in DEEPSEEK_SHARED:
        return []
    for ours, theirs in _PUBLISHED_PARTS[dialect].items():
        if rest.startswith(theirs + "."):
            return [f"layers.{k}.{ours}.{rest[len(theirs) + 1:]}"]
    return [f"layers.{k}.block.{rest}"]


def _zero_centred(dialect: str, name: str) -> bool:
    """Qwen3-Next's RMSNorms scale by 1 + w: every norm weight of its layout (``pre_fc_norm_*``, ``norm``, the
    layer's ``*_layernorm`` and ``q_norm`` / ``k_norm``)."""
    module, _, leaf = name.rpartition(".")
    return dialect == "qwen3-next" and leaf == "weight" and "norm" in module.rpartition(".")[2]


def _swap_halves(weight: torch.Tensor) -> torch.Tensor:
    """MiMo's ``input_proj`` reads cat(hidden, embedding): its column halves, swapped, are our ``eh_proj``'s."""
    half = weight.shape[-1] // 2
    return torch.cat([weight[..., half:], weight[..., :half]], dim=-1)


def _convert(dialect: str, theirs: str, value: torch.Tensor, loading: bool) -> torch.Tensor:
    if _zero_centred(dialect, theirs):
        return value + 1.0 if loading else value - 1.0
    if dialect == "mimo" and theirs.endswith("input_proj.weight"):
        return _swap_halves(value)
    return value


def to_state(tensors: dict[str, torch.Tensor], spec: MtpSpec, dialect: str, num_layers: int
             ) -> dict[str, torch.Tensor]:
    """A checkpoint's MTP tensors in our names, checked for missing, unexpected and misshapen entries."""
    shapes = expected_shapes(spec)
    state: dict[str, torch.Tensor] = {}
    unexpected = []
    for name, value in tensors.items():
        targets = our_names(name, dialect, num_layers, spec.num_modules)
        for ours in targets:
            if ours not in shapes:
                unexpected.append(name)
                continue
            if ours in state and dialect == "qwen3-next":
                continue
            state[ours] = _convert(dialect, name, value, loading=True)
    if unexpected:
        raise SpecvizError(f"unexpected tensors for these MTP modules in the {dialect} layout: "
                           f"{', '.join(sorted(set(unexpected))[:3])}")
    missing = [k for k in shapes if k not in state]
    if missing:
        shown = published_name(missing[0], dialect, num_layers)
        raise SpecvizError(f"missing tensor {shown}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise SpecvizError(f"tensor {published_name(name, dialect, num_layers)} has shape "
                               f"{list(state[name].shape)}, expected {list(shape)} for this config")
    return state


def from_state(state: dict[str, torch.Tensor], spec: MtpSpec, dialect: str, num_layers: int
               ) -> dict[str, torch.Tensor]:
    """Our state in ``dialect``'s names; refuses what the layout cannot hold (Qwen3-Next shares fc and norms)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        theirs = published_name(name, dialect, num_layers)
        value = _convert(dialect, theirs, value.detach().cpu(), loading=False).contiguous()
        if theirs in out and not torch.equal(out[theirs], value):
            raise SpecvizError("the qwen3-next layout shares fc and its norms across MTP layers; these modules have "
                               "their own")
        out[theirs] = value
    return out


def config_for(spec: MtpSpec, dialect: str, num_layers: int) -> dict:
    """config.json of ``spec`` in ``dialect``: a dense target-style config with the module count, or ours."""
    if dialect == "specviz":
        return {"architectures": ["SpecvizMtpModules"], "model_type": "specviz-mtp", SPEC_KEY: spec.to_dict()}
    if dialect not in DIALECTS:
        raise SpecvizError(f"unknown MTP layout {dialect!r}; known: {', '.join(DIALECTS)}")
    normed = dialect in ("mimo", "qwen3-next")
    if spec.feed_normed != normed:
        raise SpecvizError(f"the {dialect} layout feeds the next step {'norm(h)' if normed else 'h'}; these modules "
                           f"were made with feed_normed={spec.feed_normed}: save them in another layout")
    if spec.feature_layer != num_layers:
        raise SpecvizError(f"published MTP layers read hidden_states[{num_layers}]; these read "
                           f"hidden_states[{spec.feature_layer}]")
    model_type = "qwen3" if spec.qk_norm else "qwen2" if spec.attention_bias else "llama"
    config = {"model_type": "mimo" if dialect == "mimo" else model_type, "hidden_size": spec.hidden_size,
              "intermediate_size": spec.intermediate_size, "num_attention_heads": spec.num_heads,
              "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "hidden_act": "silu",
              "rms_norm_eps": spec.rms_norm_eps, "vocab_size": spec.vocab_size, "num_hidden_layers": num_layers,
              "max_position_embeddings": spec.max_position_embeddings, "attention_bias": spec.attention_bias,
              "rope_theta": spec.rope.get("rope_theta", 10000.0), "tie_word_embeddings": False}
    scaling = {k: v for k, v in spec.rope.items() if k != "rope_theta"}
    config["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    if dialect == "qwen3-next":
        return {"architectures": ["Qwen3NextForCausalLM"], **config, "mtp_num_hidden_layers": spec.num_modules}
    architecture = {"mimo": "MiMoForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM"}[config["model_type"]]
    return {"architectures": [architecture], **config, "num_nextn_predict_layers": spec.num_modules}


# ---- files ------------------------------------------------------------------------------------------------------
def resolve_source(source: str | Path, what: str, patterns: tuple[str, ...]) -> tuple[Path, str]:
    """(local folder, display name) of a directory or a hub id (``patterns``: the files to fetch; of a sharded
    target, only the shards that hold MTP layers)."""
    def mtp_shards(folder: Path) -> list[str]:
        index = folder / "model.safetensors.index.json"
        if not index.is_file():
            return []
        layers = flat_config(read_config(folder, what)).get("num_hidden_layers")
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return sorted({f for k, f in weight_map.items() if is_mtp_key(k, layers)})

    return checkpoint_files.resolve_source(source, what, patterns, choose_files=mtp_shards)
