"""Theory beside measurement: expected tokens per round and speedup against draft length, from a run's own numbers.

A class asks why a longer draft or a bigger tree stopped paying on this machine. The answer is two curves a finished
run already holds: how fast acceptance decays with depth (tokens gained per extra draft) and how fast a round's cost
grows with the tokens it drafts and verifies. Numbers first (``theory``), then the figure (``figure_spec``) and the
words under it (``explanation``). No Gradio here and no model: everything comes from the ``RunRecord``.

Chains (γ drafts per round, the run's own γ = k):

- α (Leviathan et al.): the chance a drafted token is accepted given every one before it was, pooled over the run:
  accepted drafts ÷ drafts the accept rule judged (the accepted ones, plus the first refused one of each round).
- closed form, as if every draft were accepted with the same α independently: τ(γ) = (1 − α^(γ+1)) ÷ (1 − α),
  γ + 1 at α = 1.
- per position: τ(γ) = 1 + Σ_{i≤γ} α_1 ⋯ α_i with α_i = P(accepted length ≥ i | ≥ i − 1) measured on the rounds (a
  round whose drafter stopped short of depth i counts as not reaching it: that is what τ realises). Past the deepest
  measured position the last measured α_i stands in: extrapolated, drawn dashed.
- speedup(γ) = τ(γ) ÷ (cost(γ + 1) ÷ cost(1) + (γ · t_draft + t_overhead) ÷ t_plain), in plain decoding steps:
  cost is the target's verify-cost curve measured on this machine (``specviz.engine.cost_curve``; the ms of one forward
  over n tokens), t_draft the run's drafting ms per drafted token, t_overhead its engine overhead ms per round, and
  t_plain one plain decoding step (the plain baseline measured with the run, else the curve's 1-token forward).

Trees (node budget n): τ(n) = 1 + the mean, over the run's rounds, of the accepted path's length had the drafter
stopped after its first n nodes (in its own order, which is topological: parents come first). Under greedy
verification that is exactly what the target would have accepted; under sampling it is an estimate. The speedup
uses the same round cost with n drafted nodes.

Where the record holds no verify-cost curve measured on a machine (a trace recorded before the app kept one, a
drafter that never timed one) there is no speedup curve, and ``Theory.missing`` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.engine.cost_curve import CostCurve
from specviz.engine.round import Round
from specviz.errors import SpecvizError
from specviz.viz.charts import FONT, LABEL_PX, PLAIN_COLOR, TITLE_PX, _axis
from specviz.viz.outcome import OUTCOME_COLORS, Outcome
from specviz.viz.record import RunRecord
from specviz.viz.text import escape, plot_escape

#: The chain chart reaches at least this draft length (twice the run's k when that is longer), so the decline past
#: the optimum shows even for short chains; the app times its verify-cost curve up to one token more.
CHAIN_SPAN = 16
THEORY_COLOR, CLOSED_COLOR = OUTCOME_COLORS[Outcome.ACCEPTED], "#7F7F7F"
MEASURED_COLOR, BEST_COLOR = OUTCOME_COLORS[Outcome.CORRECTION], OUTCOME_COLORS[Outcome.BONUS]


def closed_form_tau(alpha: float, gamma: int) -> float:
    """Leviathan et al.'s expected tokens per round, (1 − α^(γ+1)) ÷ (1 − α): γ drafts, each accepted with the same
    chance α given the ones before it were, plus the correction or bonus token."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def per_position_tau(rates: Sequence[float], gamma: int) -> float:
    """1 + Σ_{i≤γ} α_1 ⋯ α_i from per-position acceptance ``rates`` (α_i at index i − 1); positions past the last rate
    reuse the last one (an extrapolation), none at all means nothing is accepted."""
    tau, survive = 1.0, 1.0
    for i in range(gamma):
        survive *= rates[min(i, len(rates) - 1)] if rates else 0.0
        tau += survive
    return tau


def judged(round_: Round) -> int:
    """Drafts the accept rule judged in a round along its path: the accepted ones, and the first refused one where the
    path's last node (or the root) had a child to test."""
    end = round_.accepted[-1] if round_.accepted else -1
    return len(round_.accepted) + int(end in set(round_.parents))


def overall_alpha(rounds: Sequence[Round]) -> float | None:
    """α: accepted drafts ÷ drafts judged (``judged``); None where nothing was judged."""
    tested = sum(judged(r) for r in rounds)
    return sum(len(r.accepted) for r in rounds) / tested if tested else None


