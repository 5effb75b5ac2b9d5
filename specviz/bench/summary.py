"""Per-configuration, per-category statistics of a suite run, built on ``specviz.engine.metrics`` (never redefined).

Pooled over prompts: τ, acceptance rate and per-position acceptance (``metrics.compute`` over all rounds), and the
draft / verify / other milliseconds per round. Per prompt, then median with min–max: tokens/s, measured speedup and
predicted speedup.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from specviz.bench.configs import RunSpec
from specviz.bench.runners import RunResult
from specviz.bench.suite import PromptRuns, Sample, SuiteResult
from specviz.engine import metrics
from specviz.engine.round import Round

OVERALL = "overall"
PLAIN_ROW = "plain (specviz)"
FORMULAS = {
    **metrics.FORMULAS,
    "speedup": "speedup = tokens/s of the configuration ÷ tokens/s of the two plain-decoding runs of the same prompt "
    "right before and after it (same target, same machine, wall clock around the whole call, prefill included); "
    "median over prompts, with min–max",
    "predicted": "predicted speedup = τ · t_plain_round ÷ (t_draft + t_verify + t_other), where t_plain_round is the "
    "mean round time of the neighbouring plain runs and the denominator the configuration's mean round time "
    "(rounds only: prefill excluded); median over prompts",
    "hf_tau": "Hugging Face rows: τ = new tokens ÷ target forward calls (counted with a hook; the first forward "
    "also does the prefill)",
    "exact": "exact = prompts whose greedy output is token-identical to plain specviz decoding of the same prompt "
    "(vLLM's speculative rows: to vLLM's own plain decoding)",
    "vllm_tau": "vLLM rows: τ = generated tokens ÷ target steps, steps = generated − accepted draft tokens by the "
    "server's own counters (vllm:generation_tokens_total, vllm:spec_decode_num_accepted_tokens_total) read around "
    "the request; the first step is the prefill, which vLLM drafts nothing for",
    "brier": "Brier score = mean over the calibration samples (`FORMULAS[\"calibration\"]`, the same pairs as the "
    "ECE) of (predicted c − realised)², realised = 1 if the node was accepted, else 0; 0 is perfect, 0.25 is a "
    "constant 0.5",
}


@dataclass
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass
class Stats:
    """One configuration over one group of prompts (a category or all)."""

    prompts: int
    new_tokens: int
    tau: float | None
    acceptance_rate: float | None
    conditional: list[float]
    cumulative: list[float]
    tokens_per_s: Spread | None
    speedup: Spread | None
    predicted: Spread | None
    exact: int | None  # None when sampling (no exactness to check)
    draft_ms: float | None
    verify_ms: float | None
    other_ms: float | None
    #: expected calibration error of the confidences the rounds carry (DSpark: what its schedule used), and of a
    #: confidence head's own values; None where the drafter sets none
    confidence_ece: float | None = None
    head_ece: float | None = None
    #: Brier score (``FORMULAS["brier"]``) over the same (predicted, realised) pairs as the ECE beside it
    confidence_brier: float | None = None
    head_brier: float | None = None

    @property
    def slower_than_plain(self) -> bool:
        return self.speedup is not None and self.speedup.median < 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "slower_than_plain": self.slower_than_plain}


def plain_tokens_per_s(runs: Sequence[RunResult]) -> float:
    tokens, wall = sum(r.new_tokens for r in runs), sum(r.wall_s for r in runs)
    return tokens / wall if wall > 0 else 0.0


def mean_round_ms(runs: Sequence[RunResult]) -> float | None:
    rounds = [r for run in runs for r in run.rounds]
    return sum(r.total_ms for r in rounds) / len(rounds) if rounds else None


def sample_speedup(sample: Sample) -> float:
    return metrics.speedup(sample.result.tokens_per_s, plain_tokens_per_s(sample.plain))


def sample_tau(sample: Sample) -> float | None:
    result = sample.result
    if result.rounds:
        return metrics.compute(result.rounds).tau
    return result.new_tokens / result.forwards if result.forwards else None


def sample_predicted(sample: Sample) -> float | None:
    """τ · t_plain_round / t_spec_round (see FORMULAS["predicted"]); None without per-round timings."""
    tau, spec_ms, plain_ms = sample_tau(sample), mean_round_ms([sample.result]), mean_round_ms(sample.plain)
    if tau is None or not spec_ms or not plain_ms or not sample.result.rounds:
        return None
    return tau * plain_ms / spec_ms


def stats_for(samples: Sequence[Sample], greedy: bool) -> Stats:
    rounds = [r for s in samples for r in s.result.rounds]
    measured = metrics.compute(rounds) if rounds else None
    forwards = [s.result.forwards for s in samples]
    tokens = sum(s.result.new_tokens for s in samples)
    if measured is not None:
        tau = measured.tau
    elif forwards and all(forwards):
        tau = tokens / sum(forwards)
    else:
        tau = None
    predicted = [p for p in (sample_predicted(s) for s in samples) if p is not None]
    return Stats(
        prompts=len(samples),
        new_tokens=tokens,
        tau=tau,
        acceptance_rate=measured.acceptance_rate if measured and measured.drafted else None,
        conditional=measured.conditional if measured else [],
        cumulative=measured.cumulative if measured else [],
        tokens_per_s=Spread.of([s.result.tokens_per_s for s in samples]),
        speedup=Spread.of([sample_speedup(s) for s in samples]),
        predicted=Spread.of(predicted),
        exact=sum(s.result.token_ids == s.reference for s in samples) if greedy else None,
        draft_ms=measured.draft_ms if measured else None,
        verify_ms=measured.verify_ms if measured else None,
        other_ms=measured.overhead_ms if measured else None,
        **calibration_stats(rounds),
    )


def brier(samples: Sequence[tuple[float, bool]]) -> float | None:
    """Mean of (predicted − realised)² over ``(predicted, accepted)`` pairs (``FORMULAS["brier"]``); None if none."""
    return sum((p - float(hit)) ** 2 for p, hit in samples) / len(samples) if samples else None


def calibration_stats(rounds: Sequence[Round]) -> dict[str, float | None]:
    """ECE and Brier score of the confidences the rounds carry and of a confidence head's own ĉ, each over the same
    ``(predicted, accepted)`` pairs (``metrics.confidence_samples`` / ``metrics.head_confidence_samples``); None
    where the rounds have none."""
    values: dict[str, float | None] = {}
    for name, samples_of in (("confidence", metrics.confidence_samples), ("head", metrics.head_confidence_samples)):
        samples = [sample for round_ in rounds for sample in samples_of(round_)]
        values[f"{name}_ece"] = metrics.calibration_of(samples).ece if samples else None
        values[f"{name}_brier"] = brier(samples)
    return values


def plain_stats(prompts: Sequence[PromptRuns], greedy: bool) -> Stats:
    """The baseline row: every plain run (speedup 1 by definition; exact = runs agreeing with the first)."""
    runs = [r for p in prompts for r in p.plain]
    measured = metrics.compute([r for run in runs for r in run.rounds])
    return Stats(
        prompts=len(prompts), new_tokens=sum(r.new_tokens for r in runs), tau=measured.tau, acceptance_rate=None,
        conditional=[], cumulative=[], tokens_per_s=Spread.of([plain_tokens_per_s(p.plain) for p in prompts]),
        speedup=None, predicted=None,
        exact=sum(all(r.token_ids == p.plain[0].token_ids for r in p.plain) for p in prompts) if greedy else None,
        draft_ms=measured.draft_ms, verify_ms=measured.verify_ms, other_ms=measured.overhead_ms,
    )


def plain_noise(prompts: Sequence[PromptRuns]) -> Spread | None:
    """Per prompt, fastest ÷ slowest plain run: how much identical runs differ (the measurement's noise floor)."""
    ratios = [max(r.tokens_per_s for r in p.plain) / min(r.tokens_per_s for r in p.plain)
              for p in prompts if len(p.plain) > 1 and min(r.tokens_per_s for r in p.plain) > 0]
    return Spread.of(ratios)


@dataclass
class Summary:
    categories: list[str]
    rows: list[str]  # PLAIN_ROW first, then the configurations in table order
    specs: dict[str, RunSpec]
    table: dict[str, dict[str, Stats]]  # row -> category (or OVERALL) -> stats
    noise: Spread | None
    greedy: bool

    def to_dict(self) -> dict:
        return {
            "categories": self.categories, "rows": self.rows, "greedy": self.greedy,
            "plain_noise": None if self.noise is None else asdict(self.noise),
            "configs": {name: {"engine": s.engine, "drafter": s.drafter, "shape": s.shape,
                               "budget": s.budget.to_dict() if s.budget else None, "hf_kwargs": s.hf_kwargs,
                               "note": s.note} for name, s in self.specs.items()},
            "table": {row: {group: stats.to_dict() for group, stats in groups.items()}
                      for row, groups in self.table.items()},
            "formulas": FORMULAS,
        }


def summarise(suite: SuiteResult, greedy: bool) -> Summary:
    categories = list(dict.fromkeys(p.prompt.category for p in suite.prompts))
    groups = [*categories, OVERALL]

    def members(category: str) -> list[PromptRuns]:
        return [p for p in suite.prompts if category in (OVERALL, p.prompt.category)]

    table: dict[str, dict[str, Stats]] = {PLAIN_ROW: {g: plain_stats(members(g), greedy) for g in groups}}
    for spec in suite.specs:
        mine = [s for s in suite.samples if s.spec == spec.name]
        table[spec.name] = {g: stats_for([s for s in mine if g in (OVERALL, s.prompt.category)], greedy)
                            for g in groups}
    return Summary(categories, [PLAIN_ROW, *(s.name for s in suite.specs)], {s.name: s for s in suite.specs}, table,
                   plain_noise(suite.prompts), greedy)


def add_rows(summary: Summary, suite: SuiteResult, specs: Sequence[RunSpec],
             suites: Mapping[str, SuiteResult]) -> SuiteResult:
    """Rows run against another plain decoding (vLLM's own speculative rows, each in a suite of its own against vLLM's
    plain decoding) added to ``summary`` after its rows, ``specs`` in order; a spec with no suite (it did not run)
    gets a row of dashes. Returns the one suite of every sample, for the per-run outputs; its plain runs stay
    ``suite``'s."""
    groups = [*summary.categories, OVERALL]
    samples = list(suite.samples)
    wall = suite.wall_s
    for spec in specs:
        part = suites.get(spec.name)
        summary.rows.append(spec.name)
        summary.specs[spec.name] = spec
        if part is None:
            summary.table[spec.name] = {g: stats_for([], summary.greedy) for g in groups}
            continue
        mine = [s for s in part.samples if s.spec == spec.name]
        summary.table[spec.name] = {g: stats_for([s for s in mine if g in (OVERALL, s.prompt.category)],
                                                 summary.greedy) for g in groups}
        samples += mine
        wall += part.wall_s
    return SuiteResult([*suite.specs, *specs], samples, suite.prompts, wall)
