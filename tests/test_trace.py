"""Trace round trip: committed tokens reproduce the output, paths follow parents, malformed traces are refused."""

import json

import pytest
import tiny

from specviz import api
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.engine import trace
from specviz.engine.trace import TraceError

VOCAB = 48
PROMPT = [4, 9, 4, 9, 12, 30]


@pytest.fixture(scope="module")
def recorded():
    target = tiny.target("llama", VOCAB, layers=2, scale=20)
    drafter = DraftModelDrafter(tiny.truncated(target.model, 1), VOCAB)
    config = api.GenerationConfig(max_new_tokens=40, sampling=api.SamplingConfig(temperature=0.7), seed=3)
    run = api.start(target, PROMPT, drafter, api.DraftBudget(tree=True, width=3, depth=4, max_nodes=12), config).run()
    baseline = api.plain_decode(target, PROMPT, config)
    text = trace.dumps(api.header_for(run, "w4 w9"), run.rounds, api.summary_for(run, baseline))
    return run, text


def test_round_trip_reproduces_tokens(recorded, tmp_path):
    run, text = recorded
    path = tmp_path / "run.jsonl"
    path.write_text(text)
    loaded = trace.read(path)
    assert loaded.token_ids == run.token_ids
    assert loaded.summary["token_ids"] == run.token_ids
    assert [r.to_dict() for r in loaded.rounds] == [r.to_dict() for r in run.rounds]
    assert loaded.header["target"]["vocab_size"] == VOCAB and loaded.header["versions"]["torch"]


def test_accepted_paths_follow_parent_links(recorded):
    run, _ = recorded
    assert any(len(r.accepted) >= 2 for r in run.rounds)
    for record in run.rounds:
        previous = -1
        for node in record.accepted:
            assert record.parents[node] == previous
            previous = node
        assert record.committed == ([record.tokens[i] for i in record.accepted] + [record.extra_token])[
            : len(record.committed)]
        assert len(record.target_top) == len(record.tokens) + 1 == len(record.target_entropy)


def _mutate(text: str, line: int, change) -> str:
    lines = text.splitlines()
    obj = json.loads(lines[line])
    change(obj)
    lines[line] = json.dumps(obj)
    return "\n".join(lines)


def _broken_path(obj):
    obj["tokens"] = [1, 2, 3]
    obj["parents"] = [-1, -1, 0]
    obj["p_target"] = [0.1, 0.2, 0.3]
    obj["text"], obj["q_draft"], obj["confidence"] = ["a", "b", "c"], [0.5, 0.5, 0.5], None
    obj["accepted"] = [1, 2]  # node 2's parent is 0, not 1


