"""One declaration of the run settings: the CLI options, the UI widgets, the benchmark's command line and the
validation all derive from ``specviz.settings``, with one set of defaults."""

from __future__ import annotations

import argparse
import json
import math
import shlex

import pytest
import tiny

from specviz import api, cli, settings
from specviz.bench import command as bench_command
from specviz.drafters import registry
from specviz.engine.drafter import LIMITS, DraftBudget
from specviz.errors import SpecvizError

NUMBERS = [s for s in settings.SETTINGS if s.type in (int, float)]


def subparser(name: str) -> argparse.ArgumentParser:
    parser, _ = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def parse(*argv: str) -> argparse.Namespace:
    parser, _ = cli.build_parser()
    return parser.parse_args(list(argv))


def bench_args(*argv: str) -> argparse.Namespace:
    args = parse("bench", *argv)
    bench_command._resolve(args)
    return args


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


# ---- the CLI ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_every_setting_is_an_option_with_the_declared_default(command):
    parser = subparser(command)
    for setting in settings.SETTINGS:
        actions = [a for a in parser._actions if a.dest == setting.name]
        assert actions, f"{command} has no option for {setting.name}"
        flags = {flag for action in actions for flag in action.option_strings}
        assert set(setting.flags) | set(setting.off_flags) == flags, setting.name
        assert all(action.default == setting.default for action in actions), setting.name
        assert all(action.help for action in actions), setting.name


def test_parsed_defaults_are_the_declaration():
    assert dict(settings.from_args(parse("generate", "--prompt", "x"))) == settings.defaults()
    args = bench_args("--drafters", "ngram")
    assert dict(args.values) == settings.defaults() and args.draft_quant_list == ["auto"]


def test_one_set_of_defaults():
    from specviz.models.registry import DEFAULT_TARGET
    from specviz.ui import runner

    defaults = settings.defaults()
    assert defaults["target"] == DEFAULT_TARGET
    assert (defaults["k"], defaults["width"], defaults["depth"], defaults["max_nodes"]) == (2, 3, 2, 4)
    assert defaults["max_new_tokens"] == 128 and defaults["chat"] is True and defaults["tree"] is True
    request = runner.RunRequest(prompt="x")
    assert {name: getattr(request, name) for name in defaults} == defaults and request.drafter == "ngram"
    budget = api.budget_for(settings.validate())
    assert budget.to_dict() == {name: defaults[name] for name in budget.to_dict()}
    assert api.config_for(settings.validate()).max_new_tokens == 128
    assert parse("generate", "--prompt", "x").drafter is None  # resolved for the target: registry.default_for


def test_the_default_drafter_is_the_fastest_measured_where_its_checkpoint_ships():
    from specviz.models.registry import DEFAULT_TARGET

    assert registry.PREFERRED_SPECS[0] in registry.get("hybrid").ready(DEFAULT_TARGET)
    assert registry.default_for(DEFAULT_TARGET) == "hybrid"
    assert registry.default_for("some-other-model") == registry.DEFAULT_SPEC == "ngram"  # needs no checkpoint
    assert "hybrid where its checkpoint is shipped for the target, else ngram" in registry.default_help()


def test_old_command_lines_keep_working():
    args = parse("generate", "--chat", "--k", "4", "--tree", "--budget", "24", "--baseline", "--json", "--prompt", "x")
    values = settings.from_args(args)
    assert (values["chat"], values["k"], values["tree"], values["max_nodes"]) == (True, 4, True, 24)
    assert args.baseline and args.json
    assert settings.from_args(parse("generate", "--no-chat", "--max-nodes", "9", "--prompt", "x"))["max_nodes"] == 9
    assert settings.from_args(parse("generate", "--no-chat", "--prompt", "x"))["chat"] is False
    args = bench_args("--drafters", "ngram,ngram:2", "--shapes", "chain", "--draft-quant", "off,int8", "--budget", "8")
    assert args.drafter_list == ["ngram", "ngram:2"] and args.shape_list == ["chain"]
    assert args.draft_quant_list == ["off", "int8"] and args.values["max_nodes"] == 8
    assert bench_args("--tree", "--drafters", "ngram").shape_list == ["tree"]


