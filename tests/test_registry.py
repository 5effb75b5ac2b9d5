"""The drafter registry: each family registers itself; the CLI, the UI, the benchmark, ``api.make_drafter`` and
``specviz train`` read it; unknown specs are one-line errors naming the known families."""

from __future__ import annotations

import pkgutil
import sys
from dataclasses import replace

import pytest
import tiny

from specviz import api, settings
from specviz.bench import configs
from specviz.drafters import registry
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.engine.drafter import Drafter
from specviz.engine.tree import DraftTree
from specviz.errors import SpecvizError

VOCAB = 64


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", VOCAB, layers=2, scale=20)


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("draft") / "draft"
    tiny.truncated(target.model, 1).save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


def test_the_shipped_families_are_registered():
    names = [f.name for f in registry.families()]
    assert names[:2] == ["ngram", "model"]
    ngram, model = registry.get("ngram"), registry.get("model")
    assert (ngram.syntax, model.syntax) == ("ngram[:auto][:N]", "model:<name|dir|hub id>")
    assert ngram.feature_layers == () and model.feature_layers == ()  # neither needs the target's hidden states
    assert ngram.layers_for(30) == () and model.layers_for(30) == ()
    assert ngram.trainer is None and model.trainer == "draft-lm"
    assert ngram.reads == () and set(model.reads) >= {"draft_vocab", "draft_quant", "stochastic_tree",
                                                     "min_draft_prob"}
    assert ngram.default_spec == registry.DEFAULT_SPEC == "ngram" and model.argument_required
    assert all(f.description and "\n" not in f.description for f in registry.families())


def test_every_module_of_the_package_is_imported():
    import specviz.drafters as package

    for module in pkgutil.iter_modules(package.__path__):
        assert f"specviz.drafters.{module.name}" in sys.modules


def test_family_reads_are_declared_settings():
    for family in registry.families():
        assert all(name in settings.BY_NAME for name in family.reads), family.name
    for setting in settings.SETTINGS:
        if setting.drafter_only:
            assert registry.readers(setting.name), f"no family reads {setting.name}"


def test_shipped_checkpoints_come_from_the_models_registry():
    from specviz.models import drafts_for

    shipped = []
    for entry in drafts_for("smollm2-135m"):
        try:
            entry.resolve_path()
        except SpecvizError:
            continue
        shipped.append(f"model:{entry.name}")
    model = registry.get("model")
    assert model.shipped("smollm2-135m") == shipped
    assert model.shipped("/some/other/target") == []
    default = registry.default_specs("smollm2-135m")
    assert default[0] == "ngram" and all(spec in default for spec in shipped)
    menu = dict(registry.menu("smollm2-135m"))
    assert menu["n-gram lookup"] == ["ngram", "ngram:2", "ngram:4", "ngram:auto"]
    assert menu.get("draft model", []) == shipped


def test_make_drafter_builds_both_families(target, draft_dir):
    assert isinstance(api.make_drafter("ngram", target), NgramDrafter)
    assert api.make_drafter("ngram:5", target).max_ngram == 5
    assert api.make_drafter(" ngram ", target).max_ngram == 3
    drafter = api.make_drafter(f"model:{draft_dir}", target, draft_vocab=20, stochastic_tree=True)
    assert isinstance(drafter, DraftModelDrafter) and drafter.draft_vocab == 20 and drafter.stochastic_tree
    values = settings.validate({"draft_quant": "int8"})
    assert api.make_drafter(f"model:{draft_dir}", target, values).draft_quant == "int8"
    with pytest.raises(SpecvizError) as error:
        api.make_drafter(f"model:{draft_dir}", target, draft_vocab=-1)
    assert "draft-vocab must be" in one_line(error)


@pytest.mark.parametrize("spec, start", [("", "no drafter given"), ("  ", "no drafter given"),
                                         ("hydra", "unknown drafter"), ("nosuch:x", "unknown drafter"),
                                         (":ngram", "unknown drafter")])
def test_unknown_specs_are_one_line_errors_listing_the_families(target, spec, start):
    with pytest.raises(SpecvizError) as error:
        api.make_drafter(spec, target)
    message = one_line(error)
    assert message.startswith(start)
    assert all(family.syntax in message for family in registry.families())


@pytest.mark.parametrize("spec, says", [("model:", "ends in an empty part"), ("model:  ", "ends in an empty part"),
                                        ("model", "needs its argument"), ("eagle3:", "ends in an empty part"),
                                        ("dspark:raw:", "ends in an empty part"),
                                        ("hybrid:dspark:", "ends in an empty part")])
