"""Runs that replay: the same seed and settings give the same tokens and the same rounds (who proposed, what was
drafted and verified), run after run, for the drafters whose choices weigh costs: ``ngram:auto``, ``hybrid`` and
DSpark's schedule. Each drafter is built afresh per run, as the app does, so the costs they weigh must come from the
per-machine store (``specviz.engine.timings``), never from a live clock."""

from __future__ import annotations

import json

import pytest
import tiny

from specviz import api
from specviz.drafters.dflash import new_model, save_drafter
from specviz.drafters.eagle import new_head, save_head
from specviz.engine import cost_curve, timings
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig
from specviz.engine.sampling import SamplingConfig

VOCAB, LAYERS = 64, 8
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 5, 9, 3, 17, 5, 22]  # repeats: the lookup has matches to weigh
CONFIGS = {"greedy": GenerationConfig(max_new_tokens=48, seed=7),
           "sampled": GenerationConfig(max_new_tokens=48, seed=7, sampling=SamplingConfig(temperature=0.8))}


@pytest.fixture(scope="module")
def target_and_checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay")
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=25)
    save_head(new_head(target.model, "eagle3", seed=1), folder / "head", target_name="tiny")
    save_drafter(new_model(target.model, "dspark", mask_token_id=VOCAB - 1, seed=1, markov_rank=8), folder / "spark",
                 target_name="tiny")
    return target, folder


def rounds_of(target, spec: str, budget: DraftBudget, config: GenerationConfig) -> list[str]:
    drafter = api.make_drafter(spec, target)  # built afresh, as every app run builds its own
    run = api.start(target, PROMPT, drafter, budget, config).run()
    return [json.dumps({k: v for k, v in r.to_dict().items() if not k.endswith("_ms")}, sort_keys=True)
            for r in run.rounds]


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("spec, budget", [
    ("ngram:auto", DraftBudget(k=6)),
    ("hybrid:eagle3:{folder}/head", DraftBudget(k=4)),
    ("hybrid:eagle3:{folder}/head", DraftBudget(tree=True, width=2, depth=3, max_nodes=6)),
    ("dspark:{folder}/spark", DraftBudget(k=4)),
], ids=["ngram-auto", "hybrid-chain", "hybrid-tree", "dspark"])
def test_two_runs_with_one_seed_give_the_same_rounds(target_and_checkpoints, spec, budget, config, tmp_path,
                                                     monkeypatch):
    target, folder = target_and_checkpoints
    monkeypatch.setenv(timings.STORE_ENV, str(tmp_path / "timings"))
    cost_curve._CURVES.clear()  # as a new process would start: only the store carries the costs over
    spec = spec.format(folder=folder)
    first = rounds_of(target, spec, budget, CONFIGS[config])
    cost_curve._CURVES.clear()
    second = rounds_of(target, spec, budget, CONFIGS[config])
    assert first == second and len(first) > 3
    assert list((tmp_path / "timings").glob("cost-curve-*.json"))  # measured once, kept for the second run


def test_the_store_keeps_what_was_measured_and_remeasures_a_broken_file(tmp_path, monkeypatch):
    monkeypatch.setenv(timings.STORE_ENV, str(tmp_path))
    calls = []

    def measure() -> dict:
        calls.append(1)
        return {"ms": 1.5 * len(calls)}

    def parse(value: dict) -> float:
        return float(value["ms"])

    key = {"what": "x"}
    assert timings.remembered("t", key, measure, parse) == 1.5
    assert timings.remembered("t", key, measure, parse) == 1.5 and len(calls) == 1  # read back, not measured
    assert timings.remembered("t", {"what": "y"}, measure, parse) == 3.0  # another key: measured
    (stored,) = [p for p in tmp_path.glob("t-*.json") if json.loads(p.read_text())["key"]["what"] == "x"]
    stored.write_text("{not json")
    assert timings.remembered("t", key, measure, parse) == 4.5  # unreadable: measured again and rewritten
    assert timings.remembered("t", key, measure, parse) == 4.5 and len(calls) == 3
    monkeypatch.setenv(timings.RETIME_ENV, "1")
    assert timings.remembered("t", key, measure, parse) == 6.0  # opt-in live re-timing
    monkeypatch.delenv(timings.RETIME_ENV)
    assert timings.remembered("t", key, measure, parse) == 6.0 and len(calls) == 4  # the figure it stored
    monkeypatch.setattr(timings, "code_version", lambda: "other code")  # specviz changed since: its costs may have
    assert timings.remembered("t", key, measure, parse) == 7.5  # so it measures again


def test_the_code_version_follows_the_sources(tmp_path):
    """A changed, added or renamed Python or C source is another version; other files are not code."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "loop.py").write_text("x = 1\n")
    versions = [timings.source_digest(tmp_path)]
    (tmp_path / "notes.md").write_text("not code")
    assert timings.source_digest(tmp_path) == versions[0]
    (tmp_path / "engine" / "loop.py").write_text("x = 2\n")
    versions.append(timings.source_digest(tmp_path))
    (tmp_path / "kernel.c").write_text("int f(void) { return 0; }\n")
    versions.append(timings.source_digest(tmp_path))
    (tmp_path / "engine" / "loop.py").rename(tmp_path / "engine" / "round.py")
    versions.append(timings.source_digest(tmp_path))
    assert len(set(versions)) == 4 and timings.machine()["code"] == timings.code_version()
