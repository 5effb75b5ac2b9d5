"""Ship a trained drafter: fp16 safetensors + config + tokenizer, and a model card that says how it was made.

``python -m specviz.training.export --run runs/NAME --dest specviz/assets/models/NAME [--bench results.json ...]``
re-exports a finished run (its ``final/`` folder and ``metrics.json``), adding the τ/speedup ``specviz bench`` runs
measured.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specviz import outputs
from specviz.errors import SpecvizError, exit_status
from specviz.models.shared_embedding import strip_shared
from specviz.training.arguments import build_parser
from specviz.training.self_prompts import MIN_WORDS


def export_model(source: Path, dest: Path, *, dtype: torch.dtype = torch.float16) -> int:
    """Copy a saved model folder to ``dest`` with weights cast to ``dtype``; return the weights' size in bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    source_config = json.loads((source / "config.json").read_text())
    for file in source.iterdir():
        if file.suffix == ".safetensors":
            tensors = strip_shared(load_file(str(file)), source_config)  # borrowed from the target at load time
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
            save_file(tensors, str(dest / file.name), metadata={"format": "pt"})
        elif file.is_file():
            shutil.copy2(file, dest / file.name)
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = str(dtype).replace("torch.", "")
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return sum(f.stat().st_size for f in dest.glob("*.safetensors"))


def _run_arguments(command: str) -> argparse.Namespace:
    """The training arguments, recovered from the recorded command line."""
    words = shlex.split(command)
    words = words[words.index("train") + 1:] if "train" in words else words
    return build_parser().parse_args(words)


def engine_rows_from_bench(results: dict, drafter: str) -> dict:
    """Model-card rows (τ, speedup) for ``drafter``'s configurations from a ``specviz bench`` results.json."""
    table = results["summary"]["table"]
    rows = []
    for name in results["summary"]["rows"]:
        if name.split(" ")[0].split(":")[0] == drafter.split(":")[0] and name.startswith(drafter) and \
                "overall" in table.get(name, {}):  # the family's variants too (dspark:fixed beside dspark)
            overall = table[name]["overall"]
            speed = overall.get("speedup") or {}
            rows.append({"setting": name, "tau": overall["tau"], "speedup": speed.get("median", float("nan")),
                         "prompts": overall["prompts"]})
    settings = results.get("settings", {})
    machine = results.get("machine", {})
    return {"machine": f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, torch threads "
                       f"{machine.get('torch_threads', '?')}",
            "description": f"{settings.get('prompt_count', '?')} Spec-Bench prompts ({settings.get('selection', '')}), "
                           f"greedy, {settings.get('max_new_tokens', '?')} new tokens; command "
                           f"`{results.get('command', '')}`",
            "rows": rows}


#: Above a card's engine tables: the runs measured the folder before it shipped, often by a local path.
ENGINE_NOTE = ("These tables are the figures measured before export: a command may name the run's local copy (a "
               "path under the git-ignored `work/`, or another local folder) where the shipped name (`--drafters "
               "<name>`) selects this folder now. BENCHMARKS.md has the current figures.")