def position_rates(cumulative: Sequence[float]) -> list[float]:
    """α_i = P(accepted length ≥ i) ÷ P(accepted length ≥ i − 1), from ``Metrics.cumulative``; 0 where no round got
    to i − 1 (then nothing deeper counts anyway)."""
    before, rates = 1.0, []
    for reach in cumulative:
        rates.append(reach / before if before > 0 else 0.0)
        before = reach
    return rates


def budget_taus(rounds: Sequence[Round], largest: int) -> list[float]:
    """Expected τ at node budgets 1 … ``largest``: 1 + the mean, over the rounds, of the accepted path's length had the
    drafter stopped after its first n nodes. The path's first d nodes survive budget n when the highest node number
    among them is below n, so one pass counts, per budget, the path prefixes that survive it."""
    survive = [0] * (largest + 2)  # survive[n]: path prefixes whose highest node number is n − 1
    for round_ in rounds:
        top = -1
        for node in round_.accepted:
            top = max(top, node)
            survive[min(top + 1, largest + 1)] += 1
    taus, kept = [], 0
    for n in range(1, largest + 1):
        kept += survive[n]
        taus.append(1.0 + kept / len(rounds) if rounds else 1.0)
    return taus


# ---- the round's cost --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Costs:
    """What a round with ``n`` drafted tokens costs, in plain decoding steps, from this run's measured times."""

    curve: CostCurve
    step_ms: float  # one plain decoding step
    step_source: str
    draft_ms: float  # per drafted token (or node)
    overhead_ms: float  # per round, besides drafting and the verify forward
    side_rows: int  # rows a round verifies besides its drafts and the newest token (lookahead's window)

    def width(self, drafted: int) -> int:
        return drafted + 1 + self.side_rows

    def verify(self, drafted: int) -> float:
        """cost(n + 1) ÷ cost(1): the verify forward relative to a one-token forward."""
        return self.curve.cost(self.width(drafted)) / self.curve.cost(1)

    def per_round(self, drafted: int) -> float:
        """The whole round: verify forward, drafting and the engine's overhead, in plain decoding steps."""
        return self.verify(drafted) + (drafted * self.draft_ms + self.overhead_ms) / self.step_ms

    def timed(self, drafted: int) -> bool:
        """The verify width lies within the widths the curve was timed at (beyond, its last slope is extrapolated)."""
        return self.width(drafted) <= self.curve.widths[-1]


def recorded_curve(record: RunRecord) -> CostCurve | None:
    """The verify-cost curve the record holds, measured on a machine: the one the app times after a run (the summary's
    ``cost_curve``), else one a drafter scheduled on (its header's, or a part's, such as the hybrid's lookup)."""
    drafter = record.header.get("drafter")
    parts = [drafter, *drafter.values()] if isinstance(drafter, dict) else []
    found = [(record.summary or {}).get("cost_curve"), *(p.get("cost_curve") for p in parts if isinstance(p, dict))]
    for data in found:
        if not isinstance(data, dict) or not str(data.get("source", "")).startswith("measured"):
            continue
        try:
            return CostCurve.from_dict(data)
        except (SpecvizError, TypeError, KeyError, ValueError):
            continue  # a hand-edited curve: look further, else say there is none
    return None


def costs_of(record: RunRecord) -> tuple[Costs | None, str]:
    """The run's ``Costs``, or None and why not."""
    curve = recorded_curve(record)
    if curve is None and not record.finished:
        return None, "the verify-cost curve is timed once the run finishes: the speedup curve appears then"
    if curve is None:
        return None, ("this run holds no verify-cost curve measured on a machine (a trace recorded before the app "
                      "timed one after each run, or a run stopped before it finished): no speedup is predicted")
    rounds, m = record.rounds, record.metrics()
    plain, source, _ = record.baseline()
    step_ms, step_source = (1e3 / plain, source) if plain else (curve.cost(1), "the curve's 1-token forward (no "
                                                                               "plain baseline measured)")
    draft_total = sum(r.draft_ms for r in rounds)
    per_token = draft_total / m.drafted if m.drafted else 0.0
    overhead = m.overhead_ms + (0.0 if m.drafted else draft_total / len(rounds))
    side = round(sum(int((r.meta or {}).get("side_rows", 0)) for r in rounds) / len(rounds))
    return Costs(curve, step_ms, step_source, per_token, overhead, side), ""


