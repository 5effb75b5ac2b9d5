"""MTP module checkpoints: our folder and the published layouts, declared for ``specviz.drafters.layouts``.

Every layout stores, per module k, the same computation (``specviz.drafters.mtp`` builds it): RMSNorms on the token
embedding and on the incoming hidden state, a projection of their concatenation, one decoder layer and a final norm
before the target's output layer. They differ in names, concatenation order and what the next step reads
(``MtpSpec.feed_normed``): ``deepseek-v3`` (also GLM-4.5: the modules follow the L main layers and store copies of
the target's embedding and head), ``qwen3-next`` (Qwen3-Next, Qwen3.5: one ``fc`` and its norms for every step,
zero-centred RMSNorms) and ``mimo`` (MiMo: cat(hidden, embedding), a column swap of ours); docs/mtp-medusa.md has
the table and the sources.

Every published module reads ``hidden_states[L]`` (after the target's final norm), as vLLM and Megatron-LM feed it.
Llama-, Qwen2- and Qwen3-shaped dense blocks load; MLA, MoE MLPs, gated attention and partial RoPE are refused in
one line each.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specviz.drafters.checkpoint_files import TargetShape, read_config
from specviz.drafters.layouts import Convert, DecoderSpec, Layout, require
from specviz.errors import SpecvizError

SPEC_KEY = "specviz_mtp"


@dataclass(frozen=True)
class MtpSpec(DecoderSpec):
    """Everything that shapes a stack of MTP modules, whatever layout it came from.

    ``feature_layer``: the target ``hidden_states`` index the first module reads (HF numbering; L = after the
    final norm). ``attention_bias``: q/k/v biases (Qwen2, MiMo); ``qk_norm``: per-head RMSNorm on q and k (Qwen3).
    The projection always reads cat(embedding, hidden) here (MiMo's reversed order is a column swap on loading).
    ``feed_normed``: the next step reads ``norm(h')`` instead of ``h'`` (vLLM's Qwen3-Next and MiMo).
    ``origin``: ``post-hoc`` for modules trained by specviz on a frozen target, ``joint`` for published layers
    trained with their model.
    """

    KEY = SPEC_KEY
    num_modules: int
    feature_layer: int
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


def _refuse_block(flat: dict, dialect: str, keys: set[str] | None, count: int, q_rows: int | None) -> None:
    """Refuse in one line the published MTP blocks ours cannot build: MLA, MoE MLPs, gated attention, partial RoPE.

    ``q_rows``: the MTP block's q_proj output width when the tensor shapes are known (Qwen3-Next's gated attention
    doubles it)."""
    mtp_keys = {k for k in keys or () if is_mtp_key(k, flat.get("num_hidden_layers"))}
    if flat.get("kv_lora_rank") or flat.get("q_lora_rank") or any("kv_a_proj_with_mqa" in k for k in mtp_keys):
        raise SpecvizError("its MTP block uses multi-head latent attention (MLA), which is not supported")
    if any(".mlp.experts." in k or k.endswith(".mlp.gate.weight") or "shared_expert" in k for k in mtp_keys) or (
            keys is None and _moe_config(flat, dialect, count)):
        raise SpecvizError("its MTP block has a mixture-of-experts MLP, which is not supported")
    if dialect == "qwen3-next" and (keys is None or _gated(flat, q_rows)):
        raise SpecvizError("Qwen3-Next's gated attention (q_proj carries a gate) is not supported")
    factor = flat.get("partial_rotary_factor") or (flat.get("rope_parameters") or {}).get("partial_rotary_factor")
    if factor not in (None, 1, 1.0):
        raise SpecvizError(f"partial rotary embeddings (partial_rotary_factor {factor}) are not supported")
    if flat.get("hidden_act", "silu") != "silu":
        raise SpecvizError(f"the block's activation is {flat.get('hidden_act')!r}; only silu is supported")


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


#: The layouts whose next step reads norm(h') (vLLM's Qwen3-Next and MiMo); DeepSeek-V3's reads h'.
FEED_NORMED = ("mimo", "qwen3-next")


def _reader(dialect: str):
    def read(config: dict, target: TargetShape, shapes: dict[str, tuple[int, ...]] | None) -> MtpSpec:
        """The published module count and block, checked; what cannot be built here is refused in one line."""
        keys = set(shapes) if shapes is not None else None
        flat = flat_config(config)
        require(flat, "hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers")
        count = _count(flat, dialect, keys)
        q_rows = next((s[0] for k, s in (shapes or {}).items() if k.endswith("self_attn.q_proj.weight") and
                       is_mtp_key(k, int(flat["num_hidden_layers"]))), None)
        _refuse_block(flat, dialect, keys, count, q_rows)
        if int(flat["num_hidden_layers"]) != target.num_layers:
            raise SpecvizError(f"the MTP layers follow {flat['num_hidden_layers']} main layers, the target has "
                               f"{target.num_layers}")
        fields = DecoderSpec.fields_from(flat, "the MTP block's")
        fields["rope"].pop("partial_rotary_factor", None)
        return MtpSpec(num_modules=count, feature_layer=target.num_layers, origin="joint",
                       feed_normed=dialect in FEED_NORMED, **_block_flags(flat, dialect, keys), **fields)
    return read


MODULE_KEYS = {"qwen3-next": r"mtp\.layers\.(\d+)\.", "mimo": r"model\.mtp_layers\.(\d+)\.",
               "deepseek-v3": r"model\.layers\.(\d+)\.eh_proj\.weight$"}


def _count(flat: dict, dialect: str, keys: set[str] | None) -> int:
    """The module count: the config's field, checked against (or, for Qwen3-Next, read from) the tensor names."""
    declared = module_count_field(flat)
    found = None
    if keys is not None:  # module k's keys (DeepSeek-V3: its eh_proj, as main layers share the prefix)
        found = len({m.group(1) for k in keys if (m := re.match(MODULE_KEYS[dialect], k))})
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


def _writer(dialect: str):
    def write(spec: MtpSpec, target_name: str) -> dict:
        """A dense target-style config with the module count."""
        normed = dialect in FEED_NORMED
        if spec.feed_normed != normed:
            raise SpecvizError(f"the {dialect} layout feeds the next step {'norm(h)' if normed else 'h'}; these "
                               f"modules were made with feed_normed={spec.feed_normed}: save them in another layout")
        model_type = "mimo" if dialect == "mimo" else "qwen3" if spec.qk_norm else "qwen2" if spec.attention_bias \
            else "llama"
        config = {**spec.decoder_config(model_type, spec.feature_layer), "attention_bias": spec.attention_bias}
        if dialect == "qwen3-next":
            return {"architectures": ["Qwen3NextForCausalLM"], **config, "mtp_num_hidden_layers": spec.num_modules}
        architecture = {"mimo": "MiMoForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                        "qwen3": "Qwen3ForCausalLM"}[model_type]
        return {"architectures": [architecture], **config, "num_nextn_predict_layers": spec.num_modules}
    return write


def mtp_only(config: dict, shapes: dict) -> dict:
    """A published layout may sit inside a whole target checkpoint: only its MTP tensors count."""
    if SPEC_KEY in config:
        return shapes
    layers = flat_config(config).get("num_hidden_layers")
    return {k: s for k, s in shapes.items() if is_mtp_key(k, layers)}


def mtp_shards(folder: Path) -> list[str]:
    """Of a sharded target on the hub, only the shards that hold MTP layers."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return []
    layers = flat_config(read_config(folder)).get("num_hidden_layers")
    return sorted({f for k, f in json.loads(index.read_text()).get("weight_map", {}).items() if is_mtp_key(k, layers)})


# ---- the layouts ------------------------------------------------------------------------------------------------
def _swap_halves(weight: torch.Tensor) -> torch.Tensor:
    half = weight.shape[-1] // 2
    return torch.cat([weight[..., half:], weight[..., :half]], dim=-1)


#: Qwen3-Next's RMSNorms scale by 1 + w; MiMo's ``input_proj`` reads cat(hidden, embedding): its column halves,
#: swapped, are our ``eh_proj``'s (cat(embedding, hidden)).
ZERO_CENTRED = Convert(load=lambda w: w + 1.0, save=lambda w: w - 1.0)
SWAPPED = Convert(load=_swap_halves, save=_swap_halves)


def _names(own: str, block: str, parts: dict[str, str], converts: dict[str, Convert] | None = None,
           block_norms: Convert | None = None) -> tuple[tuple, ...]:
    """Module k's own parts (ours -> theirs under ``own``) and its decoder layer (under ``block``)."""
    converts = converts or {}
    pairs = tuple((f"layers.{{k}}.{ours}.{{rest}}", f"{own}{theirs}.{{rest}}", *filter(None, [converts.get(ours)]))
                  for ours, theirs in parts.items())
    norms = (("layers.{k}.block.{rest}norm.weight", block + "{rest}norm.weight", block_norms),) if block_norms else ()
    return pairs + norms + (("layers.{k}.block.{rest}", block + "{rest}"),)


def _layout(dialect: str, recognise, **declared) -> Layout:
    return Layout(dialect, recognise=recognise, read=_reader(dialect), write=_writer(dialect), **declared)


LAYOUTS = (
    Layout.own(MtpSpec, "SpecvizMtpModules", lambda spec: ["embedding", "output"]),
    _layout("qwen3-next", lambda config, keys: any(k.startswith("mtp.") for k in keys) if keys is not None else
            str(flat_config(config).get("model_type", "")).startswith(("qwen3_next", "qwen3_5"))
            or "mtp_num_hidden_layers" in flat_config(config),
            names=_names("mtp.", "mtp.layers.{k}.", {"enorm": "pre_fc_norm_embedding",
                                                     "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc",
                                                     "norm": "norm"},
                         dict.fromkeys(("enorm", "hnorm", "norm"), ZERO_CENTRED), ZERO_CENTRED),
            shares="fc and its norms across MTP layers"),
    _layout("mimo", lambda config, keys: any(k.startswith("model.mtp_layers.") for k in keys)
            if keys is not None else flat_config(config).get("model_type") == "mimo",
            names=_names("model.mtp_layers.{k}.", "model.mtp_layers.{k}.",
                         {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
                          "norm": "final_layernorm"}, {"eh_proj": SWAPPED})),
    _layout("deepseek-v3", lambda config, keys: "num_nextn_predict_layers" in flat_config(config) if keys is None
            else any(re.match(MODULE_KEYS["deepseek-v3"], k) for k in keys),
            names=_names("model.layers.{k+L}.", "model.layers.{k+L}.",
                         {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"}),
            carried=(("model.layers.{k+L}.embed_tokens.weight", "embedding"),  # copies in each MTP layer
                     ("model.layers.{k+L}.shared_head.head.weight", "output"))),
)
DIALECTS = tuple(layout.name for layout in LAYOUTS)
UNKNOWN = ("not an MTP checkpoint: no MTP tensors, and no num_nextn_predict_layers / mtp_num_hidden_layers in "
           "config.json (model_type {model_type})")
