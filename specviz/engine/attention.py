"""Which attention kernel a masked forward may use, chosen per call, and what ran, in words.

Flash-attention kernels take no arbitrary mask, so ``flash_attention_2`` serves chains (plain causal attention on top
of the cache) but not trees: a tree forward runs SDPA instead (which takes the 4D mask, and on CUDA still runs a
fused kernel). ``specviz_cascade`` (``specviz.models.cascade_attention``) takes a 4D mask whose first ``kv - q``
columns are all visible, which is every verify forward: the committed prefix is seen by every node. The draft model's
incremental tree forwards (each frontier sees only its own ancestors among earlier fed nodes) are not of that shape;
they run SDPA like a flash model's trees. The check reads the CPU-side visibility matrix, so it costs no device sync.

Why the choice is not a config write: the app runs two engine threads on one cached target, and every layer reads
``config._attn_implementation`` per call, so switching it for one thread's forward switched the other's too (and
the two restores could leave the wrong value behind). The choice lives in a ``ContextVar`` instead (per thread, per
asyncio task), keyed by the model's config object. transformers looks up the attention function, and the mask
builder, by the configured name in its registries; for each name a switched model is configured with, the global
registries' entry becomes a dispatcher (``_dispatch_attention``, ``_dispatch_mask``) that runs the function
registered for this context's choice, or, with no choice made, for the configured name: what transformers would run
anyway, so every other model and thread is unaffected. The config is never written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specviz.models import cascade_attention
from specviz.models.device import CASCADE, GROUPED_SDPA, VERIFY_ATTENTION

MASK_CAPABLE = {"sdpa", "eager", GROUPED_SDPA, VERIFY_ATTENTION}
#: Backends that take a 4D mask when its first ``kv - q`` columns are all visible.
SHARED_PREFIX_MASK_CAPABLE = {CASCADE}

#: ``id(config) -> attention name`` for the forwards of this thread / task (empty: every model runs its configured one).
_CHOSEN: ContextVar[Mapping[int, str]] = ContextVar("specviz_attention", default=MappingProxyType({}))


def shares_prefix(visible: torch.Tensor) -> bool:
    """Whether a ``[q, kv]`` visibility matrix shows its first ``kv - q`` columns to every row."""
    rows, columns = visible.shape
    return bool(visible[:, : columns - rows].all())


def implementation(model: torch.nn.Module) -> str | None:
    """The attention ``model``'s forwards run in this context: the enclosing block's choice, else the configured one."""
    return _chosen_for(model.config)


@contextmanager
def mask_capable_attention(model: torch.nn.Module, visible: torch.Tensor | None = None) -> Iterator[None]:
    """Within this block ``model`` accepts the 4D attention mask built from ``visible`` (``[q, kv]`` bool)."""
    current = implementation(model)
    if (current is None or current in MASK_CAPABLE
            or (current in SHARED_PREFIX_MASK_CAPABLE and visible is not None and shares_prefix(visible))):
        yield
        return
    with attention_implementation(model, "sdpa"):
        yield


@contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Within this block, and in this thread or task only, ``model`` runs ``name`` attention (masks built for it too);
    other threads on the same model keep theirs, and ``model.config`` is not touched."""
    if name != "eager" and name not in AttentionInterface._global_mapping:
        raise ValueError(f"unknown attention implementation {name!r}; registered: "
                         f"{', '.join(sorted(AttentionInterface._global_mapping))}, eager")
    configs = _with_sub_configs(model.config)
    for config in configs:
        _route(config._attn_implementation)
    token = _CHOSEN.set({**_CHOSEN.get(), **{id(config): name for config in configs}})
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def describe(model: torch.nn.Module) -> dict:
    """The attention that runs for chain and tree forwards of ``model``: for the trace header and the run label."""
    parameter = next(model.parameters())
    current = implementation(model) or "sdpa"
    if current == CASCADE:
        return cascade_attention.describe(parameter.device, parameter.dtype)
    tree = current if current in MASK_CAPABLE else "sdpa"
    return {"implementation": current, "chain": current if current != "sdpa" else "sdpa (causal mask)",
            "tree": f"{tree} (4D tree mask)"}


def _chosen_for(config) -> str | None:
    """This context's choice for ``config``'s layers, else its configured name (read, never written). A model being
    compiled (``torch.compile``) gets its configured name: a graph holds one attention, and dynamo cannot trace a
    ``ContextVar``."""
    if torch.compiler.is_compiling():
        return getattr(config, "_attn_implementation", None)
    chosen = _CHOSEN.get()
    return (chosen.get(id(config)) if chosen else None) or getattr(config, "_attn_implementation", None)


def _with_sub_configs(config) -> list:
    """``config`` and its sub-configs: a composite model's layers read their own (transformers' setter recurses)."""
    found = [config]
    for key in getattr(config, "sub_configs", {}):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            found += _with_sub_configs(sub)
    return found


def _route(name: str | None) -> None:
    """Make layers configured with ``name`` look their function (and mask builder) up through the dispatchers.

    The entries go into the global instances' own mappings, which take precedence over the class-wide ones that
    ``AttentionInterface.register`` writes, so a later registration of ``name`` is still reached through them.
    Idempotent, and one dict write each (atomic), so two threads routing the same name at once do no harm."""
    if name is None:
        raise ValueError("the model has no attention implementation set; load it with one (sdpa, eager, ...)")
    ALL_ATTENTION_FUNCTIONS[name] = _dispatch_attention
    if name in AttentionMaskInterface._global_mapping:  # names without one build no mask: transformers' own rule
        ALL_MASK_ATTENTION_FUNCTIONS[name] = _dispatch_mask


def _dispatch_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, *args, **kwargs):
    """transformers' attention signature: runs the function of this context's choice for the layer's config."""
    function = _attention_function(_chosen_for(module.config), module)
    return function(module, query, key, value, attention_mask, *args, **kwargs)


def _dispatch_mask(*args, config, **kwargs):
    """transformers' mask-builder signature: builds the mask of this context's choice for ``config`` (None for a
    backend that registers no mask builder, as transformers does for those)."""
    builder = AttentionMaskInterface._global_mapping.get(_chosen_for(config))
    return None if builder is None else builder(*args, config=config, **kwargs)


def _attention_function(name: str, module: torch.nn.Module) -> Callable:
    """What transformers would call for ``name``: the registered function, or for ``eager`` the modeling file's own
    (transformers passes it as the default; no registry holds it)."""
    if name == "eager":
        function = getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)
    else:
        function = AttentionInterface._global_mapping.get(name)
    if function is None:
        raise ValueError(f"no {name!r} attention function for {type(module).__name__}")
    return function
