"""``python -m specviz bench``: options, validation before anything loads, the run, the three output files."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from specviz import api, outputs, settings
from specviz.bench import configs, machine, report, runners, verify_cost, vllm_peer
from specviz.bench.prompts import DEFAULT_PROMPTS, BenchPrompt, categories_of, load_prompts, select
from specviz.bench.suite import run_suite
from specviz.bench.summary import OVERALL, add_rows, summarise
from specviz.drafters import registry
from specviz.engine.served import ServedTarget
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.models import fast_forward
from specviz.settings import Setting

QUICK = {"max_new_tokens": 24, "limit_per_category": 1}
#: --quick's categories when the file has them: open-ended writing (MT-bench), a short factual answer and a worked
#: math answer (the most predictable). Summarization and rag are left out because their ~700-token prompts make
#: prefill dominate a 24-token smoke test; with them the suite overran its 3-minute budget on 2 idle cores.
QUICK_CATEGORIES = ("writing", "qa", "math_reasoning")

#: The benchmark's own options (the run settings come from ``specviz.settings``), declared the same way so the
#: reproducible command line and the checks derive from one place.
OPTIONS: tuple[Setting, ...] = (
    Setting("drafters", str, None, f"comma list of {', '.join(f.syntax for f in registry.families())} (default: "
            "each family's ready drafters for the target: ngram plus every shipped draft model)", "drafters",
            flags=("--drafters",), optional=True, emit="always", ui=None),
    Setting("shapes", str, None, "chain, tree or chain,tree (default: both; --tree: tree only, --chain: chain only)",
            "shapes",
            flags=("--shapes",), optional=True, emit="always", ui=None),
    Setting("prompts", str, str(DEFAULT_PROMPTS), "Spec-Bench question.jsonl-style file", "prompts",
            flags=("--prompts",), emit="always", ui=None),
    Setting("categories", str, None, "comma list of categories (default: all in the file)", "categories",
            flags=("--categories",), optional=True, ui=None),
    Setting("limit_per_category", int, None, "first N prompts of each category, in file order (default: all; "
            f"--quick: {QUICK['limit_per_category']})", "limit per category", flags=("--limit-per-category",),
            low=1, optional=True, ui=None),
    Setting("out", str, "bench-out", "output folder for results.md, results.json, report.html", "out",
            flags=("--out",), emit="always", ui=None),
    Setting("quick", bool, False, f"smoke test: {QUICK['limit_per_category']} prompt from each of "
            f"{', '.join(QUICK_CATEGORIES)} (all categories if the file has none of them), "
            f"{QUICK['max_new_tokens']} new tokens, unless given", "quick", flags=("--quick",), ui=None),
    Setting("hf", bool, True, "run the Hugging Face transformers reference rows", "transformers rows",
            off_flags=("--no-hf",), off_help="skip the Hugging Face transformers reference rows", ui=None),
    Setting("hf_defaults", bool, False, "also run assisted generation with transformers' own defaults (20 tokens, "
            "confidence 0.4)", "transformers defaults", flags=("--hf-defaults",), ui=None),
    Setting("threads", int, None, "torch intra-op threads (default: torch's choice)", "threads",
            flags=("--threads",), low=1, high=1024, optional=True, ui=None),
    Setting("vllm_python", str, None, "the Python of a virtual environment with vLLM: start vLLM servers of the same "
            "weights for rows of vLLM's own plain decoding and its own speculative decoding beside specviz's drafters "
            "(ngram, retrieval: suffix, model:<name>: draft model, eagle3), τ from vLLM's metrics", "vLLM Python",
            flags=("--vllm-python",), optional=True, ui=None),
    Setting("vllm_url", str, None, "a running vLLM server of the same model: its own plain decoding as a row "
            "(default: a vllm: target's own server, else one started with --vllm-python)", "vLLM URL",
            flags=("--vllm-url",), optional=True, ui=None),
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="acceptance and measured speedup per drafter, chain vs tree, vs plain and transformers",
        description="Benchmark every drafter as a chain and a tree against plain decoding of the same target "
                    "(interleaved per prompt) and against Hugging Face assisted generation / prompt lookup.")
    settings.add_options(parser, lists=("draft_quant", "k"), readers=registry.reader_titles())
    settings.add_options(parser, OPTIONS)


def _resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on --quick / --tree and check every setting before a model loads."""
    if args.quick and "max_new_tokens" not in settings.given(args):
        args.max_new_tokens = QUICK["max_new_tokens"]
    vars(args).update(settings.check_all({o.name: getattr(args, o.name) for o in OPTIONS}, OPTIONS))
    outputs.output_dir(args.out, "--out")  # before the suite runs: a bad folder must not cost its results
    if args.limit_per_category is None and args.quick:
        args.limit_per_category = QUICK["limit_per_category"]
    args.draft_quant_list = settings.split("draft_quant", args.draft_quant)
    args.k_list = settings.split("k", str(args.k))  # chain rows per k: a verify-length sweep in one suite
    typed_shape = ["tree" if args.tree else "chain"] if "tree" in settings.given(args) else ["chain", "tree"]
    args.shape_list = configs.parse_shapes(args.shapes) if args.shapes is not None else typed_shape
    args.values = settings.from_args(args, draft_quant=args.draft_quant_list[0], k=args.k_list[0],
                                     tree="tree" in args.shape_list)  # the shapes decide; --shapes says them
    args.drafter_list = registry.parse_list(args.drafters) if args.drafters is not None else \
        registry.default_specs(args.values["target"])
    for spec in args.drafter_list:  # a bare name with nothing shipped for the target: now, not after its load
        registry.check_ready(spec, args.values["target"], where=" in --drafters")
    if args.vllm_python is not None and not Path(args.vllm_python).is_file():
        raise SpecvizError(f"--vllm-python {args.vllm_python} is not a file: give the Python of a virtual environment "
                           f"with vLLM")
    if args.vllm_url is not None and not args.vllm_url.startswith(("http://", "https://")):
        raise SpecvizError(f"--vllm-url is a server's base URL, e.g. http://127.0.0.1:8000; got {args.vllm_url!r}")


