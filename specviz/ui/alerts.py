"""Toasts (``gr.Error`` / ``gr.Warning`` / ``gr.Info``) that show their message as text.

Gradio renders a toast's message as (sanitised) HTML, and our messages quote what the user typed: a target typed as
``<img src=x onerror=…><a href=…>click me</a>`` became a real image and link in the toast and cut the message short.
Every toast of the app goes through here, so the user's text is escaped once, in one place. Status lines escape
theirs in ``specviz.viz.panels.status_html``.
"""

from __future__ import annotations

from html import escape

import gradio as gr


def as_text(message: str) -> str:
    """``message`` escaped for a toast (quotes kept: the toast shows it as element text, not in an attribute)."""
    return escape(str(message), quote=False)


def error(message: str) -> gr.Error:
    """A ``gr.Error`` to raise: a one-line message shown as text, no traceback in the server log."""
    return gr.Error(as_text(message), print_exception=False)


def warning(message: str) -> None:
    gr.Warning(as_text(message))


def info(message: str) -> None:
    gr.Info(as_text(message))
