"""Shipped examples: Spec-Bench prompts for the prompt picker and recorded traces for replay.

``python -m specviz.ui.examples record`` re-records ``specviz/examples/traces/`` with the real default target and every
drafter this project ships for it, as a chain and as a tree where it drafts one (same runner as the UI, so the traces
carry plain decoding measured beside each run too), and the default drafter at the default settings, which the
Playground opens on; ``--shapes`` records only the named ``SHAPES`` (the lesson scenarios' traces were recorded so).
Each trace's header says what it drafted and the machine it ran on (and that it was busy, when it was); its label
reads them.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from specviz import resources, settings
from specviz.engine import trace
from specviz.errors import SpecvizError, exit_status
from specviz.viz.record import RunRecord

PROMPTS = resources.EXAMPLES / "prompts.jsonl"
TRACES = resources.EXAMPLES / "traces"
DEFAULT_TRACE = "summarization-hybrid-default.jsonl"  # the default drafter and settings


@lru_cache(maxsize=1)
def prompts() -> list[dict]:
    """Spec-Bench prompts: ``question_id``, ``category``, ``turns``."""
    if not PROMPTS.is_file():
        return []
    return [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]


def prompt_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for a dropdown; value is the question id as text."""
    out = []
    for row in prompts():
        text = row["turns"][0].replace("\n", " ")
        out.append((f"{row['category']} · {text[:60]}{'…' if len(text) > 60 else ''}", str(row["question_id"])))
    return out


def prompt_text(question_id: str | None) -> str:
    for row in prompts():
        if str(row["question_id"]) == str(question_id):
            return row["turns"][0]
    return ""


def drafted_shape(rounds: list) -> str:
    """What a run's drafts were: "tree" if any round branched (a node whose parent is not the node before it),
    else "chain". A tree budget does not make a tree: DSpark drafts its block as a chain under any budget."""
    branched = any(parent != index - 1 for r in rounds for index, parent in enumerate(r.parents))
    return "tree" if branched else "chain"


def label(header: dict, fallback_category: str = "") -> str:
    """A shipped trace's label, from its header: category, drafter, the shape it drafted (``example.drafted``,
    written when it was recorded) with the budget's sizes, sampling, target and the machine it ran on."""
    drafter = (header.get("drafter") or {}).get("name", "plain")
    budget = header.get("budget") or {}
    example = header.get("example") or {}
    drafted = example.get("drafted") or ("tree" if budget.get("tree") else "chain")
    shape = (f"tree w{budget.get('width')} d{budget.get('depth')} n{budget.get('max_nodes')}" if drafted == "tree"
             else f"chain k{budget.get('depth') if budget.get('tree') else budget.get('k')}")
    temperature = (header.get("config") or {}).get("temperature", 0.0)
    if temperature:
        shape += f" T={temperature}"
    machine = f" · {example['machine']}" if example.get("machine") else ""
    return f"{example.get('category') or fallback_category} · {drafter} · {shape} · {header['target']['name']}{machine}"


def trace_choices() -> list[tuple[str, str]]:
    """(label, file name) for every shipped trace, labelled from its header."""
    out = []
    for path in sorted(TRACES.glob("*.jsonl")):
        try:
            header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
            out.append((label(header, path.stem.split("-")[0]), path.name))
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
    return out


def default_choice() -> str | None:
    """The example the page opens on: the default drafter's at the default settings, else the first shipped one
    (None when none is shipped)."""
    if (TRACES / DEFAULT_TRACE).is_file():
        return DEFAULT_TRACE
    choices = trace_choices()
    return choices[0][1] if choices else None


def load_trace(name: str) -> RunRecord:
    """A shipped trace as a fresh record (parsed per call: records are per-session, mutable objects)."""
    path = TRACES / Path(name).name
    return RunRecord.from_trace(trace.read(path), name=path.name)


# ---- recording -----------------------------------------------------------------------------------------------
#: More to see than the default's 4 nodes: the chain and tree traces draft these.
LARGER = {"k": 4, "width": 3, "depth": 4, "max_nodes": 16}
#: The shapes a trace can be recorded in, by the name its file ends with: the settings each sets on top of the
#: defaults. ``chain-sampled`` and ``chain-long`` are recorded only when asked for (``--shapes``): the Playground's
#: scenarios (``specviz.ui.scenarios``) open on them.
SHAPES: dict[str, dict] = {
    "chain": {**LARGER, "tree": False},
    "tree": {**LARGER, "tree": True},
    "tree-sampled": {**LARGER, "tree": True, "temperature": 0.7, "stochastic_tree": True},  # rejection sampling
    "default": {},  # what the Playground runs when nothing is changed
    "chain-sampled": {**LARGER, "tree": False, "temperature": 0.7},  # the same chain, sampled: p/q decides
    "chain-long": {**LARGER, "tree": False, "k": 12},  # past the best draft length on a CPU
}


def trace_name(category: str, drafter: str, shape: str) -> str:
    """The file a recording of ``drafter`` on ``category``'s prompt in ``shape`` is written to."""
    return f"{category}-{drafter.replace('model:', '').replace(':', '')}-{shape}.jsonl"


