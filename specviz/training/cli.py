"""``specviz train <kind> --target T --data PATH... --out DIR``: build shared target features, train, evaluate, export.

Wire-up for the main CLI: ``add_train_subparser(subparsers)`` adds the ``train`` command and ``run_train(args)``
runs it; ``main(argv)`` is the standalone entry point (``python -m specviz.training.cli draft-lm ...``). The
arguments are declared in ``specviz.training.arguments`` (``export`` re-parses recorded command lines with them).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specviz import outputs
from specviz.errors import SpecvizError
from specviz.training.arguments import DESCRIPTION, add_data_arguments, add_train_arguments, build_parser
from specviz.training.data import (
    MIN_WINDOW,
    SHARD_PROMPTS,
    DataPlan,
    build_data,
    live_featurizer,
    positions_subset,
    resolve_gen_dtype,
)
from specviz.training.evaluate import evaluate_agreement
from specviz.training.export import export_model, write_model_card
from specviz.training.features import extract_features
from specviz.training.floor import describe_rates, faster_dtype
from specviz.training.trainers import TrainConfig, fit, get_trainer, warm_start


def add_train_subparser(subparsers) -> argparse.ArgumentParser:
    """Register ``train`` on the main CLI's subparsers; its handler is ``run_train``."""
    parser = subparsers.add_parser("train", help="train a drafter for a target (distillation from the target)",
                                   description=DESCRIPTION)
    add_train_arguments(parser)
    return parser


def add_data_subparser(subparsers) -> argparse.ArgumentParser:
    """Register ``data`` on the main CLI's subparsers: build (or extend) the shared training data, train nothing."""
    parser = subparsers.add_parser("data", help="build the training data every learned drafter trains on",
                                   description="specviz data --target T --data PATH...: the target's answers to "
                                               "generated (and prompt-file) prompts and annotated corpus text, "
                                               "cached in resumable shards where `specviz train` finds them.")
    add_data_arguments(parser)
    return parser


