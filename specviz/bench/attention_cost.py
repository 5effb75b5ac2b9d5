"""The verify-cost curve per attention backend: one target forward of w tokens, as a chain and as a tree.

Cascade attention is meant to make a tree cost what a chain of the same size costs (the prefix runs on a flash
kernel either way; only the small q x q block differs), and to beat SDPA with the full 4D mask, which cannot use
a flash kernel. This measures both on the same loaded target, switching its attention backend between runs (a
per-call choice, ``engine.attention.attention_implementation``: the model's config is left as loaded), over the same
cached context, timed like ``specviz.engine.cost_curve`` (median of repeats, the accelerator synchronised before each
clock reading).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from specviz.engine import cache as kv
from specviz.engine.attention import attention_implementation
from specviz.engine.loop import Clock
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.engine.verify import masked_forward, prefill, tree_visibility
from specviz.models import cascade_attention
from specviz.models.device import CASCADE

BACKENDS = (CASCADE, "sdpa", "eager")
SHAPES = ("chain", "tree")


def binary_tree(nodes: int) -> DraftTree:
    """A full binary tree in breadth-first order (two children of the root, two of each node after): a wide tree."""
    return DraftTree(tokens=[0] * nodes, parents=[i // 2 - 1 for i in range(nodes)])


@contextmanager
def attention_backend(model: torch.nn.Module, name: str) -> Iterator[None]:
    """``model`` runs ``name`` attention within the block."""
    if name == CASCADE:
        cascade_attention.register()
    with attention_implementation(model, name):
        yield


def measure(target: Target, context: list[int], widths: list[int], *, backends: tuple[str, ...] = BACKENDS,
            repeats: int = 5) -> list[dict]:
    """``[{"backend", "shape", "context", "width", "ms"}]``: median milliseconds of a verify forward of ``width``
    tokens (the pending token plus ``width - 1`` nodes, as a chain or a binary tree) after ``context``."""
    rows = []
    for backend in backends:
        with attention_backend(target.model, backend):
            for shape in SHAPES:
                for width, ms in _curve(target, context, widths, shape, repeats).items():
                    rows.append({"backend": backend, "shape": shape, "context": len(context), "width": width,
                                 "ms": round(ms, 4)})
    return rows


def _curve(target: Target, context: list[int], widths: list[int], shape: str, repeats: int) -> dict[int, float]:
    model, clock = target.model, Clock(target.device)
    cache = kv.new_cache(model, len(context) + max(widths) + 1, target.name, preallocate=target.preallocated_cache)
    prefill(model, cache, context[:-1])
    past = len(context) - 1
    filler = (context * (max(widths) // len(context) + 1))[: max(widths)]  # real token ids
    timings = {}
    for width in [widths[0], *widths]:  # the first forward warms kernels up and is overwritten
        if shape == "chain":
            positions, visible = list(range(past, past + width)), None
        else:
            tree = binary_tree(width - 1)
            positions = [past + d for d in (0, *tree.depth)]
            visible = tree_visibility(tree, past) if width > 1 else None
        samples = []
        for _ in range(repeats):
            started = clock()
            masked_forward(model, cache, filler[:width], positions, visible)
            samples.append((clock() - started) * 1e3)
            kv.crop_to(cache, past)
        timings[width] = statistics.median(samples)
    return timings


def ratio(rows: list[dict], backend: str, shape: str, over_backend: str, over_shape: str, width: int,
          context: int) -> float | None:
    """``ms(over) / ms(this)`` at one width and context (e.g. SDPA tree over cascade tree = the cascade's speedup);
    None when either was not measured."""
    def find(name: str, kind: str) -> float | None:
        return next((r["ms"] for r in rows if (r["backend"], r["shape"], r["width"], r["context"])
                     == (name, kind, width, context)), None)

    this, other = find(backend, shape), find(over_backend, over_shape)
    return other / this if this and other else None
