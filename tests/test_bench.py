"""The benchmark suite end to end (``--quick`` style) on tiny random models, its statistics, and its references."""

import json

import pytest
import tiny
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import DynamicCache

from specviz import cli
from specviz.bench import verify_cost
from specviz.bench.configs import RunSpec, build_specs
from specviz.bench.prompts import BenchPrompt
from specviz.bench.runners import RunResult, run_hf, run_specviz
from specviz.bench.suite import PromptRuns, Sample, SuiteResult
from specviz.bench.summary import OVERALL, PLAIN_ROW, sample_predicted, sample_speedup, summarise
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig
from specviz.engine.round import Round
from specviz.errors import SpecvizError

VOCAB = 64
PROMPTS = [("alpha", "w3 w5 w7 w3 w5 w7 w3"), ("alpha", "w1 w2 w3 w1 w2"), ("beta", "w9 w8 w7 w9 w8 w7 w9 w8"),
           ("beta", "w4 w4 w6 w4 w4")]



def test_flops_per_token_counts_what_the_forward_multiplies():
    """The compute floor's operation count equals torch's FLOP counter over a real one-token forward (eager
    attention, whose products the counter sees), with the token attending to its cached context and itself."""
    net = tiny.model("llama", VOCAB, layers=2)
    net.set_attn_implementation("eager")
    cache = DynamicCache(config=net.config)
    with torch.no_grad():
        net(torch.tensor([list(range(1, 11))]), past_key_values=cache)
        with FlopCounterMode(display=False) as counter:
            net(torch.tensor([[5]]), past_key_values=cache)
    assert counter.get_total_flops() == verify_cost.flops_per_token(net, keys=11)
    assert verify_cost.flops_per_token(net, keys=12) > verify_cost.flops_per_token(net, keys=11)

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-models")
    target = tiny.model("llama", VOCAB, layers=2, scale=20)
    for name, net in (("target", target), ("draft", tiny.truncated(target, 1))):
        net.save_pretrained(root / name)
        tiny.tokenizer(VOCAB).save_pretrained(root / name)
    with open(root / "prompts.jsonl", "w") as f:
        for i, (category, text) in enumerate(PROMPTS):
            f.write(json.dumps({"question_id": 100 + i, "category": category, "turns": [text, "ignored"]}) + "\n")
    return root


def test_auto_precision_rows_say_what_their_drafter_ran(model_dirs, tmp_path):
    """``--draft-quant auto`` (the default): a Llama draft's rows run and are labelled int8; a draft int8 cannot run
    in (another architecture) runs in full precision under an unlabelled row, instead of failing as int8 does."""
    from specviz import api, settings
    from specviz.bench.command import _precision_drafters

    qwen = tmp_path / "qwen-draft"
    tiny.model("qwen2", VOCAB, layers=1).save_pretrained(qwen)
    tiny.tokenizer(VOCAB).save_pretrained(qwen)
    target = api.load_target(str(model_dirs / "target"))
    llama_spec, qwen_spec = f"model:{model_dirs / 'draft'}", f"model:{qwen}"
    drafters, precisions = _precision_drafters(["ngram", llama_spec, qwen_spec], ["auto"], target,
                                               settings.validate())
    assert precisions == {llama_spec: ("int8",), qwen_spec: ("off",)}
    assert drafters[f"{llama_spec} int8"].draft_quant == "int8" and drafters[qwen_spec].draft_quant == "off"
    names = [s.name for s in build_specs(["ngram", llama_spec, qwen_spec], ["chain"], DraftBudget(k=2), hf=False,
                                         draft_quants=precisions)]
    assert names == ["ngram chain k=2", f"{llama_spec} chain k=2 int8", f"{qwen_spec} chain k=2"]
    assert all(s.drafter_key in drafters for s in build_specs([llama_spec, qwen_spec], ["chain"], DraftBudget(k=2),
                                                              hf=False, draft_quants=precisions))
    with pytest.raises(SpecvizError, match="needs a Llama-architecture draft"):
        _precision_drafters([qwen_spec], ["int8"], target, settings.validate())


