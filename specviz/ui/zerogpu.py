"""ZeroGPU support: ``gpu`` is ``spaces.GPU`` (with a CPU fallback) when the ``spaces`` package is importable, a
no-op elsewhere.

On a ZeroGPU Space the decorated generator runs in a worker process that holds a GPU only while it runs, so its
arguments and yielded events must be plain picklable data (they are: ``RunRequest`` and ``Round`` records).
Outside Spaces ``spaces.GPU`` itself is a no-op, and without the package we return the function unchanged.

When ZeroGPU grants no GPU (the visitor's quota is spent, the queue timed out, the scheduler is unreachable),
``spaces`` raises a ``gr.Error`` titled "ZeroGPU …" before the function runs. The run then happens on this
process's CPU instead, with ``device="cpu"`` and a note that the run label and a warning show
(``with_cpu_fallback``). An error from a run that had its GPU ("ZeroGPU worker error") is not retried.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
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
    """Decorate a GPU-using function (or generator) of one request for ZeroGPU; unchanged elsewhere."""
    if spaces is None:
        return function
    return with_cpu_fallback(spaces.GPU(duration=GPU_SECONDS)(function), function)  # pragma: no cover


def on_zero_gpu() -> bool:
    """True on a ZeroGPU Space, where a generator cannot be held between clicks (``controller.SteppedRun``)."""
    return spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in {"1", "true"}


def no_gpu_granted(error: BaseException) -> bool:
    """Whether ``error`` is ZeroGPU declining to lend a GPU (as opposed to a failure of a run that had one)."""
    title = str(getattr(error, "title", "") or "")
    return title.startswith("ZeroGPU") and title != "ZeroGPU worker error"


def fallback_note(error: BaseException) -> str:
    """The visible note of a run that fell back to the CPU."""
    reason = str(getattr(error, "message", "") or error).strip().splitlines()
    why = f"{error.title}: {reason[0][:160]}" if reason and reason[0] else str(error.title)
    return f"ZeroGPU lent no GPU ({why}); this run fell back to the CPU and is slower"


def with_cpu_fallback(on_gpu: F, on_cpu: F) -> F:
    """``on_gpu(request)``, or, when ZeroGPU grants no GPU before anything was produced,
    ``on_cpu(request with device="cpu", fallback_note=…)``. Works for generators and plain functions."""
    def cpu_request(request, error: BaseException):
        return dataclasses.replace(request, device="cpu"), fallback_note(error)

    if inspect.isgeneratorfunction(on_cpu):
        @functools.wraps(on_cpu)
        def generator(request):
            started = False
            try:
                for event in on_gpu(request):
                    started = True
                    yield event
            except Exception as error:
                if started or not no_gpu_granted(error):
                    raise
                request, note = cpu_request(request, error)
                yield from on_cpu(request, fallback_note=note)
        return generator  # type: ignore[return-value]

    @functools.wraps(on_cpu)
    def call(request):
        try:
            return on_gpu(request)
        except Exception as error:
            if not no_gpu_granted(error):
                raise
            request, note = cpu_request(request, error)
            return on_cpu(request, fallback_note=note)
    return call  # type: ignore[return-value]
