"""Timings a run's decisions weigh, measured once per machine and kept, so that runs replay.

``ngram:auto``, DSpark's schedule and ``hybrid`` choose what to verify by weighing expected tokens against what a
forward costs here. Timed anew for every run, those costs wobble, and the same seed and settings would give other
rounds from one run to the next (output stays exact either way). So each cost is measured the first time it is
needed on a machine, for a given model, setting and version of specviz's code, stored as JSON under
``~/.cache/specviz/timings`` (or ``SPECVIZ_TIMINGS_DIR``), and read back by every later run; ``SPECVIZ_RETIME=1``
measures afresh each time (and stores the new figures). A store that cannot be read or written is measured around,
never an error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from specviz import resources
from specviz.errors import SpecvizError
from specviz.models.shared_embedding import fingerprint

T = TypeVar("T")

STORE_ENV = "SPECVIZ_TIMINGS_DIR"
RETIME_ENV = "SPECVIZ_RETIME"


def store_dir() -> Path:
    return Path(os.environ.get(STORE_ENV) or Path.home() / ".cache" / "specviz" / "timings")


def machine() -> dict:
    """What makes one machine's timings another's: processor, accelerator, threads, torch, and specviz's own code."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "gpu": gpu,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "code": code_version()}


@functools.cache
def code_version() -> str:
    """specviz's own ``source_digest``: a drafter or kernel made faster since a cost was stored would otherwise be
    weighed at its old cost until ``SPECVIZ_RETIME=1``."""
    return source_digest(resources.PACKAGE)


def source_digest(folder: Path) -> str:
    """A digest of the Python and C sources under ``folder``, with their paths."""
    digest = hashlib.sha1()
    for path in sorted([*folder.rglob("*.py"), *folder.rglob("*.c")]):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def model_key(model: torch.nn.Module) -> dict:
    """A model as its timings know it: its class, shape, dtype, device and a fingerprint of its input embedding
    (two random models of one shape time alike, but a key should not mix up two different models)."""
    parameter = next(model.parameters())
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else parameter
    config = getattr(model, "config", None)
    shape = {k: getattr(config, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                                    "num_attention_heads", "num_key_value_heads", "vocab_size")}
    return {"class": type(model).__name__, **shape, "dtype": str(parameter.dtype), "device": str(parameter.device),
            "attention": getattr(config, "_attn_implementation", None), "fingerprint": fingerprint(embedding)}


def remembered(kind: str, key: dict, measure: Callable[[], dict], parse: Callable[[dict], T]) -> T:
    """``parse`` of the stored measurement of ``kind`` for ``key`` (on this machine), else of ``measure()``, which is
    stored for next time. Both paths go through ``parse`` of the same JSON, so the run that measured decides on
    exactly what later runs read; a stored value ``parse`` refuses (hand-edited, truncated) is measured again."""
    full = json.loads(json.dumps({"kind": kind, "machine": machine(), **key}, sort_keys=True, default=str))
    path = store_dir() / f"{kind}-{hashlib.sha1(json.dumps(full, sort_keys=True).encode()).hexdigest()[:16]}.json"
    if os.environ.get(RETIME_ENV) != "1":
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored.get("key") == full:
                return parse(stored["value"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, SpecvizError):
            pass  # not measured here yet, or unreadable: measure
    value = json.loads(json.dumps(measure()))
    _store(path, {"key": full, "value": value})
    return parse(value)


def _store(path: Path, record: dict) -> None:
    """Write ``record`` whole or not at all (a crash mid-write leaves the old file or none)."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
            temporary = f.name
            json.dump(record, f)
        os.replace(temporary, path)
    except OSError:  # a read-only home: this run measured, the next measures again
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