def _engine_section(runs: list[dict] | None) -> str:
    """One table per bench run (a run's speedups are relative to its own plain runs, so runs are not merged)."""
    if not runs:
        return ("Not measured with the engine yet: run `python -m specviz bench` (greedy, 128 new tokens) and "
                "re-export with `python -m specviz.training.export --bench <results.json>`.")
    blocks = [ENGINE_NOTE]
    for run in runs:
        lines = [f"Measured with the specviz engine ({run.get('machine', 'this machine')}): "
                 f"{run.get('description', '')}", "", "| setting | τ | speedup vs plain (median) |",
                 "| --- | --- | --- |"]
        for row in run.get("rows", []):
            lines.append(f"| {row['setting']} | {row['tau']:.2f} | {row['speedup']:.2f}× |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _prompt_file_data(args: argparse.Namespace) -> str:
    """The Data bullet for prompt-file answers, or a line saying no benchmark text was used."""
    files, held, sampled = args.prompt_file, args.prompt_file_holdout, args.sampled_answers
    if not files:
        return "- No benchmark prompt was trained on."
    extra = (f" and {sampled} more sampled at temperature {args.sample_temperature} per prompt (their labels are "
             f"still the target's temperature-1 top-{args.topk})") if sampled else ""
    return (f"- The target's greedy answers to the first turns of `{' '.join(files)}`{extra}, repeated\n  "
            f"{args.prompt_file_repeat}× in the mix, **except the first {held} prompts of each "
            f"category**, which are held out: `specviz bench --limit-per-category {held}` or less evaluates only "
            f"prompts the draft never saw.")


def _prompt_file_agreement(args: argparse.Namespace, held: dict | None) -> str:
    """Agreement on the prompt files' held-out prompts (the benchmark's own kind of request), when there are any."""
    if not held:
        return ""
    taus = ", ".join(f"k={k}: {v:.2f}" for k, v in held["simulated_chain_tau"].items())
    rows = "\n".join(f"| {c} | {a:.3f} |" for c, a in held["per_category_agreement"].items())
    return f"""
### Held-out prompt-file prompts
The first {args.prompt_file_holdout} prompts per category of the prompt file, never trained on
({held['sequences']} greedy target answers, {held['positions']} positions):

- **top-1 agreement**: **{held['top1_agreement']:.3f}**{_confidence(held)}
- replayed greedy chain τ: {taus}.

| category | top-1 agreement |
| --- | --- |
{rows}
"""


EAGLE_KINDS = ("eagle", "eagle3")
_DRAFT_LM_ABOUT = """An independent draft model for speculative decoding with **{target}** (SmolLM2-135M-Instruct) as
the target, trained by specviz's `{kind}` trainer: a separate small LM with its own KV cache that never reads
the target's hidden states. It uses the target's tokenizer: same 49152 ids (the tokenizer files here are a copy)."""


def _ttt_steps(summary: dict) -> int:
    from specviz.training.trainers.eagle import DEFAULTS

    return int(summary.get("trainer_options", {}).get("ttt_steps", DEFAULTS["ttt_steps"]))


def _eagle_about(summary: dict, cfg: dict, size_mib: float) -> tuple[str, str]:
    """(intro, architecture) of an EAGLE-1 or EAGLE-3 head's card."""
    eagle3 = summary["kind"] == "eagle3"
    layers = cfg["feature_layers"]
    named = ", ".join(f"`hidden_states[{i}]`" for i in layers)
    title = "EAGLE-3" if eagle3 else "EAGLE-1"
    about = (f"An {title} draft head for speculative decoding with **{summary['target']}** (SmolLM2-135M-Instruct) "
             f"as the target, trained by specviz's `{summary['kind']}` trainer. It drafts from the target's own "
             f"hidden states, {named} in Hugging Face's numbering (`hidden_states[i]` is the output of decoder layer "
             f"i - 1; `[0]` is the embedding), captured by hooks on the target forwards that verification already "
             f"runs. `--drafter {summary['kind']}` selects it for {summary['target']}; it drafts EAGLE-2's "
             f"dynamic tree (the default shape), or a chain with `--chain`.")
    vocab = (f"a reduced draft vocabulary of {cfg['draft_vocab_size']} ids (the most frequent tokens of the "
             f"training sequences (prompts, the target's answers, corpus text) and of the target's argmax at each of "
             f"their positions; `d2t` maps them to target ids, and other tokens "
             f"get draft probability 0, so verification stays lossless)"
             if cfg["draft_vocab_size"] < cfg["vocab_size"] else "the full vocabulary")
    block = (f"`fc` ({len(layers)}·H → H) over the concatenated features, one decoder layer of the target's shape "
             f"whose attention reads [norm(embedding) ; norm(h)] (2H), its own final norm, then logits over {vocab}"
             if eagle3 else
             "`fc` (2H → H) over [embedding of x(t+1) ; feature f(t)], one decoder layer of the target's shape "
             "without input norm, then the target's output layer")
    stored = summary.get("trainable_parameters", summary["parameters"]) / 1e6
    architecture = (f"{block}; hidden {cfg['hidden_size']}, {cfg['num_heads']} heads ({cfg['num_kv_heads']} KV heads), "
                    f"MLP {cfg['intermediate_size']}.\nThe embedding and the output rows are the target's own: frozen "
                    f"during training and **not stored here**. `config.json`'s `specviz_shared_weights` names the "
                    f"donor, and specviz's loader borrows the loaded target's tensors after checking a fingerprint "
                    f"of its embedding.\n{stored:.1f}M stored parameters, fp16 safetensors ({size_mib:.1f} MiB).")
    return about, architecture


_FAMILY_ABOUT = {
    "dflash": ("A DFlash block drafter",
               "It drafts a block of {drafts} tokens in one forward: the block [last verified token, mask × {drafts}] "
               "(mask = token id {mask_token_id}, which SmolLM2 never produces) attends non-causally within itself "
               "and to the target's features of every committed position, projected by `fc` and `hidden_norm` and "
               "injected into the keys and values of each draft layer. `--drafter dflash` drafts DDTree (best-first "
               "over the block's per-position top-k by product of marginals, to the node budget); `--chain --k "
               "{drafts}` drafts the whole block as a chain."),
    "dspark": ("A DSpark block drafter", "The DFlash backbone drafts {drafts} tokens in one forward (mask token id "
               "{mask_token_id}); a Markov head of rank {markov_rank} adds W2·W1[x(k−1)] to each draft's logits, "
               "left to right within the block; a confidence head predicts each draft's acceptance. Each round "
               "verifies only the prefix length that maximises (1 + Σ survival) ÷ cost(1 + ℓ) on this machine's "
               "measured verify-cost curve (`--drafter dspark`); `dspark:fixed` verifies every draft. Both are cut "
               "to the run's chain length (`--chain --k {drafts}` for the whole block) or, under the default tree "
               "shape, its depth."),
    "mtp": ("MTP modules", "DeepSeek-V3-style multi-token-prediction modules, {num_modules} of them: module k computes "
            "h' = Block(eh_proj([enorm(emb(x)) ; hnorm(h)])) and logits = head(norm(h')); draft step d uses module "
            "(d − 1) mod {num_modules}. **Trained post hoc** on the frozen target, not jointly with it as "
            "DeepSeek-V3's, GLM-4.5's, Qwen3-Next's and MiMo's MTP layers are."),
    "medusa": ("Medusa-1 heads", "{num_heads} heads on the target's last hidden state, each a residual block "
               "x + SiLU(Linear(x)) then the target's own output layer; head i predicts token t + 2 + i. "
               "`--drafter medusa` drafts the static tree stored in `config.json` (`medusa_choices`, derived from "
               "the heads' measured top-k accuracy), cut to the run's budget (ranks below its width, depths up to its "
               "depth, then its first max-nodes choices); `--chain` drafts the heads' argmaxes."),
}
#: each family's loss, after the shared data bullets
_FAMILY_LOSS = {
    "eagle": "cross-entropy to the target's renormalised top-{topk} distribution + 0.5 × cross-entropy on the "
             "target's argmax (restricted to the head's draft vocabulary), with training-time test: {ttt} unrolled "
             "steps that feed the head its own output, weighted 0.8^i",
    "draft-lm": "cross-entropy to the target's renormalised top-{topk} distribution + 0.5 × cross-entropy on the "
                "target's argmax (the token greedy verification accepts)",
    "dflash": "cross-entropy to the target's renormalised top-{topk} distribution at every draft position of "
              "blocks anchored at random trained positions, weighted exp(−(k − 1)/γ) by draft position",
    "dspark": "per draft position (weighted exp(−(k − 1)/γ)), 0.1 × cross-entropy to the target's top-{topk} + "
              "0.9 × the total variation ½‖p − q‖₁ (the target's mass outside its top-{topk} lumped into one bucket), "
              "with the Markov head teacher-forced on the true previous token, plus binary cross-entropy of the "
              "confidence head against the step's exact acceptance rate 1 − ½‖p − q‖₁",
    "mtp": "for each module, cross-entropy to the target's renormalised top-{topk} distribution + 0.5 × "
           "cross-entropy on its argmax, averaged over modules (DeepSeek-V3 averages its MTP losses)",
    "medusa": "for each head, cross-entropy to the target's renormalised top-{topk} distribution + 0.5 × "
              "cross-entropy on its argmax, head h weighted 0.8^h (Medusa-1)",
}


def _family_about(summary: dict, cfg: dict, size_mib: float) -> tuple[str, str]:
    """(intro, architecture) of a block, MTP or Medusa drafter's card, from its saved spec."""
    title, text = _FAMILY_ABOUT[summary["kind"]]
    fields = {**cfg, "num_modules": cfg.get("num_modules", 1)}
    if "block_size" in cfg:  # BlockSpec.drafts: b from the anchor on (DSpark), else b - 1
        fields["drafts"] = cfg["block_size"] - (0 if cfg.get("anchor_predicts") else 1)
    layers = cfg.get("feature_layers") or [cfg.get("feature_layer")]
    named = ", ".join(f"`hidden_states[{i}]`" for i in layers if i is not None)
    about = (f"{title} for speculative decoding with **{summary['target']}** (SmolLM2-135M-Instruct) as the "
             f"target, trained by specviz's `{summary['kind']}` trainer on the target's own hidden states "
             f"({named}; `hidden_states[i]` is the output of decoder layer i − 1, `[0]` the embedding). "
             f"`--drafter {summary['kind']}` selects it for {summary['target']}.")
    stored = summary.get("trainable_parameters", summary["parameters"]) / 1e6
    architecture = (f"{text.format(**fields)}\nThe embedding and output layer are the target's own: frozen during "
                    f"training and **not stored here** (`specviz_shared_weights` in the config names the donor; the "
                    f"loader checks a fingerprint). Spec: `{json.dumps(cfg, sort_keys=True)}`.\n{stored:.1f}M stored "
                    f"parameters, fp16 safetensors ({size_mib:.1f} MiB).")
    return about, architecture


def _architecture(args: argparse.Namespace, cfg: dict, summary: dict, size_mib: float) -> str:
    """The Architecture paragraph: a small Llama from scratch, or a copy of some of the target's layers."""
    shape = (f"hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads ({cfg['num_key_value_heads']} KV "
             f"heads), MLP {cfg['intermediate_size']}")
    stored = summary.get("trainable_parameters", summary["parameters"]) / 1e6
    if getattr(args, "init_layers", None):
        return (f"LlamaForCausalLM, {cfg['num_hidden_layers']} layers initialised from the target's decoder layers "
                f"{args.init_layers} (then trained), {shape}, the target's final norm (trained).\n"
                f"The input embedding and the tied output layer are the target's own: frozen during training and "
                f"**not stored here**. `config.json`'s `specviz_shared_weights` names the donor, and specviz's loader "
                f"points the draft at the loaded target's tensors (no copy), after checking a fingerprint of them.\n"
                f"{stored:.1f}M stored parameters, fp16 safetensors ({size_mib:.1f} MiB).")
    return (f"LlamaForCausalLM, {cfg['num_hidden_layers']} layers, {shape}, tied input/output embeddings initialised "
            f"from a PCA projection of the target's embedding matrix. {summary['parameters'] / 1e6:.1f}M parameters, "
            f"fp16 safetensors ({size_mib:.1f} MiB).")


def _confidence(held: dict) -> str:
    """DSpark's confidence-head calibration bullet (every block position of the answers), when it was measured."""
    if "confidence_ece" not in held:
        return ""
    return (f"\n- **confidence head calibration** over {held['confidence_positions']} block positions (every trained "
            f"anchor, Markov head on the true previous tokens): ECE (10 bins) **{held['confidence_ece']:.3f}** against "
            f"greedy acceptance, {held['confidence_ece_sampled']:.3f} against the sampling acceptance rate "
            f"1 − ½‖p − q‖₁; mean confidence {held['confidence_mean']:.3f}, mean greedy acceptance "
            f"{held['greedy_acceptance_mean']:.3f}")


def _replay_caveat(summary: dict) -> str:
    """Why the replay overstates τ for drafters that read the target's features (all but the draft LM)."""
    if summary["kind"] == "draft-lm":
        return ""
    return ("; it scores every position as a first draft, from the target's own features, while deeper drafts in a "
            "real round come from the drafter's own estimates (later heads, modules or block positions), so for this "
            "family it is an upper bound")


def _generated_prompt_data(args: argparse.Namespace, sources: str, answers_dtype: str | None) -> str:
    """The card's line on the generated prompts the run answered (all of them, or its ``--extra-prompts-from``
    window of the set), and the dtype they decoded in where the run recorded it."""
    window = getattr(args, "extra_from", 0)
    decoded = {None: "", "target": ", decoded in the target's own dtype"}.get(answers_dtype,
                                                                              f", decoded in {answers_dtype}")
    answers = (f"- Self-distillation: the target's own greedy chat answers (≤ {args.gen_tokens} tokens, its chat "
               f"template{decoded})")
    if window and window >= args.extra_prompts:
        return (f"{answers}, to no generated prompt (`--extra-prompts-from {window}`: the starting weights trained on "
                f"the set's first {window} extra prompts).")
    trained = (f"{args.extra_prompts - window} (the set's extra prompts {window}..{args.extra_prompts}, "
               f"`--extra-prompts-from`: the window after those the starting weights trained on)" if window
               else args.prompts + args.extra_prompts)
    return (f"{answers} to\n  {trained} generated prompts: templates over {sources},\n  generated math word problems "
            f"and\n  general questions (science, history, writing, role-play, reasoning, coding).")


def _self_prompt_data(args: argparse.Namespace) -> str:
    """The card's line on the prompts the target wrote itself (``--self-prompts``), or nothing."""
    count = getattr(args, "self_prompts", 0)
    if not count:
        return ""
    window = getattr(args, "self_from", 0)
    drawn = f"draws {window}..{count} of those it sampled" if window else f"{count} it sampled"
    continued = ("`--self-prompts-from`: the window after those the starting weights trained on; " if window
                 else "")
    return (f"\n- The target's own greedy answers to the user turns it wrote itself among {drawn} ({continued}"
            f"`--self-prompts`: its chat template opened at a user turn, temperature 1; those that ended on their "
            f"own, {MIN_WORDS} words or more, distinct).")


def write_model_card(dest: Path, summary: dict, *, name: str, engine: list[dict] | None = None) -> None:
    """README.md: architecture, data, steps, loss, held-out agreement, engine τ, and the retraining command."""
    args = _run_arguments(summary["command"])
    commands = summary.get("commands") or [summary["command"]]
    sampled = getattr(args, "softmax_sample", 0)
    loss_note = (f" (sampled softmax over the target's top-{args.topk} + {sampled} random tokens, so the loss and this "
                 f"agreement are over that candidate set, not the full vocabulary)") if sampled else ""
    started = ([f"The run started from the weights in `{summary['init_from']}` (`--init-from`), with a fresh optimizer "
                f"and schedule."] if summary.get("init_from") else [])
    notes = "".join(f"\n\n{note}" for note in [*started, *summary.get("notes", [])])
    cfg = summary.get("student_config") or json.loads((dest / "config.json").read_text())
    held = summary["heldout"]
    taus = ", ".join(f"k={k}: {v:.2f}" for k, v in held["simulated_chain_tau"].items())
    per_cat = "\n".join(f"| {c} | {a:.3f} |" for c, a in held["per_category_agreement"].items())
    size = sum(f.stat().st_size for f in dest.glob("*.safetensors")) / 2**20
    precision = "; bf16 autocast, fp32 weights" if getattr(args, "autocast", None) else ""
    head = summary["kind"] in EAGLE_KINDS
    stdlib = f", and {args.stdlib_files} Python stdlib files" if "stdlib" in args.data else ""
    tasks = "summarise, answer from a passage, translate, extract, continue a story"
    sources = (f"corpus passages and stdlib functions ({tasks}, explain/review/test code)" if stdlib
               else f"corpus passages ({tasks})")
    if head:
        about, architecture = _eagle_about(summary, cfg, size)
    elif summary["kind"] == "draft-lm":
        about = _DRAFT_LM_ABOUT.format(target=summary["target"], kind=summary["kind"])
        architecture = _architecture(args, cfg, summary, size)
    else:
        about, architecture = _family_about(summary, cfg, size)
    corpus = (f"- {args.corpus_tokens} tokens of corpus text (`{' '.join(args.data)}`: Gutenberg books and TinyStories "
              f"with BOM,\n  CRLF and licence blocks stripped{stdlib}) annotated with the target's\n"
              f"  top-{args.topk} probabilities." if args.corpus_tokens > 0
              else f"- No corpus text of its own (`--corpus-tokens 0`): `{' '.join(args.data)}` only supplies the "
                   f"generated prompts' passages{' and code' if stdlib else ''}.")
    loss_kind = "eagle" if head else summary["kind"]
    loss = _FAMILY_LOSS[loss_kind].format(topk=args.topk, ttt=_ttt_steps(summary) if head else 0)
    text = f"""# {name}

{about}

## Architecture
{architecture}

## Data (built by the training command)
{_generated_prompt_data(args, sources, summary.get("answers_dtype"))}{_self_prompt_data(args)}
{_prompt_file_data(args)}
{corpus}
- Loss: {loss}.

## Training
{summary['steps']} steps of AdamW (lr {args.lr}, warmup {args.warmup}, cosine to 10%{precision}), batch
{args.batch_size} sequences of ≤ {args.seq_len} tokens, seed {args.seed}; {summary['train_sequences']} training
sequences ({summary['train_positions']} trained positions). Data loading took
{summary['data_seconds'] / 60:.1f} min in the last run (features come from the cache when present); training took
{summary['train_seconds'] / 60:.1f} min on 2 CPU cores over all its runs (resumed ones included). Final
training loss (last logged step): {summary['final_loss']:.3f}; top-1 agreement on that batch
{summary['final_train_agree']:.3f}{loss_note}.{notes}

## Agreement with the target (held-out target answers, teacher-forced)
{held['sequences']} held-out prompts' greedy target answers ({held['positions']} positions):

- **top-1 agreement** (drafter argmax == target argmax): **{held['top1_agreement']:.3f}**{_confidence(held)}
- replayed greedy chain τ (chain drafting replayed on the target's answer; counts the bonus/correction token):
  {taus}. A replay, not an engine run{_replay_caveat(summary)}.

| category | top-1 agreement |
| --- | --- |
{per_cat}
{_prompt_file_agreement(args, summary.get("heldout_prompt_files"))}
## Speculative decoding with the engine
{_engine_section(engine)}

## Retrain
From the repository root, in this order (features and checkpoints go to the git-ignored `.cache/` and `runs/`;
a command with `--resume` continues the previous one's checkpoints with its own step count and schedule):
```
{chr(10).join(commands)}
```
"""
    (dest / "README.md").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="export a finished training run as fp16 weights + model card")
    parser.add_argument("--run", type=Path, required=True, help="run folder (holds final/ and metrics.json)")
    parser.add_argument("--dest", type=Path, required=True, help="where to write the shipped model")
    parser.add_argument("--name", default=None)
    parser.add_argument("--bench", type=Path, nargs="+", default=[], help="results.json of `specviz bench` runs with "
                        "this drafter (their τ and speedup go into the model card, one table per run)")
    args = parser.parse_args(argv)

    def run() -> int:
        for needed in (args.run / "metrics.json", args.run / "final" / "config.json", *args.bench):
            if not needed.is_file():
                raise SpecvizError(f"{needed} is missing: --run takes a finished `specviz train` run folder, --bench "
                                   "the results.json of `specviz bench` runs")
        outputs.output_dir(args.dest, "--dest")
        try:
            summary = json.loads((args.run / "metrics.json").read_text())
            benches = [json.loads(path.read_text()) for path in args.bench]
        except (ValueError, UnicodeDecodeError) as error:
            raise SpecvizError(f"a --run metrics.json or --bench file is not valid JSON ({error})") from None
        size = export_model(args.run / "final", args.dest)
        name = args.name or args.dest.name
        drafter = f"model:{name}" if summary["kind"] == "draft-lm" else summary["kind"]
        engine = [engine_rows_from_bench(bench, drafter) for bench in benches]
        write_model_card(args.dest, summary, name=name, engine=engine)
        print(f"wrote {args.dest} ({size / 2**20:.1f} MiB of weights)")
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
