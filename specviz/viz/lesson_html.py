"""The Lesson tab's pieces: one step as a ``Lesson``, and its HTML: paragraph, note, formula box, token box, tables.

Shared by the round's steps (``lesson``) and the run's totals (``lesson_totals``), so both look alike. Cells and
paragraphs arrive as HTML; token text is escaped here (``tok``) or by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.viz.outcome import OUTCOME_COLORS
from specviz.viz.text import escape, visible

#: Draft rows shown per table (a tree can hold many more: its figure shows them all).
MAX_ROWS = 24


@dataclass(frozen=True)
class Lesson:
    """One step as the page shows it: a heading (plain text), the step in plain words, its numbers and its formula
    with those numbers (HTML, token text escaped)."""

    title: str
    sentence: str
    body: str
    formula: str


def tok(text: str) -> str:
    """A token's text, quoted, whitespace made visible, escaped."""
    return f"<code>{escape(f'“{visible(text)}”')}</code>"


def para(html: str) -> str:
    return f'<div class="sv-facts">{html}</div>'


def note(html: str) -> str:
    return f'<div class="sv-note">{html}</div>'


def subhead(text: str) -> str:
    return f'<div class="sv-subhead">{text}</div>'


def formula(html: str) -> str:
    return f'<div class="sv-facts sv-formula">{html}</div>'


def more(n: int) -> str:
    return note(f"… and {n - MAX_ROWS} more nodes (the tree figure shows them all).") if n > MAX_ROWS else ""


def tokens_box(inner: str) -> str:
    colors = ";".join(f"--sv-{o.value}:{c}" for o, c in OUTCOME_COLORS.items())
    return f'<div class="sv-text" style="{colors}"><div class="sv-stream">{inner}</div></div>'


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table from cells that are already HTML (escaped where they hold token text)."""
    top = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="sv-table"><tr>{top}</tr>{body}</table>'
