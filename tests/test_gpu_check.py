"""The GPU check's dry run: every step runs on the CPU at small sizes and writes the report format the GPU run writes.

The real run (``python tools/gpu/check.py`` on CUDA) is the same code with larger sizes; what it adds (installs,
CUDA kernels) cannot run here, so its report is checked on the dry run's, field by field.
"""

import json

import pytest
import torch

from specviz.bench import attention_cost
from tools.gpu import check as gpu_check
from tools.gpu import installer, near_ties, pytest_runs, tiny_target
from tools.gpu import report as gpu_report


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    code = gpu_check.main(["--dry-run", "--out", str(out)])
    return code, json.loads((out / "gpu-check.json").read_text()), (out / "gpu-check.md").read_text(), out


def test_dry_run_writes_the_report(dry_run):
    code, report, markdown, out = dry_run
    plan = gpu_check.dry_plan()
    assert code == 0 and report["ok"] is True
    assert (report["schema"], report["version"], report["dry_run"], report["device"]) == (
        gpu_report.SCHEMA, gpu_report.VERSION, True, "cpu")
    assert set(report["steps"]) == set(gpu_report.STEPS)
    assert report["steps"]["install"]["status"] == "skipped"  # a dry run installs nothing
    assert all(report["steps"][name]["status"] == "ok" for name in gpu_report.STEPS if name != "install")
    env = report["environment"]
    assert {"torch", "transformers", "gpu", "cuda", "flash_attn", "attention"} <= set(env)
    assert env["attention"]["float32"] == {"implementation": "sdpa", "cascade_prefix_kernel": "torch_cpu_flash"}

    (run,) = report["steps"]["tests"]["runs"]
    assert run["status"] == "passed" and run["passed"] == 2 and run["failed"] == run["errors"] == 0
    assert run["env"] == {"SPECVIZ_TEST_ATTENTION": "specviz_cascade"}
    assert (out / "pytest-dry-run-sample.xml").is_file()

    rows = report["steps"]["verify_cost"]["rows"]
    measured = {(r["dtype"], r["backend"], r["shape"], r["context"], r["width"]) for r in rows}
    assert measured == {(dtype, backend, shape, context, width) for dtype in ("bfloat16", "float32")
                        for backend in attention_cost.BACKENDS for shape in attention_cost.SHAPES
                        for context in plan.contexts for width in plan.widths}
    assert all(r["ms"] > 0 for r in rows)
    targets = report["targets"]
    assert targets["measured"] and targets["width"] == max(plan.widths) and targets["context"] == max(plan.contexts)
    assert targets["tree_over_chain_worst"] > 0 and targets["cascade_over_sdpa_tree"] > 0

    speedup = report["steps"]["speedup"]
    for dtype in ("bfloat16", "float32"):
        mine = [r for r in speedup["rows"] if r["dtype"] == dtype]
        assert mine[0]["row"] == "plain (specviz)" and mine[0]["speedup"] is None
        assert {r["row"] for r in mine[1:]} >= {"ngram chain k=2", "ngram tree w=3 d=2 n<=4"}
        for r in mine[1:]:  # greedy: every configuration's output equals plain decoding's
            assert r["exact"] == r["prompts"] == plan.prompts and r["speedup"] > 0 and r["tau"] >= 1
    built = {r["drafter"] for r in speedup["rows"] if r["dtype"] == "float32"}
    problems = {p["drafter"] for p in speedup["problems"] if p["dtype"] == "float32"}
    assert "model:tiny-draft" in built | problems  # built, or its failure reported (never silently dropped)

    ties = report["steps"]["near_ties"]
    assert (ties["prompts"], ties["tokens"]) == (plan.flip_prompts, plan.flip_tokens)
    assert ties["flips"] == sum(not r["identical"] for r in ties["rows"])

    for heading in ("**Dry run**", "## Tests on the device", "## Verify cost", "## Speedup vs plain decoding",
                    "## Near-tie flips", "specviz_cascade tree"):
        assert heading in markdown


