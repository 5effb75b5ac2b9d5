"""``load_model``: a registry name, local directory, local .gguf or hub id → a ready ``LoadedModel``.

Loaded models are cached in-process by (spec, device, dtype, attention backend), so switching drafters in the UI
never reloads the target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz.errors import SpecvizError, UnsupportedModelError
from specviz.models import cascade_attention, fast_forward, gguf_file, hub, memory, policy, shared_embedding
from specviz.models.device import CASCADE, Runtime, choose_runtime
from specviz.models.registry import REGISTRY, RegistryEntry, get_entry
from specviz.models.safetensors_check import check_matches_config, stored_shapes, weight_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
#: What loading bad weights can raise (safetensors raises its own SafetensorError, an Exception subclass).
LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError)
try:
    from safetensors import SafetensorError

    LOAD_ERRORS = (*LOAD_ERRORS, SafetensorError)
except ImportError:  # older safetensors
    pass


@dataclass
class LoadedModel:
    """A model ready for inference: HF ``PreTrainedModel`` in eval mode plus its tokenizer and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    source: str
    device: str
    dtype: torch.dtype
    attn_implementation: str = "sdpa"
    role: str = "target"
    target: str | None = None
    load_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        """Decoder layers (``hidden_states`` has ``num_layers + 1`` entries: hs[i] is the output of layer i-1)."""
        return int(self.model.config.num_hidden_layers)

    @property
    def vocab_size(self) -> int:
        """Rows of the output head (may exceed ``len(tokenizer)`` when the vocabulary is padded)."""
        return int(self.model.config.vocab_size)

    def fast_model(self) -> torch.nn.Module:
        """The model with pre-packed linear kernels (``fast_forward.fast_copy``), built once and kept."""
        with _LOCK:
            if "fast_model" not in self.extra:
                self.extra["fast_model"] = fast_forward.fast_copy(self.model)
            return self.extra["fast_model"]


_CACHE: dict[tuple, LoadedModel] = {}
_TOKENIZERS: dict[str, object] = {}
_LOCK = threading.RLock()


def clear_cache() -> None:
    """Forget every loaded model and tokenizer (tests; freeing memory)."""
    with _LOCK:
        _CACHE.clear()
        _TOKENIZERS.clear()


def load_model(spec: str, *, role: str = "target", device: str | None = None, dtype: torch.dtype | None = None,
               attn_implementation: str | None = None) -> LoadedModel:
    """Load ``spec`` (registry name, model directory, .gguf file or hub id) on the chosen device/dtype; cached."""
    runtime = choose_runtime(device, dtype)
    if attn_implementation:
        runtime = Runtime(runtime.device, runtime.dtype, attn_implementation)
    if runtime.attn_implementation == CASCADE:
        cascade_attention.register()  # transformers refuses an attn_implementation it does not know
    key = (spec, runtime.device, runtime.dtype, runtime.attn_implementation)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        start = time.perf_counter()
        loaded = _load_uncached(spec, role, runtime)
        loaded.load_seconds = time.perf_counter() - start
        _CACHE[key] = loaded
        return loaded


def check_spec(spec: str) -> None:
    """Refuse, before anything loads, a spec that cannot load: an unknown name, a missing path, a model the allowlist
    does not name, or a hub id that is neither reachable nor in the local cache. One line each."""
    entry = REGISTRY.get(spec)
    if entry is not None:
        path = entry.resolve_path() if entry.kind != "hub" else None
        policy.check_allowed(spec, entry.location, str(path or ""))
        if entry.kind == "hub":
            hub.check_fetchable(entry.location)
        return
    path = Path(spec).expanduser()
    if path.exists():
        policy.check_allowed_path(spec, path)
        if not path.is_dir() and path.suffix.lower() != ".gguf":
            raise SpecvizError(f"{spec}: expected a model directory or a .gguf file")
    elif hub.looks_like_hub_id(spec):
        policy.check_allowed(spec)
        hub.check_fetchable(spec)
    elif spec.endswith(".gguf") or "/" in spec or spec.startswith((".", "~")):
        raise SpecvizError(f"no such file or directory: {spec}")
    else:
        get_entry(spec)  # raises the "unknown model, known names are ..." error


def _load_uncached(spec: str, role: str, runtime: Runtime) -> LoadedModel:
    """Dispatch on what ``spec`` is (``check_spec`` has refused what cannot load)."""
    check_spec(spec)
    entry = REGISTRY.get(spec)
    if entry is not None:
        if entry.kind == "hub":
            loaded = _load_hub(entry.location, runtime)
        elif entry.kind == "embedded-gguf":
            loaded = _load_gguf(entry.resolve_path(), runtime)
        else:
            fallback = entry.tokenizer_from
            loaded = _load_local_dir(entry.resolve_path(), runtime,
                                     tokenizer_fallback=(lambda: _tokenizer_source(fallback)) if fallback else None)
        loaded.target = entry.target
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            loaded = _load_local_dir(path, runtime)
        elif path.exists():
            loaded = _load_gguf(path, runtime)
        else:
            loaded = _load_hub(spec, runtime)
    loaded.name = spec
    loaded.role = role
    return loaded


