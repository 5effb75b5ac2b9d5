"""ZeroGPU support: ``gpu`` is ``spaces.GPU`` when the ``spaces`` package is importable, a no-op elsewhere.

On a ZeroGPU Space the decorated generator runs in a worker process that holds a GPU only while it runs, so its
arguments and yielded events must be plain picklable data (they are: ``RunRequest`` and ``Round`` records).
Outside Spaces ``spaces.GPU`` itself is a no-op, and without the package we return the function unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

#: Longest a single GPU call may hold the device on ZeroGPU (seconds); a long generation needs more.
GPU_SECONDS = int(os.environ.get("SPECVIZ_GPU_SECONDS", "120"))

try:  # pragma: no cover - depends on the deployment
    import spaces  # type: ignore[import-not-found]
except ImportError:  # the normal case off Spaces
    spaces = None


def gpu(function: F) -> F:
    """Decorate a GPU-using function (or generator) for ZeroGPU; unchanged elsewhere."""
    if spaces is None:
        return function
    return spaces.GPU(duration=GPU_SECONDS)(function)  # pragma: no cover


def on_zero_gpu() -> bool:
    """True on a ZeroGPU Space, where a generator cannot be kept alive between clicks (see ``Session.step``)."""
    return spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in {"1", "true"}
