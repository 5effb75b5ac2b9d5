"""``python -m specviz bench``: options, validation before anything loads, the run, the three output files."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from specviz import api, cli
from specviz.bench import charts, configs, machine, report, verify_cost
from specviz.bench.prompts import DEFAULT_PROMPTS, BenchPrompt, categories_of, load_prompts, select
from specviz.bench.suite import run_suite
from specviz.bench.summary import OVERALL, summarise
from specviz.errors import SpecvizError

QUICK = {"max_new_tokens": 24, "limit_per_category": 1}
#: --quick's categories when the file has them: open-ended writing (MT-bench), a short factual answer and a worked
#: math answer (the most predictable). Summarization and rag are left out because their ~700-token prompts make
#: prefill dominate a 24-token smoke test; with them the suite overran its 3-minute budget on 2 idle cores.
QUICK_CATEGORIES = ("writing", "qa", "math_reasoning")
FULL_MAX_NEW_TOKENS = 128


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="acceptance and measured speedup per drafter, chain vs tree, vs plain and transformers",
        description="Benchmark every drafter as a chain and a tree against plain decoding of the same target "
                    "(interleaved per prompt) and against Hugging Face assisted generation / prompt lookup.")
    cli.add_generation_options(parser)
    parser.set_defaults(chat=True, max_new_tokens=None)
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="feed prompts raw (default: the target's chat template, since these are instructions)")
    parser.add_argument("--drafters", default=None,
                        help="comma list of ngram, ngram:N, model:<name|dir|hub id> (default: ngram plus every "
                             "shipped draft model for the target)")
    parser.add_argument("--shapes", default=None, help="chain, tree or chain,tree (default: both; --tree: tree only)")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="Spec-Bench question.jsonl-style file")
    parser.add_argument("--categories", default=None, help="comma list of categories (default: all in the file)")
    parser.add_argument("--limit-per-category", type=int, default=None,
                        help="first N prompts of each category, in file order (default: all; --quick: 1)")
    parser.add_argument("--out", default="bench-out", help="output folder for results.md, results.json, report.html")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK['limit_per_category']} prompt from each of "
                             f"{', '.join(QUICK_CATEGORIES)} (all categories if the file has none of them), "
                             f"{QUICK['max_new_tokens']} new tokens, unless given")
    parser.add_argument("--no-hf", dest="hf", action="store_false",
                        help="skip the Hugging Face transformers reference rows")
    parser.add_argument("--hf-defaults", action="store_true",
                        help="also run assisted generation with transformers' own defaults (20 tokens, confidence 0.4)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")


def default_drafters(target: str) -> list[str]:
    """``ngram`` plus the registry's draft models for ``target`` that are actually shipped."""
    from specviz.models import drafts_for

    specs = ["ngram"]
    for entry in drafts_for(target):
        try:
            entry.resolve_path()
        except SpecvizError:
            continue  # registered but not trained/shipped yet
        specs.append(f"model:{entry.name}")
    return specs


def _resolve(args: argparse.Namespace) -> None:
    """Fill the defaults that depend on --quick / --tree and check every setting before a model loads."""
    if args.max_new_tokens is None:
        args.max_new_tokens = QUICK["max_new_tokens"] if args.quick else FULL_MAX_NEW_TOKENS
    if args.limit_per_category is None and args.quick:
        args.limit_per_category = QUICK["limit_per_category"]
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise SpecvizError(f"threads must be at least 1, got {args.threads}")
    args.shape_list = configs.parse_shapes(args.shapes) if args.shapes else (["tree"] if args.tree else
                                                                             ["chain", "tree"])
    args.drafter_list = configs.parse_drafters(args.drafters) if args.drafters is not None else \
        default_drafters(args.target)
    args.draft_quant_list = configs.parse_draft_quants(args.draft_quant)


