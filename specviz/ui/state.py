"""Per-visitor state: the records each tab shows, the visitor's ``RunController``, and the visitors on the page.

The app keeps one ``Session`` per browser session in a ``gr.State`` whose initial value is the ``Session`` class:
Gradio calls it for each new session (and deep-copies what it returns; a fresh Session is plain data, so the copy
is an ordinary one). Nothing here is module-global, which is what keeps two people's rounds apart. A visitor who
leaves has their run stopped at once through ``demo.unload`` (``Visitors``), and their session closed again when
Gradio deletes its state (``gr.State(delete_callback=Session.close)``, an hour after the tab closed).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import weakref
from pathlib import Path

from specviz.ui.controller import RunController
from specviz.viz.record import RunRecord


class Session:
    """What one visitor sees and runs."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.runs = RunController()  # the one run of this visitor, whichever tab started it
        self.record: RunRecord | None = None  # the Playground's (a live or stepped run, or an example replay)
        self.replay: RunRecord | None = None  # the Traces tab's replayed trace
        self.chain: RunRecord | None = None  # Chain vs Tree
        self.tree: RunRecord | None = None
        self.pinned: int | None = None  # the round the reader picked during a live run (None: follow the newest)
        self.newest_shown = 0  # the newest round the live run's last frame showed (picking it follows again)
        self._before: RunRecord | None = None  # what the Playground showed before its latest run
        self._dir: Path | None = None

    def show(self, record: RunRecord) -> None:
        """The Playground shows ``record`` (a run starting) from now on; ``keep_previous`` can take it back."""
        if record is not self.record:
            self._before, self.record = self.record, record
        self.pinned = None

    def keep_previous(self, record: RunRecord) -> RunRecord | None:
        """``record``'s run failed before its first round: show what was on show before it, and return that."""
        if self.record is record and not record.rounds:
            self.record = self._before
        return self.record

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

    def close(self) -> None:
        """The visitor left: stop their run and delete their trace files (Gradio served copies of them)."""
        self.runs.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class Visitors:
    """The sessions on the page now, by Gradio's session hash: ``demo.unload`` gets no state, only the request.

    Held weakly: Gradio owns each session (its ``gr.State``), and one it has deleted drops out of here too.
    """

    def __init__(self) -> None:
        self._sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()

    def arrive(self, session_hash: str | None, session: Session) -> None:
        if session_hash:
            self._sessions[session_hash] = session

    def leave(self, session_hash: str | None) -> None:
        """Stop the run of a visitor who closed or reloaded their tab (Gradio stops drawing it, not running it)."""
        session = self._sessions.pop(session_hash, None) if session_hash else None
        if session is not None:
            session.close()

    def __len__(self) -> int:
        return len(self._sessions)
