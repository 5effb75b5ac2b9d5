"""The GPU check's two files: ``gpu-check.json`` (everything) and ``gpu-check.md`` (the tables a person reads).

Schema ``specviz.gpu-check`` version 1. Top level: ``schema``, ``version``, ``dry_run``, ``device``, ``environment``
(machine, versions, the attention backend and cascade prefix kernel chosen per dtype), ``steps`` (``install``,
``tests``, ``verify_cost``, ``speedup``, ``near_ties``; each with ``status`` ok / failed / skipped, ``seconds`` and
its results or ``error``), ``targets`` (the issue's two cost targets read off the bf16 curve), ``ok``, ``wall_s``.
A dry run's figures come from a tiny model on a CPU and say nothing about GPUs; the markdown says so at the top.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "specviz.gpu-check"
VERSION = 1
STEPS = ("install", "tests", "verify_cost", "speedup", "near_ties")


def write(out: Path, report: dict) -> list[Path]:
    """Write both files into ``out``; returns their paths."""
    json_path, md_path = out / "gpu-check.json", out / "gpu-check.md"
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return [json_path, md_path]


def markdown(report: dict) -> str:
    env, steps = report["environment"], report["steps"]
    lines = ["# specviz gpu-check", ""]
    if report["dry_run"]:
        lines += ["**Dry run**: the CPU, a tiny model built in-process, small sizes. It checks that every step runs "
                  "and the report is complete; its figures say nothing about GPUs.", ""]
    lines += [f"- date: {env.get('date')}; device: {report['device']}; GPU: {env.get('gpu')}; CPU: {env.get('cpu')}",
              f"- torch {env.get('torch')} (CUDA {env.get('cuda')}), transformers {env.get('transformers')}, "
              f"flash-attn {env.get('flash_attn') or 'not installed'}",
              "- attention chosen: " + "; ".join(f"{dtype}: {a['implementation']}, cascade prefix kernel "
                                                  f"{a['cascade_prefix_kernel']}"
                                                  for dtype, a in env.get("attention", {}).items()),
              f"- result: {'ok' if report['ok'] else 'FAILED'} in {report['wall_s']} s", "",
              "| step | status | seconds | note |", "|---|---|---|---|"]
    for name in STEPS:
        step = steps.get(name, {"status": "missing"})  # an older report without the step
        lines.append(f"| {name} | {step['status']} | {step.get('seconds', '')} | {_cell(step.get('error', ''))} |")
    lines += _install(steps.get("install", {})) + _tests(steps.get("tests", {})) + \
        _verify_cost(steps.get("verify_cost", {}), report.get("targets", {})) + \
        _speedup(steps.get("speedup", {})) + _near_ties(steps.get("near_ties", {}))
    return "\n".join(lines) + "\n"


def _install(step: dict) -> list[str]:
    packages = step.get("packages") or []
    if not packages:
        return []
    rows = [f"| {p['module']} | {p['status']} | {p['seconds']} | {_cell(p['detail'])} |" for p in packages]
    return ["", "## Install", "", "| module | status | seconds | pip |", "|---|---|---|---|", *rows]


def _tests(step: dict) -> list[str]:
    runs = step.get("runs") or []
    if not runs:
        return []
    lines = ["", "## Tests on the device", "", "| run | environment | status | passed | failed | errors | skipped | "
             "seconds |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        env = " ".join(f"{k.removeprefix('SPECVIZ_TEST_').lower()}={v}" for k, v in r.get("env", {}).items())
        lines.append(f"| {r['name']} | {env or 'default'} | {r['status']} | {r['passed']} | {r['failed']} | "
                     f"{r['errors']} | {r['skipped']} | {r['seconds']} |")
    for r in runs:
        if r.get("failures"):
            lines += ["", f"{r['name']} failures ({r.get('note', '')}):", ""]
            lines += [f"- `{name}`" for name in r["failures"][:20]]
    return lines


def _verify_cost(step: dict, targets: dict) -> list[str]:
    rows = step.get("rows") or []
    if not rows:
        return []
    lines = ["", "## Verify cost (ms per target forward)", ""]
    if targets.get("measured"):
        lines += [f"- cascade tree / chain, worst over widths (goal <= {targets['tree_over_chain_goal']}): "
                  f"{_num(targets['tree_over_chain_worst'])}",
                  f"- SDPA tree / cascade tree at {targets['width']} tokens over {targets['context']} "
                  f"(goal >= {targets['cascade_over_sdpa_goal']}): {_num(targets['cascade_over_sdpa_tree'])}"]
    columns = sorted({(r["backend"], r["shape"]) for r in rows})
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for context in dict.fromkeys(r["context"] for r in rows):
            mine = {(r["backend"], r["shape"], r["width"]): r["ms"] for r in rows
                    if r["dtype"] == dtype and r["context"] == context}
            lines += ["", f"{dtype}, {context}-token context:", "",
                      "| width | " + " | ".join(f"{b} {s}" for b, s in columns) + " |",
                      "|---|" + "---|" * len(columns)]
            for width in sorted({w for _, _, w in mine}):
                lines.append(f"| {width} | " + " | ".join(_num(mine.get((b, s, width))) for b, s in columns) + " |")
    return lines


def _speedup(step: dict) -> list[str]:
    rows = step.get("rows") or []
    lines = []
    if rows:
        lines += ["", f"## Speedup vs plain decoding (greedy, {step.get('new_tokens')} new tokens, prompts "
                  f"{step.get('prompts')}, budget {step.get('budget')})", "",
                  "| dtype | configuration | tokens/s | speedup | tau | exact |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['dtype']} | {r['row']} | {_num(r['tokens_per_s'])} | {_num(r['speedup'])} | "
                  f"{_num(r['tau'])} | {r['exact']}/{r['prompts']} |" for r in rows]
    parted = step.get("divergences") or []
    if parted:
        lines += ["", "Greedy outputs that part from plain decoding in the same dtype: the first differing token, the "
                  "top-two logit margin of the plain run's target there and the logit gap between the two tokens "
                  "(a gap near zero: a near tie that a wider verify forward rounded the other way; a large gap: a "
                  "bug).", "", "| dtype | configuration | prompt | position | plain token | its token | margin | "
                  "gap |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {d['dtype']} | {d['row']} | {d['prompt']} | {d['position']} | {d['reference_token']} | "
                  f"{d['other_token']} | {_num(d['margin'])} | {_num(d['gap'])} |" for d in parted]
    problems = step.get("problems") or []
    if problems:
        lines.append("")
    for problem in problems:
        lines.append(f"- {problem['dtype']} {problem['drafter']} not built: {_cell(problem['error'])}")
    return lines


def _near_ties(step: dict) -> list[str]:
    if "rows" not in step:
        return []
    lines = ["", f"## Near-tie flips, fp32 vs bf16 greedy: {step['flips']} of {step['prompts']} prompts differ "
             f"within {step['tokens']} tokens", ""]
    if step["flips"]:
        lines += ["| prompt | first different token | fp32 token | bf16 token | fp32 logit margin there |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['prompt']} | {r['first_difference']} | {r['reference_token']} | {r['other_token']} | "
                  f"{_num(r['reference_margin'])} |" for r in step["rows"] if not r["identical"]]
    return lines


def _num(value) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _cell(text) -> str:
    return str(text or "").replace("|", "/").replace("\n", " ")[:200]