def _finish(model, tokenizer, source: str, runtime: Runtime) -> LoadedModel:
    """Move to device/dtype, switch to eval mode and wrap (a model loaded without the cascade backend, as a GGUF
    file is, gets it here)."""
    model = model.to(device=runtime.device, dtype=runtime.dtype).eval()
    if runtime.attn_implementation == CASCADE and model.config._attn_implementation != CASCADE:
        model.set_attn_implementation(CASCADE)
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer, name="", source=source, device=runtime.device,
                       dtype=runtime.dtype, attn_implementation=runtime.attn_implementation)


def _check_causal(config, source: str) -> None:
    """Only decoder-only causal LMs can be targets or draft LMs."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(config, "auto_map", None):
        raise UnsupportedModelError(f"{source}: model type {config.model_type!r} is not a causal language model")


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(source: str | Path, **kwargs):
    """Load (and cache) a tokenizer from a directory; errors become one line."""
    from transformers import AutoTokenizer

    key = f"{source}|{sorted(kwargs.items())}"
    with _LOCK:
        if key not in _TOKENIZERS:
            try:
                _TOKENIZERS[key] = AutoTokenizer.from_pretrained(
                    str(source), trust_remote_code=policy.trust_remote_code(), **kwargs)
            except (OSError, ValueError) as error:
                raise SpecvizError(f"cannot load the tokenizer from {source}: {_first_line(error)}") from None
        return _TOKENIZERS[key]


def _tokenizer_source(name: str) -> Path:
    """A directory holding the tokenizer of registry entry ``name`` (converting an embedded GGUF once if needed)."""
    entry: RegistryEntry = get_entry(name)
    path = entry.resolve_path()
    if entry.kind == "embedded-gguf":
        folder = gguf_file.cache_dir_for(path)
        if not gguf_file.is_cached(folder):
            load_model(name, device="cpu")  # converts and fills the cache
        return folder
    return path


def _load_local_dir(directory: Path, runtime: Runtime, *,
                    tokenizer_fallback: Callable[[], Path] | None = None) -> LoadedModel:
    """config.json + safetensors (never pickles), validated before loading."""
    from transformers import AutoConfig, AutoModelForCausalLM

    files = weight_files(directory)
    stored = stored_shapes(files)  # one header read serves the memory check and the config check
    memory.check_fits(str(directory), memory.stored_numel(stored), runtime.dtype, runtime.device)
    try:
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=policy.trust_remote_code())
    except Exception as error:  # a user's config.json can fail transformers' checks in many ways
        raise SpecvizError(_remote_code_hint(directory, error)) from None
    _check_causal(config, str(directory))
    forms, ignored = _expected_shapes(config)
    expected = max(forms, key=lambda form: len(form.keys() & stored.keys()))  # the model's names, or as saved
    check_matches_config(stored, expected, str(directory), may_be_missing=_borrowed_or_tied(config), ignored=ignored)
    try:
        with shared_embedding.quiet_if_shared(config):  # the borrowed tensors are missing on purpose
            model = AutoModelForCausalLM.from_pretrained(
                str(directory), dtype=runtime.dtype, use_safetensors=True,
                attn_implementation=runtime.attn_implementation, trust_remote_code=policy.trust_remote_code())
    except LOAD_ERRORS as error:  # safetensors and transformers raise many kinds on bad weights
        raise SpecvizError(f"cannot load weights from {directory}: {_first_line(error)}") from None
    shared_embedding.attach_shared(
        model, lambda donor: load_model(donor, device=runtime.device, dtype=runtime.dtype).model, str(directory))
    if _has_tokenizer(directory):
        tokenizer = load_tokenizer(directory)
    elif tokenizer_fallback is not None:  # e.g. a drafter shipped without tokenizer files uses its target's
        tokenizer = load_tokenizer(tokenizer_fallback())
    else:
        raise SpecvizError(f"{directory} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return _finish(model, tokenizer, str(directory), runtime)


def _expected_shapes(config) -> tuple[list[dict[str, list[int]]], tuple[str, ...]]:
    """Name -> shape of every tensor the model ``config`` builds, on the meta device (no memory, no weights), in
    the model's own names and, where transformers converts weights on load (a mixture of experts' per-expert
    matrices fused into one), as ``save_pretrained`` writes them; and the patterns of checkpoint tensors its class
    itself ignores (e.g. rotary ``inv_freq`` buffers older saves hold, MTP layers)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=policy.trust_remote_code())
    except Exception as error:  # odd values can pass the config's own checks and fail here
        raise SpecvizError(f"config.json does not build a model: {_first_line(error)}") from None
    ignored = (*(getattr(skeleton, "_keys_to_ignore_on_load_unexpected", None) or ()), r"rotary_emb\.inv_freq$")
    state = skeleton.state_dict()
    forms = [{name: list(tensor.shape) for name, tensor in state.items()}]
    try:
        from transformers.core_model_loading import revert_weight_conversion

        saved = {name: list(tensor.shape) for name, tensor in revert_weight_conversion(skeleton, state).items()}
    except Exception:  # noqa: BLE001 - an older transformers, or a conversion meta tensors cannot run: names only
        saved = forms[0]
    return forms + ([saved] if saved != forms[0] else []), ignored


