"""The benchmark on the real embedded target (SmolLM2-135M-Instruct) with n-gram drafting: a CI smoke test.

No speed assertion (CI machines are shared); only that every configuration runs, is lossless, and is reported.
"""

import argparse
import json

import pytest

from specviz import cli
from specviz.bench import command
from specviz.bench.prompts import DEFAULT_PROMPTS, load_prompts, select
from specviz.bench.summary import OVERALL, PLAIN_ROW
from specviz.models import DEFAULT_TARGET, get_entry
from specviz.models.embedded import available

_TARGET = get_entry(DEFAULT_TARGET)
# installed, or fetched before (`make test` fetches it): this smoke test never downloads on its own
pytestmark = pytest.mark.skipif(available(_TARGET.package or "", _TARGET.location, _TARGET.wheel) is None,
                                reason="the embedded default target is neither installed nor fetched (make test "
                                       "fetches it)")


def test_quick_picks_its_three_categories_from_the_default_prompts():
    """``bench --quick`` on the shipped prompt file: one prompt of each of ``QUICK_CATEGORIES``, in file order."""
    args = argparse.Namespace(categories=None, quick=True)
    every = load_prompts(DEFAULT_PROMPTS)
    assert command.chosen_categories(args, every) == list(command.QUICK_CATEGORIES)
    chosen = select(every, command.chosen_categories(args, every), 1)
    assert [p.category for p in chosen] == list(command.QUICK_CATEGORIES)
    assert command.chosen_categories(argparse.Namespace(categories="qa, coding", quick=True), every) == ["qa",
                                                                                                         "coding"]


def test_quick_bench_on_the_default_target(capsys, tmp_path):
    """``bench --quick`` as documented, on one of its three prompts (the choice of three is tested above) and 8 new
    tokens (the rows, not their speed, are under test): every shipped drafter, chain and tree, and the transformers
    rows."""
    code = cli.main(["bench", "--quick", "--categories", "qa", "--max-new-tokens", "8", "--out", str(tmp_path)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    data = json.loads((tmp_path / "results.json").read_text())
    table = data["summary"]["table"]
    draft = "model:smollm2-135m-draft"
    # the declared defaults (specviz.settings): chain k = 2, a 4-node tree (width 3, depth 2)
    shipped = ["ngram", draft, "eagle3", "mtp", "medusa", "dflash", "dspark", "retrieval", "lookahead", "hybrid"]
    # every family with a model reads draft_quant, whose default (auto) drafts in int8 on CPU: the rows say so
    free = ("ngram", "retrieval", "lookahead")  # no model: no draft weights
    rows = [f"{d} {shape}{'' if d in free else ' int8'}" for d in shipped for shape in ("chain k=2",
                                                                                        "tree w=3 d=2 n<=4")]
    assert list(table) == [PLAIN_ROW, *rows,
                           "hf generate (plain)", "hf prompt lookup k=2 n=3", f"hf assisted {draft} k=2"]
    assert data["summary"]["categories"] == ["qa"]
    for name, groups in table.items():
        assert groups[OVERALL]["exact"] == 1, name  # greedy: token-identical to plain decoding on every prompt
    assert data["settings"]["chat"] is True and data["machine"]["gpu"] == "none"
    assert all(p["new_tokens"] > 0 for p in data["prompts"])
    assert (tmp_path / "report.html").stat().st_size > 0 and "| ngram chain k=2 |" in stdout
