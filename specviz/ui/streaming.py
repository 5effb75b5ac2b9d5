"""Following a run from a Gradio generator callback: when to redraw, and what the status line says.

The engine runs on the run's own thread (``controller.Producer``), so redrawing never delays a round; the only cost
of streaming is CPU time spent rendering and sending. ``watch`` keeps that small: light panels (tree, text,
numbers) at most every ``light_s``, heavy charts every ``heavy_s``, and one full render at the end
(``tools/ui_perf.py`` measures it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from specviz.errors import SpecvizError
from specviz.ui import runner
from specviz.ui.controller import StreamedRun
from specviz.viz.panels import run_label
from specviz.viz.record import RunRecord

LIGHT_S = float(os.environ.get("SPECVIZ_LIGHT_S", "0.5"))  # tree, text, numbers: at most 2 updates a second
HEAVY_S = float(os.environ.get("SPECVIZ_HEAVY_S", "5.0"))  # charts and warnings
TICK_S = 1.0  # status refresh while nothing changes (model loading)


def watch(run: StreamedRun, *, light_s: float = LIGHT_S, heavy_s: float = HEAVY_S) -> Iterator[bool]:
    """Yield ``heavy`` (True when charts are due) each time a redraw is due; return once the run has ended
    (``run.outcome``: finished, failed, or stopped, replaced or closed, with its engine thread joined)."""
    last_light = last_heavy = last_tick = time.perf_counter()
    pending = False
    while run.alive and not run.ended:
        now = time.perf_counter()
        due = (last_light + light_s) if pending else (last_tick + TICK_S)
        pending = run.wait(max(0.0, due - now)) or pending
        if run.ended:
            break
        now = time.perf_counter()
        if (pending and now - last_light >= light_s) or now - last_tick >= TICK_S:
            heavy = now - last_heavy >= heavy_s
            last_light = last_tick = now
            if heavy:
                last_heavy = now
            pending = False
            yield heavy
    run.join()


def one_line(error: BaseException) -> str:
    """A user-facing line for any error: ``SpecvizError`` as is, anything else named but without a traceback."""
    if isinstance(error, SpecvizError):
        return str(error)
    first = (str(error).strip().splitlines() or [""])[0]
    return f"internal error ({type(error).__name__}: {first[:200]}); see the server log"


def live_status(run: StreamedRun) -> str:
    """What the page says while a run is in flight, including model-loading progress."""
    request, record = run.request, run.record
    waited = time.perf_counter() - run.started
    if run.phase == "starting":
        if runner.is_loaded(request.target, request.target_forward, request.device):
            return f"Preparing {request.target} and the {request.drafter} drafter… {waited:.1f} s"
        return (f"Loading target {request.target}… {waited:.1f} s (the first load reads the weights; "
                "later runs reuse them)")
    if run.phase == "loaded":
        return f"Prefilling the prompt on {request.target}… {waited:.1f} s"
    return f"Generating · {run_label(record)} · {len(record.rounds)} rounds · {record.new_tokens} tokens"


def step_loading(request: runner.RunRequest) -> str:
    """What the page says while a stepped run loads its target and prefills, before its first round."""
    if runner.is_loaded(request.target, request.target_forward, request.device):
        return "Preparing the first round…"
    return f"Loading {request.target}…"


def final_status(record: RunRecord, *, stopped: bool = False) -> tuple[str, str]:
    """(message, level) once a run has ended."""
    if not record.rounds:
        return ("Stopped before the first round." if stopped else "No rounds were produced."), "warning"
    m = record.metrics()
    tail = f" · measured speedup {record.speedup_text()}" if record.speedup() else ""
    if stopped:
        done = f"{_count(m.rounds, 'round')} ({_count(m.new_tokens, 'token')})"
        return (f"Stopped by you after {done} · τ {m.tau:.2f}{tail}. "
                "Everything so far stays inspectable; download the trace in the Traces tab."), "warning"
    reason = {"eos": "end of sequence", "max_new_tokens": "max new tokens reached"}.get(record.stop_reason,
                                                                                       record.stop_reason or "done")
    return (f"Done ({reason}) · {run_label(record)} · {m.rounds} rounds, {m.new_tokens} tokens · τ {m.tau:.2f}"
            f"{tail}"), "ok"


def replaced_status(record: RunRecord) -> str:
    """The last word of a run that a run of the same session in another tab replaced (one run per session)."""
    done = f" after {_count(len(record.rounds), 'round')} ({_count(record.new_tokens, 'token')})"
    return (f"Stopped{done if record.rounds else ' before the first round'}: another run started in this browser "
            "session (one run at a time per session). What ran so far stays inspectable.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