# ---- the numbers -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Theory:
    """Expected τ and speedup at each draft length (chains) or node budget (trees), and the run's own point."""

    tree: bool
    x: list[int]  # draft lengths γ, or node budgets n
    own: int  # the run's k, or its largest verified tree
    measured_upto: int  # x up to this rests on measured acceptance; beyond, extrapolated
    tau: list[float]  # per position (chains), or from the rounds cut to the budget (trees)
    closed: list[float] | None  # the closed form (chains with a measured α)
    alpha: float | None
    rates: list[float]  # measured α_i (chains) or per-depth rates (trees), depth i at index i − 1
    tau_measured: float  # tokens committed ÷ rounds
    costs: Costs | None
    missing: str  # why there is no speedup curve ("" when there is one)
    speedup_measured: float | None
    speedup_spread: tuple[float, float] | None

    @property
    def speedup(self) -> list[float] | None:
        return None if self.costs is None else [t / self.costs.per_round(x) for t, x in zip(self.tau, self.x)]

    @property
    def closed_speedup(self) -> list[float] | None:
        if self.costs is None or self.closed is None:
            return None
        return [t / self.costs.per_round(x) for t, x in zip(self.closed, self.x)]

    @property
    def best(self) -> int | None:
        """The draft length (or node budget) with the highest expected speedup; the shortest one on a tie."""
        speedup = self.speedup
        return None if speedup is None else self.x[max(range(len(speedup)), key=lambda i: (speedup[i], -i))]

    def tau_at(self, x: int) -> float:
        return self.tau[self.x.index(x)]

    def speedup_at(self, x: int) -> float | None:
        return None if self.costs is None else self.tau_at(x) / self.costs.per_round(x)

    def timed(self, x: int) -> bool:
        """The speedup at ``x`` rests on measured numbers only (acceptance measured, verify width timed)."""
        return x <= self.measured_upto and self.costs is not None and self.costs.timed(x)


def theory(record: RunRecord | None, costs: Costs | None = None) -> Theory | None:
    """The theory for a record's rounds (None before its first round). ``costs`` overrides the record's own (a test
    compares two verify-cost curves on one run)."""
    if record is None or not record.rounds:
        return None
    missing = ""
    if costs is None:
        costs, missing = costs_of(record)
    budget = record.header.get("budget") or {}
    m = record.metrics()
    rates = position_rates(m.cumulative)
    spread = record.speedup_range()
    common = dict(rates=rates, tau_measured=m.tau, costs=costs, missing=missing, speedup_measured=record.speedup(),
                  speedup_spread=spread)
    if not all(r.is_chain for r in record.rounds):  # a tree budget alone does not make a tree (DSpark's chains)
        own = max(len(r.tokens) for r in record.rounds)
        x = list(range(1, max(own, int(budget.get("max_nodes") or 0)) + 1))
        return Theory(tree=True, x=x, own=own, measured_upto=x[-1], tau=budget_taus(record.rounds, x[-1]),
                      closed=None, alpha=None, **common)
    own = int(budget.get("depth" if budget.get("tree") else "k") or len(rates) or 1)
    x = list(range(1, max(CHAIN_SPAN, 2 * own) + 1))
    alpha = overall_alpha(record.rounds)
    closed = None if alpha is None else [closed_form_tau(alpha, g) for g in x]
    return Theory(tree=False, x=x, own=own, measured_upto=len(rates), tau=[per_position_tau(rates, g) for g in x],
                  closed=closed, alpha=alpha, **common)


def widest(k: int, tree: bool, max_nodes: int) -> int:
    """The widest verify the theory chart needs timed for a run of this shape (its span plus the newest token); never
    below the chain span, so small shapes share one timed curve (the ``ngram:auto`` lookup's reaches as far)."""
    return max(CHAIN_SPAN, max_nodes if tree else 2 * k) + 1


# ---- the figure --------------------------------------------------------------------------------------------------
def _line(x: list[int], y: list[float], solid: int, name: str, color: str, axis: str, hover: str) -> list[dict]:
    """A curve drawn as given up to index ``solid`` (measured) and dashed after it (extrapolated), sharing the point
    where they meet."""
    xa, ya = ("x", "y") if axis == "1" else ("x2", "y2")
    base = dict(type="scatter", mode="lines+markers", xaxis=xa, yaxis=ya, hovertemplate=hover,
                marker=dict(size=5, color=color))
    out = [dict(base, x=x[:solid], y=y[:solid], name=name, line=dict(color=color))] if solid else []
    if solid < len(x):
        start = max(solid - 1, 0)
        out.append(dict(base, x=x[start:], y=y[start:], name=f"{name} (extrapolated)",
                        line=dict(color=color, dash="dash"),
                        marker=dict(size=4, color=color, symbol="circle-open")))
    return out


