"""One visitor's runs: start one (replacing the run in flight), step one, stop it, and how each ended. No Gradio.

A visitor runs one generation at a time, whichever tab started it (the Playground's Run or Step, a side of Chain vs
Tree): a second run would halve the first one's tokens/s and leave a thread nobody draws. ``RunController`` holds
that one run. ``start`` runs a request on its own engine thread (``Producer``), which folds the runner's events into
the run's ``RunRecord``, so the engine never waits for a browser and the UI only reads the record and draws.
``stepping`` gives a run advanced one round per call in the caller's thread (Step). Starting another run, Stop, and
the visitor leaving (``close``) stop the run in flight after its current round and wait for its thread: no engine
thread outlives what its visitor asked for, and each run says why it ended (``Run.outcome``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator

from specviz.drafters.retrieval import session_memory
from specviz.drafters.suffix_store import SessionMemory
from specviz.errors import SpecvizError
from specviz.ui import runner, zerogpu
from specviz.viz.record import RunRecord

log = logging.getLogger("specviz.ui")

#: How a run ended (``Run.outcome``): its last event arrived, an error ended it, the visitor pressed Stop, another
#: run of the same visitor replaced it, or the visitor left the page.
FINISHED, FAILED, STOPPED, REPLACED, CLOSED = "finished", "failed", "stopped", "replaced", "closed"
#: The tabs that start runs (``Run.owner``): a run replaced by another tab's run must say so in its own tab.
PLAYGROUND, COMPARE = "playground", "compare"
#: Longest wait for an engine thread to finish its round once asked to stop (a round is at most a few seconds).
JOIN_S = 20.0


def apply(record: RunRecord, event: object) -> None:
    """Fold one runner event into a record."""
    if isinstance(event, runner.Loaded):
        record.header = event.header
    elif isinstance(event, runner.BaselineMeasured):
        record.beside = event.baseline
    elif isinstance(event, runner.RoundDone):
        record.prefill_ms = event.prefill_ms
        record.rounds.append(event.round)
    elif isinstance(event, runner.Finished):
        record.stop_reason = event.stop_reason
        record.summary = event.summary


def remembered(events: Iterator[object], memory: SessionMemory) -> Iterator[object]:
    """``events`` passed through; a finished run's answer joins the visitor's memory (what a retrieval drafter
    reuses in their later runs). Here, not in the engine's stream: on ZeroGPU that stream runs in a GPU worker."""
    answer: list[int] = []
    try:
        for event in events:
            if isinstance(event, runner.RoundDone):
                answer += event.round.committed
            elif isinstance(event, runner.Finished):
                memory.add(answer)
            yield event
    finally:
        if hasattr(events, "close"):
            events.close()


def _report(error: BaseException) -> None:
    """Log what is not a user's error (those are shown in the page as one line)."""
    if not isinstance(error, SpecvizError):
        log.error("generation failed", exc_info=error)


def _mark_stopped(record: RunRecord) -> None:
    """A run cut short gets a summary saying so, so its download and the debugger treat it as a stopped run."""
    if record.summary is None:
        record.stop_reason = "stopped"
        record.summary = record.trace_summary()


class Producer:
    """Iterate an event stream on a daemon thread, folding its events into ``record``.

    ``stop`` asks it to end after the event in hand (a round) and waits for the thread; an error ends it too and is
    kept in ``error``. The thread runs in a copy of the caller's context: Gradio's request context, which ZeroGPU
    reads, lives in contextvars.
    """

    def __init__(self, record: RunRecord, make_stream: Callable[[], Iterator[object]]):
        self.record = record
        self.phase = "starting"  # starting → loaded → generating → done
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.stop_requested = threading.Event()
        self._changed = threading.Event()
        self._make_stream = make_stream
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._run,), name="specviz-run", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        stream = None
        try:
            stream = self._make_stream()
            for event in stream:
                apply(self.record, event)
                if isinstance(event, runner.Loaded):
                    self.phase = "loaded"
                elif isinstance(event, runner.RoundDone):
                    self.phase = "generating"
                self._changed.set()
                if self.stop_requested.is_set():
                    break
        except Exception as error:  # reported in the page as one line
            _report(error)
            self.error = error
            if self.record.rounds and self.record.summary is None:  # the rounds before it stay in the trace
                self.record.stop_reason = "error"
                self.record.summary = {**self.record.trace_summary(), "error": str(error).splitlines()[0]
                                       if str(error) else type(error).__name__}
        finally:
            if stream is not None and hasattr(stream, "close"):
                stream.close()
            if self.error is None:
                _mark_stopped(self.record)  # a no-op when the stream's last event (Finished) arrived
            self.phase = "done"
            self._changed.set()
            # for the operator's log: a run that ends frees the machine for the others (``runner.active_runs``)
            how = "failed" if self.error is not None else "stopped" if self.stop_requested.is_set() else "finished"
            log.info("run %s after %d rounds; runs on the machine now: %d", how, len(self.record.rounds),
                     runner.active_runs())

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout: float) -> bool:
        """Block until an event arrived or the run ended (True), or ``timeout`` passed (False)."""
        changed = self._changed.wait(timeout)
        self._changed.clear()
        return changed

    def stop(self, timeout: float = JOIN_S) -> None:
        """Ask the thread to stop after the current round and wait for it."""
        self.stop_requested.set()
        self.join(timeout)

    def join(self, timeout: float = JOIN_S) -> None:
        self.thread.join(timeout)