def default_shapes(drafter: str, target: str) -> list[str]:
    """What ``record`` draws for a drafter unless told: chain and tree, a sampled stochastic tree for drafters with
    draft distributions, and the default settings for the target's default drafter."""
    from specviz.drafters import registry

    shapes = ["chain", "tree"]
    if "stochastic_tree" in registry.family_of(drafter).reads:  # it has q: show rejection sampling too
        shapes.append("tree-sampled")
    if drafter == registry.default_for(target):
        shapes.append("default")
    return shapes


def record(out_dir: Path, max_new_tokens: int, categories: list[str], drafters: list[str] | None = None,
           shapes: list[str] | None = None, machine_note: str | None = None) -> list[Path]:
    """Record each category's prompt with each drafter (default: each family's default and shipped drafters for the
    default target) in each of ``shapes`` (default: ``default_shapes``)."""
    from specviz.bench import machine
    from specviz.drafters import registry
    from specviz.ui import runner
    from specviz.ui.controller import apply

    by_category = {row["category"]: row for row in prompts()}
    target = settings.default("target")
    drafters = drafters or registry.default_specs(target)
    where = machine_line(machine, busy_note(machine) if machine_note is None else machine_note)
    written = []
    for category in categories:
        row = by_category[category]
        for drafter in drafters:
            for shape in shapes or default_shapes(drafter, target):
                request = runner.RunRequest(prompt=row["turns"][0], chat=True, drafter=drafter,
                                            max_new_tokens=max_new_tokens)
                request = replace(request, **SHAPES[shape]).validate()
                rec = RunRecord(header={})
                for event in runner.stream(request):
                    apply(rec, event)
                drafted = drafted_shape(rec.rounds)
                if shape.startswith("tree") and drafted == "chain":  # the chain trace already shows these drafts
                    print(f"{category} {drafter} {shape}: drafted chains only under a tree budget; not written")
                    continue
                rec.header["example"] = {"category": category, "question_id": row["question_id"],
                                         "source": "Spec-Bench, Apache-2.0, hemingkx/Spec-Bench",
                                         "drafted": drafted, "machine": where}
                path = out_dir / trace_name(category, drafter, shape)
                path.write_text(rec.to_trace(), encoding="utf-8")
                m = rec.metrics()
                print(f"{path.name}: {m.rounds} rounds, tau {m.tau:.2f}, {rec.tokens_per_s:.1f} tok/s, "
                      f"speedup x{rec.speedup() or 0:.2f}")
                written.append(path)
    return written


def machine_line(machine, note: str = "") -> str:
    """The machine a trace was recorded on, short enough for a label: its cores and CPU (or GPU) model, and a note
    (a busy machine's: its timings are not a quiet machine's)."""
    gpu = machine.gpu()
    where = f"{gpu}" if gpu != "none" else f"{os.cpu_count()}-core {machine.cpu_model()}"
    return f"{where}, {note}" if note else where


def busy_note(machine) -> str:
    """"not a quiet machine (…)" when other work held at least half the cores as recording began (measured over a
    second while the recorder waits; the load average would count the recorder's own previous traces), else ""; it
    names torch's thread count when that is fewer than the cores (fewer threads lose less to a busy machine)."""
    import torch

    busy = machine.busy_cores()
    cores = os.cpu_count() or 1
    if busy is None or busy < cores / 2:
        return ""
    threads = torch.get_num_threads()
    used = f", {threads} torch thread{'s' if threads > 1 else ''}" if threads < cores else ""
    return f"not a quiet machine (other work used {busy:.1f} of {cores} cores{used})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.ui.examples")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record example traces with the default target")
    rec.add_argument("--out", type=Path, default=TRACES)
    rec.add_argument("--max-new-tokens", type=int, default=64)
    rec.add_argument("--categories", default="summarization,coding")
    rec.add_argument("--drafters", default=None, help="comma list of drafter specs (default: every ready drafter)")
    rec.add_argument("--shapes", default=None,
                     help=f"comma list of shapes, some of {', '.join(SHAPES)} (default: chain, tree, a sampled tree "
                          "for drafters with q, and the default drafter's default settings)")
    rec.add_argument("--machine-note", default=None,
                     help="said after the machine in each label (default: a note when the machine is busy)")
    args = parser.parse_args(argv)

    def run() -> int:
        from specviz import outputs
        from specviz.drafters import registry

        out = outputs.output_dir(args.out, "--out")
        split = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
        categories, known = split(args.categories), sorted({row["category"] for row in prompts()})
        unknown = [c for c in categories if c not in known]
        if unknown or not categories:
            raise SpecvizError(f"--categories {args.categories!r}: give some of {', '.join(known)}")
        drafters = registry.parse_list(args.drafters) if args.drafters is not None else None
        shapes = split(args.shapes) if args.shapes is not None else None
        if shapes is not None and (not shapes or any(shape not in SHAPES for shape in shapes)):
            raise SpecvizError(f"--shapes {args.shapes!r}: give some of {', '.join(SHAPES)}")
        out.mkdir(parents=True, exist_ok=True)
        record(out, args.max_new_tokens, categories, drafters, shapes, args.machine_note)
        return 0
    return exit_status(run)


if __name__ == "__main__":
    raise SystemExit(main())