def _point(x: float, y: float, name: str, color: str, axis: str, symbol: str, hover: str, **extra) -> dict:
    xa, ya = ("x", "y") if axis == "1" else ("x2", "y2")
    return dict(type="scatter", mode="markers", x=[x], y=[y], name=name, xaxis=xa, yaxis=ya, hovertemplate=hover,
                marker=dict(size=13, color=color, symbol=symbol, line=dict(width=1, color="#222222")), **extra)


def _tau_traces(t: Theory, what: str) -> list[dict]:
    name = "expected τ from the rounds cut to n nodes" if t.tree else "expected τ, per-position αᵢ"
    data = _line(t.x, t.tau, t.measured_upto, name, THEORY_COLOR, "1", f"{what} %{{x}}: τ = %{{y:.2f}}<extra></extra>")
    if t.closed is not None and t.alpha is not None:
        data.append(dict(type="scatter", mode="lines", x=t.x, y=t.closed, name=f"closed form, α = {t.alpha:.2f}",
                         xaxis="x", yaxis="y", line=dict(color=CLOSED_COLOR, dash="dot"),
                         hovertemplate=f"{what} %{{x}}: τ = %{{y:.2f}}<extra>closed form</extra>"))
    data.append(_point(t.own, t.tau_measured, f"this run: measured τ = {t.tau_measured:.2f}", MEASURED_COLOR, "1",
                       "diamond", f"this run, {what} %{{x}}: measured τ = %{{y:.2f}}<extra></extra>"))
    return data


def _speedup_traces(t: Theory, what: str) -> list[dict]:
    speedup, costs = t.speedup, t.costs
    if speedup is None or costs is None:
        return []
    solid = next((i for i, x in enumerate(t.x) if not t.timed(x)), len(t.x))
    source = plot_escape(costs.curve.source)
    data = _line(t.x, speedup, solid, "expected speedup", THEORY_COLOR, "2",
                 f"{what} %{{x}}: ×%{{y:.2f}}<extra>cost: {source}</extra>")
    closed = t.closed_speedup
    if closed is not None:
        data.append(dict(type="scatter", mode="lines", x=t.x, y=closed, name="speedup, closed-form τ", xaxis="x2",
                         yaxis="y2", line=dict(color=CLOSED_COLOR, dash="dot"),
                         hovertemplate=f"{what} %{{x}}: ×%{{y:.2f}}<extra>closed form</extra>"))
    data.append(dict(type="scatter", mode="lines", x=[t.x[0], t.x[-1]], y=[1.0, 1.0], name="plain decoding (×1)",
                     xaxis="x2", yaxis="y2", line=dict(color=PLAIN_COLOR, dash="dash", width=1), hoverinfo="skip"))
    best = t.best
    if best is not None:
        data.append(_point(best, t.speedup_at(best), f"best {what} = {best}", BEST_COLOR, "2", "star",
                           f"best {what} %{{x}}: expected ×%{{y:.2f}}<extra></extra>"))
    if t.speedup_measured:
        extra = {}
        if t.speedup_spread:
            low, high = sorted(t.speedup_spread)
            extra["error_y"] = dict(type="data", symmetric=False, array=[max(0.0, high - t.speedup_measured)],
                                    arrayminus=[max(0.0, t.speedup_measured - low)], color=MEASURED_COLOR)
        data.append(_point(t.own, t.speedup_measured, f"this run: measured ×{t.speedup_measured:.2f}", MEASURED_COLOR,
                           "2", "diamond", f"this run, {what} %{{x}}: measured ×%{{y:.2f}}<extra></extra>", **extra))
    return data