class Run:
    """One run of one request: its record, which tab started it, and how it ended (``outcome``, None while on)."""

    def __init__(self, request: runner.RunRequest, record: RunRecord, owner: str):
        self.request = request
        self.record = record
        self.owner = owner
        self.replaced_by: Run | None = None  # set before the run is told to stop, so it never reads as "stopped"
        self.started = time.perf_counter()
        self._halted: str | None = None  # why it was asked to end (STOPPED, REPLACED, CLOSED)

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def outcome(self) -> str | None:
        raise NotImplementedError

    def halt(self, reason: str) -> None:
        """End the run after its current round, for ``reason``."""
        raise NotImplementedError


class StreamedRun(Run):
    """A run on its own engine thread (Run, Chain vs Tree): the caller follows it with ``wait`` and draws."""

    def __init__(self, request: runner.RunRequest, record: RunRecord, owner: str,
                 make_stream: Callable[[], Iterator[object]]):
        super().__init__(request, record, owner)
        self._make_stream = make_stream
        self.producer: Producer | None = None

    def begin(self) -> None:
        """Start the engine thread (``RunController.start`` does, once the run it replaces has stopped)."""
        self.producer = Producer(self.record, self._make_stream)

    @property
    def outcome(self) -> str | None:
        if self._halted is not None:  # Stop pressed just as the run finished is still a stop: the visitor's word
            return self._halted
        if self.producer is None or self.producer.alive:
            return None
        return FAILED if self.producer.error is not None else FINISHED

    @property
    def alive(self) -> bool:
        """The engine thread is running (it may have been asked to stop: ``ended``)."""
        return self.producer is not None and self.producer.alive

    @property
    def phase(self) -> str:
        """starting → loaded (the target) → generating (rounds) → done."""
        return self.producer.phase if self.producer is not None else "starting"

    @property
    def error(self) -> BaseException | None:
        return self.producer.error if self.producer is not None else None

    def wait(self, timeout: float) -> bool:
        """Block until an event arrived or the run ended (True), or ``timeout`` passed (False)."""
        return self.producer.wait(timeout) if self.producer is not None else False

    def join(self, timeout: float = JOIN_S) -> None:
        """Wait for the engine thread to end (its record is then final)."""
        if self.producer is not None:
            self.producer.join(timeout)

    def halt(self, reason: str) -> None:
        self._halted = self._halted or reason
        if self.producer is not None:
            self.producer.stop()


