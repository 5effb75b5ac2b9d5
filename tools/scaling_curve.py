"""The EAGLE-3 head's data-scaling curve: held-out agreement and replayed tau against training positions.

    python tools/scaling_curve.py --out runs/scaling --sizes 12500,25000,50000,100000,150000 --epochs 2 \
        -- --target smollm2-135m --data ../shared/corpus stdlib --corpus-tokens 0 \
        --feature-layers 2,9,15,21,27,28,30 --threads 2

Everything after ``--`` is passed to every ``specviz train eagle3`` run (the data options: one cached data set serves
every size). A first run with ``--steps 0`` builds the data and measures the untrained head; then one run per size
trains on a seeded subset of the training sequences holding that many trained positions (``--train-positions``: the
smaller subsets are parts of the larger ones, the held-out sets are the same) for the same number of epochs, with the
shipped head's recipe otherwise (batch 4, lr 0.001, warmup 50 steps or a tenth of a shorter run). Each run's folder
keeps its log and metrics.json; a size whose run finished is not trained again, so an interrupted curve resumes. The
table and a least-squares line of each figure against log10(positions) go to ``--report`` (markdown), with what the
line predicts at 10x and 100x the largest size: a straight line on a log axis, no more than a trend to read.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ["--batch-size", "4", "--lr", "0.001", "--seq-len", "256"]
#: the shipped head's warmup, shortened to a tenth of a run too short for it (the smallest sizes)
WARMUP = 50
#: the replayed chain length the report reads (the model cards' k = 4)
CHAIN_K = "4"


def run(kind_args: list[str], out: Path, extra: list[str]) -> dict:
    """One ``specviz train eagle3`` run into ``out`` (skipped when its metrics are already there)."""
    metrics = out / "metrics.json"
    if metrics.is_file():
        return json.loads(metrics.read_text())
    resume = ["--resume"] if (out / "checkpoints").is_dir() else []  # an interrupted size continues
    command = [sys.executable, "-m", "specviz", "train", "eagle3", "--out", str(out), *RECIPE, *kind_args, *resume,
               *extra]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    return json.loads(metrics.read_text())


def figures(summary: dict) -> dict:
    """The curve's numbers from one run's metrics.json."""
    held, files = summary["heldout"], summary.get("heldout_prompt_files") or {}
    return {"positions": summary["train_positions"], "sequences": summary["train_sequences"],
            "steps": summary["steps"], "agreement": held["top1_agreement"],
            "tau": held["simulated_chain_tau"][CHAIN_K],
            "file_agreement": files.get("top1_agreement"),
            "file_tau": (files.get("simulated_chain_tau") or {}).get(CHAIN_K),
            "minutes": summary["train_seconds"] / 60}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b * log10(x)."""
    xs = [math.log10(x) for x, _ in points]
    ys = [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def report(rows: list[dict], untrained: dict, epochs: float, command: str) -> str:
    lines = ["# EAGLE-3 head: held-out agreement and replayed tau against training positions", "",
             f"Command: `{command}`", "",
             f"Each size trains {epochs:g} epochs on a nested seeded subset of one data set; held out: the generated "
             "prompts' answers and, with a prompt file, its first two prompts per category (never trained on). "
             f"τ is the greedy chain of k = {CHAIN_K} replayed on the target's answers (bonus token counted).", "",
             "| trained positions | sequences | steps | train min | agreement | τ (k=4) | prompt-file agreement | "
             "prompt-file τ |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
             f"| 0 (untrained) | – | 0 | – | {untrained['agreement']:.3f} | {untrained['tau']:.2f} | "
             f"{_num(untrained['file_agreement'], 3)} | {_num(untrained['file_tau'], 2)} |"]
    for r in rows:
        lines.append(f"| {r['positions']:,} | {r['sequences']:,} | {r['steps']} | {r['minutes']:.1f} | "
                     f"{r['agreement']:.3f} | {r['tau']:.2f} | {_num(r['file_agreement'], 3)} | "
                     f"{_num(r['file_tau'], 2)} |")
    largest = max(r["positions"] for r in rows)
    lines += ["", "Least-squares lines against log10(positions), and what they predict (a trend, not a promise: "
              "agreement saturates below 1 and τ below k + 1):", "",
              "| figure | per 10× positions | at 10× the largest | at 100× |", "| --- | ---: | ---: | ---: |"]
    for key, name in (("agreement", "agreement"), ("tau", "τ (k=4)"), ("file_agreement", "prompt-file agreement"),
                      ("file_tau", "prompt-file τ")):
        points = [(r["positions"], r[key]) for r in rows if r[key] is not None]
        if len(points) < 2:
            continue
        a, b = fit(points)
        ten, hundred = (a + b * math.log10(scale * largest) for scale in (10, 100))
        lines.append(f"| {name} | {b:+.3f} | {ten:.3f} | {hundred:.3f} |")
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="one run folder per size under it")
    parser.add_argument("--sizes", required=True, help="comma list of trained positions, e.g. 25000,50000,100000")
    parser.add_argument("--epochs", type=float, default=2.0, help="passes over each size's subset")
    parser.add_argument("--report", type=Path, default=None, help="markdown report (default: OUT/report.md)")
    args = parser.parse_args(own)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    untrained_summary = run(["--steps", "0", "--warmup", "0"], args.out / "untrained", extra)
    untrained = figures(untrained_summary)
    per_sequence = untrained["positions"] / untrained["sequences"]
    rows = []
    for size in sizes:
        steps = max(1, math.ceil(args.epochs * size / (4 * per_sequence)))
        warmup = min(WARMUP, max(1, steps // 10))
        rows.append(figures(run(["--train-positions", str(size), "--steps", str(steps), "--warmup", str(warmup)],
                                args.out / f"positions-{size}", extra)))
    command = "python tools/scaling_curve.py " + " ".join(argv)
    text = report(rows, untrained, args.epochs, command)
    (args.report or args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
