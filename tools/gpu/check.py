"""``python tools/gpu/check.py --out DIR`` (from the repository root): the prepared check a session runs when it is
lent a GPU.

One command, under ten minutes on a CUDA machine with this repository and PyPI: install what is missing
(``installer``), run the greedy and sampling lossless tests on CUDA with the cascade kernels (``pytest_runs``),
measure the verify-cost curve for cascade vs SDPA vs eager, chain vs tree (``attention_cost``), measure speedup vs
plain decoding for the shipped drafters on the embedded default target in bf16 and fp32 (the benchmark's own suite),
count near-tie flips between fp32 and bf16 greedy outputs (``near_ties``), and write ``gpu-check.json`` and
``gpu-check.md`` (``report``). ``--dry-run`` runs the same steps on the CPU at small sizes on a tiny model built
in-process and writes the same report, so its format is tested without a GPU.

Each step is isolated: one that fails is reported with its error and the rest still run; a step that would overrun
the time budget is skipped and says so.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: this checkout's specviz and tools

import torch

from specviz.bench import attention_cost, machine
from specviz.engine.cost_curve import widths_up_to
from specviz.errors import SpecvizError, exit_status
from specviz.models import device as devices
from specviz.models.device import CASCADE
from tools.gpu import installer, near_ties, pytest_runs, report, tiny_target
from tools.gpu.pytest_runs import TestRun

DTYPES = (torch.bfloat16, torch.float32)  # bf16 first: the GPU default
CUDA_ENV = {"SPECVIZ_TEST_DEVICE": "cuda"}
CASCADE_ENV = {"SPECVIZ_TEST_ATTENTION": CASCADE}


@dataclass(frozen=True)
class Plan:
    """The sizes of every step: the real check on CUDA, or its CPU dry run."""

    device: str
    dry_run: bool
    install: tuple[str, ...]
    tests: tuple[TestRun, ...]
    contexts: tuple[int, ...]
    widths: tuple[int, ...]
    repeats: int
    new_tokens: int
    prompts: int
    flip_prompts: int
    flip_tokens: int
    budget: dict = field(default_factory=dict)
    time_budget_s: float = 570.0
    steps: tuple[str, ...] = report.STEPS
    drafters: tuple[str, ...] | None = None  # None: every spec ready for the default target
    shape_config: Path | None = None  # verify cost on a random model of this config.json's shape (no weights)


def full_plan(workers: int = 1) -> Plan:
    lossless = ("test_greedy_lossless.py", "test_sampling_lossless.py")
    return Plan(
        device="cuda", dry_run=False, install=tuple(installer.PACKAGES),
        tests=(TestRun("cascade-maths-cuda", ("test_cascade_attention.py",), CUDA_ENV, timeout_s=120,
                       note="cascade vs masked SDPA on CUDA, every kernel there, fp32 and bf16", workers=workers),
               TestRun("lossless-cuda-cascade-fp32", lossless, {**CUDA_ENV, **CASCADE_ENV}, timeout_s=270,
                       note="greedy identity and sampled distributions, cascade verification, fp32",
                       workers=workers),
               TestRun("greedy-cuda-cascade-bf16", ("test_greedy_lossless.py",),
                       {**CUDA_ENV, **CASCADE_ENV, "SPECVIZ_TEST_DTYPE": "bfloat16"}, timeout_s=120,
                       note="bf16: a failure can be a near tie that a wider verify forward rounds the other way",
                       workers=workers)),
        contexts=(256, 2048), widths=tuple(widths_up_to(64)), repeats=5, new_tokens=64, prompts=3,
        flip_prompts=6, flip_tokens=64, budget={"k": 4, "width": 3, "depth": 4, "max_nodes": 16})


def dry_plan() -> Plan:
    quick = ("test_cascade_attention.py::test_kernel_choice",
             "test_cascade_attention.py::test_a_mask_hiding_prefix_columns_falls_back_to_sdpa")
    return Plan(device="cpu", dry_run=True, install=(),
                tests=(TestRun("dry-run-sample", quick, CASCADE_ENV, timeout_s=300,  # a busy 2-core CPU: slow start
                               note="two unit tests, to exercise the subprocess and its report"),),
                contexts=(24,), widths=(1, 2, 4, 8), repeats=2, new_tokens=8, prompts=1, flip_prompts=2,
                flip_tokens=8, time_budget_s=600.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/gpu/check.py",
        description="The prepared GPU check: lossless tests on CUDA, verify cost per attention kernel, speedup in bf16 "
                    "and fp32, near-tie flips; one JSON and one markdown report. Run on a CUDA machine (under 10 "
                    "minutes); --dry-run runs the same steps on the CPU at small sizes and writes the same report "
                    "format.")
    parser.add_argument("--out", default="gpu-check", help="output folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny in-process model, small sizes")
    parser.add_argument("--steps", default=",".join(report.STEPS),
                        help="comma-separated steps to run, in their fixed order (default: all: "
                             f"{','.join(report.STEPS)}); a lent machine with no package index skips install")
    parser.add_argument("--drafters", help="comma-separated drafter specs for the speedup step (default: every "
                                           "spec ready for the default target)")
    parser.add_argument("--workers", type=int, default=1,
                        help="pytest processes per test run (pytest-xdist, where installed; default 1)")
    parser.add_argument("--budget-s", type=float, help="time budget of the whole check in seconds (default 570)")
    parser.add_argument("--shape-config", help="measure verify cost on a randomly initialised model built from "
                                               "this config.json (the cost does not depend on the weights) instead "
                                               "of loading the default target")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the check; a bad argument or a missing CUDA device is one line and exit code 2."""
    parser = build_parser()
    return exit_status(lambda: run(parser.parse_args(argv)))