class SteppedRun(Run):
    """A run advanced one round per ``advance`` in the caller's thread (Step): its generation waits between calls.

    On ZeroGPU a GPU worker cannot be held between calls, so the first ``advance`` runs the whole generation and
    the later ones reveal one round each (``whole``).
    """

    def __init__(self, request: runner.RunRequest, record: RunRecord, owner: str, events: Iterator[object], *,
                 whole: bool = False):
        super().__init__(request, record, owner)
        self.error: BaseException | None = None
        self._events = events
        self._whole = whole  # run the whole generation at the first call (ZeroGPU)
        self._finished = False
        self._advancing = False
        self._lock = threading.Lock()  # Stop (another thread) must not close the generator while it runs

    @property
    def outcome(self) -> str | None:
        if self._halted is not None:
            return self._halted
        if self.error is not None:
            return FAILED
        return FINISHED if self._finished else None

    @property
    def fresh(self) -> bool:
        """Nothing has been generated yet: the next ``advance`` loads the target and prefills."""
        return not self.record.header

    def advance(self) -> None:
        """Generate up to the next round (or the end); an error ends the run (``outcome`` FAILED, ``error``)."""
        with self._lock:
            if self.ended:
                return
            self._advancing = True
        try:
            if self._whole:
                self._events, self._whole = iter(list(self._events)), False
            for event in self._events:
                apply(self.record, event)
                if isinstance(event, runner.Finished):
                    self._finished = True
                if isinstance(event, (runner.RoundDone, runner.Finished)) or self._halted is not None:
                    break
        except Exception as error:
            _report(error)
            self.error = error
        finally:
            with self._lock:
                self._advancing = False
                if self.ended:
                    self._close()

    def halt(self, reason: str) -> None:
        with self._lock:
            self._halted = self._halted or reason
            if not self._advancing:  # else ``advance`` closes it after the round in hand
                self._close()

    def _close(self) -> None:
        if hasattr(self._events, "close"):
            self._events.close()
        if self.error is None:
            _mark_stopped(self.record)


class RunController:
    """The one run of one visitor: ``start`` (replacing the run in flight), ``stepping``, ``stop``, ``close``.

    A controller that never ran holds plain data only (its lock is made on first use), so Gradio can deep-copy a
    fresh one as each visitor's initial state; once it has run it holds a thread and cannot be copied.
    """

    def __init__(self, stream: Callable[..., Iterator[object]] = runner.stream, *, whole_steps: bool | None = None):
        self._stream = stream
        self._whole_steps = zerogpu.on_zero_gpu() if whole_steps is None else whole_steps
        self._current: Run | None = None

    @property
    def _lock(self) -> threading.Lock:
        """This controller's lock, made on first use (``setdefault``: two first users get the same one)."""
        lock = self.__dict__.get("_guard")
        return lock if lock is not None else self.__dict__.setdefault("_guard", threading.Lock())

    @property
    def memory(self) -> SessionMemory:
        """This visitor's finished answers (the retrieval drafter's cache reuse), made on first use: their own, or
        the app's shared one where the operator turned sharing on (``retrieval.session_memory``)."""
        found = self.__dict__.get("_memory")
        return found if found is not None else self.__dict__.setdefault("_memory", session_memory())

    def _events(self, request: runner.RunRequest) -> Iterator[object]:
        return remembered(self._stream(request, memory=self.memory), self.memory)

    @property
    def current(self) -> Run | None:
        """The latest run of this visitor, on or ended."""
        return self._current

    @property
    def running(self) -> StreamedRun | None:
        """The run whose engine thread is running now, if any."""
        current = self._current
        return current if isinstance(current, StreamedRun) and current.alive else None

    @property
    def busy(self) -> bool:
        return self.running is not None

    def start(self, request: runner.RunRequest, *, owner: str = PLAYGROUND, name: str = "") -> StreamedRun:
        """Run ``request`` on a fresh engine thread, once the run in flight (if any) has stopped as replaced."""
        with self._lock:
            run = StreamedRun(request, RunRecord(header={}, source="live", name=name), owner,
                              lambda: self._events(request))
            self._replace(run)
            run.begin()
            self._current = run
            return run

    def stepping(self, request: runner.RunRequest) -> SteppedRun:
        """The stepped run to advance for ``request``: the current one when it is a stepped run of the same request
        that has not ended, else a new one (the run in flight stopped as replaced)."""
        with self._lock:
            current = self._current
            if isinstance(current, SteppedRun) and current.request == request and not current.ended:
                return current
            run = SteppedRun(request, RunRecord(header={}, source="step"), PLAYGROUND, self._events(request),
                             whole=self._whole_steps)
            self._replace(run)
            self._current = run
            return run

    def stop(self) -> Run | None:
        """Stop the run in flight after its current round; the run stopped, or None when none was on."""
        return self._halt(STOPPED)

    def close(self) -> None:
        """The visitor left: end their run now (Gradio's state delete and ``demo.unload`` call this)."""
        self._halt(CLOSED)

    def _halt(self, reason: str) -> Run | None:
        with self._lock:
            run = self._current
            if run is None or run.ended:
                return None
            run.halt(reason)
            return run

    def _replace(self, run: Run) -> None:
        """Stop the run in flight, if any, as replaced by ``run``, and wait for it."""
        previous = self._current
        if previous is not None and not previous.ended:
            previous.replaced_by = run
            previous.halt(REPLACED)