def run_data(args: argparse.Namespace) -> int:
    """Handler for ``data``: build every stage of ``train``'s data (the hidden states of ``--feature-layers``)."""
    from specviz.models import load_model

    check_numbers(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda message: print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)  # noqa: E731
    target = load_model(args.target, device=args.device)
    plan = replace(_plan(args, topk=args.topk, layers=tuple(args.feature_layers), device=target.device, log=log),
                   keep_hidden=False)
    data = build_data(_inference_view(target, log), plan, args.cache_dir, log)
    log(f"data in {args.cache_dir}: {data.train.num_sequences} training sequences "
        f"({int(data.train.loss_mask.sum())} trained positions), {data.heldout.num_sequences} held-out answers")
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Handler for the ``train`` subcommand: train and return the exit status (errors raise SpecvizError)."""
    train(args)
    return 0


def train(args: argparse.Namespace) -> dict:
    """Prepare data, train, evaluate on held-out target answers, save; return the metrics."""
    check_numbers(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer_cls = get_trainer(args.kind)
    family_options = trainer_options(trainer_cls, args.trainer_options)
    out = run_folder(args.out, resume=args.resume)
    if args.export is not None:  # checked now: a file there used to fail only after the whole run
        args.export = outputs.output_dir(args.export, "--export")
    from specviz.models import check_spec

    check_spec(args.target)  # an unknown or unreachable target: one line, and no run folder left behind
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.log").open("a", encoding="utf-8") as log_file:
        def log(message: str) -> None:
            line = f"[{time.strftime('%H:%M:%S')}] {message}"
            print(line, file=sys.stderr, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        return _run(args, trainer_cls, family_options, out, log)


def _run(args: argparse.Namespace, trainer_cls, family_options: dict, out: Path, log) -> dict:
    """``train`` once its arguments are checked and its log is open."""
    from specviz.models import load_model

    argv = getattr(args, "argv", None) or sys.argv[1:]
    command = "python -m specviz " + " ".join(shlex.quote(a) for a in argv)
    log(f"start: {command}")
    started = time.perf_counter()
    target = load_model(args.target, device=args.device)
    log(f"target {target.name} ({target.source}) on {target.device} loaded in {target.load_seconds:.1f}s")
    if args.autocast == "bf16":
        _check_autocast(target.device, log)
    options = {"hidden": args.hidden, "layers": args.layers, "topk": args.topk, "softmax_sample": args.softmax_sample,
               "init_layers": args.init_layers, "target_name": args.target,
               **family_options}
    trainer = trainer_cls(target, options)
    warm = trainer.load_exported(args.init_from) if args.init_from is not None else None  # refused before the data
    request = trainer.features()
    plan = replace(_plan(args, topk=request.topk, layers=request.layers, device=target.device, log=log),
                   live_features=args.live_features)
    if plan.live_features and not plan.layers:
        raise SpecvizError(f"--live-features: {args.kind} reads no hidden states of the target (drop the option)")
    view = _inference_view(target, log)
    data = build_data(view, plan, args.cache_dir, log)
    train_set, heldout = data.train, data.heldout
    if args.train_positions:
        train_set = positions_subset(train_set, args.train_positions, args.seed)
    data_seconds = time.perf_counter() - started
    log(f"data ready in {data_seconds:.0f}s: {train_set.num_sequences} train sequences "
        f"({int(train_set.loss_mask.sum())} trained positions), {heldout.num_sequences} held-out answers")
    trainer.prepare(train_set)
    torch.manual_seed(args.seed)
    student = trainer.build_student()
    if warm is not None:
        warm_start(trainer, student, warm, args.init_from)
        log(f"student initialised from {args.init_from}")
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                         warmup=args.warmup, seed=args.seed, save_every=args.save_every, log_every=args.log_every,
                         resume=args.resume, autocast=args.autocast,
                         device=target.device)
    params, trainable = _parameters(student)
    log(f"student {args.kind}: {params / 1e6:.1f}M parameters ({trainable / 1e6:.1f}M trained); "
        f"training {args.steps} steps")
    train_started = time.perf_counter()
    if plan.live_features:
        log(f"live features: each batch's target hidden states {list(plan.layers)} are computed as it is drawn")
    result = fit(trainer, student, train_set, config, out, log=log,
                 featurize=live_featurizer(view, plan) if plan.live_features else None)
    train_seconds = time.perf_counter() - train_started
    predict = lambda ids, hidden: trainer.predict_argmax(student, ids, hidden)  # noqa: E731
    metrics = {**evaluate_agreement(predict, heldout), **trainer.heldout_metrics(student, heldout)}
    file_metrics = ({**evaluate_agreement(predict, data.heldout_files),
                     **trainer.heldout_metrics(student, data.heldout_files)}
                    if data.heldout_files is not None else None)
    final = out / "final"
    trainer.save_pretrained(student, final)
    summary = _summary(args, trainer, student, train_set, result, command=command, metrics=metrics,
                       file_metrics=file_metrics, seconds=(data_seconds, train_seconds), warm=warm is not None,
                       answers_dtype=plan.gen_dtype)
    _merge_resumed(summary, out / "metrics.json", args.resume, result["resumed"])
    log(f"held-out top-1 agreement {metrics['top1_agreement']:.3f}, simulated chain tau "
        f"{metrics['simulated_chain_tau']}; saved {final}")
    if file_metrics:
        log(f"held-out prompt-file answers: top-1 agreement {file_metrics['top1_agreement']:.3f}, simulated chain "
            f"tau {file_metrics['simulated_chain_tau']}")
    if args.export:
        export_model(final, args.export)
        write_model_card(args.export, summary, name=args.name or args.export.name)
        log(f"exported fp16 weights and model card to {args.export}")
    return summary


def _check_autocast(device: str, log) -> None:
    """``--autocast bf16`` where bfloat16 is emulated trains many times slower than float32: said before the run."""
    dtype, rates = faster_dtype(device)
    if dtype != torch.bfloat16:
        log(f"warning: --autocast bf16 trains slower than float32 on this machine ({describe_rates(rates)}): leave it "
            "out here")


def _plan(args: argparse.Namespace, *, topk: int, layers: tuple[int, ...], device: str, log=print) -> DataPlan:
    """The data to build with ``topk`` labels and the hidden states of ``layers`` (a trainer's), checked; the
    answers' dtype chosen for ``device`` where ``--gen-dtype auto`` asks."""
    plan = DataPlan(sources=args.data, prompts=args.prompts, eval_prompts=args.eval_prompts,
                    extra_prompts=args.extra_prompts, extra_from=args.extra_from, self_prompts=args.self_prompts,
                    self_from=args.self_from,
                    gen_tokens=args.gen_tokens, gen_batch=args.gen_batch,
                    gen_dtype=resolve_gen_dtype(args.gen_dtype, device, log),
                    corpus_tokens=args.corpus_tokens,
                    seq_len=args.seq_len, topk=topk, layers=layers,
                    extra_layers=args.feature_layers,
                    stdlib_files=args.stdlib_files, seed=args.seed, prompt_files=tuple(args.prompt_file),
                    prompt_file_holdout=args.prompt_file_holdout, sampled_answers=args.sampled_answers,
                    sample_temperature=args.sample_temperature, prompt_file_repeat=args.prompt_file_repeat)
    _check_plan(plan)
    return plan


def _parameters(student) -> tuple[int, int]:
    """(all parameters, trained ones): borrowed target tensors are frozen."""
    return (sum(p.numel() for p in student.parameters()),
            sum(p.numel() for p in student.parameters() if p.requires_grad))


def _summary(args: argparse.Namespace, trainer, student, train_set, result: dict, *, command: str, metrics: dict,
             file_metrics: dict | None, seconds: tuple[float, float], warm: bool, answers_dtype: str) -> dict:
    """What ``metrics.json`` and the model card say about this run (``answers_dtype``: what the answers decoded in,
    which ``--gen-dtype auto`` chose on this machine and the command line does not say)."""
    params, trainable = _parameters(student)
    data_seconds, train_seconds = seconds
    history = result["history"]
    return {
        "kind": args.kind, "target": args.target, "parameters": params, "trainable_parameters": trainable,
        "steps": args.steps,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "lr": args.lr,
        "final_loss": history[-1]["loss"] if history else None,
        "final_train_agree": history[-1].get("agree") if history else None,
        "data_seconds": data_seconds, "train_seconds": train_seconds, "answers_dtype": answers_dtype,
        "train_sequences": train_set.num_sequences, "train_positions": int(train_set.loss_mask.sum()),
        "heldout": metrics, "heldout_prompt_files": file_metrics,
        "command": command, "init_from": str(args.init_from) if warm and not result["resumed"] else None,
        "student_config": trainer.describe_student(student),
        "trainer_options": getattr(trainer, "opts", {}), "history": history,
    }


def _merge_resumed(summary: dict, path: Path, resume: bool, resumed: bool) -> None:
    """Write ``summary`` to ``path``; a resumed run is reproduced by the chain of commands that made it, so it keeps
    the earlier runs' commands, training time and warm start."""
    if resume and path.is_file():
        before = json.loads(path.read_text())
        summary["commands"] = [*before.get("commands", [before["command"]]), summary["command"]]
        summary["train_seconds"] += before.get("train_seconds", 0.0)  # the steps it resumed from
        if resumed:  # a warm start belongs to the run that began the chain
            summary["init_from"] = before.get("init_from")
    path.write_text(json.dumps(summary, indent=2))


def _inference_view(target, log=print):
    """The target for the data stages (answers, top-k, hidden states): the fast forward path where it runs, on
    whichever kernel runs a feature pass faster on this machine. The engine declares the thin kernel for its few-row
    steps and verifies; a feature pass multiplies batches of thousands of tokens, where the library's blocked kernels
    can win or lose by machine (BENCHMARKS.md, "Training answers"). Both are float32 products, so the labels and
    features differ by rounding only; the choice is timed once per run on a fixed probe batch and logged.

    Students borrow tensors from ``target.model`` itself, which stays transformers' own module for autograd.
    """
    from specviz.models import fast_forward

    if not fast_forward.available(target.device, target.dtype):
        return target
    torch_kernel = fast_forward.fast_copy(target.model, thin=False)
    if target.fast_model().kernel_choice["wide"] != "thin":  # the thin kernel did not build here: nothing to time
        return replace(target, model=torch_kernel)
    kernels = {"torch's kernel": torch_kernel, "the thin kernel": target.fast_model()}
    probe = [[(7 + 31 * row + 13 * i) % target.vocab_size for i in range(PROBE_TOKENS)] for row in range(4)]
    seconds = {name: _probe_seconds(model, probe) for name, model in kernels.items()}
    name = min(seconds, key=seconds.get)
    log(f"data stages on {name}: a feature pass of {4 * PROBE_TOKENS} tokens took "
        + ", ".join(f"{seconds[k]:.2f} s on {k}" for k in seconds))
    return replace(target, model=kernels[name])


#: tokens per row of the probe batch that times the data stages' kernels
PROBE_TOKENS = 256


def _probe_seconds(model, probe: list[list[int]]) -> float:
    """The better of two timed feature passes over ``probe`` after one untimed (warm-up) pass."""
    extract_features(model, probe, layers=(1,), desc=None)
    best = math.inf
    for _ in range(2):
        started = time.perf_counter()
        extract_features(model, probe, layers=(1,), desc=None)
        best = min(best, time.perf_counter() - started)
    return best


def trainer_options(trainer_cls, pairs: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs as the family's options (values parsed as JSON where they parse, else text)."""
    known = trainer_cls.defaults
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise SpecvizError(f"--set {pair!r}: expected KEY=VALUE with KEY one of "
                               f"{', '.join(sorted(known)) or '(this family has no options)'}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


#: The train options that must be whole numbers of at least this much (checked before any data stage).
AT_LEAST = {"steps": 0, "train_positions": 0, "batch_size": 1, "seq_len": MIN_WINDOW, "warmup": 0, "save_every": 1,
            "log_every": 1, "prompts": 0, "extra_prompts": 0, "extra_from": 0, "self_prompts": 0, "self_from": 0,
            "eval_prompts": 0, "gen_tokens": 1, "gen_batch": 1, "corpus_tokens": 0, "stdlib_files": 0, "topk": 1,
            "threads": 1, "hidden": 1, "layers": 1}


def run_folder(path, *, resume: bool) -> Path:
    """``--out`` checked: a writable folder, and one that holds no earlier run unless ``--resume`` continues it
    (training into it would overwrite its final weights and metrics, and prune its checkpoints)."""
    out = outputs.output_dir(path, "--out")
    earlier = []
    if out.is_dir():
        earlier = [name for name in ("latest", "final", "metrics.json") if (out / name).exists()]
        earlier += sorted(p.name for p in out.glob("step-*"))[:1]
    if earlier and not resume:
        raise SpecvizError(f"--out {out} holds an earlier run ({', '.join(earlier)}): add --resume to continue it, or "
                           "give a new folder")
    return out


def check_numbers(args: argparse.Namespace) -> None:
    """Out-of-range numbers, and empty --data entries, are one-line errors before anything loads."""
    for name, low in AT_LEAST.items():
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise SpecvizError(f"--{name.replace('_', '-')} must be {low} or more, got {value}")
    if hasattr(args, "lr") and not (math.isfinite(args.lr) and args.lr > 0):
        raise SpecvizError(f"--lr must be a positive number, got {args.lr}")
    last = args.extra_prompts if args.self_prompts else args.extra_prompts - 1
    if args.extra_from and (args.extra_from % SHARD_PROMPTS or args.extra_from > last):
        below = "up to" if last == args.extra_prompts else "below"
        raise SpecvizError(f"--extra-prompts-from must be a multiple of {SHARD_PROMPTS} {below} --extra-prompts "
                           f"({args.extra_prompts}), got {args.extra_from}")
    if args.self_from and (args.self_from % SHARD_PROMPTS or args.self_from >= args.self_prompts):
        raise SpecvizError(f"--self-prompts-from must be a multiple of {SHARD_PROMPTS} below --self-prompts "
                           f"({args.self_prompts}), got {args.self_from}")
    if any(not str(path).strip() for path in args.data):
        raise SpecvizError("--data has an empty entry: give files, folders, globs or 'stdlib'")


def _check_plan(plan: DataPlan) -> None:
    """Out-of-range data options are one-line errors before the slow data stages start."""
    if plan.sampled_answers < 0 or plan.prompt_file_repeat < 1 or plan.prompt_file_holdout < 0:
        raise SpecvizError("--sampled-answers and --prompt-file-holdout must be 0 or more, --prompt-file-repeat 1 or "
                           "more")
    if plan.sampled_answers and not plan.sample_temperature > 0:
        raise SpecvizError(f"--sample-temperature must be above 0, got {plan.sample_temperature}")
    for path in plan.prompt_files:
        if not Path(path).is_file():
            raise SpecvizError(f"prompt file {path} does not exist")


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point; user errors print one line and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = ["train", *argv]
    try:
        train(args)
    except SpecvizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