#: The input embedding and output layer: with tied embeddings a checkpoint holds either one.
TIED_PAIR = ("model.embed_tokens.weight", "lm_head.weight")


def _borrowed_or_tied(config) -> set[str]:
    """Tensors a checkpoint may leave out: those borrowed from a donor model, and an output layer tied to the
    embedding."""
    spec = shared_embedding.spec_of(config) or {}
    names = set(spec.get("tensors") or [])
    if getattr(config, "tie_word_embeddings", False):  # one copy is saved, under either name
        names.update(TIED_PAIR)
    return names


def _load_gguf(path: Path, runtime: Runtime) -> LoadedModel:
    """A .gguf file: check its architecture, then load the float cache or dequantise (and fill the cache)."""
    architecture, numel = gguf_file.gguf_metadata(path)
    gguf_file.check_architecture(path, architecture)
    folder = gguf_file.cache_dir_for(path)
    if gguf_file.is_cached(folder):
        try:
            loaded = _load_local_dir(folder, runtime)
            loaded.source = f"{path} (float cache {folder})"
            return loaded
        except SpecvizError:
            pass  # a damaged cache is rebuilt below
    # dequantisation materialises float32 weights on the CPU first
    memory.check_fits(str(path), numel, torch.float32, "cpu")
    memory.check_fits(str(path), numel, runtime.dtype, runtime.device)
    from transformers import AutoModelForCausalLM
    from transformers.utils import is_accelerate_available

    if not is_accelerate_available():
        raise SpecvizError("loading a GGUF file needs the accelerate package: pip install accelerate")
    tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except LOAD_ERRORS as error:  # gguf + transformers raise many kinds on unsupported content
        raise UnsupportedModelError(f"cannot load GGUF {path.name}: {_first_line(error)}") from None
    gguf_file.write_cache(model, tokenizer, folder)
    if gguf_file.is_cached(folder):  # reload from the cache so both paths give identical plain (unquantised) models
        loaded = _load_local_dir(folder, runtime)
        loaded.source = f"{path} (float cache {folder})"
        return loaded
    model.config.quantization_config = None
    return _finish(model, tokenizer, str(path), runtime)


def _load_hub(spec: str, runtime: Runtime) -> LoadedModel:
    """A hub id; offline or unreachable hubs give one line that says to pass a local directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    repo, revision = hub.split_revision(spec)
    common = {"revision": revision, "trust_remote_code": policy.trust_remote_code(),
              "local_files_only": hub.local_only()}
    try:
        config = AutoConfig.from_pretrained(repo, **common)
    except (OSError, ValueError) as error:
        if "trust_remote_code" in str(error):
            raise SpecvizError(_remote_code_hint(spec, error)) from None
        raise hub.hub_error(spec, error) from None
    _check_causal(config, spec)
    memory.check_fits(spec, memory.params_from_config(config), runtime.dtype, runtime.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(repo, **common)
        model = AutoModelForCausalLM.from_pretrained(repo, dtype=runtime.dtype, use_safetensors=True,
                                                     attn_implementation=runtime.attn_implementation, **common)
    except OSError as error:
        raise hub.hub_error(spec, error) from None
    return _finish(model, tokenizer, f"hub:{spec}", runtime)


def _remote_code_hint(source, error: Exception) -> str:
    if "trust_remote_code" in str(error):
        return (f"{source} needs custom code from its repository; set {policy.TRUST_REMOTE_CODE_ENV}=1 only if you "
                f"trust it")
    return f"cannot read the config of {source}: {_first_line(error)}"


def _first_line(error: Exception) -> str:
    """The message's first line, with the next one where it only introduces it (ends in ':')."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return text[:200]