def test_quick_bench_end_to_end(capsys, model_dirs, tmp_path):
    out = tmp_path / "out"
    code = cli.main(["bench", "--target", str(model_dirs / "target"), "--drafters",
                     f"ngram,model:{model_dirs / 'draft'}", "--prompts", str(model_dirs / "prompts.jsonl"),
                     "--no-chat", "--quick", "--max-new-tokens", "20", "--k", "3", "--draft-quant", "off,int8",
                     "--width", "4", "--depth", "5", "--budget", "24",
                     "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "| configuration |" in stdout
    data = json.loads((out / "results.json").read_text())
    summary = data["summary"]
    names = summary["rows"]
    assert names[0] == PLAIN_ROW
    draft = f"model:{model_dirs / 'draft'}"
    expected = ["ngram chain k=3", "ngram tree w=4 d=5 n<=24", f"{draft} chain k=3", f"{draft} tree w=4 d=5 n<=24",
                f"{draft} chain k=3 int8", f"{draft} tree w=4 d=5 n<=24 int8",
                "hf generate (plain)", "hf prompt lookup k=3 n=3", f"hf assisted {draft} k=3"]
    assert names[1:] == expected
    assert summary["categories"] == ["alpha", "beta"]
    assert data["settings"]["question_ids"] == ["100", "102"]  # --quick: the first prompt of each category
    assert data["settings"]["draft_quant"] == ["off", "int8"] and "--draft-quant off,int8" in data["command"]
    table = summary["table"]
    assert table[PLAIN_ROW][OVERALL]["tau"] == 1.0
    for name in names[1:]:
        overall = table[name][OVERALL]
        assert overall["prompts"] == 2 and overall["exact"] == 2, name  # greedy: identical to plain decoding
        assert overall["speedup"]["median"] > 0 and overall["tokens_per_s"]["median"] > 0
        assert set(table[name]) == {"alpha", "beta", OVERALL}
    chain = table[f"{draft} chain k=3"][OVERALL]
    assert chain["tau"] == pytest.approx(table[f"hf assisted {draft} k=3"][OVERALL]["tau"])  # same rounds
    assert len(chain["conditional"]) == 3
    assert 0.0 <= chain["confidence_ece"] <= 1.0 and chain["head_ece"] is None  # draft probabilities, no head
    assert table[PLAIN_ROW][OVERALL]["confidence_ece"] is None
    for prompt in data["prompts"]:  # A B A C A ... A: one plain run before, between and after the configurations
        assert len(prompt["plain_tokens_per_s"]) == len(expected) + 1
    assert len(data["runs"]) == 2 * len(expected)
    assert all(run["identical"] for run in data["runs"])
    markdown = (out / "results.md").read_text()
    assert "## Speedup by category" in markdown and "## Per-position acceptance" in markdown
    assert f"| {draft} chain k=3 | {chain['confidence_ece']:.3f} | – |" in markdown  # the calibration table
    assert data["command"] in markdown and data["machine"]["cpu"] in markdown
    cost = data["verify_cost"]
    thin = cost["kernel_choice"]["wide"] == "thin"  # then the fast path on torch's kernel too, in the same run
    assert list(cost["paths"]) == (["fast", "fast-torch", "hf"] if thin else ["fast", "hf"])
    for curve in cost["paths"].values():
        assert [c["width"] for c in curve] == [1, 2, 3, 4, 5, 8, 16, 25]  # k + 1 = 4, budget + 1 = 25
    assert cost["weight_bytes"] > 0 and cost["bandwidth_gbs"] > 0
    assert cost["floor_ms"] == pytest.approx(cost["weight_bytes"] / cost["bandwidth_gbs"] / 1e6)
    assert data["machine"]["memory_bandwidth_gbs"] == cost["bandwidth_gbs"]
    assert cost["peak_gflops"] == data["machine"]["matmul_gflops"] > 0
    per_ms = cost["peak_gflops"] * 1e6  # operations per millisecond
    assert cost["compute_floor_ms"]["16"] == pytest.approx(16 * cost["flops_per_token"] / per_ms)
    assert cost["compute_floor_ms"]["16"] == pytest.approx(16 * cost["compute_floor_ms"]["1"])
    assert "## Target forward cost by verify width" in markdown and "fast vs width 1" in markdown
    assert "memory floor ms" in markdown and "compute floor ms" in markdown and "GFLOP/s" in markdown
    choice = cost["kernel_choice"]  # the fast path's declared choice, in the results and the report
    wide = "the thin kernel" if thin else "torch's F.linear"
    assert (f"F.linear for products of ≤ {choice['plain_rows']} rows, {wide} above" if choice["plain_rows"]
            else f"{wide} for every product") in markdown and "declared for this device and dtype" in markdown
    page = (out / "report.html").read_text()
    assert page.count("Plotly.newPlot") == 3 and "speedup vs τ" in page


def test_verify_cost_measures_each_width_and_rejects_bad_settings():
    target = tiny.target("llama", VOCAB, layers=2)
    cost = verify_cost.measure(target, [3, 5, 7, 9], [1, 3, 6], repeats=2)
    assert [c["width"] for c in cost] == [1, 3, 6] and cost[0]["relative"] == 1.0
    assert all(c["ms"] > 0 and c["relative"] > 0 for c in cost)
    for context, widths, repeats, message in (([], [1], 1, "context is empty"), ([3], [0, 2], 1, "at least 1"),
                                              ([3], [1], 0, "at least 1"), ([3] * 1020, [8], 1, "exceed")):
        with pytest.raises(SpecvizError, match=message):
            verify_cost.measure(target, context, widths, repeats=repeats)


def test_sampled_bench_has_no_exactness_column(capsys, model_dirs, tmp_path):
    code = cli.main(["bench", "--target", str(model_dirs / "target"), "--drafters", "ngram", "--shapes", "chain",
                     "--prompts", str(model_dirs / "prompts.jsonl"), "--no-chat", "--categories", "beta",
                     "--limit-per-category", "1", "--max-new-tokens", "12", "--temperature", "0.8", "--no-hf",
                     "--k", "4",
                     "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    table = json.loads((tmp_path / "results.json").read_text())["summary"]["table"]
    assert table["ngram chain k=4"][OVERALL]["exact"] is None
    assert list(table) == [PLAIN_ROW, "ngram chain k=4"]


def test_hf_assisted_settings_are_restored_and_output_is_lossless():
    target = tiny.target("llama", VOCAB, layers=2, scale=20)
    draft = tiny.truncated(target.model, 1)
    config = GenerationConfig(max_new_tokens=24)
    before = draft.generation_config.num_assistant_tokens
    spec = build_specs(["model:x"], ["chain"], DraftBudget(k=5), hf=True)[-1]
    assert spec.hf_kwargs == {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant",
                              "assistant_confidence_threshold": 0.0}
    prompt = [3, 5, 7, 3, 5]
    result = run_hf(target, prompt, config, assistant=draft, assistant_settings=spec.hf_kwargs)
    assert draft.generation_config.num_assistant_tokens == before
    plain = run_specviz(target, prompt, config)
    speculative = run_specviz(target, prompt, config, DraftModelDrafter(draft, VOCAB), DraftBudget(k=5))
    assert result.token_ids == plain.token_ids == speculative.token_ids
    assert result.forwards == len(speculative.rounds)  # same draft, same k, same greedy rule: same rounds


def _round(drafted: int, accepted: int, ms: tuple[float, float, float]) -> Round:
    return Round(index=0, start=0, tokens=list(range(drafted)), parents=list(range(-1, drafted - 1)), text=[],
                 q_draft=None, confidence=None, sampled=False, p_target=[], target_top=[], draft_top=None,
                 target_entropy=[], accepted=list(range(accepted)), extra_token=0, extra_text="",
                 extra_kind="correction", committed=[0] * (accepted + 1), committed_text=[], draws=[],
                 residual_top=None, rule="greedy", lossless=True, draft_ms=ms[0], verify_ms=ms[1], other_ms=ms[2])


def test_speedup_and_predicted_speedup_formulas():
    prompt = BenchPrompt("1", "qa", "x")
    plain_rounds = [_round(0, 0, (0.0, 9.0, 1.0))] * 8  # 10 ms per token
    plain = RunResult([1] * 8, 0.1, plain_rounds)  # 80 tokens/s
    slower_plain = RunResult([1] * 8, 0.3, plain_rounds)  # 26.7 tokens/s
    spec = RunResult([1] * 8, 0.05, [_round(4, 3, (4.0, 12.0, 4.0))] * 2)  # tau 4, 20 ms per round
    sample = Sample("chain", prompt, spec, (plain, slower_plain), [1] * 8)
    assert sample_speedup(sample) == pytest.approx((8 / 0.05) / (16 / 0.4))  # against both neighbours' tokens/time
    assert sample_predicted(sample) == pytest.approx(4 * 10.0 / 20.0)
    suite = SuiteResult([RunSpec("chain", "specviz", "ngram", "chain", DraftBudget(k=4))], [sample],
                        [PromptRuns(prompt, 3, [plain, slower_plain])], 1.0)
    summary = summarise(suite, greedy=True)
    stats = summary.table["chain"][OVERALL]
    assert stats.tau == 4.0 and stats.acceptance_rate == 0.75 and stats.exact == 1
    assert stats.conditional == [1.0, 1.0, 1.0, 0.0] and stats.cumulative == [1.0, 1.0, 1.0, 0.0]
    assert (stats.draft_ms, stats.verify_ms, stats.other_ms) == (4.0, 12.0, 4.0)
    assert not stats.slower_than_plain
    assert summary.noise.median == pytest.approx(3.0)


def test_k_list_sweeps_chain_lengths_in_one_suite():
    """``--k 1,2,4``: one chain row per k (DSpark's schedule against every fixed length, side by side), trees and
    transformers' rows once, at the first k; the command line reproduces the list."""
    from specviz.bench import command

    specs = build_specs(["ngram"], ["chain", "tree"], DraftBudget(k=1), hf=True, chain_ks=(1, 2, 4))
    names = [s.name for s in specs]
    assert names[:3] == ["ngram chain k=1", "ngram chain k=2", "ngram chain k=4"]
    assert names[4:] == ["hf generate (plain)", "hf prompt lookup k=1 n=3"]
    assert specs[3].shape == "tree" and [s.budget.k for s in specs[:3]] == [1, 2, 4]
    scheduled = build_specs(["ngram", "ngram:auto"], ["chain"], DraftBudget(k=2), hf=True)
    assert [s.name for s in scheduled] == ["ngram chain k=2", "ngram:auto chain k=2", "hf generate (plain)",
                                           "hf prompt lookup k=2 n=3"]  # one transformers row for both
    parser, _ = cli.build_parser()
    args = parser.parse_args(["bench", "--drafters", "ngram", "--k", "2,1,7", "--no-hf"])
    command._resolve(args)
    assert args.k_list == [2, 1, 7] and args.values["k"] == 2 and "--k 2,1,7" in command._command(args)