def test_a_spec_missing_its_argument_says_the_family_syntax(target, spec, says):
    """A trailing ':' is a part left out, not the bare name (the run label would carry it)."""
    with pytest.raises(SpecvizError) as error:
        api.make_drafter(spec, target)
    message = one_line(error)
    family = registry.get(spec.split(":")[0])
    assert says in message and family.syntax in message


@pytest.mark.parametrize("spec", ["ngram:x", "ngram:0", "ngram:9", "ngram:-1"])
def test_bad_ngram_size(target, spec):
    with pytest.raises(SpecvizError) as error:
        registry.parse(spec)
    assert "ngram takes a maximum n-gram size" in one_line(error)


def test_drafter_lists():
    assert registry.parse_list("ngram, model:smollm2-135m-draft") == ["ngram", "model:smollm2-135m-draft"]
    for text, fragment in (("", "is empty"), ("ngram,,ngram:2", "empty entry"), ("ngram,ngram", "listed twice"),
                           ("ngram,nosuch", "unknown drafter 'nosuch' in --drafters")):
        with pytest.raises(SpecvizError, match=fragment):
            registry.parse_list(text)


def test_cli_ui_and_train_read_the_registry():
    from specviz import cli
    from specviz.training.trainers import TRAINERS
    from specviz.ui import runner

    parser, _ = cli.build_parser()
    generate = next(a for a in parser._actions if hasattr(a, "choices") and a.choices and "generate" in a.choices)
    drafter = next(a for a in generate.choices["generate"]._actions if a.dest == "drafter")
    assert all(f.syntax in drafter.help for f in registry.families())
    assert [spec for _, spec in runner.drafter_menu("smollm2-135m")] == [
        s for _, specs in registry.menu("smollm2-135m") for s in specs]
    labels = dict((spec, label) for label, spec in runner.drafter_menu("smollm2-135m"))
    assert labels["ngram"].startswith("n-gram lookup")
    assert set(registry.trainers()) <= set(TRAINERS) and "draft-lm" in registry.trainers()


def test_markdown_table_has_a_row_per_family():
    table = registry.markdown_table()
    lines = table.splitlines()
    assert lines[0].startswith("| family |") and len(lines) == 2 + len(registry.families())
    for family in registry.families():
        assert f"`{family.syntax}`".replace("|", "\\|") in table  # pipes escaped inside table cells
    assert "`specviz train draft-lm`" in table and "`--draft-vocab`" in table


class _Echo(Drafter):
    """Proposes the last context token, ``n`` times (a toy family for the extension test)."""

    name = "echo"

    def __init__(self, n: int):
        self.n = n

    def propose(self, context, budget, sampling, generator):
        return DraftTree.chain([context[-1]] * min(self.n, budget.k))


@pytest.fixture
def echo_family():
    family = registry.register(registry.DrafterFamily(
        name="echo", syntax="echo[:N]", title="echo", description="repeat the last token",
        build=lambda argument, target, values: _Echo(int(argument or 1)),
        check=lambda argument: argument if argument == "" or argument.isdigit() else
        (_ for _ in ()).throw(SpecvizError(f"echo takes a count, got {argument!r}")),
        default_spec="echo", order=99))
    yield family
    registry._FAMILIES.pop("echo")


def test_a_new_family_needs_no_edit_elsewhere(target, echo_family, capsys):
    """Registering is all it takes: make_drafter, bench --drafters, the bench's default list and the UI offer it."""
    from specviz.ui import runner

    drafter = api.make_drafter("echo:2", target)
    run = api.start(target, [3, 4, 5, 3, 4], drafter, replace(api.budget_for(settings.validate()), k=2),
                    api.GenerationConfig(max_new_tokens=8))
    plain = api.plain_decode(target, [3, 4, 5, 3, 4], api.GenerationConfig(max_new_tokens=8))
    assert run.run().token_ids == plain.token_ids  # lossless whatever it drafts
    assert registry.parse_list("ngram,echo:3", "--drafters") == ["ngram", "echo:3"]
    assert "echo" in registry.default_specs("smollm2-135m")
    assert "echo" in [spec for _, spec in runner.drafter_menu("smollm2-135m")]
    specs = configs.build_specs(["echo"], ["chain"], api.budget_for(settings.validate()), hf=True)
    assert [s.name for s in specs] == ["echo chain k=2", "hf generate (plain)"]  # no transformers counterpart
    with pytest.raises(SpecvizError, match="echo takes a count"):
        registry.parse("echo:x")
