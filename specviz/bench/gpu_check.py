"""``python -m specviz gpu-check --out DIR``: the prepared check a session runs when it is lent a GPU.

One command, under ten minutes on a CUDA machine with this repository and PyPI: install what is missing
(``gpu_setup``), run the greedy and sampling lossless tests on CUDA with the cascade kernels (``pytest_runs``),
measure the verify-cost curve for cascade vs SDPA vs eager, chain vs tree (``attention_cost``), measure speedup vs
plain decoding for the shipped drafters on the embedded default target in bf16 and fp32 (the benchmark's own suite),
count near-tie flips between fp32 and bf16 greedy outputs (``near_ties``), and write ``gpu-check.json`` and
``gpu-check.md`` (``gpu_report``). ``--dry-run`` runs the same steps on the CPU at small sizes on a tiny model built
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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz.bench import attention_cost, gpu_report, gpu_setup, machine, near_ties, pytest_runs, tiny_target
from specviz.bench.pytest_runs import TestRun
from specviz.engine.cost_curve import widths_up_to
from specviz.errors import SpecvizError
from specviz.models import device as devices
from specviz.models.device import CASCADE

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


def full_plan() -> Plan:
    lossless = ("test_greedy_lossless.py", "test_sampling_lossless.py")
    return Plan(
        device="cuda", dry_run=False, install=tuple(gpu_setup.PACKAGES),
        tests=(TestRun("cascade-maths-cuda", ("test_cascade_attention.py",), CUDA_ENV, timeout_s=120,
                       note="cascade vs masked SDPA on CUDA, every kernel there, fp32 and bf16"),
               TestRun("lossless-cuda-cascade-fp32", lossless, {**CUDA_ENV, **CASCADE_ENV}, timeout_s=270,
                       note="greedy identity and sampled distributions, cascade verification, fp32"),
               TestRun("greedy-cuda-cascade-bf16", ("test_greedy_lossless.py",),
                       {**CUDA_ENV, **CASCADE_ENV, "SPECVIZ_TEST_DTYPE": "bfloat16"}, timeout_s=120,
                       note="bf16: a failure can be a near tie that a wider verify forward rounds the other way")),
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


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "gpu-check", help="the prepared GPU check: lossless tests on CUDA, verify cost per attention kernel, speedup "
                          "in bf16 and fp32, near-tie flips; one JSON and one markdown report",
        description="Run on a CUDA machine (under 10 minutes). --dry-run runs the same steps on the CPU at small "
                    "sizes and writes the same report format.")
    parser.add_argument("--out", default="gpu-check", help="output folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny in-process model, small sizes")


def run(args: argparse.Namespace) -> int:
    plan = dry_plan() if args.dry_run else full_plan()
    if not plan.dry_run and not torch.cuda.is_available():
        raise SpecvizError("gpu-check needs a CUDA device (torch.cuda.is_available() is False); run with --dry-run "
                           "to check the steps on the CPU")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecvizError(f"cannot create {out}: {error.strerror}") from None
    report = check(plan, out, log=lambda line: print(line, file=sys.stderr, flush=True))
    paths = gpu_report.write(out, report)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0 if report["ok"] else 1


def check(plan: Plan, out: Path, log: Callable[[str], None] = lambda line: None) -> dict:
    """Every step in order, within ``plan.time_budget_s``; the report as a dict (``gpu_report`` writes it)."""
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

    step("install", 0, lambda left: _install(plan))
    step("tests", 60 if not plan.dry_run else 0, lambda left: _tests(plan, out, left - 200))
    step("verify_cost", 30, lambda left: _verify_cost(plan))
    step("speedup", 60 if not plan.dry_run else 0, lambda left: _speedup(plan))
    step("near_ties", 20 if not plan.dry_run else 0, lambda left: _near_ties(plan))
    tests = steps["tests"].get("runs", [])
    ok = all(s["status"] != "failed" for s in steps.values()) and all(
        r["status"] == "passed" for r in tests if not r["name"].endswith("bf16"))
    return {"schema": gpu_report.SCHEMA, "version": gpu_report.VERSION, "dry_run": plan.dry_run,
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
    packages = gpu_setup.ensure(list(plan.install))
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
        runs.append(pytest_runs.run(TestRun(spec.name, spec.targets, spec.env, spec.select,
                                            min(spec.timeout_s, left), spec.note), out))
    return {"runs": runs}


def _verify_cost(plan: Plan) -> dict:
    rows = []
    for dtype in DTYPES:
        target = _target(plan, dtype)
        for length in plan.contexts:
            context = [(7 + 31 * i) % target.vocab_size for i in range(length)]  # any ids: the cost ignores text
            for row in attention_cost.measure(target, context, list(plan.widths), repeats=plan.repeats):
                rows.append({"dtype": _name(dtype), **row})
    return {"rows": rows, "widths": list(plan.widths), "contexts": list(plan.contexts)}


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
    budget, rows, problems = api.budget_for(values), [], []
    every = load_prompts(DEFAULT_PROMPTS)
    prompts = select(every, [c for c in QUICK_CATEGORIES if c in categories_of(every)] or None, 1)[: plan.prompts]
    for dtype in DTYPES:
        target = _target(plan, dtype)
        drafters = {}
        specs = ["ngram", "model:tiny-draft"] if plan.dry_run else registry.default_specs(values["target"])
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
        for name in summary.rows:
            stats = summary.table[name][OVERALL]
            spec = summary.specs.get(name)
            rows.append({"dtype": _name(dtype), "row": name, "drafter": spec.drafter if spec else None,
                         "shape": spec.shape if spec else "plain", "prompts": stats.prompts,
                         "tokens_per_s": stats.tokens_per_s.median if stats.tokens_per_s else None,
                         "speedup": None if name == PLAIN_ROW or not stats.speedup else stats.speedup.median,
                         "tau": stats.tau, "exact": stats.exact})
    return {"rows": rows, "problems": problems, "budget": budget.to_dict(), "new_tokens": plan.new_tokens,
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


def _tiny_drafter(target):
    from specviz.drafters.draft_model import DraftModelDrafter

    return DraftModelDrafter(tiny_target.draft(target.model), target.vocab_size, name="tiny-draft")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
