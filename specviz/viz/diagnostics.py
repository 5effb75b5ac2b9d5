"""Warnings for the silent failures users report: speculation that runs but does nothing, or loses.

Each check reads only the record (rounds + measured baselines), so it works on traces too. Thresholds are
deliberately loose and need a few rounds, so a short healthy run does not raise false alarms.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from specviz.viz.record import RunRecord

MIN_ROUNDS = 6


@dataclass(frozen=True)
class Diagnostic:
    level: str  # "warning" or "info"
    title: str
    detail: str


def diagnose(record: RunRecord) -> list[Diagnostic]:
    rounds = record.rounds
    found: list[Diagnostic] = []
    if not rounds or record.header.get("drafter") is None:
        return found
    m = record.metrics()
    drafting = [r for r in rounds if r.tokens]
    if len(rounds) >= MIN_ROUNDS and not drafting:
        found.append(Diagnostic("warning", "The drafter proposed nothing",
                                f"0 draft tokens in {len(rounds)} rounds: this was plain decoding plus drafter "
                                "overhead (n-gram lookup finds no repeated n-gram in text that never repeats)."))
    if len(drafting) >= MIN_ROUNDS and all(not r.accepted for r in drafting):
        found.append(Diagnostic("warning", "Every round rejected at position 1",
                                f"none of {len(drafting)} drafts had its first token accepted. Check that the drafter "
                                "was trained for this target, with the same chat template and tokenizer."))
    elif len(rounds) >= MIN_ROUNDS and drafting and m.tau < 1.05:
        found.append(Diagnostic("warning", f"τ ≈ {m.tau:.2f}: speculation is not paying",
                                "about one token per target forward, as in plain decoding. Typical causes: the wrong "
                                "drafter for this target, a chat-template or thinking-mode mismatch, a draft that is "
                                "too long for its acceptance rate."))
    confident = [(r.q_draft[i], r.p_target[i]) for r in drafting if r.q_draft is not None
                 for i, parent in enumerate(r.parents) if parent == -1 and i < len(r.p_target)]
    if len(confident) >= MIN_ROUNDS:
        q_mean, p_mean = mean(q for q, _ in confident), mean(p for _, p in confident)
        if q_mean > 0.5 and p_mean < 0.02:
            found.append(Diagnostic("warning", "Confident drafter, target disagrees: tokenizer mismatch?",
                                    f"the drafter gives its first tokens q ≈ {q_mean:.2f} but the target gives them "
                                    f"p ≈ {p_mean:.3f}. Token ids probably mean different strings to the two models "
                                    "(different tokenizer or vocabulary), or the prompt formats differ."))
    speedup = record.speedup()
    plain, source, decode_only = record.baseline()
    if speedup is not None and speedup < 1.0 and len(rounds) >= MIN_ROUNDS:
        found.append(Diagnostic("warning", f"Slower than plain decoding (×{speedup:.2f})",
                                f"{record.rate(decode_only):.1f} tokens/s against {plain:.1f} for plain decoding "
                                f"({source}). Drafting and verifying more tokens costs more than the accepted tokens "
                                "save: try a shorter chain, a smaller tree, or a better drafter."))
    if speedup is not None and record.speedup_beyond_limit():
        tau = record.metrics().tau
        found.append(Diagnostic("warning", f"Speedup beyond what τ allows (×{speedup:.2f} at τ {tau:.2f})",
                                "every round runs at least one target forward, so a speedup cannot exceed the tokens "
                                f"per round by more than noise; the baseline ({source}) and this run were timed "
                                "under different loads. Run again on a quiet machine."))
    if any(not r.lossless for r in rounds):
        found.append(Diagnostic("warning", "Lossy acceptance rule",
                                "some rounds used a rule that changes the output distribution."))
    return found


def diagnostics_html(found: list[Diagnostic]) -> str:
    from specviz.viz.text import escape

    if not found:
        return '<div class="sv-diag sv-ok">No silent-failure warnings for this run.</div>'
    items = "".join(
        f'<div class="sv-diag sv-{d.level}"><b>⚠ {escape(d.title)}</b><br>{escape(d.detail)}</div>' for d in found
    )
    return f'<div class="sv-diags">{items}</div>'
