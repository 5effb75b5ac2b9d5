"""Command line: ``specviz generate|bench|train|data ...`` (``python -m specviz`` too). User errors: one line on stderr,
exit code 2.

The run settings' options come from their declaration (``specviz.settings``), the drafter specs from the drafter
registry; the other subcommands register from ``SUBCOMMANDS`` (module paths, imported when the parser is built).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable

from specviz import api, outputs, settings
from specviz.drafters import registry
from specviz.errors import SpecvizError, exit_status

#: name -> (module, its add-parser function, its run function). Optional: a command whose module does not import
#: (e.g. training left out of a deployment) is simply not offered.
SUBCOMMANDS = {
    "bench": ("specviz.bench.command", "add_parser", "run"),
    "train": ("specviz.training.cli", "add_train_subparser", "run_train"),
    "data": ("specviz.training.cli", "add_data_subparser", "run_data"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        raise SpecvizError(f"{self.prog}: {message}")


def _generate_parser(sub) -> None:
    parser = sub.add_parser("generate", help="run one speculative generation")
    settings.add_options(parser, readers=registry.reader_titles())
    parser.add_argument("--drafter", help=f"{registry.spec_help()} (default: {registry.default_help()})")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--baseline", action="store_true", help="also run plain decoding and report the speedup")
    parser.add_argument("--trace", help="write the JSON Lines trace here")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_generate(args: argparse.Namespace) -> int:
    values = settings.from_args(args)  # every setting checked before anything loads
    drafter_spec = args.drafter if args.drafter is not None else registry.default_for(values["target"])
    registry.check_ready(drafter_spec, values["target"], where=" (--drafter)")
    budget, config = api.budget_for(values), api.config_for(values)
    if not args.prompt.strip():
        raise SpecvizError("the prompt is empty")
    if args.trace is not None:  # a bad path fails now, not after the generation
        outputs.output_file(args.trace, "--trace")
    kwargs = {"device": values["device"]} if values["device"] else {}
    target = api.load_target(values["target"], target_forward=values["target_forward"], **kwargs)
    drafter = api.make_drafter(drafter_spec, target, values)
    prompt_ids = target.encode_prompt(args.prompt, chat=values["chat"])
    api.warm_up(target, prompt_ids)
    run = api.start(target, prompt_ids, drafter, budget, config)
    try:
        run.run()
    except SpecvizError as error:  # e.g. a served target's server died: the rounds so far stay in the trace
        if not args.trace or not run.rounds:
            raise
        run.stop_reason = "error"
        summary = {**api.summary_for(run), "error": str(error)}
        api.trace.write(args.trace, api.header_for(run, args.prompt, values["chat"]), run.rounds, summary)
        raise SpecvizError(f"{error}; the {len(run.rounds)} rounds before it are in {args.trace}") from None
    baseline = api.plain_decode(target, prompt_ids, config) if args.baseline else None
    summary = api.summary_for(run, baseline)
    if args.trace:
        api.trace.write(args.trace, api.header_for(run, args.prompt, values["chat"]), run.rounds, summary)
    measured = summary["metrics"]
    if args.json:
        out = {
            "text": run.text, "token_ids": run.token_ids, "rounds": measured["rounds"], "tau": measured["tau"],
            "acceptance_rate": measured["acceptance_rate"], "tokens_per_s": run.tokens_per_s,
            "rule": run.rounds[0].rule if run.rounds else None, "lossless": all(r.lossless for r in run.rounds),
            "stop_reason": run.stop_reason,
        }
        if "served" in summary:
            out["served"] = summary["served"]
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


def _subcommands() -> dict[str, tuple[Callable, Callable]]:
    """name -> (add parser, run)."""
    commands: dict[str, tuple[Callable, Callable]] = {"generate": (_generate_parser, run_generate)}
    for name, (module_name, add, run) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        commands[name] = (getattr(module, add), getattr(module, run))
    return commands


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, tuple[Callable, Callable]]]:
    """The ``specviz`` parser with every subcommand, and name -> (add parser, run)."""
    commands = _subcommands()
    parser = _Parser(prog="specviz", description="Real speculative decoding, round by round.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add, _ in commands.values():
        add(sub)
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    parser, commands = build_parser()

    def run() -> int:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line a run records (model cards)
        return commands[args.command][1](args)
    return exit_status(run)