BROKEN = {
    "not json": lambda text: text.replace("}", "", 1),
    "empty": lambda text: "",
    "no header": lambda text: "\n".join(text.splitlines()[1:]),
    "wrong version": lambda text: _mutate(text, 0, lambda o: o.update(version=99)),
    "missing field": lambda text: _mutate(text, 1, lambda o: o.pop("accepted")),
    "wrong type": lambda text: _mutate(text, 1, lambda o: o.update(tokens="abc")),
    "parent after child": lambda text: _mutate(text, 1, lambda o: o.update(parents=[0] + o["parents"][1:])),
    "path off the tree": lambda text: _mutate(text, 1, _broken_path),
    "committed mismatch": lambda text: _mutate(text, 1, lambda o: o.update(committed=[o["extra_token"] + 1])),
    "unknown kind": lambda text: _mutate(text, 1, lambda o: o.update(extra_kind="lucky")),
    "round missing": lambda text: "\n".join(line for i, line in enumerate(text.splitlines()) if i != 1),
    "summary mismatch": lambda text: _mutate(text, -1, lambda o: o.update(token_ids=[1, 2, 3])),
    "unknown record": lambda text: text + '\n{"type": "party"}',
    "nested too deep to parse": lambda text: text + "\n" + "[" * 100_000,
}
#: Hand edits the views would trip on: each is refused by the reader, naming the line and the field.
EDITED = {
    "a round without draws": (1, lambda o: o.pop("draws"), "missing field 'draws'"),
    "a round without target_top": (1, lambda o: o.pop("target_top"), "missing field 'target_top'"),
    "top-k rows that are not choices": (1, lambda o: o.update(target_top=[[{"x": 1}]]), "'target_top'"),
    "top-k as text": (1, lambda o: o.update(target_top="abc"), "'target_top'"),
    "probabilities as text": (1, lambda o: o.update(p_target=["a"] * len(o["tokens"])), "'p_target'"),
    "a NaN time": (1, lambda o: o.update(verify_ms=float("nan")), "'verify_ms'"),
    "token text as numbers": (1, lambda o: o.update(text=list(range(len(o["tokens"])))), "'text'"),
    "meta that is not an object": (1, lambda o: o.update(meta="x"), "'meta'"),
    "text shorter than the tree": (1, lambda o: o.update(text=o["text"][:-1]), "one entry per node"),
    "a negative time": (1, lambda o: o.update(draft_ms=-5), "'draft_ms'"),
    "a probability above 1": (1, lambda o: o.update(p_target=[1.5] * len(o["tokens"])), "'p_target'"),
    "a negative token id": (1, lambda o: o.update(extra_token=-3), "'extra_token'"),
    "a header config that is not an object": (0, lambda o: o.update(config=5), "'config'"),
    "a summary prefill as text": (-1, lambda o: o.update(prefill_ms="abc"), "'prefill_ms'"),
    "a summary baseline speed as text": (-1, lambda o: o.update(baseline={"tokens_per_s": "fast"}), "'baseline'"),
    "a draw at a node not in the tree": (1, lambda o: o.update(draws=[{"parent": -1, "node": 99, "accepted": False}]),
                                         "draw"),
    "a draw without its verdict": (1, lambda o: o.update(draws=[{"parent": -1, "node": 0, "u": 0.5}]), "draw"),
    "a draw at a list of nodes": (1, lambda o: o.update(draws=[{"parent": -1, "node": [1], "accepted": True}]),
                                  "draw"),
    "a draw's coin as text": (1, lambda o: o.update(draws=[{"parent": -1, "node": 0, "accepted": True, "u": "x"}]),
                              "draw"),
    "an empty pruned record": (1, lambda o: o.setdefault("meta", {}).update(pruned=[{}]), "meta.pruned"),
    "pruned nodes as text": (1, lambda o: o.setdefault("meta", {}).update(pruned="x"), "meta.pruned"),
    "a pruned confidence as text": (1, lambda o: o.setdefault("meta", {}).update(pruned=[
        {"token": 3, "depth": 1, "q": 0.5, "confidence": "high", "parent": -1, "pruned_parent": None}]), "meta.pruned"),
    "a pruned node hanging off a later one": (1, lambda o: o.setdefault("meta", {}).update(pruned=[
        {"token": 3, "depth": 2, "q": 0.5, "confidence": 0.2, "parent": None, "pruned_parent": 0}]), "meta.pruned"),
    "a budget's stop threshold as text": (0, lambda o: o["budget"].update(min_draft_prob="x"), "'budget'"),
    "a temperature as text": (0, lambda o: o["config"].update(temperature="hot"), "'config'"),
    "prompt pieces as a number": (0, lambda o: o["prompt"].update(pieces=5), "'prompt'"),
    "prompt pieces as ids": (0, lambda o: o["prompt"].update(pieces=[1, 2, 3]), "'prompt'"),
    "prompt ids as text": (0, lambda o: o["prompt"].update(token_ids="abc"), "'prompt'"),
    "a header without its target": (0, lambda o: o.pop("target"), "missing field 'target'"),
    "a header without its config": (0, lambda o: o.pop("config"), "missing field 'config'"),
    "a header without its prompt": (0, lambda o: o.pop("prompt"), "missing field 'prompt'"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_validator_rejects_malformed_traces(recorded, name):
    _, text = recorded
    with pytest.raises(TraceError) as error:
        trace.loads(BROKEN[name](text))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", list(EDITED))
def test_hand_edits_the_views_would_trip_on_are_refused_on_read(recorded, name):
    _, text = recorded
    line, change, says = EDITED[name]
    with pytest.raises(TraceError) as error:
        trace.loads(_mutate(text, line, change))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_read_refuses_missing_and_binary_files(tmp_path):
    with pytest.raises(TraceError):
        trace.read(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError):
        trace.read(binary)


def test_the_header_says_which_kernels_ran_the_target():
    """A fast-path target's header records its measured linear-kernel choice; transformers' forward has none."""
    fast = tiny.target("llama", VOCAB, forward="fast", layers=1)
    header = api.header_for(api.start(fast, PROMPT, None))
    choice = fast.model.kernel_choice
    assert header["target"]["forward"] == "fast"
    assert header["target"]["linear_kernels"] == {"wide": choice["wide"], "plain_rows": choice["plain_rows"]}
    assert "linear_kernels" not in api.header_for(api.start(tiny.target("llama", VOCAB), PROMPT, None))["target"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_live_runs_with_pruned_nodes_schedules_and_draws_pass_validation(temperature):
    """What the engine writes must read back: DSpark's schedule cuts and ``ngram:auto``'s (pruned records, q absent for
    the lookup), a dynamic tree's pruned nodes, and the accept rule's draws, greedy and sampled."""
    from specviz.drafters.dflash import DSparkDrafter, new_model
    from specviz.drafters.ngram import NgramDrafter
    from specviz.engine.cost_curve import CostCurve

    target = tiny.target("llama", 64, layers=8, scale=25)
    steep = CostCurve.from_points({1: 1.0, 2: 1.2, 4: 3.0, 8: 9.0}, "steep")
    dspark = DSparkDrafter(new_model(target.model, "dspark", mask_token_id=63, seed=1, markov_rank=16), 64,
                           cost_curve=steep)
    cases = [(dspark, api.DraftBudget(k=7)), (NgramDrafter(schedule=steep), api.DraftBudget(k=6)),
             (DraftModelDrafter(tiny.model(vocab_size=64, layers=1, seed=3), 64, stochastic_tree=True),
              api.DraftBudget(tree=True, width=3, depth=4, max_nodes=5))]
    config = api.GenerationConfig(max_new_tokens=30, sampling=api.SamplingConfig(temperature=temperature))
    for drafter, budget in cases:
        run = api.start(target, [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17], drafter, budget, config).run()
        loaded = trace.loads(trace.dumps(api.header_for(run), run.rounds, api.summary_for(run)))
        assert loaded.token_ids == run.token_ids
    assert any(r.meta.get("pruned") for r in run.rounds)  # the dynamic tree cut some drafts