def _command(args: argparse.Namespace) -> str:
    """The equivalent command line with every effective setting (what BENCHMARKS.md quotes)."""
    parts = ["python", "-m", "specviz", "bench", "--target", args.target, "--drafters", ",".join(args.drafter_list),
             "--shapes", ",".join(args.shape_list), "--k", str(args.k), "--width", str(args.width), "--depth",
             str(args.depth), "--budget", str(args.budget), "--max-new-tokens", str(args.max_new_tokens),
             "--temperature", str(args.temperature), "--prompts", args.prompts, "--out", args.out]
    if args.categories:
        parts += ["--categories", args.categories]
    if args.limit_per_category:
        parts += ["--limit-per-category", str(args.limit_per_category)]
    flags = {"--quick": args.quick, "--no-chat": not args.chat, "--no-hf": not args.hf,
             "--hf-defaults": args.hf_defaults}
    for flag, on in flags.items():
        if on:
            parts.append(flag)
    if args.min_draft_prob:
        parts += ["--min-draft-prob", f"{args.min_draft_prob:g}"]
    if args.draft_vocab:
        parts += ["--draft-vocab", str(args.draft_vocab)]
    if args.draft_quant_list != ["off"]:
        parts += ["--draft-quant", ",".join(args.draft_quant_list)]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    if args.temperature > 0:
        parts += ["--top-p", str(args.top_p), "--top-k", str(args.top_k), "--seed", str(args.seed)]
    return shlex.join(parts)


def _selection(prompts: list[BenchPrompt], limit: int | None) -> str:
    names = categories_of(prompts)
    counts = ", ".join(f"{name} {sum(p.category == name for p in prompts)}" for name in names)
    rule = f"first {limit} per category in file order" if limit else "all"
    return f"{rule}; {counts}"


def run(args: argparse.Namespace) -> int:
    _resolve(args)
    budget, config, options = cli.budget_from(args), cli.config_from(args), cli.drafter_options(args)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    if args.categories is not None and not categories:
        raise SpecvizError("--categories is empty")
    every = load_prompts(args.prompts)
    if categories is None and args.quick:
        categories = [c for c in QUICK_CATEGORIES if c in categories_of(every)] or None
    prompts = select(every, categories, args.limit_per_category)
    if args.threads:
        torch.set_num_threads(args.threads)
    kwargs = {"device": args.device} if args.device else {}
    target = api.load_target(args.target, **kwargs)
    specs = configs.build_specs(args.drafter_list, args.shape_list, budget, hf=args.hf, hf_defaults=args.hf_defaults,
                                draft_vocab=args.draft_vocab, draft_quants=tuple(args.draft_quant_list))
    drafters = {}
    for spec in specs:  # one drafter per (drafter, precision); transformers' rows use the same loaded draft model
        if spec.drafter and spec.drafter_key not in drafters:
            drafters[spec.drafter_key] = api.make_drafter(spec.drafter, target, **options,
                                                          draft_quant=spec.draft_quant, **kwargs)
    about = machine.describe()
    print(f"bench: {len(prompts)} prompts x {len(specs)} configurations + plain between each; "
          f"{args.max_new_tokens} new tokens", file=sys.stderr)
    suite = run_suite(target, prompts, specs, drafters, config, chat=args.chat,
                      log=lambda line: print(line, file=sys.stderr, flush=True))
    # the verify-width curve over the longest prompt's context (the hardest case for a wide verify)
    context = max((target.encode_prompt(p.text, chat=args.chat) for p in prompts), key=len)
    try:
        cost = verify_cost.measure(target, context, verify_cost.widths_for(budget.k, budget.max_nodes))
    except SpecvizError as error:  # an extra measurement: never lose the suite's results over it
        print(f"warning: {error}; the report leaves the verify-width table out", file=sys.stderr)
        cost = []
    about["load_average_end"] = machine.load_average()
    summary = summarise(suite, config.sampling.greedy)
    meta = {
        "command": _command(args), "machine": about, "wall_s": suite.wall_s, "verify_cost": cost,
        "settings": {"target": args.target, "drafters": args.drafter_list, "shapes": args.shape_list,
                     "budget": budget.to_dict(), "draft_quant": args.draft_quant_list,
                     "max_new_tokens": args.max_new_tokens, **config.sampling.to_dict(),
                     "seed": args.seed, "chat": args.chat, "prompts_file": args.prompts, "prompt_count": len(prompts),
                     "selection": _selection(prompts, args.limit_per_category),
                     "question_ids": [p.question_id for p in prompts]},
    }
    out = Path(args.out)
    paths = report.write(out, summary, suite, meta)
    paths["html"] = charts.write_html(out / "report.html", summary, suite, meta)
    print("\n".join(report.overall_table(summary)))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return _exit_code(summary)


def _exit_code(summary) -> int:
    """1 when a lossless specviz configuration's greedy output differed from plain decoding (a correctness bug)."""
    broken = [name for name in summary.rows[1:] if summary.specs[name].engine == "specviz"
              and summary.table[name][OVERALL].exact not in (None, summary.table[name][OVERALL].prompts)]
    if broken:
        print(f"error: greedy output differs from plain decoding for {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0
