"""The text so far, one span per token, coloured by where it came from (prompt, accepted draft, correction, bonus).

Everything is escaped (``text.html_token``); the block uses ``white-space: pre-wrap`` so newlines stay newlines
and spaces, line breaks and tabs also get faint glyphs. Long prompts are elided in the middle so a streamed
update stays small. An accepted draft token's tooltip names the part of the drafter that drafted it, when the
drafter labels its nodes (MTP's module, Medusa's head: ``specviz.viz.labels``).
"""

from __future__ import annotations

from collections.abc import Sequence

from specviz.engine.round import Round
from specviz.viz.labels import node_labels
from specviz.viz.outcome import OUTCOME_COLORS, OUTCOME_LABELS, Outcome, committed_outcomes
from specviz.viz.text import escape, html_token

PROMPT_HEAD, PROMPT_TAIL = 48, 96
CSS_CLASS = {
    Outcome.PROMPT: "sv-prompt",
    Outcome.ACCEPTED: "sv-accepted",
    Outcome.CORRECTION: "sv-correction",
    Outcome.BONUS: "sv-bonus",
}

#: What an empty token text means (``Target.piece_after``): a byte-level token with part of an emoji or CJK character.
PART_OF_A_CHARACTER = "no text of its own (usually part of a character that a later token completes)"


def legend_html() -> str:
    items = "".join(
        f'<span class="sv-tok {CSS_CLASS[o]}">{escape(OUTCOME_LABELS[o])}</span> '
        for o in (Outcome.PROMPT, Outcome.ACCEPTED, Outcome.CORRECTION, Outcome.BONUS)
    )
    return f'<div class="sv-legend">{items}<span class="sv-mark">␣ ↵ = space, newline</span></div>'


def _prompt_spans(pieces: Sequence[str]) -> list[str]:
    spans = []
    indices: list[int | None] = list(range(len(pieces)))
    if len(pieces) > PROMPT_HEAD + PROMPT_TAIL + 8:
        indices = [*range(PROMPT_HEAD), None, *range(len(pieces) - PROMPT_TAIL, len(pieces))]
    for i in indices:
        if i is None:
            hidden = len(pieces) - PROMPT_HEAD - PROMPT_TAIL
            spans.append(f'<span class="sv-elided">[… {hidden} prompt tokens …]</span>')
        else:
            spans.append(f'<span class="sv-tok sv-prompt" title="prompt token {i}">{html_token(pieces[i])}</span>')
    return spans


def round_spans(round_: Round, *, selected: bool = False) -> list[str]:
    """Spans for one round's committed tokens (the first carries a round marker)."""
    spans = []
    texts = round_.committed_text or [str(t) for t in round_.committed]
    accepted = len(round_.accepted)
    drafted_by = node_labels(round_)
    for j, (text, outcome) in enumerate(zip(texts, committed_outcomes(round_))):
        if outcome is Outcome.ACCEPTED:
            node = round_.accepted[j]
            p = round_.p_target[node] if node < len(round_.p_target) else None
            detail = (f"accepted draft node {node}" + (f" ({drafted_by[node]})" if drafted_by else "")
                      + (f", p_target {p:.3f}" if p is not None else ""))
        else:
            detail = f"{outcome.value} token (target's own choice after {accepted} accepted)"
        if text == "":
            detail += f" · {PART_OF_A_CHARACTER}"
        classes = f"sv-tok {CSS_CLASS[outcome]}" + (" sv-first" if j == 0 else "") + (" sv-sel" if selected else "")
        title = escape(f"round {round_.index} · {detail}")
        spans.append(f'<span class="{classes}" data-round="{round_.index}" title="{title}">{html_token(text)}</span>')
    return spans


def tokens_html(prompt_pieces: Sequence[str] | None, rounds: Sequence[Round], *, upto: int | None = None,
                selected: int | None = None, show_legend: bool = True, caret: bool = False) -> str:
    """The prompt and every committed token of ``rounds[: upto + 1]`` as escaped, coloured HTML."""
    shown = rounds if upto is None else rounds[: upto + 1]
    body = _prompt_spans(prompt_pieces or [])
    for round_ in shown:
        body += round_spans(round_, selected=round_.index == selected)
    if caret:
        body.append('<span class="sv-caret">▌</span>')
    if not shown and not prompt_pieces:
        body.append('<span class="sv-empty">no tokens yet</span>')
    legend = legend_html() if show_legend else ""
    colors = ";".join(f"--sv-{o.value}:{c}" for o, c in OUTCOME_COLORS.items())
    return f'<div class="sv-text" style="{colors}">{legend}<div class="sv-stream">{"".join(body)}</div></div>'
