"""Small HTML panels: metrics with their formulas, measured speedup, one round's summary, chain-vs-tree verdict.

Every number that has a definition in ``metrics.FORMULAS`` carries it as a tooltip, and ``formulas_markdown``
lists them all for the page's "formulas" accordion.
"""

from __future__ import annotations

from specviz.engine.metrics import FORMULAS
from specviz.engine.round import Round
from specviz.viz.debugger import RULE_TEXT
from specviz.viz.outcome import OUTCOME_LABELS, Outcome, node_outcomes
from specviz.viz.record import RunRecord
from specviz.viz.text import escape, visible

#: The live comparison against the short calibration uses the decode phase (see ``RunRecord.baseline``).
DECODE_FORMULA = ("decode tokens/s = new tokens ÷ wall time of the rounds (prefill excluded on both sides: it is the "
                  "same forward over the same prompt for speculative and plain decoding)")


def _card(name: str, value: str, formula_key: str | None = None, *, extra_class: str = "",
          formula: str | None = None) -> str:
    formula = formula or FORMULAS.get(formula_key or "", "")
    info = f'<span class="sv-info" title="{escape(formula)}">ⓘ</span>' if formula else ""
    title = f' title="{escape(formula)}"' if formula else ""
    return (f'<div class="sv-card {extra_class}"{title}><div class="sv-value">{escape(value)}</div>'
            f'<div class="sv-name">{escape(name)} {info}</div></div>')


def formulas_markdown() -> str:
    names = {"tau": "τ (mean tokens per round)", "acceptance_rate": "acceptance rate", "per_position": "per position",
             "per_label": "per head / module",
             "histogram": "histogram", "tokens_per_s": "tokens/s", "speedup": "speedup",
             "verified_per_round": "verified per round", "wasted": "wasted verification",
             "overhead_ms": "overhead"}
    return "\n".join(f"- **{names.get(key, key)}**: {text}" for key, text in FORMULAS.items())


def metrics_html(record: RunRecord | None) -> str:
    if record is None or not record.rounds:
        return '<div class="sv-cards sv-muted">Metrics appear after the first round.</div>'
    m = record.metrics()
    cards = [
        _card("τ tokens / round", f"{m.tau:.2f}", "tau"),
        _card("acceptance rate", f"{m.acceptance_rate:.0%}", "acceptance_rate"),
        _card("rounds (target forwards)", f"{m.rounds}", "tau"),
        _card("new tokens", f"{m.new_tokens}", "tau"),
        _card("drafted / accepted", f"{m.drafted} / {m.accepted}", "acceptance_rate"),
        _card("verified / round", f"{m.verified_per_round:.1f}", "verified_per_round"),
        _card("wasted verification", f"{m.wasted:.0%}", "wasted"),
        _card("draft · verify · overhead", f"{m.draft_ms:.1f} · {m.verify_ms:.1f} · {m.overhead_ms:.1f} ms",
              "overhead_ms"),
    ]
    return f'<div class="sv-cards">{"".join(cards)}</div>'


def speedup_html(record: RunRecord | None) -> str:
    if record is None or not record.rounds:
        return '<div class="sv-cards sv-muted">Speedup appears after the first round.</div>'
    plain, source, decode_only = record.baseline()
    speedup = record.speedup()
    phase = " (decode)" if decode_only else ""
    formula = DECODE_FORMULA if decode_only else None
    cards = [_card(f"speculative tokens/s{phase}", f"{record.rate(decode_only):.1f}", "tokens_per_s",
                   formula=formula),
             _card(f"plain decoding tokens/s{phase}", f"{plain:.1f}" if plain else "—", "tokens_per_s",
                   formula=formula)]
    if speedup is None:
        cards.append(_card("speedup", "—", "speedup"))
    else:
        good = "sv-good" if speedup >= 1.0 else "sv-bad"
        cards.append(_card("measured speedup", f"×{speedup:.2f}", "speedup", extra_class=good))
    lossless = ""
    if record.plain and "token_ids" in record.plain and record.finished:
        lossless = lossless_html(record)
    note = f'<div class="sv-note">baseline: {escape(source)}; same target, same machine, same clock.</div>'
    return f'<div class="sv-cards">{"".join(cards)}</div>{note}{lossless}'


def lossless_html(record: RunRecord) -> str:
    """Compare against the full plain run: identical under greedy, equal in distribution under sampling."""
    plain_ids = list(record.plain.get("token_ids") or []) if record.plain else []
    ids = record.token_ids
    if not record.greedy:
        return ('<div class="sv-note">sampled run: a different realisation from plain decoding is expected; the '
                'rules are lossless in distribution (tested statistically in tests/test_sampling_lossless.py).</div>')
    if ids == plain_ids:
        return (f'<div class="sv-badge sv-good">✓ lossless: all {len(ids)} tokens identical to plain greedy '
                'decoding</div>')
    first = next((i for i, (a, b) in enumerate(zip(ids, plain_ids)) if a != b), min(len(ids), len(plain_ids)))
    return (f'<div class="sv-badge sv-bad">first divergence from plain greedy decoding at new token {first} '
            f'(of {len(ids)}); tiny floating-point differences between batched and single-token forwards can flip '
            'a near-tie</div>')


