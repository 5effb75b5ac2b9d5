"""The CLI: --json output, greedy identity against --baseline, traces, and one-line errors with exit code 2."""

import json

import pytest
import tiny

from specviz import cli
from specviz.engine import trace


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny.model("llama", 64, layers=2, scale=20)
    for name, net in (("target", target), ("draft", tiny.truncated(target, 1))):
        net.save_pretrained(root / name)
        tiny.tokenizer(64).save_pretrained(root / name)
    return root


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("shape", [["--k", "4"], ["--tree", "--width", "3", "--depth", "4", "--budget", "12"]])
@pytest.mark.parametrize("drafter", ["ngram", "model", "model-int8"])
def test_generate_json_with_baseline(capsys, model_dirs, tmp_path, shape, drafter):
    spec = "ngram" if drafter == "ngram" else f"model:{model_dirs / 'draft'}"
    quant = ["--draft-quant", "int8"] if drafter == "model-int8" else []
    code, out, err = run_cli(capsys, "generate", "--no-chat", "--target", model_dirs / "target", "--drafter", spec,
                             *shape, *quant, "--prompt", "w3 w5 w7 w3 w5", "--max-new-tokens", 30, "--baseline",
                             "--json", "--trace", tmp_path / "new" / "t.jsonl")  # its folder made on writing
    assert code == 0, err
    result = json.loads(out)
    for key in ("text", "token_ids", "rounds", "tau", "acceptance_rate", "tokens_per_s", "baseline_token_ids",
                "baseline_tokens_per_s", "speedup"):
        assert key in result
    assert len(result["token_ids"]) == 30
    assert result["token_ids"] == result["baseline_token_ids"] and result["identical"]
    assert result["tau"] == pytest.approx(30 / result["rounds"])
    assert trace.read(tmp_path / "new" / "t.jsonl").token_ids == result["token_ids"]


def test_sampled_generation_is_reproducible(capsys, model_dirs):
    argv = ["generate", "--no-chat", "--target", model_dirs / "target", "--drafter", f"model:{model_dirs / 'draft'}",
            "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--prompt", "w1 w2", "--max-new-tokens", 20,
            "--chain", "--json"]
    first = json.loads(run_cli(capsys, *argv)[1])
    second = json.loads(run_cli(capsys, *argv)[1])
    assert first["token_ids"] == second["token_ids"] and first["rule"] == "rejection-sampling"


@pytest.mark.parametrize("argv, fragment", [
    (["generate", "--prompt", ""], "empty"),
    (["generate", "--prompt", "hi", "--k", "0"], "k must be"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "99999999"], "max-new-tokens"),
    (["generate", "--prompt", "hi", "--temperature", "-2"], "temperature"),
    (["generate", "--prompt", "hi", "--target", "/no/such/dir"], "no such file"),
    (["generate", "--prompt", "hi", "--target", "no-such-registry-name"], "no-such-registry-name"),
    (["generate", "--prompt", "hi", "--k", "four"], "k must be an integer in [1, 32], got 'four'"),
    (["generate", "--prompt", "hi", "--k", "2.5"], "k must be an integer in [1, 32], got 2.5"),
    (["generate", "--prompt", "hi", "--seed", "1e400"],
     "seed must be an integer in [0, 9223372036854775807], got '1e400'"),
    (["generate", "--prompt", "hi", "--temperature", "nan"], "temperature must be a number in [0, 10], got 'nan'"),
    (["generate", "--prompt", "hi", "--target", " "], "target is empty"),
    (["generate", "--prompt", "hi", "--draft-quant", "int4"], "draft-quant must be one of auto, off, int8"),
    (["frobnicate"], "invalid choice"),
])
def test_user_errors_are_one_line_with_exit_2(capsys, argv, fragment):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err
    assert "Traceback" not in err


def test_bad_outputs_and_inputs_fail_before_the_model_loads(capsys, tmp_path):
    """Nothing loads (the target does not exist): each line names the bad input, not the missing model."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for argv, says in ((["--trace", str(a_file / "t.jsonl")], "--trace"), (["--trace", str(tmp_path)], "is a folder"),
                       (["--trace", ""], "--trace is empty"), (["--drafter", ""], "no drafter given"),
                       (["--drafter", "eagle3:"], "ends in an empty part")):
        code, _, err = run_cli(capsys, "generate", "--target", tmp_path / "no-model", "--prompt", "hi", *argv)
        assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_prompt_that_is_not_utf8_is_one_line(capsys, model_dirs):
    bad = b"abc\xff\xfe(def".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    code, _, err = run_cli(capsys, "generate", "--no-chat", "--target", model_dirs / "target", "--prompt", bad)
    assert code == 2 and "not valid UTF-8" in err and "Traceback" not in err


def test_unknown_drafter_and_long_prompt(capsys, model_dirs):
    code, _, err = run_cli(capsys, "generate", "--target", model_dirs / "target", "--drafter", "magic",
                           "--prompt", "w1")
    assert code == 2 and "unknown drafter" in err
    code, _, err = run_cli(capsys, "generate", "--no-chat", "--target", model_dirs / "target", "--prompt", "w1 " * 2000)
    assert code == 2 and "reads at most" in err


@pytest.mark.parametrize("module, argv, says", [
    ("specviz.ui.examples", ["record", "--categories", "nope"], "--categories 'nope': give some of"),
    ("specviz.ui.examples", ["record", "--drafters", "foo"], "unknown drafter 'foo' in --drafters"),
    ("specviz.ui.examples", ["record", "--out", "{file}"], "is a file, not a folder"),
    ("specviz.training.export", ["--run", "/no/such/run", "--dest", "{tmp}/dest"], "metrics.json is missing"),
    ("tools.draft_forward", ["--context", "-1"], "--context must be 1 or more"),
    ("tools.thin_rows", ["--rows", "0"], "--rows must be 1 or more"),
    ("tools.attention_ab", ["--contexts", "100,x"], "--contexts takes comma-separated whole numbers"),
    ("tools.attention_ab", ["--width", "65"], "--width must be at most 64"),
    ("tools.ui_perf", ["--category", "nope"], "--category 'nope' has no example prompt"),
    ("tools.live_speedup", ["--repeats", "0"], "--repeats must be 1 or more"),
    ("tools.served_cost", ["--url", "http://127.0.0.1:9", "--contexts", "0"], "--contexts takes context lengths"),
    ("tools.served_cost", ["--url", "http://127.0.0.1:9"], "cannot reach the server"),
])
def test_the_documented_helper_commands_refuse_bad_input_in_one_line(module, argv, says, tmp_path, capsys):
    """The helpers' entry points (``python -m specviz.<helper>``, ``python tools/<tool>.py``) treat errors as the CLI
    does: one line, exit 2, no traceback."""
    import importlib

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code = importlib.import_module(module).main([a.format(file=a_file, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


@pytest.mark.parametrize("argv", [["generate", "--drafter", "eagle", "--prompt", "hi"],
                                  ["bench", "--drafters", "ngram,eagle", "--quick", "--no-hf"]])
def test_a_bare_drafter_with_nothing_shipped_is_refused_before_the_target_loads(argv, capsys, monkeypatch):
    """No EAGLE-1 head is shipped for the default target: one line at once, not after loading the target."""
    from specviz.models import loader

    monkeypatch.setattr(loader, "_load_uncached", lambda *a: pytest.fail("the target loaded"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[-1]] and "no EAGLE-1 head is shipped for smollm2-135m" in err[-1]
    assert "eagle:<dir|hub id>" in err[-1]
