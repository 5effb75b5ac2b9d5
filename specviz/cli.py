"""Command line: ``python -m specviz generate|bench|train ...``. User errors: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from specviz import api
from specviz.drafters.draft_model import check_draft_vocab
from specviz.drafters.quantized import check_draft_quant
from specviz.errors import SpecvizError

DEFAULT_TARGET = "smollm2-135m"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        raise SpecvizError(f"{self.prog}: {message}")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that runs generations (generate, bench)."""
    parser.add_argument("--target", default=DEFAULT_TARGET, help="registry name, model directory, .gguf or hub id")
    parser.add_argument("--k", type=int, default=4, help="chain length (tokens drafted per round)")
    parser.add_argument("--tree", action="store_true", help="draft a tree instead of a chain")
    parser.add_argument("--width", type=int, default=4, help="tree: children per expanded node")
    parser.add_argument("--depth", type=int, default=5, help="tree: maximum depth")
    parser.add_argument("--budget", type=int, default=24, help="tree: maximum number of nodes")
    parser.add_argument("--min-draft-prob", type=float, default=0.0,
                        help="stop a draft branch after a token the draft model gives less than this probability "
                             "(transformers' assistant_confidence_threshold; 0 = always draft k / depth)")
    parser.add_argument("--stochastic-tree", action="store_true",
                        help="tree at temperature > 0: draw children from the draft instead of taking its top-w")
    parser.add_argument("--draft-vocab", type=int, default=0,
                        help="draft models: draft from the first N token ids only, with the output layer cut to "
                             "those rows (0 = the whole vocabulary)")
    parser.add_argument("--draft-quant", default="off",
                        help="draft models on CPU: off, or int8 (int8/fp16 weights for the draft only; the target "
                             "still verifies in full precision, so output is unchanged). bench: a comma list")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")


def budget_from(args: argparse.Namespace) -> api.DraftBudget:
    return api.DraftBudget(tree=args.tree, k=args.k, width=args.width, depth=args.depth, max_nodes=args.budget,
                           min_draft_prob=args.min_draft_prob)


def drafter_options(args: argparse.Namespace) -> dict:
    """``make_drafter`` keywords from the shared options, checked before any model loads."""
    return {"stochastic_tree": args.stochastic_tree, "draft_vocab": check_draft_vocab(args.draft_vocab)}


def config_from(args: argparse.Namespace) -> api.GenerationConfig:
    sampling = api.SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    return api.GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed)


def _generate_parser(sub) -> None:
    parser = sub.add_parser("generate", help="run one speculative generation")
    add_generation_options(parser)
    parser.add_argument("--drafter", default="ngram", help="ngram, ngram:N or model:<name|dir|hub id>")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--baseline", action="store_true", help="also run plain decoding and report the speedup")
    parser.add_argument("--trace", help="write the JSON Lines trace here")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_generate(args: argparse.Namespace) -> int:
    budget, config, options = budget_from(args), config_from(args), drafter_options(args)  # before loading anything
    options["draft_quant"] = check_draft_quant(args.draft_quant)  # one value here; bench takes a list
    if not args.prompt.strip():
        raise SpecvizError("the prompt is empty")
    kwargs = {"device": args.device} if args.device else {}
    target = api.load_target(args.target, **kwargs)
    drafter = api.make_drafter(args.drafter, target, **options, **kwargs)
    prompt_ids = target.encode_prompt(args.prompt, chat=args.chat)
    warm_up(target, prompt_ids)
    run = api.start(target, prompt_ids, drafter, budget, config).run()
    baseline = api.plain_decode(target, prompt_ids, config) if args.baseline else None
    summary = api.summary_for(run, baseline)
    if args.trace:
        api.trace.write(args.trace, api.header_for(run, args.prompt, args.chat), run.rounds, summary)
    measured = summary["metrics"]
    if args.json:
        out = {
            "text": run.text, "token_ids": run.token_ids, "rounds": measured["rounds"], "tau": measured["tau"],
            "acceptance_rate": measured["acceptance_rate"], "tokens_per_s": run.tokens_per_s,
            "rule": run.rounds[0].rule if run.rounds else None, "lossless": all(r.lossless for r in run.rounds),
            "stop_reason": run.stop_reason,
        }
        if baseline is not None:
            out.update(baseline_token_ids=baseline.token_ids, baseline_tokens_per_s=baseline.tokens_per_s,
                       speedup=summary["speedup"], identical=baseline.token_ids == run.token_ids)
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(run.text)
    line = (f"\n[{drafter.name} {budget.describe()}] rounds={measured['rounds']} tau={measured['tau']:.2f} "
            f"acceptance={measured['acceptance_rate']:.2f} tokens/s={run.tokens_per_s:.1f}")
    if baseline is not None:
        line += f" plain tokens/s={baseline.tokens_per_s:.1f} speedup={summary['speedup']:.2f}x"
        if config.sampling.greedy:
            line += " identical" if baseline.token_ids == run.token_ids else " DIFFERENT FROM PLAIN"
    print(line, file=sys.stderr)
    return 0


def warm_up(target: api.Target, prompt_ids: list[int]) -> None:
    """One short plain decode so one-time costs (allocations, kernel selection) are not charged to a timed run."""
    api.plain_decode(target, prompt_ids[-16:], api.GenerationConfig(max_new_tokens=2))


def _subcommands() -> dict[str, tuple[Callable, Callable]]:
    """name -> (add parser, run). Optional commands register only when their module is present."""
    commands: dict[str, tuple[Callable, Callable]] = {"generate": (_generate_parser, run_generate)}
    try:
        from specviz import bench

        commands["bench"] = (bench.add_parser, bench.run)
    except ImportError:
        pass
    try:
        from specviz.training import cli as training_cli

        commands["train"] = (training_cli.add_train_subparser, training_cli.run_train)
    except ImportError:
        pass
    return commands


def main(argv: list[str] | None = None) -> int:
    commands = _subcommands()
    parser = _Parser(prog="specviz", description="Real speculative decoding, round by round.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add, _ in commands.values():
        add(sub)
    try:
        args = parser.parse_args(argv)
        return commands[args.command][1](args)
    except SpecvizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