#: The verify-cost curve's name for the fast path on torch's own linear kernel, measured beside the thin kernel's.
TORCH_PATH = "fast-torch"


def _library_path(target: Target, reference: Target) -> dict[str, Target]:
    """Where the fast path runs the thin kernel, the same path on torch's own linear kernel (the other declared
    backend), so one run gives both curves; else nothing."""
    if reference is target or (getattr(target.model, "kernel_choice", None) or {}).get("wide") != "thin":
        return {}
    return {TORCH_PATH: dataclasses.replace(target, model=fast_forward.fast_copy(reference.model, thin=False))}


def _command(args: argparse.Namespace) -> str:
    """The equivalent command line with every effective setting (what BENCHMARKS.md quotes), generated from the
    declarations: the run settings' and the benchmark's own."""
    run_values = {**args.values, "draft_quant": args.draft_quant_list, "k": args.k_list}
    run_values.pop("tree")  # --shapes (always written) says which shapes ran
    own = {**{o.name: getattr(args, o.name) for o in OPTIONS}, "drafters": ",".join(args.drafter_list),
           "shapes": ",".join(args.shape_list)}
    return settings.command_line(["python", "-m", "specviz", "bench", *settings.command_args(run_values),
                                  *settings.command_args(own, OPTIONS)])


def _selection(prompts: list[BenchPrompt], limit: int | None) -> str:
    names = categories_of(prompts)
    counts = ", ".join(f"{name} {sum(p.category == name for p in prompts)}" for name in names)
    rule = f"first {limit} per category in file order" if limit else "all"
    return f"{rule}; {counts}"


def _precision_drafters(specs: list[str], quants: list[str], target, values) -> tuple[dict, dict[str, tuple[str, ...]]]:
    """One drafter per (spec, precision) for the families that read ``draft_quant``, keyed as ``RunSpec.drafter_key``
    keys them, and the precisions each spec's rows run at: ``auto`` becomes what the built drafter resolved it to
    (int8 for a float32 head on CPU, full precision for a draft int8 cannot run in), so a row's label says what ran."""
    drafters: dict = {}
    precisions: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        if "draft_quant" not in registry.family_of(spec).reads:
            continue
        resolved = []
        for quant in quants:
            drafter = api.make_drafter(spec, target, values.replace(draft_quant=quant))
            precision = drafter.describe().get("draft_quant") or "off"
            drafters.setdefault(spec if precision == "off" else f"{spec} {precision}", drafter)
            resolved.append(precision)
        precisions[spec] = tuple(dict.fromkeys(resolved))
    return drafters, precisions


def chosen_categories(args: argparse.Namespace, every: list[BenchPrompt]) -> list[str] | None:
    """``--categories``, else ``--quick``'s (those of ``QUICK_CATEGORIES`` the file has), else None: every one."""
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    if args.categories is not None and not categories:
        raise SpecvizError("--categories is empty")
    if categories is None and args.quick:
        categories = [c for c in QUICK_CATEGORIES if c in categories_of(every)] or None
    return categories


