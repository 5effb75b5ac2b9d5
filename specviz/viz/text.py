"""Token text made visible and safe: whitespace glyphs, HTML escaping, length caps.

Token text is untrusted (a model can emit ``<script>``; a prompt can hold ``<img onerror=...>``), so every view
escapes it here before it reaches HTML or plotly (plotly renders a subset of HTML in labels and hover text).
"""

from __future__ import annotations

import html

SPACE, NEWLINE, TAB, EMPTY = "␣", "↵", "→", "∅"


def visible(text: str) -> str:
    """Plain text with whitespace shown as glyphs (for labels where real whitespace would vanish)."""
    if text == "":
        return EMPTY
    return text.replace(" ", SPACE).replace("\n", NEWLINE).replace("\t", TAB).replace("\r", "␍")


def escape(text: str) -> str:
    """HTML-escape, including quotes and ``$`` (some templates interpolate ``${...}``)."""
    return html.escape(text, quote=True).replace("$", "&#36;")


def plot_escape(text: str) -> str:
    """Escape for plotly text, titles and hover labels.

    Plotly renders a small HTML subset there. It decodes ``&amp; &lt; &gt;`` but shows ``&quot;`` literally, so
    only the three characters that can open a tag or an entity are escaped.
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def label(text: str, limit: int = 14) -> str:
    """Short, plotly-escaped, whitespace-visible label for a figure."""
    shown = visible(text)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return plot_escape(shown)


def html_token(text: str) -> str:
    """Escaped HTML for a token inside a ``white-space: pre-wrap`` block. Whitespace stays whitespace, so the text
    reads as text; each space, tab and line break also carries a glyph (``sv-mark``) that the page shows in place
    of the space when the reader turns the markers on (a class on the page, ``sv-markers``: see specviz.css)."""
    if text == "":
        return f'<span class="sv-ws">{EMPTY}</span>'
    # escape() never emits spaces, tabs or newlines, so replacing them afterwards cannot break an entity.
    return (escape(text).replace(" ", f'<span class="sv-mark">{SPACE}</span><span class="sv-sp"> </span><wbr>')
            .replace("\t", f'<span class="sv-mark">{TAB}</span><span class="sv-sp">\t</span>')
            .replace("\n", f'<span class="sv-mark">{NEWLINE}</span>\n'))


def fmt_prob(value: float | None) -> str:
    if value is None:
        return "—"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:.3f}"