def plan_for(args: argparse.Namespace) -> Plan:
    """The plan the arguments ask for; each bad argument is one line."""
    steps = tuple(name.strip() for name in args.steps.split(",") if name.strip())
    unknown = [name for name in steps if name not in report.STEPS]
    if unknown or not steps:
        raise SpecvizError(f"--steps: unknown step(s) {', '.join(unknown) or '(none given)'}; choose from "
                           f"{', '.join(report.STEPS)}")
    if args.workers < 1:
        raise SpecvizError(f"--workers must be at least 1, got {args.workers}")
    if args.budget_s is not None and not 10 <= args.budget_s <= 3600:
        raise SpecvizError(f"--budget-s must be between 10 and 3600 seconds, got {args.budget_s}")
    drafters = None
    if args.drafters is not None:
        drafters = tuple(spec.strip() for spec in args.drafters.split(",") if spec.strip())
        if not drafters:
            raise SpecvizError("--drafters names no drafter spec")
    shape_config = None
    if args.shape_config is not None:
        shape_config = Path(args.shape_config)
        if not shape_config.is_file():
            raise SpecvizError(f"--shape-config: no file at {shape_config}")
    plan = dry_plan() if args.dry_run else full_plan(args.workers)
    return replace(plan, steps=tuple(name for name in report.STEPS if name in steps), drafters=drafters,
                   shape_config=shape_config, time_budget_s=args.budget_s or plan.time_budget_s)


def run(args: argparse.Namespace) -> int:
    plan = plan_for(args)
    if not plan.dry_run and not torch.cuda.is_available():
        raise SpecvizError("gpu-check needs a CUDA device (torch.cuda.is_available() is False); run with --dry-run "
                           "to check the steps on the CPU")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecvizError(f"cannot create {out}: {error.strerror}") from None
    result = check(plan, out, log=lambda line: print(line, file=sys.stderr, flush=True))
    paths = report.write(out, result)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0 if result["ok"] else 1


def check(plan: Plan, out: Path, log: Callable[[str], None] = lambda line: None) -> dict:
    """Every step in order, within ``plan.time_budget_s``; the report as a dict (``report.write`` writes it)."""
    started = time.perf_counter()
    steps: dict[str, dict] = {}

    def step(name: str, minimum_s: float, body: Callable[[float], dict]) -> None:
        left = plan.time_budget_s - (time.perf_counter() - started)
        if left < minimum_s:
            steps[name] = {"status": "skipped", "seconds": 0.0, "error": f"time budget: {left:.0f} s left"}
            log(f"gpu-check: {name} skipped ({left:.0f} s left)")
            return
        log(f"gpu-check: {name} ...")
        t0 = time.perf_counter()
        try:
            steps[name] = {"status": "ok", **body(left)}
        except Exception as error:  # noqa: BLE001 - one broken step must not lose the others' results
            steps[name] = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                           "traceback": traceback.format_exc()[-3000:]}
        steps[name]["seconds"] = round(time.perf_counter() - t0, 1)
        log(f"gpu-check: {name} {steps[name]['status']} in {steps[name]['seconds']} s")

    bodies: dict[str, tuple[float, Callable[[float], dict]]] = {
        "install": (0, lambda left: _install(plan)),
        "tests": (60, lambda left: _tests(plan, out, left - (200 if len(plan.steps) > 1 else 10))),
        "verify_cost": (30, lambda left: _verify_cost(plan)),
        "speedup": (60, lambda left: _speedup(plan)),
        "near_ties": (20, lambda left: _near_ties(plan)),
    }
    for name in report.STEPS:
        if name not in plan.steps:
            steps[name] = {"status": "not run", "seconds": 0.0, "error": "not in --steps"}
            continue
        minimum_s, body = bodies[name]
        step(name, 0 if plan.dry_run and name != "verify_cost" else minimum_s, body)
    tests = steps["tests"].get("runs", [])
    ok = all(s["status"] != "failed" for s in steps.values()) and all(
        r["status"] == "passed" for r in tests if not r["name"].endswith("bf16"))
    return {"schema": report.SCHEMA, "version": report.VERSION, "dry_run": plan.dry_run,
            "device": plan.device, "environment": environment(plan.device), "steps": steps,
            "targets": targets(steps.get("verify_cost", {}).get("rows", []), plan),
            "ok": ok, "wall_s": round(time.perf_counter() - started, 1)}