def test_markdown_shows_failures_and_flips():
    """A failed step, a failed test and a flip each reach the markdown (never hidden)."""
    report = {"dry_run": False, "device": "cuda", "ok": False, "wall_s": 1.0, "targets": {"measured": False},
              "environment": {"attention": {"bfloat16": {"implementation": "specviz_cascade",
                                                         "cascade_prefix_kernel": "flash_attn"}}},
              "steps": {"install": {"status": "ok", "seconds": 1, "packages": [
                            {"module": "flash_attn", "status": "failed", "seconds": 2.0, "detail": "no wheel | x"}]},
                        "tests": {"status": "ok", "seconds": 3, "runs": [
                            {"name": "greedy-cuda-cascade-bf16", "env": {"SPECVIZ_TEST_DTYPE": "bfloat16"},
                             "status": "failed", "passed": 3, "failed": 1, "errors": 0, "skipped": 0, "seconds": 2,
                             "failures": ["tests.test_greedy_lossless::test_x"], "note": "near tie?"}]},
                        "verify_cost": {"status": "failed", "seconds": 0, "error": "RuntimeError: boom"},
                        "near_ties": {"status": "ok", "seconds": 1, "prompts": 2, "tokens": 8, "flips": 1, "rows": [
                            {"prompt": 1, "identical": False, "first_difference": 5, "reference_token": 7,
                             "other_token": 9, "reference_margin": 0.01}]}}}
    text = gpu_report.markdown(report)
    assert "result: FAILED" in text and "| verify_cost | failed | 0 | RuntimeError: boom |" in text
    assert "| speedup | missing |" in text and "no wheel / x" in text
    assert "`tests.test_greedy_lossless::test_x`" in text
    assert "1 of 2 prompts differ" in text and "| 1 | 5 | 7 | 9 | 0.010 |" in text


def test_refuses_without_cuda(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_junit_counts_and_present_packages(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/><testcase classname="a" name="bad">'
                   '<failure/></testcase><testcase classname="a" name="err"><error/></testcase>'
                   '<testcase classname="a" name="skip"><skipped/></testcase></testsuite></testsuites>')
    assert pytest_runs.junit_counts(xml) == {"passed": 1, "failed": 1, "errors": 1, "skipped": 1,
                                             "failures": ["a::bad", "a::err"]}
    assert pytest_runs.junit_counts(tmp_path / "missing.xml")["passed"] == 0
    (present,) = installer.ensure(["pytest"])  # installed here: no pip call
    assert present["status"] == "present"
    plan = gpu_check.full_plan()  # the real run's sizes: 1..64 tokens, a 2k-token context, both dtypes' tests
    assert max(plan.widths) == 64 and 1 in plan.widths and max(plan.contexts) >= 2048
    assert {"SPECVIZ_TEST_DEVICE"} <= set(plan.tests[1].env) and "flash_attn" in plan.install


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "tests,bogus"], "--steps: unknown step(s) bogus"),
    (["--steps", ","], "--steps: unknown step(s) (none given)"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--budget-s", "5"], "--budget-s must be between 10 and 3600"),
    (["--drafters", " , "], "--drafters names no drafter spec"),
    (["--shape-config", "no/such/config.json"], "--shape-config: no file at"),
])
def test_bad_arguments_are_one_line(arguments, message, tmp_path, capsys):
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path / "out"), *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_chosen_steps_drafters_and_a_shape_only_cost_curve(tmp_path):
    """The split a lent machine runs (tools/gpu/phase.sh): only the steps asked for, the speedup only for the
    drafters named, and verify cost on random weights of a config's shape (no checkpoint needed)."""
    from transformers import LlamaConfig

    shape = tmp_path / "shape"
    LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, architectures=["LlamaForCausalLM"]).save_pretrained(shape)
    out = tmp_path / "out"
    assert gpu_check.main(["--dry-run", "--steps", "verify_cost,speedup", "--drafters", "ngram",
                     "--shape-config", str(shape / "config.json"), "--out", str(out)]) == 0
    report = json.loads((out / "gpu-check.json").read_text())
    statuses = {name: step["status"] for name, step in report["steps"].items()}
    assert statuses == {"install": "not run", "tests": "not run", "verify_cost": "ok", "speedup": "ok",
                        "near_ties": "not run"}
    cost = report["steps"]["verify_cost"]
    assert cost["model"].endswith("(random weights)") and cost["rows"]
    assert {r["drafter"] for r in report["steps"]["speedup"]["rows"]} == {None, "ngram"}
    assert report["steps"]["speedup"]["divergences"] == []  # float32 greedy: identical, nothing to explain
    assert "| tests | not run | 0.0 | not in --steps |" in (out / "gpu-check.md").read_text()


def test_divergence_names_the_first_differing_token_and_its_margin():
    target = tiny_target.target("cpu", torch.float32, "sdpa")
    prompt = [3, 5, 7]
    logits = near_ties.next_logits(target, prompt)
    best, worst = int(logits.argmax()), int(logits.argmin())
    assert near_ties.divergence(target, prompt, [best, 4], [best, 4]) is None
    parted = near_ties.divergence(target, prompt, [best, 4], [worst, 4])
    assert parted["position"] == 0 and (parted["reference_token"], parted["other_token"]) == (best, worst)
    assert parted["gap"] == pytest.approx(float(logits[best] - logits[worst]), abs=1e-5) and parted["gap"] > 0
    top = torch.topk(logits, 2).values
    assert parted["margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert near_ties.divergence(target, prompt, [best, 4], [best])["position"] == 1  # a shorter output parts too
