"""The ``specviz train`` arguments, declared once: the CLI parses them, ``export`` re-parses recorded command lines."""

from __future__ import annotations

import argparse
from pathlib import Path

from specviz.drafters import registry
from specviz.models.registry import DEFAULT_TARGET
from specviz.training.data import AUTO_DTYPE, DTYPES, DataPlan
from specviz.training.trainers import TRAINERS

DESCRIPTION = ("specviz train <kind> --target T --data PATH... --out DIR: build shared target features, train, "
               "evaluate, export.")
#: Relative to the folder training runs in, as ``--out`` is (the repository root in a checkout; git-ignored there).
DEFAULT_CACHE = Path(".cache") / "specviz"


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of the train command (shared by the subcommand and the standalone parser): the data's and its own."""
    kinds = [f"{kind} (trains {family.syntax} drafters)" for kind, family in registry.trainers().items()
             if kind in TRAINERS]  # the drafter registry names each family's trainer
    parser.add_argument("kind", help=f"what to train: {', '.join(kinds)}")
    add_data_arguments(parser)
    parser.add_argument("--out", required=True, help="run folder: checkpoints, metrics, final model")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--train-positions", type=int, default=0,
                        help="train on a seeded subset of the training sequences holding at least this many trained "
                        "positions (0: all); a smaller size's subset is part of every larger one's and the held-out "
                        "sets stay the same, so runs at several sizes make a data-scaling curve")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--live-features", action="store_true",
                        help="hidden-state families: compute the training sequences' target features batch by batch "
                             "as they are trained on instead of caching them (the disk and memory of a large data "
                             "set are then its answers'; each epoch pays the target's pass again)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--log-every", type=int, default=10, help="log the loss every N steps")
    parser.add_argument("--hidden", type=int, default=None, help="student hidden size (trainer default if unset)")
    parser.add_argument("--layers", type=int, default=None, help="student decoder layers")
    parser.add_argument("--init-layers", default=None,
                        help="draft-lm: start from these target decoder layers, e.g. 0,1,2,3 (the student takes the "
                             "target's shape and shares its embedding and output layer, which are not shipped)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start from a drafter of this family exported before (e.g. the shipped one in "
                             "specviz/assets/models/): a later session continues training without the earlier run "
                             "folder")
    parser.add_argument("--set", dest="trainer_options", action="append", default=[], metavar="KEY=VALUE",
                        help="a family's own option (repeatable), e.g. markov_rank=32, anchors=16, block_size=8, "
                             "medusa_heads=4; the model card records them")
    parser.add_argument("--autocast", choices=["bf16"], default=None,
                        help="mixed precision for the training forward/backward (fp32 weights; bf16 matmuls are "
                             "several times faster on CPUs with AMX and on GPUs)")
    parser.add_argument("--softmax-sample", type=int, default=0,
                        help="draft-lm: score the target's top-k + N random tokens instead of the full vocabulary "
                             "(sampled softmax; 0 = full softmax)")
    parser.add_argument("--export", default=None, help="also write fp16 weights + model card here")
    parser.add_argument("--name", default=None, help="model name used in the model card")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments that say what data to build (``specviz data`` takes only these; ``train`` adds its own)."""
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="target model: registry name, directory, .gguf or hub id")
    parser.add_argument("--data", nargs="+", required=True,
                        help="training text: files, folders, globs, or 'stdlib' (the Python standard library)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=1200, help="self-distillation prompts the target answers")
    parser.add_argument("--extra-prompts", type=int, default=0,
                        help="more training-only prompts, appended so the held-out split stays the same")
    parser.add_argument("--extra-prompts-from", dest="extra_from", type=int, default=0, metavar="N",
                        help="train on the extra prompts from the N-th on only (a multiple of 512; the base prompts "
                             "and the extra ones before N are left out, the held-out sets stay): the next window of "
                             "the set, for continuing a drafter (--init-from) that trained on the ones before; with "
                             "--self-prompts, N may equal --extra-prompts (then no generated prompt is trained on)")
    parser.add_argument("--self-prompts", type=int, default=0, metavar="N",
                        help="sample N user turns from the target itself (its chat template opened at a user turn, "
                             "temperature 1; the ones that end on their own and are distinct are kept) and train on "
                             "its answers to them too: requests of the kinds its own fine-tuning taught it")
    parser.add_argument("--self-prompts-from", dest="self_from", type=int, default=0, metavar="N",
                        help="train on the user turns sampled from the N-th draw on only (a multiple of 512 below "
                             "--self-prompts; those before are still sampled, from the cache, so none repeats): the "
                             "next window, for continuing a drafter (--init-from) that trained on the ones before")
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts for agreement metrics")
    parser.add_argument("--prompt-file", nargs="+", default=[], type=str,
                        help="Spec-Bench-style question.jsonl files whose first turns the target also answers")
    parser.add_argument("--prompt-file-holdout", type=int, default=2,
                        help="first N prompts per category of each prompt file kept out of training and used for "
                             "held-out metrics (specviz bench --limit-per-category N evaluates exactly those)")
    parser.add_argument("--sampled-answers", type=int, default=0,
                        help="extra sampled (not greedy) target answers per prompt-file training prompt")
    parser.add_argument("--sample-temperature", type=float, default=0.8, help="temperature of those sampled answers")
    parser.add_argument("--prompt-file-repeat", type=int, default=1,
                        help="repeat the prompt-file answers N times in the training mix (a mixture weight)")
    parser.add_argument("--gen-tokens", type=int, default=144, help="max answer length when self-distilling")
    parser.add_argument("--gen-batch", type=int, default=DataPlan.gen_batch,
                        help="answers decoded at once (the slot decoder's slots, or the padded batch's rows)")
    parser.add_argument("--gen-dtype", choices=sorted([*DTYPES, AUTO_DTYPE]), default=AUTO_DTYPE,
                        help="dtype the answers are decoded in ('target': the target's own; 'auto': bfloat16 where "
                             "this machine's bfloat16 products run at least half as fast as float32's, else "
                             "float32); the hidden-state families' feature pass relabels them with the target's own "
                             "numbers")
    parser.add_argument("--corpus-tokens", type=int, default=100_000, help="corpus tokens annotated with target top-k")
    parser.add_argument("--stdlib-files", type=int, default=400, help="how many stdlib .py files 'stdlib' samples")
    parser.add_argument("--topk", type=int, default=8, help="target probabilities kept per position")
    parser.add_argument("--feature-layers", type=_layer_list, default=(),
                        help="more hidden_states indices to cache with the ones this family reads, e.g. "
                             "2,9,15,21,27,28,30: one slow extraction then serves every family")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="feature cache (git-ignored)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specviz train", description=DESCRIPTION)
    add_train_arguments(parser)
    return parser


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
