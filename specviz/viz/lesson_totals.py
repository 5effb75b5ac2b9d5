"""The lesson's last page: the run's totals, each with its live numbers and its definition.

τ, acceptance, α per position, wasted verification and the measured speedup, computed by ``RunRecord.metrics`` and
``RunRecord.speedup`` (the numbers every other tab shows) and defined by ``metrics.FORMULAS``.
"""

from __future__ import annotations

from specviz.engine.metrics import FORMULAS
from specviz.viz.glossary import term
from specviz.viz.lesson_html import Lesson, para, table
from specviz.viz.lesson_html import formula as formula_box
from specviz.viz.panels import DECODE_FORMULA
from specviz.viz.record import RunRecord
from specviz.viz.text import escape


def totals(record: RunRecord) -> Lesson:
    """The run's totals with the division behind each, and the definitions beside them."""
    m = record.metrics()
    verified = sum(r.verified for r in record.rounds)
    sentence = (f"Over {m.rounds} rounds the target ran {m.rounds} forwards and committed {m.new_tokens} tokens: "
                f"{term('τ')} = {m.tau:.2f} tokens per forward, where {term('plain decoding')} gets exactly 1. "
                + speedup_sentence(record))
    if not record.finished:
        sentence += " The run is still going: these are its totals so far."
    alphas = " · ".join(f"α_{d} = {rate:.2f}" for d, rate in enumerate(m.conditional, start=1)) or "no drafts"
    rows = [
        [term("τ"), f"{m.new_tokens} tokens ÷ {m.rounds} rounds = {m.tau:.2f}"],
        [term("acceptance rate"), f"{m.accepted} kept ÷ {m.drafted} drafted = {m.acceptance_rate:.0%}"
         if m.drafted else "no drafts"],
        [term("α per position"), alphas],
        [term("wasted verification"), f"({verified} verified − {m.new_tokens} committed) ÷ {verified} = {m.wasted:.0%}"
         if verified else "—"],
        [term("speedup"), speedup_numbers(record)],
    ]
    _, _, decode_only = record.baseline()
    definitions = [FORMULAS["tau"], FORMULAS["acceptance_rate"], FORMULAS["per_position"], FORMULAS["wasted"],
                   FORMULAS["speedup"]] + ([DECODE_FORMULA] if decode_only else [])
    title = f"The run's totals: {m.rounds} rounds, {m.new_tokens} tokens"
    return Lesson(title, para(sentence), table(["total", "this run's numbers"], rows),
                  formula_box("<br>".join(escape(text) for text in definitions)))


def speedup_sentence(record: RunRecord) -> str:
    """The measured speedup in words, or why there is none yet."""
    speedup = record.speedup()
    if not speedup:
        return (f"There is no {term('speedup')} yet: no plain decoding of this model was measured beside it "
                "(the Playground's “Measure plain decoding” runs one).")
    faster = "faster than" if speedup >= 1 else "slower than"
    return (f"Measured against plain decoding of the same model on the same machine, it ran ×{speedup:.2f}: "
            f"{faster} plain decoding.")


def speedup_numbers(record: RunRecord) -> str:
    """speculative tokens/s ÷ plain tokens/s = speedup, with the spread and where the plain figure came from."""
    plain, source, decode_only = record.baseline()
    if not plain:
        return "not measured"
    phase = "decode " if decode_only else ""
    return (f"{record.rate(decode_only):.1f} ÷ {plain:.1f} {phase}tokens/s = {escape(record.speedup_text())}"
            f"<br><span class=\"sv-note\">plain: {escape(source)}</span>")
