"""Markdown and JSON outputs of a benchmark run (the HTML charts live in ``charts``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specviz.bench.suite import SuiteResult
from specviz.bench.summary import (
    FORMULAS,
    OVERALL,
    PLAIN_ROW,
    Spread,
    Stats,
    Summary,
    sample_predicted,
    sample_speedup,
    sample_tau,
)

DASH = "–"


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return DASH if value is None else f"{value:.{digits}f}{suffix}"


def _spread(spread: Spread | None, digits: int = 2, suffix: str = "") -> str:
    if spread is None:
        return DASH
    return f"{spread.median:.{digits}f}{suffix} ({spread.low:.{digits}f}–{spread.high:.{digits}f})"


def _exact(stats: Stats) -> str:
    return DASH if stats.exact is None or not stats.prompts else f"{stats.exact}/{stats.prompts}"


def _split(stats: Stats) -> str:
    if stats.verify_ms is None:
        return DASH
    return f"{stats.draft_ms:.1f} / {stats.verify_ms:.1f} / {stats.other_ms:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def overall_table(summary: Summary, group: str = OVERALL) -> list[str]:
    header = ["configuration", "τ", "acceptance", "tokens/s median (min–max)", "speedup median (min–max)",
              "predicted", "exact", "draft / verify / other ms per round", ""]
    rows = []
    for name in summary.rows:
        stats = summary.table[name][group]
        spec = summary.specs.get(name)
        flag = "**slower than plain**" if spec is not None and spec.speculative and stats.slower_than_plain else ""
        speedup = "1 (baseline)" if name == PLAIN_ROW else _spread(stats.speedup, suffix="×")
        rows.append([name, _num(stats.tau), _num(stats.acceptance_rate), _spread(stats.tokens_per_s, 1), speedup,
                     _spread(stats.predicted, suffix="×") if stats.predicted else DASH, _exact(stats), _split(stats),
                     flag])
    return _table(header, rows)


def by_category(summary: Summary, cell) -> list[str]:
    groups = [*summary.categories, OVERALL]
    counts = [f"{g} ({summary.table[PLAIN_ROW][g].prompts})" for g in groups]
    rows = [[name, *(cell(summary.table[name][g]) for g in groups)] for name in summary.rows[1:]]
    return _table(["configuration", *counts], rows)


def per_position(summary: Summary, field: str) -> list[str]:
    names = [n for n in summary.rows[1:] if getattr(summary.table[n][OVERALL], field)]
    depth = max((len(getattr(summary.table[n][OVERALL], field)) for n in names), default=0)
    rows = []
    for name in names:
        values = getattr(summary.table[name][OVERALL], field)
        rows.append([name, *(_num(v) for v in values), *([DASH] * (depth - len(values)))])
    return _table(["configuration", *(f"d={d}" for d in range(1, depth + 1))], rows)


def markdown(summary: Summary, meta: dict, suite: SuiteResult | None = None) -> str:
    """The report: settings, machine, the overall table, per-category tables, per-position acceptance, vLLM's rows
    beside specviz's (with the per-run ``suite``), notes."""
    machine, settings = meta["machine"], meta["settings"]
    lines = [
        "# specviz benchmark", "",
        f"Command: `{meta['command']}`", "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, torch threads {machine['torch_threads']}, "
        f"GPU {machine['gpu']}; torch {machine['torch']}, transformers {machine['transformers']}, "
        f"Python {machine['python']}; {machine['date']}; load average at start {machine['load_average_start']}, "
        f"at end {machine.get('load_average_end')}.", "",
        f"Target `{settings['target']}`; {settings['max_new_tokens']} new tokens; temperature "
        f"{settings['temperature']}; chat template {'on' if settings['chat'] else 'off'}; "
        f"prompts {settings['prompts_file']} ({settings['prompt_count']} prompts: {settings['selection']}); "
        f"suite wall time {meta['wall_s']:.0f} s.", "",
        "## All prompts", "", *overall_table(summary), "",
        "## Speedup by category (median over prompts)", "",
        *by_category(summary, lambda s: _num(s.speedup.median if s.speedup else None, suffix="×")), "",
        "## τ by category", "", *by_category(summary, lambda s: _num(s.tau)), "",
    ]
    if any(summary.table[n][OVERALL].conditional for n in summary.rows[1:]):
        lines += ["## Per-position acceptance (all prompts)", "",
                  "Conditional: P(depth d accepted | depth d−1 accepted and drafted).", "",
                  *per_position(summary, "conditional"), "",
                  "Cumulative: P(accepted length ≥ d).", "", *per_position(summary, "cumulative"), ""]
    calibrated = [n for n in summary.rows[1:] if summary.table[n][OVERALL].confidence_ece is not None]
    if calibrated:
        lines += ["## Confidence calibration (all prompts)", "",
                  "ECE and Brier score of the drafter's confidence against the target's verdicts "
                  "(`FORMULAS[\"calibration\"]`, `FORMULAS[\"brier\"]`): the confidence the rounds carry (DSpark: "
                  "the recalibrated ĉ its schedule used) and a confidence head's own.", "",
                  *_table(["configuration", "ECE of the confidence used", "ECE of the head's own ĉ",
                           "Brier of the confidence used", "Brier of the head's own ĉ"],
                          [[n, *(_num(getattr(summary.table[n][OVERALL], key), 3)
                                 for key in ("confidence_ece", "head_ece", "confidence_brier", "head_brier"))]
                           for n in calibrated]), ""]
    if suite is not None:
        lines += vllm_section(summary, suite)
    if meta.get("verify_cost"):
        lines += verify_cost_section(meta["verify_cost"])
    slower = [n for n in summary.rows[1:]
              if summary.specs[n].speculative and summary.table[n][OVERALL].slower_than_plain]
    lines += ["## Notes", ""]
    if slower:
        lines.append(f"- Slower than plain decoding (median speedup < 1): {', '.join(slower)}.")
    if summary.noise is not None:
        lines.append(f"- Noise floor: identical plain runs of one prompt differ by a factor "
                     f"{_spread(summary.noise, 3)} (fastest ÷ slowest, median (min–max) over prompts).")
    for name, spec in summary.specs.items():
        if spec.note:
            lines.append(f"- `{name}`: {spec.note}.")
    lines += [f"- {text}" for text in FORMULAS.values()]
    return "\n".join(lines) + "\n"


