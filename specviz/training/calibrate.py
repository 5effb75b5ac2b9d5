"""``python -m specviz.training.calibrate``: fit a DSpark confidence head's reliability curve under greedy
verification, on training prompts, and store it in the drafter's config.json.

Why: the head learns the sampling acceptance rate 1 − ½‖p − q‖₁, and greedy verification accepts less, so its raw ĉ
overstates greedy acceptance. The engine's online calibration (``specviz.drafters.confidence``) corrects that as a
run goes, but a run's first rounds are scheduled on the raw values. This runs the drafter with every draft verified
(``dspark:fixed``) on prompts it was trained on (a prompt file's training split: the first ``--holdout`` prompts per
category, the ones ``specviz bench`` evaluates, are never read), collects each judged draft's (raw ĉ, accepted), and
fits a ``ReliabilityCurve``; a greedy ``dspark`` run then starts its calibration from that curve.

``--evaluate`` reads the held-out prompts instead and prints, on the same judged drafts, the expected calibration
error of the head's raw ĉ, of the drafter's curve alone, and of the online calibration from either, each beside the
ECE a perfectly calibrated predictor would score on as few drafts.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
from pathlib import Path

import torch

from specviz import api
from specviz.bench.prompts import DEFAULT_PROMPTS
from specviz.drafters.confidence import OnlineCalibration, ReliabilityCurve, judged_drafts
from specviz.drafters.dflash import GREEDY_CALIBRATION_KEY, DSparkDrafter
from specviz.engine import metrics
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate
from specviz.errors import SpecvizError
from specviz.models.registry import DEFAULT_TARGET
from specviz.training.prompts import file_prompts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.training.calibrate",
                                     description="Fit a DSpark confidence head's reliability curve under greedy "
                                                 "verification on training prompts; store it in its config.json.")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--drafter", default="dspark:fixed",
                        help="a DSpark spec verifying every draft (dspark:fixed[:<dir|hub id>])")
    parser.add_argument("--prompt-file", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--holdout", type=int, default=2,
                        help="first N prompts per category never read (the training run's --prompt-file-holdout)")
    parser.add_argument("--per-category", type=int, default=3, help="training prompts per category to run")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--evaluate", action="store_true",
                        help="instead of fitting: on the held-out prompts (the first --per-category of the --holdout "
                             "per category), the ECE of the raw ĉ, the drafter's curve and the online calibrations")
    parser.add_argument("--write", type=Path, default=None,
                        help="the drafter folder whose config.json receives the curve (default: only print it)")
    return parser


#: One prompt's rounds: for each, the raw ĉ of the drafts verified and how many of them were accepted.
Rounds = list[tuple[list[float], int]]


def collect(target, drafter: DSparkDrafter, prompts: list[list[int]], max_new_tokens: int, log=print
            ) -> list[Rounds]:
    """Each prompt's rounds, greedy, every draft of the block verified (the head's raw ĉ, accepted count)."""
    if not isinstance(drafter, DSparkDrafter) or drafter.schedule or drafter.runner.confidence_head is None:
        raise SpecvizError("calibrate needs a DSpark drafter with a confidence head that verifies every draft "
                           "(dspark:fixed[:<dir|hub id>])")
    budget, config = DraftBudget(k=drafter.spec.drafts), GenerationConfig(max_new_tokens=max_new_tokens)
    collected: list[Rounds] = []
    count = 0
    for index, prompt_ids in enumerate(prompts):
        run = generate(target, prompt_ids, config, drafter, budget)
        collected.append([(r.meta["confidence_head"][: len(r.tokens)], len(r.accepted)) for r in run.rounds
                          if r.tokens])
        count += sum(len(judged_drafts(raws, accepted)) for raws, accepted in collected[-1])
        log(f"prompt {index + 1}/{len(prompts)}: {count} judged drafts")
    return collected


def judged(collected: list[Rounds], predict=None, prior: ReliabilityCurve | None = None
           ) -> list[tuple[float, bool]]:
    """(prediction, accepted) of every draft the target judged (every draft before it accepted), prompt by prompt
    and round by round: the raw ĉ, or ``predict(raw, online)`` with the prompt's own ``OnlineCalibration`` (starting
    at ``prior``), which, as in a run, learns each round only after predicting its drafts."""
    pairs = []
    for rounds in collected:
        online = OnlineCalibration(prior=prior)
        for raws, accepted in rounds:
            pairs += [(raw if predict is None else predict(raw, online), hit)
                      for raw, hit in judged_drafts(raws, accepted)]
            online.record(raws, accepted)
    return pairs


def evaluate(collected: list[Rounds], curve: ReliabilityCurve, draws: int = 50) -> dict[str, tuple[float, float]]:
    """ECE of four predictions of greedy acceptance on the same judged drafts, each beside the ECE a perfectly
    calibrated predictor of those values would score on that many drafts (outcomes drawn from the predictions):
    the head's raw ĉ, the curve alone, the online calibration from the raw ĉ and from the curve."""
    def online(raw: float, calibration: OnlineCalibration) -> float:
        return calibration(raw)

    methods = {"the head's raw ĉ": (None, None), "the curve alone": (lambda raw, _: curve(raw), None),
               "online from the raw ĉ": (online, None), "online from the curve": (online, curve)}
    rng = random.Random(0)
    results = {}
    for name, (predict, prior) in methods.items():
        pairs = judged(collected, predict, prior)
        floor = statistics.mean(metrics.calibration_of((p, rng.random() < p) for p, _ in pairs).ece
                                for _ in range(draws))
        results[name] = (metrics.calibration_of(pairs).ece, floor)
    return results


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.per_category < 1 or args.max_new_tokens < 1:
            raise SpecvizError("--per-category and --max-new-tokens must be at least 1")
        if args.write is not None and not (args.write / "config.json").is_file():
            raise SpecvizError(f"--write {args.write}: no config.json there (give the drafter's folder)")
        train, held = file_prompts(args.prompt_file, args.holdout)
        taken: dict[str, int] = {}
        prompts = []
        for prompt in held if args.evaluate else train:  # the first --per-category prompts of each category
            taken[prompt.category] = taken.get(prompt.category, 0) + 1
            if taken[prompt.category] <= args.per_category:
                prompts.append(prompt.text)
        if not prompts:
            split = "held-out" if args.evaluate else "training"
            raise SpecvizError(f"{args.prompt_file} has no {split} prompts (--holdout {args.holdout} per category)")
        target = api.load_target(args.target)
        drafter = api.make_drafter(args.drafter, target)
        encoded = [target.encode_prompt(text, chat=True) for text in prompts]  # as specviz bench encodes them
        collected = collect(target, drafter, encoded, args.max_new_tokens)
        if args.evaluate:
            shipped = getattr(drafter.model, "greedy_calibration", None)
            if shipped is None:
                raise SpecvizError(f"{args.drafter} has no greedy curve to evaluate (fit one with --write first)")
            print(f"ECE against greedy acceptance on {len(judged(collected))} judged drafts of {len(prompts)} "
                  f"held-out prompts (beside it: a perfectly calibrated predictor's ECE on as many drafts):")
            for name, (ece, floor) in evaluate(collected, shipped).items():
                print(f"  {name}: {ece:.3f} ({floor:.3f})")
            return 0
        pairs = judged(collected)
        curve = ReliabilityCurve.fit(pairs)
        print(json.dumps(curve.to_dict()))
        print(f"ECE on these drafts: raw {metrics.calibration_of(pairs).ece:.3f}, fitted curve "
              f"{metrics.calibration_of((curve(raw), hit) for raw, hit in pairs).ece:.3f} (in-sample; on held-out "
              f"prompts: --evaluate)")
        if args.write is not None:
            path = args.write / "config.json"
            config = json.loads(path.read_text())
            command = "python -m specviz.training.calibrate " + shlex.join(argv if argv is not None else sys.argv[1:])
            config[GREEDY_CALIBRATION_KEY] = {**curve.to_dict(), "prompts": len(prompts), "command": command}
            path.write_text(json.dumps(config, indent=2) + "\n")
            print(f"wrote {GREEDY_CALIBRATION_KEY} into {path}")
    except SpecvizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
