"""``python tools/gpu/train_all.py --out DIR`` (from the repository root): on one CUDA GPU, build the shared training
data and train every learned family for the embedded default target, in under ten minutes of GPU time.

One data build (``specviz data``: the target's answers, to generated prompts and to user turns it writes itself, from
the slot decoder in bfloat16, relabelled in the target's own dtype by the feature pass that caches every family's
hidden states) feeds every family's ``specviz train``,
each exported with its model card under ``DIR/export/<family>`` to compare against the shipped ones (``specviz
bench --drafters eagle3:DIR/export/eagle3,...``) before anything replaces them. Each stage runs in this process,
is timed, and is skipped (and says so) once the budget is spent; ``DIR/train-all.json`` records what ran.

``--dry-run`` runs the same stages on the CPU at tiny sizes on a tiny model written to ``DIR`` (nothing is
downloaded), so the plan and its commands are tested without a GPU (``tests/test_gpu_check.py``). The GPU sizes
below are an estimate, not a measurement: no GPU has run them yet (BENCHMARKS.md says when one does).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: this checkout's specviz and tools

from specviz.cli import main as specviz_main  # noqa: E402
from tools.gpu import tiny_target  # noqa: E402

#: the hidden states every family reads, for SmolLM2-135M (EAGLE-3: 2, 15, 27; DFlash/DSpark: 2, 9, 15, 21, 28;
#: MTP and Medusa: 30, the output of the final norm); the dry run's four-layer model reads its own
FEATURE_LAYERS = {"full": "2,9,15,21,27,28,30", "dry": "0,1,2,3,4"}


@dataclass(frozen=True)
class Sizes:
    """How much of everything: the data, and each family's training steps."""

    prompts: int
    #: user turns the target writes itself (``--self-prompts``): they moved the EAGLE-3 head's agreement on held-out
    #: real requests further than as many generated prompts did (BENCHMARKS.md)
    self_prompts: int
    eval_prompts: int
    gen_tokens: int
    gen_batch: int
    corpus_tokens: int
    steps: int
    batch_size: int
    seq_len: int


GPU = Sizes(prompts=16_000, self_prompts=8_000, eval_prompts=64, gen_tokens=144, gen_batch=512, corpus_tokens=200_000,
            steps=3000, batch_size=32, seq_len=256)
DRY = Sizes(prompts=6, self_prompts=8, eval_prompts=2, gen_tokens=6, gen_batch=4, corpus_tokens=200, steps=2,
            batch_size=2, seq_len=48)
#: family -> its own train options (the shipped cards' choices)
FAMILIES = {
    "eagle3": [],
    "dspark": ["--set", "markov_rank=32"],
    "dflash": [],
    "mtp": [],
    "medusa": [],
    "draft-lm": ["--softmax-sample", "2048"],
}
#: options that name the embedded default's own layers (the shipped MTP modules start from its last decoder layer,
#: the draft model from its first six), left out of the dry run's two-layer model
FULL_ONLY = {"mtp": ["--init-layers", "29"], "draft-lm": ["--init-layers", "0,1,2,3,4,5"]}
#: the dry run's own: a draft model smaller than its 32-wide target
DRY_ONLY = {"draft-lm": ["--hidden", "16", "--layers", "1"]}


def data_options(target: str, sizes: Sizes, *, device: str, cache: Path, sources: list[str],
                 prompt_file: str | None) -> list[str]:
    """The options ``data`` and every ``train`` share (so each ``train`` reads what ``data`` cached)."""
    options = ["--target", target, "--data", *sources, "--device", device, "--cache-dir", str(cache),
               "--prompts", str(sizes.prompts), "--self-prompts", str(sizes.self_prompts),
               "--eval-prompts", str(sizes.eval_prompts),
               "--gen-tokens", str(sizes.gen_tokens), "--gen-batch", str(sizes.gen_batch),
               "--corpus-tokens", str(sizes.corpus_tokens), "--seq-len", str(sizes.seq_len)]
    if prompt_file:
        options += ["--prompt-file", prompt_file, "--sampled-answers", "1"]
    return options


def stages(out: Path, *, dry_run: bool, target: str, sources: list[str], prompt_file: str | None,
           device: str) -> list[tuple[str, list[str]]]:
    """(name, ``specviz`` argv) for every stage, in order."""
    sizes = DRY if dry_run else GPU
    layers = FEATURE_LAYERS["dry" if dry_run else "full"]
    shared = data_options(target, sizes, device=device, cache=out / "cache", sources=sources,
                          prompt_file=prompt_file)
    plan = [("data", ["data", *shared, "--feature-layers", layers])]
    for family, own in FAMILIES.items():
        argv = ["train", family, *shared, "--feature-layers", layers, "--out", str(out / "runs" / family),
                "--steps", str(sizes.steps), "--batch-size", str(sizes.batch_size), "--lr", "1e-3",
                "--save-every", str(max(1, sizes.steps // 4)), "--export", str(out / "export" / family),
                "--name", f"{Path(target).name}-{family}", *own]
        argv += DRY_ONLY.get(family, []) if dry_run else ["--autocast", "bf16", *FULL_ONLY.get(family, [])]
        plan.append((family, argv))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU on a tiny model")
    parser.add_argument("--budget-s", type=float, default=600.0, help="skip stages once this many seconds are spent")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--data", nargs="+", default=["../shared/corpus", "stdlib"])
    parser.add_argument("--prompt-file", default="specviz/examples/spec_bench_dev.jsonl")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        target = tiny_target.save_chat_model(args.out / "tiny-target")
        corpus = args.out / "corpus.txt"
        corpus.write_text(" ".join(f"w{i % 60} ." for i in range(4000)))
        plan = stages(args.out, dry_run=True, target=target, sources=[str(corpus)], prompt_file=None, device="cpu")
    else:
        plan = stages(args.out, dry_run=False, target=args.target, sources=args.data, prompt_file=args.prompt_file,
                      device="cuda")
    started = time.perf_counter()
    record = {"dry_run": args.dry_run, "budget_s": args.budget_s, "stages": []}
    for name, command in plan:
        spent = time.perf_counter() - started
        if spent > args.budget_s:
            record["stages"].append({"name": name, "status": "skipped", "why": f"budget spent ({spent:.0f} s)"})
            continue
        began = time.perf_counter()
        code = specviz_main(command)
        record["stages"].append({"name": name, "status": "ok" if code == 0 else f"exit {code}",
                                 "seconds": round(time.perf_counter() - began, 1),
                                 "command": "python -m specviz " + " ".join(command)})
        (args.out / "train-all.json").write_text(json.dumps(record, indent=2))
    (args.out / "train-all.json").write_text(json.dumps(record, indent=2))
    return 0 if all(stage["status"] == "ok" for stage in record["stages"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