def environment(device: str) -> dict:
    """Machine, versions and the attention choices ``specviz.models.device`` makes here."""
    import importlib.metadata

    try:
        flash = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        flash = None
    devices.choose_cascade_kernel.cache_clear()  # the install step may have added flash-attn
    return {**machine.describe(), "cuda": torch.version.cuda, "flash_attn": flash,
            "attention": {str(dtype).removeprefix("torch."): {
                "implementation": devices.choose_attn_implementation(device, dtype),
                "cascade_prefix_kernel": devices.choose_cascade_kernel(device, dtype)} for dtype in DTYPES}}


def _install(plan: Plan) -> dict:
    if not plan.install:
        return {"status": "skipped", "packages": [], "error": "dry run: nothing installed"}
    packages = installer.ensure(list(plan.install))
    devices.choose_cascade_kernel.cache_clear()
    return {"packages": packages}


def _tests(plan: Plan, out: Path, seconds: float) -> dict:
    runs = []
    deadline = time.perf_counter() + max(seconds, 60)
    for spec in plan.tests:
        left = deadline - time.perf_counter()
        if left < 20:
            runs.append({"name": spec.name, "status": "skipped", "note": "time budget", "env": spec.env,
                         "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": [], "seconds": 0.0})
            continue
        runs.append(pytest_runs.run(replace(spec, timeout_s=min(spec.timeout_s, left)), out))
    return {"runs": runs}


def _verify_cost(plan: Plan) -> dict:
    rows = []
    for dtype in DTYPES:
        target = _shape_target(plan, dtype) if plan.shape_config else _target(plan, dtype)
        for length in plan.contexts:
            context = [(7 + 31 * i) % target.vocab_size for i in range(length)]  # any ids: the cost ignores text
            for row in attention_cost.measure(target, context, list(plan.widths), repeats=plan.repeats):
                rows.append({"dtype": _name(dtype), **row})
    return {"rows": rows, "widths": list(plan.widths), "contexts": list(plan.contexts),
            "model": str(plan.shape_config) + " (random weights)" if plan.shape_config else "the default target"}


def _speedup(plan: Plan) -> dict:
    from specviz import api, settings
    from specviz.bench import configs
    from specviz.bench.command import QUICK_CATEGORIES
    from specviz.bench.prompts import DEFAULT_PROMPTS, categories_of, load_prompts, select
    from specviz.bench.suite import run_suite
    from specviz.bench.summary import OVERALL, PLAIN_ROW, summarise
    from specviz.drafters import registry
    from specviz.engine.loop import GenerationConfig

    values = settings.validate({**plan.budget, "device": plan.device})
    budget, rows, problems, divergences = api.budget_for(values), [], [], []
    every = load_prompts(DEFAULT_PROMPTS)
    prompts = select(every, [c for c in QUICK_CATEGORIES if c in categories_of(every)] or None, 1)[: plan.prompts]
    for dtype in DTYPES:
        target = _target(plan, dtype)
        drafters = {}
        specs = list(plan.drafters or (["ngram", "model:tiny-draft"] if plan.dry_run
                                       else registry.default_specs(values["target"])))
        for spec in specs:
            try:
                drafters[spec] = (_tiny_drafter(target) if spec == "model:tiny-draft"
                                  else api.make_drafter(spec, target, values))
            except (SpecvizError, RuntimeError, ValueError, OSError) as error:
                problems.append({"dtype": _name(dtype), "drafter": spec, "error": str(error)[:300]})
        run_specs = configs.build_specs(list(drafters), ["chain", "tree"], budget, hf=False)
        config = GenerationConfig(max_new_tokens=plan.new_tokens)
        suite = run_suite(target, prompts, run_specs, drafters, config, chat=not plan.dry_run)
        summary = summarise(suite, greedy=True)
        encoded = {p.question_id: target.encode_prompt(p.text, chat=not plan.dry_run) for p in prompts}
        for sample in suite.samples:  # greedy outputs that part from plain decoding: where, and by what margin
            parted = near_ties.divergence(target, encoded[sample.prompt.question_id], sample.reference,
                                          sample.result.token_ids)
            if parted is not None:
                divergences.append({"dtype": _name(dtype), "row": sample.spec, "prompt": sample.prompt.question_id,
                                    **parted})
        for name in summary.rows:
            stats = summary.table[name][OVERALL]
            spec = summary.specs.get(name)
            rows.append({"dtype": _name(dtype), "row": name, "drafter": spec.drafter if spec else None,
                         "shape": spec.shape if spec else "plain", "prompts": stats.prompts,
                         "tokens_per_s": stats.tokens_per_s.median if stats.tokens_per_s else None,
                         "speedup": None if name == PLAIN_ROW or not stats.speedup else stats.speedup.median,
                         "tau": stats.tau, "exact": stats.exact})
    return {"rows": rows, "problems": problems, "divergences": divergences, "budget": budget.to_dict(),
            "new_tokens": plan.new_tokens,
            "prompts": [p.question_id for p in prompts]}