def run(args: argparse.Namespace) -> int:
    _resolve(args)
    values = args.values
    budget, config = api.budget_for(values), api.config_for(values)
    every = load_prompts(args.prompts)
    prompts = select(every, chosen_categories(args, every), args.limit_per_category)
    if args.threads:
        torch.set_num_threads(args.threads)
    kwargs = {"device": values["device"]} if values["device"] else {}
    target = api.load_target(values["target"], target_forward=values["target_forward"], **kwargs)
    served = isinstance(target, ServedTarget)
    if served:
        _served_rows(args, target)
    # transformers' reference rows, and the other side of the verify-cost comparison, run transformers' own forward
    reference = target if target.forward in ("hf", "served") else api.load_target(
        values["target"], target_forward="hf", **kwargs)
    drafters, precisions = _precision_drafters(args.drafter_list, args.draft_quant_list, target, values)
    specs = configs.build_specs(args.drafter_list, args.shape_list, budget, hf=args.hf, hf_defaults=args.hf_defaults,
                                draft_vocab=values["draft_vocab"], draft_quants=precisions,
                                chain_ks=tuple(args.k_list),
                                hf_mtp_layers=runners.transformers_mtp_layers(reference.model) if args.hf else 0)
    for spec in specs:  # the families that do not read draft_quant, and transformers' rows (the draft as loaded)
        if spec.drafter and spec.drafter_key not in drafters:
            drafters[spec.drafter_key] = api.make_drafter(spec.drafter, target,
                                                          values.replace(draft_quant=spec.draft_quant))
    about = machine.describe()
    about["memory_bandwidth_gbs"] = machine.memory_bandwidth_gbs()
    about["matmul_gflops"] = machine.matmul_gflops()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    encoded = [target.encode_prompt(p.text, chat=values["chat"]) for p in prompts]
    with vllm_peer.Session(reference, python=args.vllm_python, url=args.vllm_url, log=log,
                           logs=Path(args.out) / "vllm-logs",
                           max_model_len=max(map(len, encoded)) + values["max_new_tokens"] + 64) as vllm:
        if vllm.plain is not None:
            specs.append(vllm_peer.plain_spec())
        print(f"bench: {len(prompts)} prompts x {len(specs)} configurations + plain between each; "
              f"{values['max_new_tokens']} new tokens", file=sys.stderr)
        suite = run_suite(target, prompts, specs, drafters, config, chat=values["chat"], reference=reference,
                          log=log, given={vllm_peer.PLAIN_NAME: vllm.run_plain} if vllm.plain is not None else None)
        peers = vllm.run_peers(vllm.plan(args.drafter_list, budget.k, drafters),
                               {"target": target, "prompts": prompts, "config": config, "chat": values["chat"],
                                "log": log})
    # the verify-width curve over the longest prompt's context (the hardest case for a wide verify)
    context = max(encoded, key=len)
    try:
        if served:
            raise SpecvizError("a served target's forward runs on its server, not here")
        paths = {target.forward: target} | _library_path(target, reference) | (
            {} if reference is target else {"hf": reference})
        cost = verify_cost.compare_paths(paths, context, verify_cost.widths_for(max(args.k_list), budget.max_nodes),
                                         about["memory_bandwidth_gbs"], peak_gflops=about["matmul_gflops"])
        cost["kernel_choice"] = getattr(target.model, "kernel_choice", None) or None
    except SpecvizError as error:  # an extra measurement: never lose the suite's results over it
        print(f"warning: {error}; the report leaves the verify-width table out", file=sys.stderr)
        cost = None
    about["load_average_end"] = machine.load_average()
    summary = summarise(suite, config.sampling.greedy)
    suite = add_rows(summary, suite, peers.specs, peers.suites)
    meta = {
        "command": _command(args), "machine": about, "wall_s": suite.wall_s, "verify_cost": cost,
        "settings": {"target": values["target"], "target_forward": values["target_forward"],
                     "drafters": args.drafter_list, "shapes": args.shape_list,
                     "budget": budget.to_dict(), "draft_quant": args.draft_quant_list,
                     "max_new_tokens": values["max_new_tokens"], **config.sampling.to_dict(),
                     "seed": values["seed"], "chat": values["chat"], "prompts_file": args.prompts,
                     "prompt_count": len(prompts),
                     "selection": _selection(prompts, args.limit_per_category),
                     "question_ids": [p.question_id for p in prompts]},
    }
    out = Path(args.out)
    paths = report.write(out, summary, suite, meta)
    from specviz.bench import charts  # plotly: only for the HTML report (the GPU check runs without it)

    paths["html"] = charts.write_html(out / "report.html", summary, suite, meta)
    print("\n".join(report.overall_table(summary)))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return _exit_code(summary)


def _served_rows(args: argparse.Namespace, target: ServedTarget) -> None:
    """A served target runs specviz's rows through its server: no transformers rows (the model is not in this
    process), and by default only the drafters that read no target hidden states."""
    if args.hf:
        print("bench: a served target's model is not in this process: the transformers rows are left out",
              file=sys.stderr)
        args.hf = args.hf_defaults = False
    if args.drafters is None:
        layers = target.config.num_hidden_layers
        args.drafter_list = [spec for spec in args.drafter_list if not registry.family_of(spec).layers_for(layers)]


def _exit_code(summary) -> int:
    """1 when a lossless specviz configuration's greedy output differed from plain decoding (a correctness bug)."""
    broken = [name for name in summary.rows[1:] if summary.specs[name].engine == "specviz"
              and summary.table[name][OVERALL].exact not in (None, summary.table[name][OVERALL].prompts)]
    if broken:
        print(f"error: greedy output differs from plain decoding for {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0
