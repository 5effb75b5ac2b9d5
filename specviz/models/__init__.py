"""Model registry and loading: names, local directories, GGUF files and hub ids → ``LoadedModel``.

Feature-layer convention used across specviz: HF ``hidden_states[i]`` is the output of decoder layer ``i-1``
(``hidden_states[0]`` = embeddings, ``hidden_states[L]`` = after the final norm).
"""

from specviz.models.device import Runtime, choose_attn_implementation, choose_device, choose_dtype, choose_runtime
from specviz.models.loader import LoadedModel, check_spec, clear_cache, load_model, load_tokenizer
from specviz.models.registry import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    REGISTRY,
    RegistryEntry,
    drafts_for,
    get_entry,
    list_models,
)
from specviz.models.vocab import check_same_tokenizer

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "REGISTRY",
    "LoadedModel",
    "RegistryEntry",
    "Runtime",
    "check_same_tokenizer",
    "choose_attn_implementation",
    "choose_device",
    "choose_dtype",
    "choose_runtime",
    "clear_cache",
    "drafts_for",
    "get_entry",
    "list_models",
    "check_spec",
    "load_model",
    "load_tokenizer",
]
