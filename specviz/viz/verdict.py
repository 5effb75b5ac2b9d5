"""Chain vs Tree's verdict: the faster side on tokens/s where the difference beats the measured noise, and why.

Every sentence states only what the two runs' numbers show: the speedups against plain decoding timed beside each
run, with their noise; the τ gained per extra verified node; wasted verification; where each round's time went.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.engine.metrics import FORMULAS, Metrics
from specviz.viz.panels import DECODE_FORMULA
from specviz.viz.record import RunRecord
from specviz.viz.text import escape

#: Without plain decoding timed beside both runs (traces recorded before it was), the verdict compares their decode
#: tokens/s and calls a difference up to this fraction noise, and says that it did.
FALLBACK_NOISE = 0.05


@dataclass(frozen=True)
class SpeedCall:
    """Chain vs Tree on tokens/s (``speed_call``): the two values compared, the noise a winner must beat, the winner."""

    chain: float  # speedup vs plain decoding (measured noise) or decode tokens/s (fallback)
    tree: float
    noise: float  # relative: the gap a winner needs
    measured: bool  # the noise comes from the plain tokens timed beside each run (else FALLBACK_NOISE)
    winner: str = ""  # "chain", "tree", or "" (within noise)

    @property
    def gap(self) -> float:
        """How much the larger value exceeds the smaller (0.10: by 10 %)."""
        low, high = sorted((self.chain, self.tree))
        return high / low - 1 if low > 0 else 0.0


def speed_spread(record: RunRecord) -> float | None:
    """The relative noise of a run's speedup: half the width of its range at the quartiles of the plain tokens timed
    beside it, over the speedup itself (estimate ÷ low − estimate ÷ high, halved); None without those timings."""
    beside = record.beside_estimate
    if beside is None:
        return None
    return (beside.tokens_per_s / beside.low - beside.tokens_per_s / beside.high) / 2


def speed_call(chain: RunRecord, tree: RunRecord) -> SpeedCall:
    """Which side is faster, only where the difference exceeds the measured noise.

    The two runs go one after the other, so the machine may have sped up or slowed down in between: each side's decode
    tokens/s is divided by plain decoding timed beside it (between its own rounds), and the two speedups are
    compared, which cancels that drift. Each speedup's noise is ``speed_spread`` (the quartiles of its own plain
    timings); the comparison's noise is the two added. A side wins when its speedup exceeds the other's by more than
    that. Without plain timings beside both runs (older traces) the decode tokens/s are compared against a fixed
    ``FALLBACK_NOISE``, and the verdict says so.
    """
    spreads = (speed_spread(chain), speed_spread(tree))
    speedups = (chain.speedup(), tree.speedup())
    if spreads[0] is not None and spreads[1] is not None and speedups[0] and speedups[1]:
        call = SpeedCall(speedups[0], speedups[1], spreads[0] + spreads[1], measured=True)
    else:
        call = SpeedCall(chain.rate(True), tree.rate(True), FALLBACK_NOISE, measured=False)
    if call.gap > call.noise:
        return replace(call, winner="chain" if call.chain > call.tree else "tree")
    return call


def _percents(*values: float) -> list[str]:
    """Percentages with as many decimals as it takes to tell them apart (10% vs 10% is no explanation)."""
    for digits in range(3):
        texts = [f"{value:.{digits}%}" for value in values]
        if len(set(texts)) == len(texts):
            return texts
    return texts


def speed_sentence(call: SpeedCall) -> str:
    """The verdict's first sentence: the faster side with both numbers and the noise, or no clear winner."""
    first, second = (call.winner, "tree" if call.winner == "chain" else "chain") if call.winner else ("chain", "tree")
    value = {"chain": call.chain, "tree": call.tree}
    if call.measured:
        values = f"{first} ×{value[first]:.2f} vs {second} ×{value[second]:.2f} plain decoding"
    else:
        values = f"{first} {value[first]:.1f} vs {second} {value[second]:.1f} decode tokens/s"
    gap, noise = _percents(call.gap, call.noise)
    noise = (f"the measured noise (±{noise}: the quartile spreads of the plain tokens timed beside each run, added)"
             if call.measured else
             f"a fixed ±{noise} (no plain decoding was timed beside both runs, so there is no measured noise)")
    if call.winner:
        return f"The {call.winner} is {gap} faster: {values}, more than {noise}."
    return f"No clear winner on tokens/s: {values} differ by {gap}, within {noise}."


def tau_per_node_sentence(chain: Metrics, tree: Metrics) -> str:
    """What the side verifying more tokens per round bought with them: τ gained per extra verified node."""
    sides = {"chain": chain, "tree": tree}
    if f"{chain.verified_per_round:.2f}" == f"{tree.verified_per_round:.2f}":
        both = f"Both verified {chain.verified_per_round:.2f} target tokens per round"
        if f"{chain.tau:.2f}" == f"{tree.tau:.2f}":
            return f"{both} for the same τ ({chain.tau:.2f})."
        return f"{both}; τ chain {chain.tau:.2f}, tree {tree.tau:.2f}."
    more, fewer = ("tree", "chain") if tree.verified_per_round > chain.verified_per_round else ("chain", "tree")
    a, b = sides[more], sides[fewer]
    extra, gained = a.verified_per_round - b.verified_per_round, a.tau - b.tau
    head = (f"The {more} verified {extra:.2f} more target tokens per round ({a.verified_per_round:.2f} vs "
            f"{b.verified_per_round:.2f})")
    if f"{a.tau:.2f}" == f"{b.tau:.2f}":
        return f"{head} for no gain in τ ({a.tau:.2f} both)."
    if gained > 0:
        return (f"{head} and gained {gained:.2f} τ ({a.tau:.2f} vs {b.tau:.2f}): {gained / extra:.2f} τ per extra "
                "verified node.")
    return f"{head} and still lost {-gained:.2f} τ ({a.tau:.2f} vs {b.tau:.2f})."


