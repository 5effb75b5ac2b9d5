"""Bad benchmark input fails with one clear line (exit code 2), before any model is loaded."""

import json

import pytest

from specviz import cli
from specviz.bench.prompts import DEFAULT_PROMPTS, BenchPrompt, load_prompts, select
from specviz.errors import SpecvizError

MISSING_TARGET = "/nonexistent/target-dir"  # loading it would fail with a different message: validation comes first


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"question_id": 1, "category": "qa", "turns": ["What is 2 + 2?"]})


@pytest.mark.parametrize("lines, fragment", [
    (["{not json"], "not valid JSON"),
    ([GOOD, "[1, 2]"], "expected a JSON object"),
    ([json.dumps({"question_id": 1, "turns": ["x"]})], "missing category"),
    ([json.dumps({"question_id": 1, "category": "qa", "turns": []})], "turns must be a list"),
    ([json.dumps({"question_id": 1, "category": "qa", "turns": ["   "]})], "turns must be a list"),
    ([json.dumps({"question_id": 1, "category": "", "turns": ["x"]})], "category must be a non-empty string"),
    (["", "  "], "has no prompts"),
])
def test_malformed_prompts_file(capsys, tmp_path, lines, fragment):
    path = write(tmp_path / "p.jsonl", lines)
    code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", "ngram", "--prompts", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    if lines[0].strip():
        assert f"{path}:" in err  # names the file and line


def test_missing_prompts_file(capsys, tmp_path):
    code = cli.main(["bench", "--target", MISSING_TARGET, "--prompts", str(tmp_path / "nope.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and err.count("\n") == 1


@pytest.mark.parametrize("drafters, fragment", [
    ("ngram,nosuch", "unknown drafter 'nosuch'"),
    ("model:", "drafter 'model:' in --drafters ends in an empty part"),
    ("ngram:x", "maximum n-gram size"),
    ("ngram,,model:a", "empty entry"),
    ("", "--drafters is empty"),
    ("ngram,ngram", "listed twice"),
])
def test_bad_drafter_list(capsys, tmp_path, drafters, fragment):
    path = write(tmp_path / "p.jsonl", [GOOD])
    code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", drafters, "--prompts", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_an_unwritable_out_fails_before_the_suite(capsys, tmp_path):
    """Checked before the target loads (it does not exist here), so a bad --out never costs a finished run."""
    path = write(tmp_path / "p.jsonl", [GOOD])
    a_file = write(tmp_path / "a-file", [GOOD])
    for out, says in ((a_file, "is a file, not a folder"), (a_file / "below", "cannot create that folder")):
        code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", "ngram", "--prompts", str(path),
                         "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and says in err and err.count("\n") == 1, err
    code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", "ngram", "--prompts", str(tmp_path)])
    assert code == 2 and "is a folder, not a file" in capsys.readouterr().err


def test_a_refused_command_leaves_no_out_folder(capsys, tmp_path):
    """The --out check creates nothing: a later refusal (here the drafter list) must not leave an empty folder."""
    path = write(tmp_path / "p.jsonl", [GOOD])
    out = tmp_path / "new" / "run"
    code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", "magic", "--prompts", str(path),
                     "--out", str(out)])
    assert code == 2 and "unknown drafter" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert list(tmp_path.iterdir()) == [path]  # nor the write check's file


@pytest.mark.parametrize("argv, fragment", [
    (["--categories", "qa,nonsense"], "category 'nonsense' has no prompts"),
    (["--categories", " , "], "--categories is empty"),
    (["--limit-per-category", "0"], "limit-per-category must be at least 1"),
    (["--shapes", "chain,star"], "--shapes takes chain, tree"),
    (["--k", "0"], "k must be"),
    (["--k", "2,0"], "k must be"),
    (["--k", "2,x"], "k must be"),
    (["--k", "2,,3"], "has an empty entry"),
    (["--shapes", "chain,,"], "--shapes takes chain, tree"),
    (["--shapes", ""], "--shapes takes chain, tree"),  # once meant "not given": the whole default suite ran
    (["--threads", "0"], "threads must be"),
    (["--draft-quant", "off,int4"], "draft-quant must be one of auto, off, int8"),
    (["--draft-quant", ","], "--draft-quant is empty"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
])
def test_bad_settings(capsys, tmp_path, argv, fragment):
    path = write(tmp_path / "p.jsonl", [GOOD])
    code = cli.main(["bench", "--target", MISSING_TARGET, "--drafters", "ngram", "--prompts", str(path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err


def test_select_keeps_file_order_per_category():
    prompts = [BenchPrompt(str(i), c, f"p{i}") for i, c in enumerate("abab")]
    assert [p.question_id for p in select(prompts, None, 1)] == ["0", "1"]
    assert [p.question_id for p in select(prompts, ["b"], None)] == ["1", "3"]
    with pytest.raises(SpecvizError, match="category 'c' has no prompts"):
        select(prompts, ["c"], None)


def test_shipped_dev_prompts_load():
    prompts = load_prompts(DEFAULT_PROMPTS)
    assert len(prompts) == 240
    counts = {c: sum(p.category == c for p in prompts) for c in {p.category for p in prompts}}
    assert counts["qa"] == 40 and counts["writing"] == 5 and len(counts) == 13


def test_prompt_too_long_for_the_context_fails_before_any_run(tmp_path):
    import tiny

    from specviz.bench.configs import build_specs
    from specviz.bench.suite import run_suite
    from specviz.engine.drafter import DraftBudget
    from specviz.engine.loop import GenerationConfig

    target = tiny.target("llama", 32, layers=1, max_positions=64)
    prompts = [BenchPrompt("7", "qa", " ".join(f"w{i % 30}" for i in range(60)))]
    specs = build_specs(["ngram"], ["chain"], DraftBudget(k=4), hf=False)
    with pytest.raises(SpecvizError, match=r"prompt #7 \(qa\) is 60 tokens"):
        run_suite(target, prompts, specs, {}, GenerationConfig(max_new_tokens=8), chat=False)
