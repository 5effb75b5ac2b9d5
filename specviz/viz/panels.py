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

#: Live speedups compare decode phases (see ``RunRecord.baseline``).
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
             "overhead_ms": "overhead", "draft_ms": "draft ms / round", "verify_ms": "verify ms / round"}
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
    split = served_split(record.rounds)
    if split is not None:  # a served target: the verify time is the server's own, the rest is the trip
        cards.append(_card("verify: server · transfer", f"{split['server_ms']:.1f} · {split['transfer_ms']:.1f} ms",
                           formula=SERVED_FORMULA))
        cards.append(_card("prompt tokens recomputed", f"{split['recomputed_tokens']} of {split['prompt_tokens']}",
                           formula=SERVED_FORMULA))
    return f'<div class="sv-cards">{"".join(cards)}</div>'


#: what a served round's split says (``specviz.engine.served.server_split``)
SERVED_FORMULA = ("served target: server ms = the server's own time for the round's request (its Prometheus latency "
                  "counters), transfer ms = the rest of the verify wall time (HTTP, the server's front end, the "
                  "network); recomputed = prompt tokens the server computed rather than read from its prefix cache; "
                  "drafting stays local (draft ms)")


def served_split(rounds: list[Round]) -> dict | None:
    """Per-round means of a served target's server and transfer time, and the prompt tokens it recomputed in all;
    None for a local target (or a served run recorded without the server's counters)."""
    splits = [r.meta["served"] for r in rounds if "server_ms" in ((r.meta or {}).get("served") or {})]
    if not splits:
        return None
    return {"server_ms": sum(s["server_ms"] for s in splits) / len(splits),
            "transfer_ms": sum(s["transfer_ms"] for s in splits) / len(splits),
            "recomputed_tokens": sum(s.get("recomputed_tokens", 0) for s in splits),
            "prompt_tokens": sum(s.get("prompt_tokens", 0) for s in splits)}


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
        good = "sv-bad" if speedup < 1.0 or record.speedup_beyond_limit() else "sv-good"
        cards.append(_card("measured speedup", record.speedup_text(), "speedup", extra_class=good))
    lossless = ""
    if record.plain and "token_ids" in record.plain and record.finished:
        lossless = lossless_html(record)
    full = ""
    if record.plain and record.plain.get("tokens_per_s") and record.beside_estimate is not None:
        full = (f"; a full plain run of this prompt, timed after it (another moment, so not the divisor): "
                f"{float(record.plain['tokens_per_s']):.1f} tokens/s")
    note = (f'<div class="sv-note">baseline: {escape(source)}; same target, same machine, same clock'
            f'{escape(full)}.</div>')
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
    split = (round_.meta or {}).get("served") or {}
    if "server_ms" in split:  # a served target's verify, split as the server accounts it
        parts.append(f'<span title="{escape(SERVED_FORMULA)}">of the verify: server {split["server_ms"]:.1f} ms · '
                     f'transfer {split["transfer_ms"]:.1f} ms · {split.get("recomputed_tokens", 0)} of '
                     f'{split.get("prompt_tokens", 0)} prompt tokens recomputed</span>')
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
        ("τ tokens / round", f"{m.tau:.2f}", FORMULAS["tau"]),
        ("acceptance rate", f"{m.acceptance_rate:.0%}", FORMULAS["acceptance_rate"]),
        ("target tokens verified / round", f"{m.verified_per_round:.1f}", FORMULAS["verified_per_round"]),
        ("wasted verification", f"{m.wasted:.0%}", FORMULAS["wasted"]),
        ("draft ms / round", f"{m.draft_ms:.1f}", FORMULAS["draft_ms"]),
        ("verify ms / round", f"{m.verify_ms:.1f}", FORMULAS["verify_ms"]),
        (rate_name, f"{record.rate(decode_only):.1f}", DECODE_FORMULA if decode_only else FORMULAS["tokens_per_s"]),
        ("speedup vs plain", record.speedup_text() if speedup else "—", FORMULAS["speedup"]),
    ]
    body = "".join(f'<tr title="{escape(tip)}"><td>{escape(name)}</td><td><b>{escape(value)}</b></td></tr>'
                   for name, value, tip in rows)
    note = (f"drafter {record.drafter_name} · {m.rounds} rounds, {m.new_tokens} tokens"
            + (f"; plain {plain:.1f} tok/s" if plain else ""))
    return f'<table class="sv-table">{body}</table><div class="sv-note">{escape(note)}</div>'