def round_info_html(round_: Round | None, total: int | None = None) -> str:
    if round_ is None:
        return '<div class="sv-muted">No round selected.</div>'
    outcomes = node_outcomes(round_)
    counts = {o: outcomes.count(o) for o in (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.UNREACHED)}
    accepted = "".join(visible(round_.text[i]) for i in round_.accepted if i < len(round_.text))
    of = f" of {total}" if total else ""
    parts = [
        f"<b>round {round_.index}{of}</b>",
        f'rule <code title="{escape(RULE_TEXT.get(round_.rule, round_.rule))}">{escape(round_.rule)}</code>'
        + ("" if round_.lossless else " <b>(lossy)</b>"),
        ", ".join(f"{counts[o]} {OUTCOME_LABELS[o]}" for o in counts),
        f"accepted <code>{escape(accepted) or '∅'}</code> + {escape(round_.extra_kind)} "
        f"<code>{escape(visible(round_.extra_text))}</code>",
        f"draft {round_.draft_ms:.1f} ms · verify {round_.verify_ms:.1f} ms · overhead {round_.other_ms:.1f} ms",
    ]
    return f'<div class="sv-roundinfo">{" · ".join(parts)}</div>'


def status_html(message: str, level: str = "info") -> str:
    return f'<div class="sv-status sv-{level}">{escape(message)}</div>'


def run_label(record: RunRecord) -> str:
    """One line naming what is shown: live or replayed, which target, drafter and budget."""
    origin = {"trace": f"replay of {record.name or 'a trace'}", "step": "step-by-step run"}.get(record.source,
                                                                                                 "live run")
    config = record.header.get("config") or {}
    temperature = config.get("temperature", 0.0)
    sampling = "greedy" if record.greedy else f"T={temperature} top-p={config.get('top_p', 1.0)}"
    notes = "; ".join(note for note in (record.drafter_reads, record.drafter_modules, record.drafter_trained,
                                        record.drafter_precision, record.drafter_schedule) if note)
    reads = f" ({notes})" if notes else ""
    fallback = f" · {record.run_note}" if record.run_note else ""
    attention = f" · {record.attention_text}" if record.attention_text else ""
    return (f"{origin} · target {record.target_name} · drafter {record.drafter_name}{reads} · {record.budget_text} · "
            f"{sampling} · seed {config.get('seed')}{attention}{fallback}")


def compare_stats_html(record: RunRecord | None) -> str:
    if record is None or not record.rounds:
        return '<div class="sv-muted">not run yet</div>'
    m = record.metrics()
    plain, _, decode_only = record.baseline()
    speedup = record.speedup()
    rate_name = "decode tokens/s" if decode_only else "tokens/s"
    rows = [
        ("τ tokens / round", f"{m.tau:.2f}", "tau"),
        ("acceptance rate", f"{m.acceptance_rate:.0%}", "acceptance_rate"),
        ("target tokens verified / round", f"{m.verified_per_round:.1f}", "verified_per_round"),
        ("wasted verification", f"{m.wasted:.0%}", "wasted"),
        ("verify ms / round", f"{m.verify_ms:.1f}", "overhead_ms"),
        (rate_name, f"{record.rate(decode_only):.1f}", "tokens_per_s"),
        ("speedup vs plain", f"×{speedup:.2f}" if speedup else "—", "speedup"),
    ]
    def tip(name: str, key: str) -> str:
        return DECODE_FORMULA if name == "decode tokens/s" else FORMULAS[key]

    body = "".join(f'<tr title="{escape(tip(name, key))}"><td>{escape(name)}</td><td><b>{escape(value)}</b></td></tr>'
                   for name, value, key in rows)
    note = (f"drafter {record.drafter_name} · {m.rounds} rounds, {m.new_tokens} tokens"
            + (f"; plain {plain:.1f} tok/s" if plain else ""))
    return f'<table class="sv-table">{body}</table><div class="sv-note">{escape(note)}</div>'


def verdict_html(chain: RunRecord | None, tree: RunRecord | None) -> str:
    """Who wins on τ, on tokens/s and on waste, and the sentence that explains a split decision."""
    if not chain or not tree or not chain.rounds or not tree.rounds:
        return '<div class="sv-muted">Run both to get a verdict.</div>'
    mc, mt = chain.metrics(), tree.metrics()

    def winner(c: float, t: float, higher_better: bool = True) -> str:
        if abs(c - t) <= 0.02 * max(abs(c), abs(t), 1e-9):
            return "tie"
        return ("chain" if c > t else "tree") if higher_better else ("chain" if c < t else "tree")

    cells = [
        ("τ", f"{mc.tau:.2f}", f"{mt.tau:.2f}", winner(mc.tau, mt.tau)),
        ("verified / round", f"{mc.verified_per_round:.1f}", f"{mt.verified_per_round:.1f}",
         winner(mc.verified_per_round, mt.verified_per_round, higher_better=False)),
        ("wasted verification", f"{mc.wasted:.0%}", f"{mt.wasted:.0%}", winner(mc.wasted, mt.wasted, False)),
        ("decode tokens/s", f"{chain.rate(True):.1f}", f"{tree.rate(True):.1f}",
         winner(chain.rate(True), tree.rate(True))),
    ]
    body = "".join(f"<tr><td>{escape(n)}</td><td>{escape(c)}</td><td>{escape(t)}</td><td><b>{escape(w)}</b></td></tr>"
                   for n, c, t, w in cells)
    tau_win, speed_win = cells[0][3], cells[3][3]
    if tau_win == "tree" and speed_win == "chain":
        sentence = ("The tree accepts more per round but verifies more tokens per forward; on this machine the "
                    "extra verification costs more than the extra accepted tokens save.")
    elif tau_win == speed_win and tau_win != "tie":
        sentence = f"The {tau_win} wins on both acceptance and wall-clock speed here."
    elif speed_win == "tree":
        sentence = "The tree is faster in wall-clock time."
    else:
        sentence = "No clear winner on this prompt: try a longer generation or another prompt category."
    return (f'<table class="sv-table sv-verdict"><tr><th></th><th>chain</th><th>tree</th><th>better</th></tr>'
            f'{body}</table><div class="sv-note"><b>Verdict:</b> {escape(sentence)}</div>')