def generate_values(*argv: str) -> settings.Values:
    return settings.from_args(parse("generate", *argv, "--prompt", "x"))


def test_the_default_shape_is_a_small_tree_and_a_typed_k_asks_for_a_chain():
    def shape(*argv: str) -> tuple[bool, int]:
        values = generate_values(*argv)
        return values["tree"], values["k"]

    assert shape() == (True, 2)  # the declared default: the 4-node tree
    assert shape("--k", "4") == (False, 4)  # a chain length alone never drafts the default tree
    assert shape("--chain") == (False, 2) and shape("--chain", "--k", "3") == (False, 3)
    assert shape("--tree", "--k", "4") == (True, 4) and shape("--k", "4", "--tree") == (True, 4)
    assert shape("--width", "4") == (True, 2)  # a tree size keeps the tree
    # the reproducible command line names the shape, so a typed k cannot turn a tree into a chain on the way back
    for argv in ((), ("--chain",), ("--k", "5"), ("--tree", "--k", "5")):
        values = generate_values(*argv)
        words = settings.command_args(values)
        assert ("--tree" in words) == values["tree"] and ("--chain" in words) == (not values["tree"])
        assert generate_values(*words) == values
    # bench: both shapes unless one is typed
    assert bench_args("--drafters", "ngram").shape_list == ["chain", "tree"]
    assert bench_args("--drafters", "ngram", "--k", "1,2").shape_list == ["chain", "tree"]
    assert bench_args("--drafters", "ngram", "--chain").shape_list == ["chain"]

def test_target_forward_is_a_setting_of_generate_and_bench():
    assert settings.from_args(parse("generate", "--target-forward", "hf", "--prompt", "x"))["target_forward"] == "hf"
    assert bench_args("--target-forward", "fast", "--drafters", "ngram").values["target_forward"] == "fast"
    with pytest.raises(SpecvizError, match="target-forward must be one of auto, fast, hf, got 'turbo'"):
        settings.from_args(parse("generate", "--target-forward", "turbo", "--prompt", "x"))


def test_quick_shortens_only_what_was_not_given():
    assert bench_args("--quick", "--drafters", "ngram").values["max_new_tokens"] == bench_command.QUICK[
        "max_new_tokens"]
    assert bench_args("--quick", "--max-new-tokens", "128", "--drafters", "ngram").values["max_new_tokens"] == 128
    assert bench_args("--quick", "--drafters", "ngram").limit_per_category == 1
    assert bench_args("--drafters", "ngram").values["max_new_tokens"] == 128


# ---- validation --------------------------------------------------------------------------------------------------
def out_of_range(setting: settings.Setting) -> list:
    bad = []
    if setting.low is not None:
        bad.append(setting.low - 1 if not setting.open_low else setting.low)
    if setting.high is not None:
        bad.append(setting.high + 1 if not setting.open_high else setting.high)
    return bad


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.name)
def test_out_of_range_values_are_one_line_errors(setting):
    for value in out_of_range(setting):
        with pytest.raises(SpecvizError) as error:
            settings.check(setting.name, value)
        assert one_line(error).startswith(f"{setting.cli_name} must be")
    for value in (float("nan"), float("inf"), True, "3", None):
        with pytest.raises(SpecvizError):
            settings.check(setting.name, value)
    if setting.type is int:
        with pytest.raises(SpecvizError):
            settings.check(setting.name, 2.5)
        assert settings.check(setting.name, float(setting.default)) == setting.default  # a number box sends 4.0 for 4


def malformed(setting: settings.Setting) -> list[str]:
    """Texts that are not a value of a number setting: no number, no finite number, or (for an integer) no integer."""
    return ["", "four", "nan", "inf", "-inf", "1e400", *(["2.5"] if setting.type is int else [])]


