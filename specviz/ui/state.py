"""Per-browser-session state: the runs this session is looking at, its engine thread, its step iterator.

A ``Session`` lives in a ``gr.State``, so every browser tab gets its own (Gradio creates one per session by
deep-copying the initial value; ``__deepcopy__`` returns a fresh, empty Session). Nothing here is module-global,
which is what keeps two people's rounds apart.

``Producer`` runs a generation on its own thread and applies its events to a ``RunRecord``; the UI callback only
polls the record and renders. The engine therefore never waits for the browser (streaming costs no tokens/s
beyond CPU contention), and Stop works even when Gradio has already cancelled the streaming callback.
"""

from __future__ import annotations

import contextvars
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from specviz.errors import SpecvizError
from specviz.ui import runner
from specviz.viz.record import RunRecord

log = logging.getLogger("specviz.ui")


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


def one_line(error: BaseException) -> str:
    """A user-facing line for any error: ``SpecvizError`` as is, anything else named but without a traceback."""
    if isinstance(error, SpecvizError):
        return str(error)
    first = (str(error).strip().splitlines() or [""])[0]
    return f"internal error ({type(error).__name__}: {first[:200]}); see the server log"


class Producer:
    """Iterate an event stream on a daemon thread, folding events into ``record`` as they arrive.

    Once a callback has watched it (``seen``), a producer nobody has looked at for ``orphan_s`` stops after its
    round: Gradio stops iterating a callback whose browser tab was closed or reloaded, and without this its engine
    thread would generate on to max-new-tokens, outside the queue's concurrency limit, slowing every other run.
    """

    #: Seconds without a look from a callback that has watched before, after which the run is abandoned.
    ORPHAN_S = 30.0

    def __init__(self, record: RunRecord, make_stream: Callable[[], Iterator[object]]):
        self.record = record
        self.phase = "starting"  # starting → loaded → generating → done
        self.error: BaseException | None = None
        self.stop_requested = threading.Event()
        self.changed = threading.Event()
        self.started = time.perf_counter()
        self.watched: float | None = None  # when a callback last looked (None: never; then nothing is orphaned)
        self.orphan_s = self.ORPHAN_S
        self._make_stream = make_stream
        # Run in a copy of the caller's context: Gradio's request context (which ZeroGPU reads) lives in contextvars.
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
                self.changed.set()
                if self.stop_requested.is_set():
                    break
                if self.orphaned:
                    log.info("stopping a run nobody has watched for %.0f s (its browser tab went away)", self.orphan_s)
                    break
        except Exception as error:  # reported in the page as one line
            if not isinstance(error, SpecvizError):
                log.exception("generation failed")
            self.error = error
        finally:
            if stream is not None and hasattr(stream, "close"):
                stream.close()
            self.phase = "done"
            self.changed.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def seen(self) -> None:
        """A callback is still watching this run (``streaming.watch`` calls it on every pass)."""
        self.watched = time.perf_counter()

    @property
    def orphaned(self) -> bool:
        return self.watched is not None and time.perf_counter() - self.watched > self.orphan_s

    def wait(self, timeout: float) -> bool:
        """Block until something changed (True) or ``timeout`` passed (False)."""
        changed = self.changed.wait(timeout)
        self.changed.clear()
        return changed

    def stop(self, timeout: float = 20.0) -> None:
        """Ask the thread to stop after the current round and wait for it."""
        self.stop_requested.set()
        self.thread.join(timeout)


class Session:
    """What one browser session sees and runs."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.record: RunRecord | None = None  # the playground's run (live, stepped, or an example replay)
        self.replay: RunRecord | None = None  # the Traces tab's replayed trace
        self.chain: RunRecord | None = None  # Chain vs Tree
        self.tree: RunRecord | None = None
        self.producer: Producer | None = None
        self.stepper: Iterator[object] | None = None
        self.step_request: runner.RunRequest | None = None
        self.pinned: int | None = None  # the round the reader picked during a live run (None: follow the newest)
        self.newest_shown = 0  # the newest round the live run's last frame showed (picking it follows again)
        self.stopped = threading.Event()
        self._dir: Path | None = None

    def __deepcopy__(self, memo: dict) -> Session:
        return Session()

    @property
    def busy(self) -> bool:
        return self.producer is not None and self.producer.alive

    def start(self, record: RunRecord, make_stream: Callable[[], Iterator[object]]) -> Producer:
        """Run ``make_stream`` on a fresh engine thread; any earlier run of this session is stopped first.

        The earlier producer is detached before it is stopped, so its callback sees itself superseded (and knows
        another run took over) from the moment it is told to stop, never a stopped-by-Stop state in between."""
        previous, self.producer = self.producer, None
        self.stopped.set()
        if previous is not None and previous.alive:
            previous.stop()
        self.close_stepper()
        self.stopped.clear()
        self.producer = Producer(record, make_stream)
        return self.producer

    def stop(self) -> bool:
        """Stop the running generation, if any; True when there was one."""
        self.stopped.set()
        producer, running = self.producer, self.busy
        if producer is not None and running:
            producer.stop()
        return running

    def close_stepper(self) -> None:
        if self.stepper is not None and hasattr(self.stepper, "close"):
            self.stepper.close()
        self.stepper, self.step_request = None, None

    def trace_file(self, record: RunRecord, stem: str) -> str:
        """Write ``record`` as a JSON Lines trace into this session's temp folder and return the path."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"specviz-{self.id}-"))
        drafter = record.drafter_name.replace(":", "-").replace("/", "-")
        path = self._dir / f"specviz-{stem}-{drafter}-{'tree' if 'tree' in record.budget_text else 'chain'}.jsonl"
        path.write_text(record.to_trace(), encoding="utf-8")
        return str(path)

    def source(self, name: str) -> RunRecord | None:
        return {"playground": self.record, "replay": self.replay, "chain": self.chain, "tree": self.tree}.get(name)