def waste_sentence(chain: Metrics, tree: Metrics) -> str:
    """Wasted verification on each side, the larger first."""
    if f"{chain.wasted:.0%}" == f"{tree.wasted:.0%}":
        return f"Both wasted {chain.wasted:.0%} of their verification."
    sides = {"chain": chain, "tree": tree}
    more, fewer = ("tree", "chain") if tree.wasted > chain.wasted else ("chain", "tree")
    return f"Wasted verification: {more} {sides[more].wasted:.0%} vs {fewer} {sides[fewer].wasted:.0%}."


def round_time_sentence(chain: Metrics, tree: Metrics) -> str:
    """Where the time per round went: decode tokens/s is τ ÷ the mean round time, so this is the other half of why."""
    def total(m: Metrics) -> float:
        return m.draft_ms + m.verify_ms + m.overhead_ms

    digits = 2 if max(total(chain), total(tree)) < 10 else 1  # sub-ms parts of a fast round must not round away
    if f"{total(chain):.{digits}f}" == f"{total(tree):.{digits}f}":
        return f"A round took {total(chain):.{digits}f} ms on both sides (decode tokens/s = τ ÷ round time)."
    sides = {"chain": chain, "tree": tree}
    longer, shorter = ("tree", "chain") if total(tree) > total(chain) else ("chain", "tree")
    a, b = sides[longer], sides[shorter]
    parts = [(what, getattr(a, key) - getattr(b, key))
             for what, key in (("drafting", "draft_ms"), ("verifying", "verify_ms"), ("overhead", "overhead_ms"))]
    detail = ", ".join(f"{what} {delta:+.{digits}f} ms" for what, delta in parts if abs(delta) >= 0.5 * 10 ** -digits)
    return (f"A {longer} round took {total(a) - total(b):.{digits}f} ms longer ({total(a):.{digits}f} vs "
            f"{total(b):.{digits}f} ms{': ' + detail if detail else ''}); decode tokens/s = τ ÷ round time.")


def _better(chain: str, tree: str, chain_value: float, tree_value: float, *, lower: bool = False) -> str:
    """The better side of a row as shown (equal at the shown precision: "same")."""
    if chain == tree:
        return "same"
    return "chain" if (chain_value < tree_value) == lower else "tree"


def verdict_rows(chain: RunRecord, tree: RunRecord, call: SpeedCall) -> list[tuple[str, str, str, str, str]]:
    """(name, chain, tree, better, formula) per row; the speed row that decided carries the noise-aware winner."""
    mc, mt = chain.metrics(), tree.metrics()
    speed = call.winner or "within noise"
    rows = []
    for name, key, form, lower in (("τ tokens / round", "tau", "{:.2f}", False),
                                   ("target tokens verified / round", "verified_per_round", "{:.2f}", True),
                                   ("wasted verification", "wasted", "{:.0%}", True)):
        c, t = getattr(mc, key), getattr(mt, key)
        rows.append((name, form.format(c), form.format(t),
                     _better(form.format(c), form.format(t), c, t, lower=lower), FORMULAS[key]))
    rows += [("draft ms / round", f"{mc.draft_ms:.1f}", f"{mt.draft_ms:.1f}", "", FORMULAS["draft_ms"]),
             ("verify ms / round", f"{mc.verify_ms:.1f}", f"{mt.verify_ms:.1f}", "", FORMULAS["verify_ms"]),
             ("decode tokens/s", f"{chain.rate(True):.1f}", f"{tree.rate(True):.1f}",
              "" if call.measured else speed, DECODE_FORMULA),
             ("speedup vs plain", chain.speedup_text(), tree.speedup_text(), speed if call.measured else "",
              FORMULAS["speedup"])]
    return rows


def verdict_html(chain: RunRecord | None, tree: RunRecord | None) -> str:
    """The winner on tokens/s where the numbers show one beyond the noise (``speed_call``), and why, from the
    metrics: τ gained per extra verified node, wasted verification, and where each round's time went."""
    if not chain or not tree or not chain.rounds or not tree.rounds:
        return '<div class="sv-muted">Run both to get a verdict.</div>'
    call = speed_call(chain, tree)
    body = "".join(f'<tr title="{escape(tip)}"><td>{escape(name)}</td><td>{escape(c)}</td><td>{escape(t)}</td>'
                   f"<td><b>{escape(better)}</b></td></tr>"
                   for name, c, t, better, tip in verdict_rows(chain, tree, call))
    mc, mt = chain.metrics(), tree.metrics()
    why = " ".join(sentence(mc, mt) for sentence in (tau_per_node_sentence, waste_sentence, round_time_sentence))
    return (f'<table class="sv-table sv-verdict"><tr><th></th><th>chain</th><th>tree</th><th>better</th></tr>'
            f'{body}</table><div class="sv-note"><b>Verdict:</b> {escape(speed_sentence(call))}</div>'
            f'<div class="sv-note"><b>{"Why" if call.winner else "Behind the numbers"}:</b> {escape(why)}</div>')