@pytest.mark.parametrize("command", ["generate", "bench"])
@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.name)
def test_malformed_numbers_on_the_command_line_name_the_setting_and_its_range(capsys, command, setting):
    """``--k 2.5`` is refused, not rounded, and ``--k four`` says what k takes (argparse said "invalid int value")."""
    extra = ["--prompt", "x"] if command == "generate" else ["--drafters", "ngram"]
    for text in malformed(setting):
        code = cli.main([command, "--target", "/no/such/target", *extra, f"{setting.flags[0]}={text}"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, (text, err)
        assert err.startswith((f"error: {setting.cli_name} must be ", f"error: --{setting.cli_name} is empty")), err
        assert setting.describe_bounds(setting.low, setting.high) in err, (text, err)
    typed = parse("generate", "--prompt", "x", setting.flags[0], f"{setting.default:e}")  # any spelling of a number
    assert settings.from_args(typed)[setting.name] == setting.default


@pytest.mark.parametrize("command", ["generate", "bench"])
@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.name)
def test_out_of_range_on_the_command_line(capsys, command, setting):
    """One line, exit code 2, before anything loads (the target does not exist)."""
    for value in out_of_range(setting):
        text = str(int(value)) if setting.type is int else repr(float(value))
        extra = ["--prompt", "x"] if command == "generate" else ["--drafters", "ngram"]
        code = cli.main([command, "--target", "/no/such/target", *extra, setting.flags[0], text])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"{setting.cli_name} must be" in err, err


def test_choices_and_unknown_names():
    with pytest.raises(SpecvizError, match="draft-quant must be one of auto, off, int8, got 'int4'"):
        settings.check("draft_quant", "int4")
    with pytest.raises(SpecvizError, match="unknown setting 'budget'"):
        settings.validate({"budget": 3})
    with pytest.raises(SpecvizError, match="--draft-quant is empty"):
        settings.split("draft_quant", " , ")
    assert settings.split("draft_quant", "int8, off,int8") == ["int8", "off"]


def test_values_are_checked_once_and_kept():
    values = settings.validate({"k": 4.0, "temperature": 1})
    assert values["k"] == 4 and isinstance(values["k"], int) and values["temperature"] == 1.0
    assert settings.validate(values) is values  # already checked: not again
    assert values.replace(k=3)["k"] == 3
    with pytest.raises(SpecvizError, match="k must be"):
        values.replace(k=0)
    with pytest.raises(TypeError):
        settings.Values({"k": 0})


def test_engine_limits_are_the_declared_bounds():
    for name, (low, high) in LIMITS.items():
        assert (low, high) == (settings.get(name).low, settings.get(name).high)
    with pytest.raises(SpecvizError):
        DraftBudget(k=settings.get("k").high + 1)


# ---- the UI -------------------------------------------------------------------------------------------------------
def test_ui_widgets_follow_the_declaration():
    import gradio as gr

    from specviz.ui import settings as panel_settings

    with gr.Blocks():
        panel = panel_settings.Settings.build()
    assert [c.elem_id for c in panel.inputs] == [
        "prompt", "mode", "target", "target-forward", "drafter", "shape", "k", "width", "depth", "max-nodes",
        "temperature", "top-p", "seed", "max-new-tokens", "stochastic-tree", "min-draft-prob", "draft-vocab",
        "draft-quant"]
    for setting in panel_settings.SHOWN:
        component = panel.widgets[setting.name]
        low, high = setting.ui_range
        # a first-screen setting says what it does in plain words (tests/test_first_screen.py), the rest the CLI help
        assert component.label == setting.label, setting.name
        assert (setting.ui_info[1:] if setting.ui_basic else setting.help) in component.info, setting.name
        if setting.type in (int, float):  # a bare number box: the check, not Gradio, refuses (see test_ui)
            assert isinstance(component, gr.Number), setting.name
            assert (component.minimum, component.maximum, component.precision) == (None, None, None), setting.name
            assert setting.low <= low and (setting.high is None or high <= setting.high)
        if setting.name != "target":
            assert component.value == panel_settings.to_widget(setting, setting.default), setting.name
        if setting.choices:
            assert [c[1] for c in component.choices] == list(setting.choices)
        if setting.why and not setting.ui_basic:
            assert "BENCHMARKS.md" in component.info
        if setting.drafter_only:
            titles = " / ".join(family.title for family in registry.readers(setting.name))
            assert component.info.startswith(f"{titles} only: ")
    assert panel.target.value == settings.default("target")
    assert panel.drafter.value == registry.default_for(panel.target.value)
    assert [v for _, v in panel.drafter.choices] == [s for _, s in registry.plain_menu(panel.target.value)]


def test_ui_request_round_trips_and_checks_with_the_ui_range():
    from specviz.ui import runner
    from specviz.ui import settings as panel_settings

    request = runner.RunRequest(prompt="x", tree=True, k=5, max_nodes=9, temperature=0.5, draft_quant="int8",
                                target_forward="hf", chat=False)
    values = panel_settings.values_for(request)
    assert panel_settings.request(*values) == request
    slider = list(values)
    slider[panel_settings.INPUT_NAMES.index("k")] = 5.0  # sliders send floats
    rebuilt = panel_settings.request(*slider)
    assert rebuilt.k == 5 and isinstance(rebuilt.k, int)
    for name, value, fragment in (("max_new_tokens", 600, "max-new-tokens must be an integer in [1, 512] here"),
                                  ("k", 17, "k must be an integer in [1, 16] here"),
                                  ("chat", "markdown", "prompt format must be chat or raw"),
                                  ("tree", "star", "draft shape must be chain or tree"),
                                  ("drafter", "nosuch", "unknown drafter 'nosuch'")):
        broken = list(values)
        broken[panel_settings.INPUT_NAMES.index(name)] = value
        with pytest.raises(SpecvizError) as error:
            panel_settings.request(*broken)
        assert fragment in one_line(error)
    with pytest.raises(SpecvizError, match="max-new-tokens must be an integer in \\[1, 4096\\]"):
        settings.check("max_new_tokens", 5000)  # the CLI's range is wider than the UI's


# ---- the benchmark's command line -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--drafters", "ngram"],
    ["--quick", "--drafters", "ngram,ngram:2", "--no-chat", "--no-hf"],
    ["--drafters", "model:smollm2-135m-draft", "--k", "1", "--width", "2", "--depth", "1", "--budget", "2",
     "--draft-quant", "off,int8", "--limit-per-category", "2", "--out", "bench-out/k1 int8"],
    ["--drafters", "ngram", "--tree", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "20", "--seed", "3",
     "--min-draft-prob", "0.4", "--draft-vocab", "16384", "--stochastic-tree", "--categories", "qa,math",
     "--hf-defaults", "--threads", "2", "--target-forward", "hf", "--device", "cpu", "--max-new-tokens", "64"],
    [],
])
def test_bench_command_line_round_trips(argv):
    first = bench_args(*argv)
    line = bench_command._command(first)
    words = shlex.split(line)
    assert words[:4] == ["python", "-m", "specviz", "bench"]
    again = bench_args(*words[4:])
    assert dict(again.values) == dict(first.values)
    assert again.drafter_list == first.drafter_list and again.shape_list == first.shape_list
    assert again.draft_quant_list == first.draft_quant_list
    for option in bench_command.OPTIONS:
        if option.name not in ("drafters", "shapes"):
            assert getattr(again, option.name) == getattr(first, option.name), option.name
    assert bench_command._command(again) == line
    assert "--budget" not in line and "--max-nodes" in line  # canonical names


# ---- an end-to-end run with the old command line ------------------------------------------------------------------
def test_old_generate_command_line_runs(capsys, tmp_path):
    target = tiny.save_tiny_model(tmp_path / "target", seed=1)
    code = cli.main(["generate", "--target", str(target), "--chat", "--k", "4", "--tree", "--budget", "24",
                     "--baseline", "--json", "--prompt", "tell a story about the cat", "--max-new-tokens", "12"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["identical"] and len(result["token_ids"]) <= 12
    assert math.isfinite(result["tau"])


def test_only_a_declared_bound_is_open():
    """top-p's declared range is (0, 1]; the UI narrows it to [0.05, 1], whose 0.05 the slider offers and must pass."""
    assert settings.check("top_p", 0.05, ui=True) == 0.05
    with pytest.raises(SpecvizError, match=r"top-p must be a number in \[0.05, 1\] here"):
        settings.check("top_p", 0.04, ui=True)
    with pytest.raises(SpecvizError, match=r"top-p must be a number in \(0, 1\]"):
        settings.check("top_p", 0.0)
    assert settings.check("min_draft_prob", 0.95, ui=True) == 0.95
    with pytest.raises(SpecvizError, match="seed is empty or not a number: give an integer"):
        settings.check("seed", None)
