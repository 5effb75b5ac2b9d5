"""``RunRecord``: what the views render — a trace's header, its rounds so far, and the measured baselines.

A live run fills it round by round; a replay builds it from a trace file. Either way the views see the same
object, which is how replay reproduces every panel without a model. Wall time after round i is recomputed from
the rounds themselves (prefill + Σ draft/verify/other ms, exactly how ``Generation`` accumulates ``elapsed_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from specviz.engine import metrics, trace
from specviz.engine.baseline import BaselineEstimate, beyond_limit, speedup_interval
from specviz.engine.metrics import Metrics
from specviz.engine.round import Round
from specviz.viz.outcome import Outcome, node_outcomes


@dataclass
class RunRecord:
    header: dict
    rounds: list[Round] = field(default_factory=list)
    prefill_ms: float = 0.0
    summary: dict | None = None  # set once the run has finished (or was stopped)
    stop_reason: str = ""
    #: plain decoding measured beside this run, between its rounds (``engine.baseline.BaselineEstimate.to_dict``
    #: plus ``runs_sharing``): the baseline a live run's speedup divides by
    beside: dict | None = None
    calibration: dict | None = None  # older traces: a cached short plain decode (tokens/s, decode tokens/s, …)
    plain: dict | None = None  # full plain run on the same prompt: {"tokens_per_s", "token_ids", "elapsed_s"}
    source: str = "live"  # "live", "step" or "trace"
    name: str = ""  # trace file name, or a short description of a live run
    _metrics: tuple[tuple[int, bool], Metrics] | None = field(default=None, repr=False)
    _interval: tuple[tuple, tuple[float, float] | None] | None = field(default=None, repr=False)

    # ---- derived -------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def elapsed(self) -> list[float]:
        """Generation wall time (s) after each round."""
        return [(self.prefill_ms + ms) / 1e3 for ms in accumulate(r.total_ms for r in self.rounds)]

    @property
    def elapsed_s(self) -> float:
        if self.summary and isinstance(self.summary.get("elapsed_s"), (int, float)):
            return float(self.summary["elapsed_s"])
        return (self.prefill_ms + sum(r.total_ms for r in self.rounds)) / 1e3

    @property
    def token_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.committed]

    @property
    def new_tokens(self) -> int:
        return sum(len(r.committed) for r in self.rounds)

    @property
    def text(self) -> str:
        if self.summary and "text" in self.summary:
            return self.summary["text"]
        return "".join(t for r in self.rounds for t in r.committed_text)

    @property
    def tokens_per_s(self) -> float:
        elapsed = self.elapsed_s
        return self.new_tokens / elapsed if elapsed > 0 else 0.0

    @property
    def prompt_pieces(self) -> list[str]:
        return list((self.header.get("prompt") or {}).get("pieces") or [])

    @property
    def drafter_name(self) -> str:
        drafter = self.header.get("drafter")
        return drafter.get("name", "?") if isinstance(drafter, dict) else "none (plain decoding)"

    @property
    def drafter_reads(self) -> str:
        """The target features the drafter reads, in words ("" for drafters that read none)."""
        drafter = self.header.get("drafter")
        layers = drafter.get("feature_layers") if isinstance(drafter, dict) else None
        if not layers:
            return ""
        return "reads the target's " + ", ".join(f"hidden_states[{i}]" for i in layers)

    @property
    def drafter_trained(self) -> str:
        """How the drafter was trained, when its header says: our MTP modules are trained post hoc on a frozen target,
        published MTP layers jointly with their model, and a reader comparing them must know which is shown."""
        drafter = self.header.get("drafter")
        trained = drafter.get("trained") if isinstance(drafter, dict) else None
        return f"trained {trained}" if isinstance(trained, str) and trained else ""

    @property
    def drafter_modules(self) -> str:
        """How MTP modules map to draft depths, when the header gives their count: with one module every node says
        "module 1", which reads as a missing label unless the line says it is reused."""
        drafter = self.header.get("drafter")
        count = drafter.get("modules") if isinstance(drafter, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return ""
        if count == 1:
            return "1 module, reused at every depth"
        return f"{count} modules; depth d drafts with module (d − 1) mod {count} + 1"

    @property
    def drafter_precision(self) -> str:
        """Reduced-precision draft weights, when the drafter ran with them: its q (the hovers, the confidence panel)
        is then the int8 draft's, while verification stays full precision."""
        drafter = self.header.get("drafter")
        quant = drafter.get("draft_quant") if isinstance(drafter, dict) else None
        return f"{quant} draft weights" if isinstance(quant, str) and quant else ""

    @property
    def attention_text(self) -> str:
        """The attention kernel the target's forwards ran, from the trace header ("" for traces written before it
        was recorded): on a GPU, the cascade and its prefix kernel; elsewhere SDPA with the tree mask."""
        attention = self.header.get("attention")
        name = attention.get("implementation") if isinstance(attention, dict) else None
        if not isinstance(name, str) or not name:
            return ""
        kernel = attention.get("prefix_kernel")
        return f"attention {name}" + (f" ({kernel} prefix kernel)" if isinstance(kernel, str) and kernel else "")

    @property
    def run_note(self) -> str:
        """A note on how the run ran that its reader must see (a ZeroGPU run that fell back to the CPU)."""
        note = self.header.get("note")
        return note if isinstance(note, str) else ""

    @property
    def drafter_schedule(self) -> str:
        """DSpark's verify-cost curve, when the drafter cuts its proposals on one ("" otherwise)."""
        drafter = self.header.get("drafter")
        curve = drafter.get("cost_curve") if isinstance(drafter, dict) and drafter.get("schedule") else None
        if not isinstance(curve, dict) or not curve.get("ms"):
            return ""
        base = curve["ms"][0] or 1.0
        points = ", ".join(f"{w}: ×{ms / base:.2f}" for w, ms in zip(curve.get("widths", []), curve["ms"]))
        return (f"confidence-scheduled on the verify cost ({curve.get('source', 'given')}; {base:.0f} ms for 1 token; "
                f"tokens: cost {points})")

    @property
    def budget_text(self) -> str:
        budget = self.header.get("budget") or {}
        if not budget:
            return "—"
        if budget.get("tree"):
            shape = f"tree w={budget.get('width')} d={budget.get('depth')} n≤{budget.get('max_nodes')}"
        else:
            shape = f"chain k={budget.get('k')}"
        stop = budget.get("min_draft_prob") or 0  # absent in traces recorded before it existed
        return f"{shape}, stop below q={stop:g}" if stop else shape

    @property
    def target_name(self) -> str:
        return str((self.header.get("target") or {}).get("name", "?"))

    @property
    def greedy(self) -> bool:
        return float((self.header.get("config") or {}).get("temperature", 0.0)) < 1e-5

    def showcase_index(self) -> int:
        """The most instructive round to open on: accepted drafts and a draft the accept rule actually turned down (not
        merely one it never reached: under rejection sampling, siblings after an accepted one are never tested), then
        the longest accepted path, then the biggest tree."""
        def score(r: Round) -> tuple:
            rejected = Outcome.REJECTED in node_outcomes(r)
            return (bool(r.accepted) and rejected, len(r.accepted), len(r.tokens), -r.index)

        return max(self.rounds, key=score).index if self.rounds else 0

    def metrics(self) -> Metrics:
        """Metrics over the rounds so far (cached per round count: streamed panels ask often)."""
        key = (len(self.rounds), self.finished)
        if self._metrics is None or self._metrics[0] != key:
            self._metrics = (key, metrics.compute(self.rounds, self.elapsed_s))
        return self._metrics[1]

    @property
    def decode_s(self) -> float:
        """Wall time of the rounds alone (prefill excluded)."""
        return sum(r.total_ms for r in self.rounds) / 1e3

    def rate(self, decode_only: bool = False) -> float:
        """Tokens/s over the whole generation (``metrics.FORMULAS['tokens_per_s']``) or over the rounds only."""
        elapsed = self.decode_s if decode_only else self.elapsed_s
        return self.new_tokens / elapsed if elapsed > 0 else 0.0

    def baseline(self) -> tuple[float | None, str, bool]:
        """Plain-decoding tokens/s to compare against, where it came from, and whether it is decode-phase only.

        Plain decoding measured beside this run (between its rounds, under the same load) comes first: it is the
        only one taken in the run's own conditions. Then a full plain run of this prompt (same length, prefill
        included on both sides), then an older trace's cached short calibration. The interleaved rounds and the
        calibration are compared on the decode phase only (the prefill is the same work for both methods).
        """
        beside = self.beside_estimate
        if beside is not None:
            sharing = int((self.beside or {}).get("runs_sharing", 1) or 1)
            shared = f"; {sharing} runs shared the machine" if sharing > 1 else ""
            return (beside.tokens_per_s, f"plain decoding measured beside this run: {beside.samples} plain tokens "
                    f"timed between its rounds, {beside.low:.1f}–{beside.high:.1f} tokens/s between quartiles{shared}",
                    True)
        if self.plain and self.plain.get("tokens_per_s"):
            return float(self.plain["tokens_per_s"]), "plain decoding of this prompt (full run)", False
        calibration = self.calibration or {}
        n = calibration.get("new_tokens", "?")
        if calibration.get("decode_tokens_per_s"):
            return (float(calibration["decode_tokens_per_s"]),
                    f"calibration: {n}-token plain decode of this prompt length, cached; decode phase of both "
                    "(prefill is the same work either way)", True)
        if calibration.get("tokens_per_s"):
            return float(calibration["tokens_per_s"]), f"calibration: {n}-token plain decode, cached", False
        return None, "no plain-decoding measurement yet", False

    def speedup(self) -> float | None:
        plain, _, decode_only = self.baseline()
        return metrics.speedup(self.rate(decode_only), plain) if plain else None

    @property
    def beside_estimate(self) -> BaselineEstimate | None:
        return BaselineEstimate.from_dict(self.beside) if isinstance(self.beside, dict) else None

    def speedup_range(self) -> tuple[float, float] | None:
        """The speedup's uncertainty (``baseline.speedup_interval``: its rounds and the plain tokens timed beside it,
        resampled); from a trace without the plain tokens' times, the speedup at their fast and slow quartiles."""
        beside = self.beside_estimate
        if beside is None:
            return None
        key = (len(self.rounds), beside.samples_ms)
        if self._interval is None or self._interval[0] != key:
            interval = speedup_interval([len(r.committed) for r in self.rounds], [r.total_ms for r in self.rounds],
                                        beside.samples_ms)
            self._interval = (key, interval)
        return self._interval[1] or beside.speedup_range(self.rate(decode_only=True))

    def speedup_beyond_limit(self) -> bool:
        """A speedup larger than tau allows (``engine.baseline.beyond_limit``): the two rates saw different loads."""
        speedup = self.speedup()
        return bool(speedup and self.rounds) and beyond_limit(speedup, self.metrics().tau)

    def speedup_text(self) -> str:
        """The speedup as the page states it: its value, its spread where measured beside the run, and a flag when it
        is beyond what tau allows."""
        speedup = self.speedup()
        if not speedup:
            return "—"
        spread = self.speedup_range()
        text = f"×{speedup:.2f}" + (f" (×{spread[0]:.2f}–×{spread[1]:.2f})" if spread else "")
        return text + (" ⚠ beyond what τ allows: not a fact" if self.speedup_beyond_limit() else "")

    # ---- trace ---------------------------------------------------------------------------------------------
    def trace_summary(self) -> dict:
        """The summary line, shaped like ``api.summary_for`` plus the baselines this UI measured."""
        summary = dict(self.summary or {})
        summary.setdefault("token_ids", self.token_ids)
        summary.setdefault("text", self.text)
        summary.setdefault("stop_reason", self.stop_reason or "stopped")
        summary.setdefault("elapsed_s", self.elapsed_s)
        summary.setdefault("prefill_ms", self.prefill_ms)
        summary["metrics"] = metrics.compute(self.rounds, self.elapsed_s).to_dict()
        if self.beside:
            summary["plain_beside"] = self.beside
        if self.calibration:
            summary["calibration"] = self.calibration
        if self.plain:
            summary["baseline"] = {k: self.plain[k] for k in ("token_ids", "tokens_per_s", "elapsed_s")
                                   if k in self.plain}
            summary["speedup"] = self.speedup()
        return summary

    def to_trace(self) -> str:
        return trace.dumps(self.header, self.rounds, self.trace_summary())

    @classmethod
    def from_trace(cls, loaded: trace.Trace, name: str = "") -> RunRecord:
        summary = loaded.summary or None
        if summary is not None:
            summary = {k: v for k, v in summary.items() if k != "type"}
        record = cls(header=loaded.header, rounds=list(loaded.rounds), summary=summary, source="trace", name=name)
        if summary:
            record.prefill_ms = float(summary.get("prefill_ms", 0.0) or 0.0)
            record.stop_reason = str(summary.get("stop_reason", ""))
            record.calibration = summary.get("calibration")
            record.beside = summary.get("plain_beside")
            baseline = summary.get("baseline")
            if isinstance(baseline, dict) and baseline.get("tokens_per_s"):
                record.plain = baseline
        else:
            record.summary = {"stop_reason": "trace has no summary line"}
        return record