def figure_spec(t: Theory | None) -> dict:
    """Two panels as a plain plotly dict: expected τ (left) and expected speedup (right) against draft length or node
    budget, with the run's measured point on each and the best length starred."""
    what = "n" if t is not None and t.tree else "γ"
    data = [] if t is None else [*_tau_traces(t, what), *_speedup_traces(t, what)]
    xtitle = "node budget n (drafted nodes per round)" if what == "n" else "draft length γ (tokens drafted per round)"
    notes = [("Expected tokens per round τ", 0, 1.08), ("Expected speedup over plain decoding", 0.55, 1.08)]
    if t is None:
        notes.append(("appears after the first round", 0.3, 0.5))
    elif t.costs is None:
        notes.append(("no verify-cost curve in this run:<br>speedup not predicted", 0.6, 0.5))
    layout = dict(
        # the top clears the strip where gr.Plot lays its label over the figure (the panel titles sit above the plots)
        height=480, margin=dict(l=60, r=10, t=80, b=40), font=FONT, plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
        legend=dict(orientation="h", x=0, y=-0.24, yanchor="top", font=dict(size=LABEL_PX)),
        xaxis=_axis([0, 0.45], "y", xtitle, rangemode="tozero"),
        yaxis=_axis([0, 1], "x", "tokens per round", rangemode="tozero"),
        xaxis2=_axis([0.55, 1], "y2", xtitle, rangemode="tozero"),
        yaxis2=_axis([0, 1], "x2", "× plain decoding", rangemode="tozero"),
        annotations=[dict(text=text, x=x, y=y, xref="paper", yref="paper", showarrow=False, xanchor="left",
                          font=dict(size=TITLE_PX, color="#222222")) for text, x, y in notes],
    )
    return dict(data=data, layout=layout)


# ---- the words ---------------------------------------------------------------------------------------------------
def _rates_text(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in rates[:8]) + (" …" if len(rates) > 8 else "") if rates else "none"


def _tau_words(t: Theory) -> str:
    if t.tree:
        return ("**Left**: expected tokens per round `τ(n) = 1 + mean over the rounds of the accepted length within "
                "the first n nodes`: what this run's rounds would have accepted had the drafter stopped after its "
                "first n nodes (exact under greedy verification, an estimate under sampling); per-depth acceptance "
                f"`α_d = {_rates_text(t.rates)}`. The diamond is the run's measured τ = {t.tau_measured:.2f} at its "
                f"largest tree (n = {t.own}).")
    alpha = f"α = {t.alpha:.2f}" if t.alpha is not None else "α (none judged)"
    return ("**Left**: expected tokens per round τ against draft length γ. Dotted, Leviathan et al.'s closed form "
            f"`τ(γ) = (1 − α^(γ+1)) / (1 − α)` with this run's `{alpha}` (accepted drafts ÷ drafts judged), as if "
            "every position were accepted alike. Solid, the measured per-position rates "
            f"`α_i = {_rates_text(t.rates)}`: `τ(γ) = 1 + Σ(i ≤ γ) α_1 ⋯ α_i`, dashed past γ = {t.measured_upto} "
            f"where the last α_i is extrapolated. The diamond is the run's measured τ = {t.tau_measured:.2f} at "
            f"its own γ = {t.own}.")


def _speedup_words(t: Theory) -> str:
    costs, what = t.costs, "n" if t.tree else "γ"
    if costs is None:
        return f"**Right**: {escape(t.missing)}."
    best, unit = t.best, "node" if t.tree else "token"
    own = f"; at this run's {what} = {t.own}, ×{t.speedup_at(t.own):.2f} expected"
    measured = (f" and ×{t.speedup_measured:.2f} measured" if t.speedup_measured else
                ", and no plain baseline was measured to place beside it")
    if best is not None and best < t.x[-1]:
        shape = ("Past the peak, each further draft adds less to τ than it adds to the round's verify and drafting "
                 "time on this machine.")
    elif t.tree:
        shape = "It still rises at the largest tree shown: a bigger budget may pay, which these rounds cannot show."
    else:
        shape = "It still rises at the longest γ shown: on this machine, longer drafts would still pay."
    return (f"**Right**: `speedup({what}) = τ({what}) / (cost({what} + 1) / cost(1) + ({what} · t_draft + t_overhead) "
            f"/ t_plain)`, in plain decoding steps: cost is the verify-cost curve ({escape(costs.curve.source)}; "
            f"{costs.curve.cost(1):.1f} ms for one token), `t_draft = {costs.draft_ms:.2f} ms` per drafted {unit} and "
            f"`t_overhead = {costs.overhead_ms:.1f} ms` per round as this run measured them, `t_plain = "
            f"{costs.step_ms:.1f} ms` ({escape(costs.step_source)}). The best {what} is {best}"
            f"{'' if t.timed(best) else ' (on extrapolated numbers)'} "
            f"(×{t.speedup_at(best):.2f} expected){own}{measured}. {shape}")


def explanation(t: Theory | None) -> str:
    """One paragraph in plain words under the figure: what each curve is, its formula, what is measured."""
    if t is None:
        return "*Theory vs measurement appears after the first round.*"
    return f"{_tau_words(t)} {_speedup_words(t)}"
