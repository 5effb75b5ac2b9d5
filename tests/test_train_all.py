"""The GPU training pipeline (``tools/gpu/train_all.py``): its dry run builds the data once and trains and exports
every learned family on the CPU; the GPU plan's commands are the ones the CLI accepts."""

from __future__ import annotations

import json

from specviz.training.arguments import build_parser
from tools.gpu import train_all


def test_the_dry_run_builds_the_data_once_and_exports_every_family(tmp_path):
    assert train_all.main(["--dry-run", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "train-all.json").read_text())
    assert [stage["name"] for stage in record["stages"]] == ["data", *train_all.FAMILIES]
    assert all(stage["status"] == "ok" for stage in record["stages"])
    for family in train_all.FAMILIES:
        export = tmp_path / "export" / family
        assert (export / "model.safetensors").is_file() and (export / "README.md").is_file(), family
    names = [p.name for p in (tmp_path / "cache" / "features").iterdir()]
    # one answer shard and one feature file for it, built by the data stage and read by every family
    assert len([n for n in names if n.startswith("answers-") and "hidden" not in n]) == 1
    assert len([n for n in names if n.startswith("answers-hidden-")]) == 1
    assert len([n for n in names if n.startswith("self-prompts-")]) == 1  # the user turns it wrote, sampled once


def test_the_gpu_plan_is_what_the_cli_accepts_on_cuda(tmp_path):
    plan = train_all.stages(tmp_path, dry_run=False, target="smollm2-135m", sources=["stdlib"],
                            prompt_file="specviz/examples/spec_bench_dev.jsonl", device="cuda")
    assert plan[0][0] == "data"
    for family, argv in plan[1:]:
        args = build_parser().parse_args(argv[1:])
        assert (args.kind, args.device, args.autocast) == (family, "cuda", "bf16")
        assert args.prompts == train_all.GPU.prompts and args.cache_dir == tmp_path / "cache"
        assert args.self_prompts == train_all.GPU.self_prompts


def test_a_spent_budget_skips_the_remaining_stages(tmp_path):
    assert train_all.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 1
    record = json.loads((tmp_path / "train-all.json").read_text())
    assert {stage["status"] for stage in record["stages"]} == {"skipped"}