def vllm_section(summary: Summary, suite: SuiteResult) -> list[str]:
    """vLLM's own rows beside specviz's: τ per prompt for each drafter vLLM runs too (specviz's chain row and vLLM's),
    and what vLLM's counters say of its drafting steps; nothing where the run has no vLLM rows."""
    engines = {name: spec.engine for name, spec in summary.specs.items()}
    peers = [name for name in summary.rows if engines.get(name) == "vllm"]
    if not peers:
        return []
    lines = ["## vLLM beside specviz", "",
             f"`{peers[0]}`'s speedup is vLLM's own tokens/s over specviz's plain decoding of the same model, "
             "interleaved; vLLM's speculative rows run on a server of their own, interleaved with vLLM's plain "
             "decoding, their speedup and exact against it. vLLM's τ is from its counters "
             "(`FORMULAS[\"vllm_tau\"]`).", ""]
    pairs = []
    for name in peers:
        drafter = summary.specs[name].drafter
        mine = next((row for row in summary.rows if engines.get(row) == "specviz"
                     and summary.specs[row].drafter == drafter and summary.specs[row].shape == "chain"), None)
        if drafter is not None and mine is not None and summary.table[name][OVERALL].prompts:
            pairs.append((mine, name))
    if pairs:
        tau = {(s.spec, s.prompt.question_id): sample_tau(s) for s in suite.samples}
        names = [name for pair in pairs for name in pair]
        rows = [[f"{p.prompt.category} #{p.prompt.question_id}", *(_num(tau.get((n, p.prompt.question_id)))
                                                                 for n in names)] for p in suite.prompts]
        rows.append(["all prompts (pooled)", *(_num(summary.table[n][OVERALL].tau) for n in names)])
        lines += ["τ per prompt, specviz's chain and vLLM's own drafting of the same kind:", "",
                  *_table(["prompt", *(f"τ {n}" for n in names)], rows), ""]
    counted = {}
    for name in peers:
        totals: dict[str, int] = {}
        for sample in suite.samples:
            if sample.spec == name:
                for key, value in sample.result.counters.items():
                    totals[key] = totals.get(key, 0) + value
        if totals.get("drafts"):
            counted[name] = totals
    if counted:
        depth = max(sum(key.startswith("pos") for key in totals) for totals in counted.values())
        rows = []
        for name, totals in counted.items():
            drafts = totals["drafts"]
            rows.append([name, str(drafts), str(totals.get("draft_tokens", 0)), str(totals.get("accepted", 0)),
                         _num(totals.get("accepted", 0) / drafts),
                         _num(totals.get("accepted", 0) / totals["draft_tokens"] if totals.get("draft_tokens")
                              else None),
                         *(_num(totals[f"pos{d}"] / drafts) if f"pos{d}" in totals else DASH for d in range(depth))])
        lines += ["vLLM's drafting steps by its counters (all prompts): accepted per drafting step, acceptance rate "
                  "(accepted ÷ drafted tokens) and P(the draft at depth d accepted) per drafting step:", "",
                  *_table(["row", "drafting steps", "drafted tokens", "accepted", "accepted per step", "acceptance",
                           *(f"d={d + 1}" for d in range(depth))], rows), ""]
    return lines


