"""Calibration figures of the benchmark's confidence rows: the Brier score beside the ECE, on hand-built rounds
with a known answer, in results.json and in the markdown report, and through a small ``specviz bench`` run."""

import json

import pytest
import tiny

from specviz import cli
from specviz.bench import report
from specviz.bench.configs import RunSpec
from specviz.bench.prompts import BenchPrompt
from specviz.bench.runners import RunResult
from specviz.bench.suite import PromptRuns, Sample, SuiteResult
from specviz.bench.summary import OVERALL, PLAIN_ROW, brier, summarise
from specviz.engine import metrics
from specviz.engine.drafter import DraftBudget
from specviz.engine.round import Round

VOCAB = 64


def _chain(confidence: list[float] | None, accepted: int, head: list[float] | None = None,
           drafted: int | None = None) -> Round:
    drafted = len(confidence or head or []) if drafted is None else drafted
    return Round(index=0, start=0, tokens=list(range(drafted)), parents=list(range(-1, drafted - 1)), text=[],
                 q_draft=None, confidence=confidence, sampled=False, p_target=[], target_top=[], draft_top=None,
                 target_entropy=[], accepted=list(range(accepted)), extra_token=0, extra_text="",
                 extra_kind="correction", committed=[0] * (accepted + 1), committed_text=[], draws=[],
                 residual_top=None, rule="greedy", lossless=True, draft_ms=1.0, verify_ms=2.0, other_ms=0.5,
                 meta={} if head is None else {"confidence_head": head})


# Path confidences (the chance a node and all its ancestors survive), so the per-node predictions are the ratios:
# round A judges (0.9, accepted) and (0.18 / 0.9 = 0.2, rejected), round B (0.5, rejected); A's third node is never
# judged (its parent was rejected). The head's own ĉ: A judges (0.7, accepted) and (0.4, rejected).
ROUNDS = [_chain([0.9, 0.18, 0.054], accepted=1, head=[0.7, 0.4, 0.3]), _chain([0.5], accepted=0)]
BRIER = (0.1 ** 2 + 0.2 ** 2 + 0.5 ** 2) / 3  # (0.01 + 0.04 + 0.25) / 3
HEAD_BRIER = (0.3 ** 2 + 0.4 ** 2) / 2
ECE = (0.1 + 0.2 + 0.5) / 3  # one sample per bin


def test_brier_score_of_hand_built_pairs():
    assert brier([(0.9, True), (0.2, False), (0.5, False)]) == pytest.approx(BRIER)
    assert brier([(1.0, True), (0.0, False)]) == 0.0 and brier([(0.0, True)]) == 1.0
    assert brier([]) is None


def _suite(rounds: list[Round]) -> SuiteResult:
    prompt = BenchPrompt("1", "qa", "x")
    plain = RunResult([1] * 4, 0.1, [_chain([], accepted=0)] * 4)
    result = RunResult([1] * 4, 0.05, rounds)
    spec = RunSpec("dspark chain k=3", "specviz", "dspark", "chain", DraftBudget(k=3))
    return SuiteResult([spec], [Sample(spec.name, prompt, result, (plain, plain), [1] * 4)],
                       [PromptRuns(prompt, 3, [plain, plain])], 1.0)


def test_summary_brier_uses_the_same_pairs_as_the_ece():
    stats = summarise(_suite(ROUNDS), greedy=True).table["dspark chain k=3"][OVERALL]
    assert stats.confidence_brier == pytest.approx(BRIER) and stats.head_brier == pytest.approx(HEAD_BRIER)
    assert stats.confidence_ece == pytest.approx(ECE)  # the existing key keeps its meaning
    assert stats.confidence_ece == pytest.approx(metrics.calibration(ROUNDS).ece)
    assert stats.head_ece == pytest.approx(metrics.calibration(ROUNDS, head=True).ece)
    assert stats.head_ece == pytest.approx((0.3 + 0.4) / 2)
    none = summarise(_suite([_chain(None, accepted=1, drafted=3)]), greedy=True).table
    for row in none.values():  # no confidence anywhere (and the plain row): no figures
        assert row[OVERALL].confidence_brier is None and row[OVERALL].head_brier is None


def test_results_json_and_markdown_show_brier_beside_ece(tmp_path):
    suite = _suite(ROUNDS)
    summary = summarise(suite, greedy=True)
    machine = {key: "x" for key in ("cpu", "cores", "torch_threads", "gpu", "torch", "transformers", "python",
                                    "date", "load_average_start")}
    settings = {"target": "t", "max_new_tokens": 4, "temperature": 0.0, "chat": False, "prompts_file": "p",
                "prompt_count": 1, "selection": "all"}
    paths = report.write(tmp_path, summary, suite, {"command": "specviz bench", "machine": machine,
                                                    "settings": settings, "wall_s": 1.0})
    row = json.loads(paths["json"].read_text())["summary"]["table"]["dspark chain k=3"][OVERALL]
    assert row["confidence_brier"] == pytest.approx(BRIER) and row["head_brier"] == pytest.approx(HEAD_BRIER)
    assert row["confidence_ece"] == pytest.approx(ECE)
    markdown = paths["markdown"].read_text()
    assert "| configuration | ECE of the confidence used | ECE of the head's own ĉ | Brier of the confidence used " \
           "| Brier of the head's own ĉ |" in markdown
    assert f"| dspark chain k=3 | {ECE:.3f} | {0.35:.3f} | {BRIER:.3f} | {HEAD_BRIER:.3f} |" in markdown
    assert "Brier score = mean" in markdown  # its formula among the notes


def test_bench_run_reports_brier_for_a_draft_models_confidence(capsys, tmp_path):
    """A small ``specviz bench``: a draft model's chain row carries both figures, computed from its own rounds'
    (draft probability, verdict) pairs; the plain row none."""
    target = tiny.model("llama", VOCAB, layers=2, scale=20)
    for name, net in (("target", target), ("draft", tiny.truncated(target, 1))):
        net.save_pretrained(tmp_path / name)
        tiny.tokenizer(VOCAB).save_pretrained(tmp_path / name)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "alpha", "turns": ["w3 w5 w7 w3 w5 w7 w3"]}) + "\n")
    out = tmp_path / "out"
    code = cli.main(["bench", "--target", str(tmp_path / "target"), "--drafters", f"model:{tmp_path / 'draft'}",
                     "--shapes", "chain", "--prompts", str(prompts), "--no-chat", "--no-hf", "--max-new-tokens", "16",
                     "--k", "3", "--draft-quant", "off", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    table = json.loads((out / "results.json").read_text())["summary"]["table"]
    name = f"model:{tmp_path / 'draft'} chain k=3"
    chain = table[name][OVERALL]
    assert 0.0 <= chain["confidence_brier"] <= 1.0 and chain["head_brier"] is None
    assert 0.0 <= chain["confidence_ece"] <= 1.0
    assert table[PLAIN_ROW][OVERALL]["confidence_brier"] is None
    markdown = (out / "results.md").read_text()
    assert f"| {name} | {chain['confidence_ece']:.3f} | – | {chain['confidence_brier']:.3f} | – |" in markdown