def _near_ties(plan: Plan) -> dict:
    reference, other = _target(plan, torch.float32), _target(plan, torch.bfloat16)
    if plan.dry_run:
        prompts = [[(5 + 11 * i + j) % tiny_target.VOCAB for j in range(12)] for i in range(plan.flip_prompts)]
    else:
        from specviz.bench.prompts import DEFAULT_PROMPTS, load_prompts

        texts = [p.text for p in load_prompts(DEFAULT_PROMPTS)[: plan.flip_prompts]]
        prompts = [reference.encode_prompt(text, chat=True) for text in texts]
    return near_ties.compare(reference, other, prompts, plan.flip_tokens)


def targets(rows: list[dict], plan: Plan) -> dict:
    """The issue's two targets, read off the bf16 verify-cost curve: the cascade's tree over chain cost at every
    width (<= 1.1) and its speedup over SDPA for the widest tree over the longest context (>= 1.3)."""
    bf16 = [r for r in rows if r["dtype"] == "bfloat16"]
    if not bf16:
        return {"measured": False}
    context, widest = max(plan.contexts), max(plan.widths)
    tree_over_chain = [attention_cost.ratio(bf16, CASCADE, "chain", CASCADE, "tree", w, c)
                       for c in plan.contexts for w in plan.widths]
    worst = max((r for r in tree_over_chain if r is not None), default=None)
    speedup = attention_cost.ratio(bf16, CASCADE, "tree", "sdpa", "tree", widest, context)
    return {"measured": True, "dry_run": plan.dry_run, "context": context, "width": widest,
            "tree_over_chain_worst": worst, "tree_over_chain_goal": 1.1,
            "tree_over_chain_met": None if worst is None else worst <= 1.1,
            "cascade_over_sdpa_tree": speedup, "cascade_over_sdpa_goal": 1.3,
            "cascade_over_sdpa_met": None if speedup is None else speedup >= 1.3}


def _target(plan: Plan, dtype: torch.dtype):
    """The embedded default on the plan's device (transformers' forward, the backend ``device.py`` picks), or the
    tiny in-process target for a dry run."""
    if plan.dry_run:
        return tiny_target.target(plan.device, dtype, devices.choose_attn_implementation(plan.device, dtype))
    from specviz import api
    from specviz.models.registry import DEFAULT_TARGET

    return api.load_target(DEFAULT_TARGET, target_forward="hf", device=plan.device, dtype=dtype)


def _shape_target(plan: Plan, dtype: torch.dtype):
    """A randomly initialised causal LM of ``plan.shape_config``'s shape on the plan's device: what a verify forward
    costs does not depend on the weights, so the cost curve needs no checkpoint."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specviz.engine.target import Target

    attention = devices.choose_attn_implementation(plan.device, dtype)
    if attention == CASCADE:
        from specviz.models import cascade_attention

        cascade_attention.register()
    config = AutoConfig.from_pretrained(plan.shape_config.parent if plan.shape_config.name == "config.json"
                                        else plan.shape_config, attn_implementation=attention)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device=plan.device, dtype=dtype).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tiny_target.tokenizer(), name=f"{config.model_type} shape (random weights)",
                  source=str(plan.shape_config))


def _tiny_drafter(target):
    from specviz.drafters.draft_model import DraftModelDrafter

    return DraftModelDrafter(tiny_target.draft(target.model), target.vocab_size, name="tiny-draft")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


if __name__ == "__main__":
    raise SystemExit(main())