def verify_cost_section(cost: dict) -> list[str]:
    """How one target forward's time grows with the tokens it verifies, per forward path, beside the memory floor and
    each width's compute floor."""
    paths = cost["paths"]
    names = list(paths)
    by_width = {name: {c["width"]: c for c in curve} for name, curve in paths.items()}
    widths = sorted({w for curve in by_width.values() for w in curve})
    floor = cost.get("floor_ms")
    compute = cost.get("compute_floor_ms") or {}
    header = ["width"]
    for name in names:
        header += [f"{name} ms", f"{name} vs width 1"]
    header += ["memory floor ms", "compute floor ms"]
    rows = []
    for width in widths:
        row = [str(width)]
        for name in names:
            point = by_width[name].get(width)
            row += [_num(point["ms"], 1), _num(point["relative"], 2, "×")] if point else ["–", "–"]
        row += [_num(floor, 1), _num(compute.get(str(width)), 1)]
        rows.append(row)
    bandwidth, peak = cost.get("bandwidth_gbs"), cost.get("peak_gflops")
    about = (f" Memory floor: the weights' {cost['weight_bytes'] / 1e6:.0f} MB read at the {bandwidth:.1f} GB/s "
             "measured on this machine at the start of the run." if bandwidth else "")
    if peak and cost.get("flops_per_token"):
        about += (f" Compute floor: w × {cost['flops_per_token'] / 1e6:.0f} MFLOP per token (linear layers and "
                  f"attention over this context) at the {peak:.0f} GFLOP/s of a large float32 matrix product on "
                  "this machine.")
        if floor:
            crossover = floor / (cost["flops_per_token"] / (peak * 1e9) * 1e3)
            about += f" Past w ≈ {crossover:.1f} compute, not memory, bounds a forward."
    choice = cost.get("kernel_choice") or {}
    if "plain_rows" in choice:
        wide = {"thin": "the thin kernel", "torch": "torch's F.linear"}.get(choice.get("wide"), str(choice.get("wide")))
        chosen = (f"F.linear for products of ≤ {choice['plain_rows']} rows, {wide} above" if choice["plain_rows"]
                  else f"{wide} for every product")
        about += f" The fast path's linear backend, declared for this device and dtype: {chosen}."
        if choice.get("thin_unavailable"):
            about += f" The thin kernel did not run here: {choice['thin_unavailable']}."
    return ["## Target forward cost by verify width", "",
            "One causal forward over w new tokens on the longest prompt's cached context (median of 5), through "
            f"each target forward path ({', '.join(names)}) in the same run.{about}", "",
            *_table(header, rows), ""]


def runs_json(suite: SuiteResult) -> list[dict]:
    """One entry per timed configuration run (plain runs are summarised per prompt)."""
    rows = []
    for sample in suite.samples:
        result = sample.result
        rows.append({
            "config": sample.spec, "question_id": sample.prompt.question_id, "category": sample.prompt.category,
            "new_tokens": result.new_tokens, "wall_s": result.wall_s, "tokens_per_s": result.tokens_per_s,
            "plain_wall_s": [p.wall_s for p in sample.plain], "speedup": sample_speedup(sample),
            "tau": sample_tau(sample), "predicted": sample_predicted(sample), "forwards": result.forwards,
            "prefill_ms": result.prefill_ms, "identical": result.token_ids == sample.reference,
        })
    return rows


def prompts_json(suite: SuiteResult) -> list[dict]:
    return [{"question_id": p.prompt.question_id, "category": p.prompt.category, "prompt_tokens": p.prompt_tokens,
             "plain_tokens_per_s": [r.tokens_per_s for r in p.plain], "new_tokens": p.plain[0].new_tokens,
             "plain_token_ids": p.plain[0].token_ids} for p in suite.prompts]


def write(out: Path, summary: Summary, suite: SuiteResult, meta: dict) -> dict[str, Path]:
    """Write results.md and results.json into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md", "json": out / "results.json"}
    paths["markdown"].write_text(markdown(summary, meta, suite), encoding="utf-8")
    data = {**meta, "summary": summary.to_dict(), "prompts": prompts_json(suite), "runs": runs_json(suite)}
    paths["json"].write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return paths
