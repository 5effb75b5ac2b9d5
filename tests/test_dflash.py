"""DFlash and DSpark block drafters: lossless drafting (chain, DDTree, scheduled DSpark chains), the injected-context
cache, the feature-layer numbering, DDTree and the confidence schedule, and the published layouts.

Drafters are built in-process on tiny random targets and fitted for a few seconds to the target's own greedy
continuations (blocks trained exactly as drafting runs them), so their drafts are partly accepted: a random
drafter is almost never right, which would leave the accept paths untested.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import tiny
import torch
import torch.nn.functional as F
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, Table, V, chi_square_p
from test_sampling_lossless import PROMPT as SAMPLING_PROMPT
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specviz import resources
from specviz.drafters import ddtree, registry
from specviz.drafters import dflash_layouts as layouts
from specviz.drafters.checkpoint_files import TargetShape, read_config, read_tensors
from specviz.drafters.confidence import OnlineCalibration, ReliabilityCurve
from specviz.drafters.dflash import (
    FORMAT,
    GREEDY_CALIBRATION_KEY,
    SMOLLM2_MASK_TOKEN_ID,
    DFlashBackbone,
    DFlashDrafter,
    DSparkDrafter,
    build_model,
    load_drafter,
    mask_token_for,
    new_model,
    save_drafter,
)
from specviz.engine import accept as accept_module
from specviz.engine import cost_curve
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.training import calibrate
from specviz.training.trainers.dflash import forward_blocks

VOCAB = 64
LAYERS = 8  # build_target_layer_ids(8, 5) = [1, 2, 3, 4, 5]: hidden_states[2..6]
MASK = VOCAB - 1
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
NEW_TOKENS = 40
#: Verify cost rising steeply with width: the schedule cuts most rounds short of the budget.
STEEP = CostCurve.from_points({1: 1.0, 2: 1.2, 4: 3.0, 8: 9.0}, "steep (test)")
LAYOUT_DIR = Path(__file__).resolve().parent / "data" / "layouts"  # published configs and key names, see README.md
SMOLLM2 = TargetShape(hidden_size=576, num_layers=30, vocab_size=49152)
QWEN3_8B = TargetShape(hidden_size=4096, num_layers=36, vocab_size=151936)


def fit(model: DFlashBackbone, net: torch.nn.Module, steps: int = 60, seed: int = 0) -> DFlashBackbone:
    """A stand-in for real training that makes drafts partly right: blocks anchored at every position of the
    target's greedy continuations of random prompts, labels = the target's argmax, the Markov head teacher-forced,
    the confidence head fitted to whether each draft is the argmax (greedy acceptance)."""
    generator = torch.Generator().manual_seed(seed)
    spec = model.spec
    seqs = torch.randint(0, VOCAB - 1, (12, 4), generator=generator)
    with torch.no_grad():
        for _ in range(36):
            seqs = torch.cat([seqs, net(seqs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        out = net(seqs, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in spec.feature_layers], dim=-1)
    labels = out.logits.argmax(-1)  # the target's choice for the token after each position
    anchors = torch.arange(1, seqs.shape[1] - spec.drafts).expand(len(seqs), -1)
    where = anchors[..., None] + torch.arange(spec.drafts)
    targets = labels.gather(1, where.flatten(1)).reshape(where.shape)
    previous = seqs.gather(1, where.flatten(1)).reshape(where.shape)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        hidden = forward_blocks(model, features, seqs, anchors)
        logits = model.logits(hidden)
        if model.markov_head is not None:
            logits = logits + model.markov_bias(previous)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        if model.confidence_head is not None:
            right = (logits.argmax(-1) == targets).float()
            loss = loss + F.binary_cross_entropy(model.confidence(hidden, previous), right)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def copy_model(model: DFlashBackbone, net: torch.nn.Module) -> DFlashBackbone:
    """The same weights on another target object (e.g. the fast path's copy of the same model)."""
    return build_model(net, model.spec, model.state_dict())


@pytest.fixture(scope="module")
def setup():
    targets = tiny.both_forwards("llama", VOCAB, layers=LAYERS, scale=25)
    baselines = tiny.plain_outputs(targets, PROMPT, NEW_TOKENS)
    net = targets["hf"].model
    models = {"dflash": fit(new_model(net, "dflash", mask_token_id=MASK, seed=1), net),
              "dspark": fit(new_model(net, "dspark", mask_token_id=MASK, seed=1, markov_rank=16), net)}
    return targets, baselines, models


def make_drafter(case: str, model: DFlashBackbone, pack: bool = True):
    if case == "dspark-scheduled":
        return DSparkDrafter(model, VOCAB, cost_curve=STEEP, pack=pack)
    if case in ("dspark-all", "dspark-tree", "dspark-shallow-tree"):
        return DSparkDrafter(model, VOCAB, schedule=False, pack=pack)
    if case == "dspark-raw":
        return DSparkDrafter(model, VOCAB, cost_curve=STEEP, pack=pack, calibrate=False)
    return DFlashDrafter(model, VOCAB, pack=pack)


CASES = {"dflash-chain": DraftBudget(k=5), "dflash-ddtree": DraftBudget(tree=True, width=3, depth=5, max_nodes=12),
         "dspark-scheduled": DraftBudget(k=7), "dspark-all": DraftBudget(k=5), "dspark-raw": DraftBudget(k=7),
         # a tree budget deeper than its node budget: DSpark's chain keeps to the node budget
         "dspark-tree": DraftBudget(tree=True, width=3, depth=6, max_nodes=4),
         # shallower: its one chain may still fill the node budget (the depth shapes trees)
         "dspark-shallow-tree": DraftBudget(tree=True, width=2, depth=1, max_nodes=4)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("forward", ["hf", "fast"])
def test_greedy_matches_plain(setup, forward, case):
    targets, baselines, models = setup
    target, budget = targets[forward], CASES[case]
    drafter = make_drafter(case, copy_model(models[case.split("-")[0]], target.model))
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, budget)
    assert run.token_ids == baselines[forward]
    assert all(r.rule == "greedy" and r.lossless for r in run.rounds)
    assert all(len(r.tokens) <= (budget.max_nodes if budget.tree else budget.k) for r in run.rounds)
    assert any(len(r.accepted) < len(r.tokens) for r in run.rounds)
    assert any(len(r.accepted) > 0 for r in run.rounds)  # the fitted drafter is partly right
    if case in ("dspark-scheduled", "dspark-raw"):  # the schedule cut some rounds, and its choice is on record
        assert {r.meta["verify_length"] for r in run.rounds} != {7}
        assert all(len(r.tokens) == r.meta["schedule"]["length"] for r in run.rounds)
        _check_the_cut_is_drawn(run, drafter)
        _check_the_calibration(run, drafter)
    if case == "dflash-ddtree":
        assert any(not _is_chain(r.parents) for r in run.rounds)
    if case == "dspark-shallow-tree":
        assert max(len(r.tokens) for r in run.rounds) == budget.max_nodes > budget.depth


def _check_the_calibration(run: Generation, drafter: DSparkDrafter) -> None:
    """The survival multiplies the recalibrated ĉ (or the head's own without calibration); the calibration learnt
    from exactly the drafts the target judged, and the survival after it follows what the run accepted."""
    rounds = [r for r in run.rounds if r.tokens]
    for r in rounds:
        used = r.meta["calibrated"] if drafter.calibrate else r.meta["confidence_head"]
        assert r.confidence == pytest.approx(cost_curve.survival(used)[: len(r.tokens)], abs=1e-5)
    if not drafter.calibrate:
        assert drafter.calibration is None and all(r.meta["calibrated"] is None for r in rounds)
        return
    rebuilt = OnlineCalibration()  # every round is committed, the last one included
    for r in rounds:
        rebuilt.record(r.meta["confidence_head"][: len(r.tokens)], accepted=len(r.accepted))
    assert drafter.calibration.trials == rebuilt.trials and drafter.calibration.hits == rebuilt.hits
    assert sum(rebuilt.trials) == sum(min(len(r.tokens), len(r.accepted) + 1) for r in rounds)
    assert rounds[0].meta["calibrated"] == pytest.approx(rounds[0].meta["confidence_head"], abs=1e-5)  # no past yet
    assert any(r.meta["calibrated"] != pytest.approx(r.meta["confidence_head"], abs=1e-3) for r in rounds[1:])


def _check_the_cut_is_drawn(run: Generation, drafter: DSparkDrafter) -> None:
    """The drafts the schedule cut hang faded off the verified prefix, saying why; the root names the schedule and
    the run label the cost curve it was chosen on."""
    from specviz.viz.panels import run_label
    from specviz.viz.record import RunRecord
    from specviz.viz.tree_figure import tree_spec

    for r in run.rounds:
        cut = r.meta["pruned"]
        drafted = len(r.tokens) + len(cut)  # the block, or fewer near the end of the generation
        assert drafted <= 7 and [c["depth"] for c in cut] == list(range(len(r.tokens) + 1, drafted + 1))
        assert all((c["parent"] == len(r.tokens) - 1) == (i == 0) for i, c in enumerate(cut))
    round_ = next(r for r in run.rounds if r.meta["pruned"])
    spec = tree_spec(round_)
    faded = [t for trace in spec["data"] if trace.get("name") == "pruned (not verified)" for t in trace["hovertext"]]
    assert len(faded) == len(round_.meta["pruned"])
    assert all("cut by the confidence schedule" in h for h in faded)
    root = next(trace for trace in spec["data"] if trace.get("name") == "context")["hovertext"][0]
    drafted = len(round_.tokens) + len(round_.meta["pruned"])
    assert f"verify {len(round_.tokens)} of {drafted} drafts" in root and "steep (test)" in root
    label = run_label(RunRecord(header={"drafter": drafter.describe(), "config": {}}))
    assert "confidence-scheduled on the verify cost (steep (test)" in label and "8: ×9.00" in label


def test_qwen2_target_and_anchor_predicting_dflash():
    """Another target architecture, and a DFlash drafter with DeepSpec's convention (the anchor predicts too)."""
    target = tiny.target("qwen2", VOCAB, layers=LAYERS, scale=25)
    model = new_model(target.model, "dflash", mask_token_id=MASK, seed=2, anchor_predicts=True, block_size=4)
    assert model.spec.drafts == 4
    baseline = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=24)).token_ids
    for budget in (DraftBudget(k=4), DraftBudget(tree=True, width=2, depth=4, max_nodes=6)):
        run = generate(target, PROMPT, GenerationConfig(max_new_tokens=24), DFlashDrafter(model, VOCAB), budget)
        assert run.token_ids == baseline


def test_one_token_prompt_drafts_from_the_block_alone(setup):
    targets, _, models = setup
    target = targets["hf"]
    baseline = plain_decode(target, [5], GenerationConfig(max_new_tokens=12)).token_ids
    run = generate(target, [5], GenerationConfig(max_new_tokens=12), DFlashDrafter(models["dflash"], VOCAB),
                   DraftBudget(k=3))
    assert run.token_ids == baseline and len(run.rounds[0].tokens) == 3


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_draft_cache_holds_exactly_the_injected_context(setup, kind):
    """Between rounds the draft cache holds the context KV of every committed position before the anchor, fed
    once with the target's real features (what one forward over the whole text gives), and no block entries."""
    targets, _, models = setup
    target, model = targets["hf"], models[kind]
    drafter = make_drafter("dflash-chain" if kind == "dflash" else "dspark-all", model, pack=False)
    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=24), drafter, DraftBudget(k=4))
    context = list(PROMPT)
    checked = 0
    for record in run:
        context += record.committed
        if record.finished:
            break
        drafter.block(context)  # next round's forward: injects the features that just arrived
        anchor = len(context) - 1
        with torch.inference_mode():
            states = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states
            feats = torch.cat([states[i][:, :anchor] for i in model.feature_layers], dim=-1)
            fresh = DynamicCache()
            block = torch.tensor([[context[-1]] + [MASK] * (model.spec.block_size - 1)])
            model(feats, block, torch.arange(anchor), torch.arange(anchor, anchor + model.spec.block_size),
                  cache=fresh)
        for ours, theirs in zip(drafter.draft_cache.layers, fresh.layers, strict=True):
            assert ours.keys.shape[-2] == anchor
            torch.testing.assert_close(ours.keys, theirs.keys[..., :anchor, :], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours.values, theirs.values[..., :anchor, :], atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 3


def test_a_drafter_without_the_features_it_needs_fails_in_one_line(setup):
    targets, _, models = setup
    drafter = DFlashDrafter(models["dflash"], VOCAB)
    drafter.begin(PROMPT)
    with pytest.raises(SpecvizError, match="has target features up to position -1, it needs") as error:
        drafter.propose(PROMPT, DraftBudget(k=2), CONFIG, torch.Generator())
    assert "\n" not in str(error.value)


def test_tree_and_chain_records(setup):
    """DDTree's nodes carry the product of marginals and their parent's marginal rows; DSpark's chain carries the
    prefix survival of its confidence head and the schedule's scan."""
    targets, _, models = setup
    target, trees = targets["hf"], []

    class Keeping(DFlashDrafter):
        def propose(self, *args):
            trees.append(super().propose(*args))
            return trees[-1]

    budget = DraftBudget(tree=True, width=3, depth=4, max_nodes=9)
    for record in Generation(target, PROMPT, GenerationConfig(max_new_tokens=12), Keeping(models["dflash"], VOCAB),
                             budget):
        tree = trees[-1]
        assert len(tree) == 9 and max(tree.depth) <= 4
        assert all(len(kids) <= 3 for kids in tree.children.values())
        for node, parent in enumerate(tree.parents):
            expected = tree.q_token[node] * (1.0 if parent < 0 else tree.confidence[parent])
            assert tree.confidence[node] == pytest.approx(expected, rel=1e-5)
            assert tree.q_dist[parent + 1][tree.tokens[node]] == pytest.approx(tree.q_token[node], rel=1e-5)
        assert record.meta["block"]["drafts"] == 7 and len(record.meta["block"]["tokens"]) == 7
        json.dumps(record.meta)

    chains, blocks = [], []

    class KeepingSpark(DSparkDrafter):
        def propose(self, *args):
            self.before = copy.deepcopy(self.calibration)  # what this round's ĉ are recalibrated with
            self.schedule = False  # the whole block first (the same block: its forward only reads the cache)
            blocks.append(super().propose(*args))
            self.schedule = True
            chains.append(super().propose(*args))
            return chains[-1]

    drafter = KeepingSpark(models["dspark"], VOCAB, cost_curve=STEEP)
    cut_short = 0
    for record in Generation(target, PROMPT, GenerationConfig(max_new_tokens=12), drafter, DraftBudget(k=7)):
        chain, meta, whole = chains[-1], record.meta, blocks[-1].meta
        heads = meta["confidence_head"]  # the drafted positions: up to the one that ended the schedule's scan
        cap = len(whole["confidence_head"])  # 7, or what is left to generate
        assert all(0.0 < c < 1.0 for c in heads)
        used = meta["calibrated"]  # the head's ĉ recalibrated on the rounds before this one
        assert used == pytest.approx([drafter.before(c) for c in heads], abs=1e-5)
        assert meta["survival"] == pytest.approx([math.prod(used[: i + 1]) for i in range(len(used))], abs=1e-5)
        assert chain.confidence == pytest.approx(meta["survival"][: len(chain)], abs=1e-5)
        # the early stop changes nothing: the same drafts and the choice the whole block's survival gives
        expected = cost_curve.best_prefix(whole["survival"], STEEP, cap)
        assert meta["schedule"]["length"] == expected.length == len(chain)
        assert meta["schedule"]["cap"] == cap  # what the views say the run's budget allowed
        assert meta["block"]["tokens"] == whole["block"]["tokens"][: len(heads)]
        assert len(heads) == (cap if len(chain) == cap else len(chain) + 1)
        cut_short += len(heads) < cap
        assert record.confidence == chain.confidence
        json.dumps(meta)
    assert cut_short  # the steep curve did stop the drafting early
    assert drafter.describe()["cost_curve"]["source"] == "steep (test)"


# ---- DDTree -----------------------------------------------------------------------------------------------------
def test_ddtree_is_the_best_first_top_of_all_paths():
    """With distinct scores, the built tree is exactly the ``max_nodes`` highest-scoring paths over the positions'
    top-w tokens, in best-first (hence topological) order, each scoring the sum of its marginal log-probs."""
    generator = torch.Generator().manual_seed(3)
    log_q = torch.log_softmax(torch.randn(3, 10, generator=generator) * 2, dim=-1)
    top_logq, top_ids = ddtree.top_candidates(log_q, 3)
    assert torch.equal(top_ids[:, 0], log_q.argmax(-1))
    paths = [ranks for depth in (1, 2, 3) for ranks in itertools.product(range(3), repeat=depth)]
    score = {p: sum(float(top_logq[d, r]) for d, r in enumerate(p)) for p in paths}
    for budget in (1, 5, 11, len(paths), len(paths) + 4):
        built = ddtree.build(top_logq, top_ids, budget)
        assert len(built.tokens) == min(budget, len(paths))
        assert built.scores == sorted(built.scores, reverse=True)  # best first
        assert all(parent < node for node, parent in enumerate(built.parents))  # topological
        chosen = set()
        for node in range(len(built.tokens)):
            ranks, cursor = [], node
            while cursor >= 0:
                ranks.append(built.ranks[cursor])
                cursor = built.parents[cursor]
            path = tuple(reversed(ranks))
            chosen.add(path)
            assert built.depths[node] == len(path)
            assert built.tokens[node] == int(top_ids[len(path) - 1, path[-1]])
            assert built.scores[node] == pytest.approx(score[path])
            assert built.confidence[node] == pytest.approx(math.exp(score[path]))
        assert chosen == set(sorted(paths, key=lambda p: -score[p])[:budget])


def test_ddtree_respects_width_depth_and_support():
    log_q = torch.log(torch.tensor([[0.7, 0.3, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]]))
    top_logq, top_ids = ddtree.top_candidates(log_q, 3)
    built = ddtree.build(top_logq, top_ids, 50)
    assert len(built.tokens) == 2 + 2 * 3  # two tokens with mass at depth 1, three under each at depth 2
    assert max(built.depths) == 2 and 2 not in built.tokens[:2]
    assert built.depths[:2] == [1, 2] and built.tokens[:2] == [0, 0]  # 0.7 * 0.5 beats 0.3: the child comes first
    assert [(t, r) for t, r, d in zip(built.tokens, built.ranks, built.depths) if d == 1] == [(0, 0), (1, 1)]
    assert ddtree.build(top_logq[:1], top_ids[:1], 50).depths == [1, 1]


# ---- the confidence schedule ------------------------------------------------------------------------------------
def test_flat_cost_verifies_every_draft():
    plan = cost_curve.best_prefix([0.9, 0.5, 0.2, 0.01], CostCurve.flat(), 4)
    assert plan.length == 4
    assert list(plan.values) == pytest.approx([1.9, 2.4, 2.6, 2.61])


def test_steep_cost_cuts_and_the_scan_stops_at_the_first_drop():
    survival = [0.9, 0.81, 0.73, 0.66]
    assert cost_curve.best_prefix(survival, CostCurve.from_points({1: 1.0, 8: 8.0}), 4).length == 1
    # A step-shaped cost: length 4 would score best, but length 2 already scores below length 1, so the scan
    # stops at 1. Looking further would make whether token 2 is verified depend on tokens after it.
    steps = CostCurve.from_points({2: 1.0, 3: 2.0, 4: 2.0, 5: 2.0})
    plan = cost_curve.best_prefix(survival, steps, 4)
    assert plan.length == 1 and len(plan.values) == 2
    assert (1 + sum(survival)) / steps.cost(5) > plan.values[0]
    assert cost_curve.best_prefix(survival, steps, 0).length == 0
    assert cost_curve.best_prefix(survival, CostCurve.flat(), 2).length == 2  # capped by the budget


def test_cost_curve_interpolates_and_refuses_nonsense():
    curve = CostCurve.from_rows([{"width": 1, "ms": 10.0, "relative": 1.0}, {"width": 3, "ms": 14.0},
                                 {"width": 5, "ms": 20.0}])
    assert [curve.cost(n) for n in (1, 2, 3, 4, 5, 7)] == pytest.approx([10, 12, 14, 17, 20, 26])
    assert curve.cost(0) == 10.0 and CostCurve.flat().cost(99) == 1.0
    for bad in ([{"width": 2, "ms": 1.0}, {"width": 2, "ms": 2.0}], [{"width": 1, "ms": 0.0}], [{"w": 1}], []):
        with pytest.raises(SpecvizError) as error:
            CostCurve.from_rows(bad)
        assert "\n" not in str(error.value)


def test_measured_cost_curve_of_a_real_target(setup):
    targets, _, _ = setup
    curve = cost_curve.measure(targets["fast"], 9, context_length=8, repeats=1)
    assert curve.widths == (1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert all(b >= a > 0 for a, b in zip(curve.ms, curve.ms[1:]))
    assert curve.source == "measured on tiny-llama"


# ---- feature-layer numbering --------------------------------------------------------------------------------------
def test_layer_ids_convention():
    """DFlash/DeepSpec ids are "output of layer id" = hidden_states[id + 1]; SmolLM2's 30 layers read 2, 9, 15, 21,
    28 and Qwen3-8B's 36 layers 2, 10, 18, 26, 34 (the published [1, 9, 17, 25, 33])."""
    assert layouts.build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    assert layouts.default_feature_layers(30) == (2, 9, 15, 21, 28)
    assert layouts.build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert layouts.build_target_layer_ids(36, 1) == [18]
    assert layouts.default_feature_layers(LAYERS) == (2, 3, 4, 5, 6)
    assert layouts.default_feature_layers(2) == (1,)  # small targets: every raw layer output
    assert registry.get("dflash").layers_for(30) == registry.get("dspark").layers_for(30) == (2, 9, 15, 21, 28)


def test_the_engine_hands_over_exactly_those_rows():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    target = Target(model=LlamaForCausalLM(config).eval(), tokenizer=tiny.tokenizer(VOCAB), name="tiny-30")
    seen = {}

    class Recording(DFlashDrafter):
        def observe(self, features):
            for row in range(len(features)):
                seen[features.start + row] = features.hidden[row].clone()
            super().observe(features)

    model = new_model(target.model, "dflash", mask_token_id=MASK, seed=0)
    assert model.feature_layers == (2, 9, 15, 21, 28)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=6), Recording(model, VOCAB), DraftBudget(k=2))
    full = PROMPT + run.token_ids
    with torch.inference_mode():
        states = target.model(torch.tensor([full]), output_hidden_states=True).hidden_states
    assert sorted(seen) == list(range(len(full) - 1))  # every committed position before the last anchor
    for position, rows in seen.items():
        expected = torch.stack([states[i][0, position] for i in (2, 9, 15, 21, 28)])
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=1e-5)


# ---- sampling: the output distribution is the target's -----------------------------------------------------------
@pytest.fixture(scope="module")
def sampling_target():
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    exact = Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()
    return target, exact


#: With the head-less drafter below, a third verified token costing this much is worth it after some first drafts only.
COST_OF_THREE = 1.38
SAMPLING_SEED = 10  # a draw of the heads where the cut depends on the first draft (1 token after some, 2 after others)


def sampling_dspark(target) -> DSparkDrafter:
    """A random DSpark drafter for the V-token target (its q is far from the target's peaked p) whose confidence
    reads the Markov embedding strongly, on a cost curve where the schedule keeps 1 or 2 tokens depending on the
    first draft."""
    model = new_model(target.model, "dspark", mask_token_id=V - 1, feature_layers=(0, 1), seed=5, markov_rank=8)
    generator = torch.Generator().manual_seed(SAMPLING_SEED)
    with torch.no_grad():
        model.markov_head.markov_w1.weight.normal_(0, 1.0, generator=generator)
        model.confidence_head.proj.weight.normal_(0, 1.0, generator=generator)
    return DSparkDrafter(model, V, cost_curve=CostCurve.from_points({1: 1.0, 2: 1.0, 3: 1.3}))


def sampling_ddtree(target) -> tuple[DFlashDrafter, DraftBudget]:
    model = new_model(target.model, "dflash", mask_token_id=V - 1, feature_layers=(0, 1), seed=4, block_size=3)
    return DFlashDrafter(model, V), DraftBudget(tree=True, width=2, depth=2, max_nodes=4)


def engine_counts(target, drafter, budget, samples: int) -> tuple[dict, set[int]]:
    """First two generated tokens over ``samples`` seeds, and the verify lengths the first rounds used."""
    counts: dict[tuple[int, int], int] = {}
    lengths = set()
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        run = Generation(target, SAMPLING_PROMPT, config, drafter, budget).run()
        counts[tuple(run.token_ids)] = counts.get(tuple(run.token_ids), 0) + 1
        lengths.add(len(run.rounds[0].tokens))
    return counts, lengths


def test_dspark_sampled_scheduled_chain_keeps_the_target_distribution(sampling_target):
    """Markov-corrected drafts drawn from q, cut by the confidence schedule, verified by rejection sampling."""
    target, exact = sampling_target
    counts, lengths = engine_counts(target, sampling_dspark(target), DraftBudget(k=2), samples=800)
    assert lengths == {1, 2}  # the schedule really cut some rounds and not others
    assert chi_square_p(counts, exact) > PASS_P


def test_dspark_sampled_early_stop_is_the_whole_block_truncated(sampling_target):
    """Under sampling, stopping the drafting where the schedule's scan stops proposes exactly what drafting the
    whole block and then cutting it would (same generator state: the same draws, in the same order, as far as they
    go) and chooses the same length, so the chi-square tests above cover it."""
    target, _ = sampling_target
    pairs = []

    class Both(DSparkDrafter):
        def propose(self, context, budget, sampling, generator):
            twin = torch.Generator().set_state(generator.get_state())
            self.schedule = False
            whole = super().propose(context, budget, sampling, twin)
            self.schedule = True
            pairs.append((whole, super().propose(context, budget, sampling, generator)))
            return pairs[-1][1]

    drafter = sampling_dspark(target)
    both = Both(drafter.model, V, cost_curve=CostCurve.from_points({1: 1.0, 2: 1.0, 3: 1.3, 4: 2.0}))
    for seed in range(6):
        config = GenerationConfig(max_new_tokens=10, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        Generation(target, SAMPLING_PROMPT, config, both, DraftBudget(k=4)).run()
    short = 0
    for whole, chain in pairs:
        drafted = chain.meta["block"]["tokens"]
        assert drafted == whole.meta["block"]["tokens"][: len(drafted)]
        cap = len(whole.meta["block"]["tokens"])
        expected = cost_curve.best_prefix(whole.meta["survival"], both.cost_curve, cap)
        assert chain.meta["verify_length"] == expected.length
        short += len(drafted) < cap
    assert short  # some rounds stopped drafting before the cap


def test_dspark_without_a_confidence_head_cuts_only_on_earlier_drafts(sampling_target):
    """Without a confidence head the survival uses the mode probability of each draft's row, which depends on the
    drafts before it only: the cut still varies with the first draft, and the output keeps the target's law."""
    target, exact = sampling_target
    model = new_model(target.model, "dspark", mask_token_id=V - 1, feature_layers=(0, 1), seed=5, markov_rank=8,
                      confidence_head=False)
    generator = torch.Generator().manual_seed(SAMPLING_SEED)
    with torch.no_grad():
        model.markov_head.markov_w1.weight.normal_(0, 3.0, generator=generator)
        model.markov_head.markov_w2.weight.normal_(0, 3.0, generator=generator)
    drafter = DSparkDrafter(model, V, cost_curve=CostCurve.from_points({1: 1.0, 2: 1.0, 3: COST_OF_THREE}))
    counts, lengths = engine_counts(target, drafter, DraftBudget(k=2), samples=800)
    assert lengths == {1, 2}
    assert chi_square_p(counts, exact) > PASS_P


class Experienced(DSparkDrafter):
    """A DSpark drafter whose calibration starts with a long history (as if many rounds had run) that swaps two
    bins: drafts rated 0.9–1 were accepted a fifth of the time, those rated 0.6–0.7 always. The drafter's second
    ĉ is about 1.0 or 0.62 (its first 0.58): raw, the schedule verifies 2 after the first and 1 after the second;
    recalibrated, the other way round."""

    def reset(self, prompt_ids):
        super().reset(prompt_ids)
        bins = self.calibration.bins
        self.calibration.trials = [200] * bins
        self.calibration.hits = [round(200 * (b + 0.5) / bins) for b in range(bins)]
        self.calibration.hits[9], self.calibration.hits[6] = 40, 200


def test_recalibrated_schedule_keeps_the_target_distribution(sampling_target):
    """A cut chosen on confidences recalibrated from earlier rounds depends on the draft and the past only: the
    output keeps the target's law, with the cut really moved by the calibration."""
    target, exact = sampling_target
    plain = sampling_dspark(target)
    drafter = Experienced(plain.model, V, cost_curve=plain.cost_curve)
    seen = []
    propose = drafter.propose
    drafter.propose = lambda *args: seen.append(propose(*args)) or seen[-1]
    counts, lengths = engine_counts(target, drafter, DraftBudget(k=2), samples=800)
    assert lengths == {1, 2}
    flipped = [tree for tree in seen
               if len(tree.meta["confidence_head"]) == 2 and tree.meta["confidence_head"][1] > 0.9]
    assert flipped and {len(tree) for tree in flipped} == {1}
    raw = cost_curve.survival(flipped[0].meta["confidence_head"])
    assert cost_curve.best_prefix(raw, drafter.cost_curve, 2).length == 2  # on the head's own ĉ: 2
    assert chi_square_p(counts, exact) > PASS_P


def test_online_calibration_follows_the_judged_drafts():
    calibration = OnlineCalibration(bins=10, weight=4.0)
    assert calibration(0.85) == 0.85 and calibration(0.0) == 0.0 and calibration(1.0) == 1.0  # no past: the raw ĉ
    calibration.record([0.85, 0.87, 0.15], accepted=1)  # the third draft was never judged
    assert calibration.trials[8] == 2 and calibration.hits[8] == 1 and sum(calibration.trials) == 2
    assert calibration(0.85) == pytest.approx((1 + 4 * 0.85) / (2 + 4))
    calibration.record([0.15, 0.15], accepted=2)  # every draft accepted: both judged
    assert calibration.trials[1] == 2 and calibration.hits[1] == 2
    for _ in range(100):
        calibration.record([0.95], accepted=0)
    assert calibration(0.95) < 0.05  # a confident bin that is never accepted falls toward what happened


def test_dspark_broken_residual_is_detected(sampling_target, monkeypatch):
    """Control: correcting from p instead of the residual biases the output, and the test above would see it."""
    target, exact = sampling_target
    monkeypatch.setattr(accept_module.sampling, "residual", lambda p, q: p)
    counts, _ = engine_counts(target, sampling_dspark(target), DraftBudget(k=2), samples=300)
    assert chi_square_p(counts, exact) < FAIL_P


def test_ddtree_keeps_the_target_distribution(sampling_target):
    """A deterministic tree verified by drawing from the target at each node and descending while the draw is a
    child (the tree's verify forward, mask and cache rollback all feed those draws)."""
    target, exact = sampling_target
    drafter, budget = sampling_ddtree(target)
    counts, lengths = engine_counts(target, drafter, budget, samples=600)
    assert lengths == {4}
    assert chi_square_p(counts, exact) > PASS_P


def test_ddtree_verified_as_if_sampled_is_detected(sampling_target, monkeypatch):
    """Control: treating DDTree's argmax/top-w children as draws from its marginals (rejection sampling with q) is
    the classic mistake for deterministic drafts; it biases the output and the test above would see it."""
    target, exact = sampling_target
    monkeypatch.setattr(accept_module, "choose_rule",
                        lambda tree, config: "greedy" if config.greedy else "rejection-sampling")
    drafter, budget = sampling_ddtree(target)
    counts, _ = engine_counts(target, drafter, budget, samples=150)
    assert chi_square_p(counts, exact) < FAIL_P


def test_rounds_use_the_rule_that_fits_each_drafter(sampling_target):
    target, _ = sampling_target
    config = GenerationConfig(max_new_tokens=8, sampling=CONFIG, seed=3)
    run = Generation(target, SAMPLING_PROMPT, config, sampling_dspark(target), DraftBudget(k=2)).run()
    assert all(r.rule == "rejection-sampling" and r.sampled for r in run.rounds if r.tokens)
    drafter, budget = sampling_ddtree(target)
    run = Generation(target, SAMPLING_PROMPT, config, drafter, budget).run()
    assert all(r.rule == "target-sampling" and not r.sampled for r in run.rounds if r.tokens)


# ---- layouts ----------------------------------------------------------------------------------------------------
PUBLISHED = {
    "dflash__sgl-project__SpecForge__configs_qwen3-8b-dflash.json": "zlab-dflash",
    "dflash__sgl-project__SpecForge__configs_qwen3-4b-dflash.json": "zlab-dflash",
    "dspark__sgl-project__SpecForge__configs_qwen3-8b-dspark.json": "specforge-dspark",
    "dspark__sgl-project__SpecForge__configs_qwen3.6-27b-dspark.json": "specforge-dspark",
}


def _published(name: str) -> dict:
    return json.loads((LAYOUT_DIR / name).read_text())


def test_every_published_config_is_recognised_and_read():
    files = sorted(p.name for p in LAYOUT_DIR.glob("d*") if p.name.startswith(("dflash__", "dspark__"))
                   and "__keys__" not in p.name)
    assert set(files) == set(PUBLISHED), "a layout file was added or renamed: list it here"
    for name, dialect in PUBLISHED.items():
        config = _published(name)
        assert FORMAT.layout_of(config).name == dialect
        shape = TargetShape(config["hidden_size"], config["num_target_layers"], config["vocab_size"])
        spec = FORMAT.spec_of(config, shape)
        ids = config["dflash_config"]["target_layer_ids"]
        assert spec.feature_layers == tuple(i + 1 for i in ids)
        assert spec.block_size == config["block_size"]
        assert spec.mask_token_id == config["dflash_config"]["mask_token_id"]
        assert spec.head_dim == 128 and spec.num_layers == 5 and spec.num_kv_heads == 8
        if dialect == "zlab-dflash":
            assert spec.drafts == 15 and not spec.anchor_predicts and spec.kind == "dflash"
        else:
            assert spec.drafts == config["block_size"] and spec.anchor_predicts and spec.kind == "dspark"
            assert spec.markov_rank == 256 and spec.markov_type == "vanilla"
            assert spec.confidence_head and spec.confidence_with_markov
        for wrong in (SMOLLM2, replace(shape, vocab_size=shape.vocab_size + 1), replace(shape, num_layers=30)):
            got, reason = FORMAT.verdict(config, wrong)
            assert got == dialect and reason is not None and "\n" not in reason
    qwen8 = FORMAT.spec_of(_published("dflash__sgl-project__SpecForge__configs_qwen3-8b-dflash.json"), QWEN3_8B)
    assert qwen8.feature_layers == (2, 10, 18, 26, 34) and qwen8.mask_token_id == 151669
    big = _published("dspark__sgl-project__SpecForge__configs_qwen3.6-27b-dspark.json")
    assert FORMAT.spec_of(big, TargetShape(5120, 64, 248320)).feature_layers == (3, 18, 33, 48, 63)


def test_deepspec_top_level_config_and_zlab_variants():
    """DeepSpec keeps the DSpark settings at the top level; z-lab's newer configs nest block_size, and without ids
    z-lab's fallback spreads one id per draft layer."""
    source = _published("dspark__sgl-project__SpecForge__configs_qwen3-8b-dspark.json")
    deepspec = {k: v for k, v in source.items() if k not in ("dflash_config", "auto_map")}
    deepspec.update({k: v for k, v in source["dflash_config"].items() if k not in ("projector_type",)})
    deepspec["architectures"] = ["Qwen3DSparkModel"]
    assert FORMAT.layout_of(deepspec).name == "deepspec"
    assert FORMAT.spec_of(deepspec, QWEN3_8B) == FORMAT.spec_of(source, QWEN3_8B)
    zlab = _published("dflash__sgl-project__SpecForge__configs_qwen3-8b-dflash.json")
    nested = {**{k: v for k, v in zlab.items() if k != "block_size"},
              "dflash_config": {**zlab["dflash_config"], "block_size": 10}}
    assert FORMAT.spec_of(nested, QWEN3_8B).block_size == 10
    no_ids = {**zlab, "dflash_config": {"mask_token_id": 151669}}
    assert FORMAT.spec_of(no_ids, QWEN3_8B).feature_layers == (2, 10, 18, 26, 34)
    refusals = {"gated": ({**deepspec, "markov_head_type": "gated"}, "'gated' Markov head is not supported"),
                "unknown": ({**deepspec, "markov_head_type": "lstm"}, "unknown Markov head type 'lstm'"),
                "final norm": ({**deepspec, "target_layer_ids": [1, 35]}, r"hidden_states\[36\] is after"),
                "out of range": ({**deepspec, "target_layer_ids": [1, 40]}, r"reads hidden_states\[41\]"),
                "gemma": ({**deepspec, "model_type": "gemma4"}, "only Qwen3-style"),
                "window": ({**zlab, "use_sliding_window": True}, "sliding-window"),
                "no mask": ({**zlab, "dflash_config": {"target_layer_ids": [1]}}, "lacks mask_token_id"),
                "not dflash": ({"architectures": ["LlamaForCausalLM"]}, "not a DFlash or DSpark")}
    for name, (config, message) in refusals.items():
        with pytest.raises(SpecvizError, match=message) as error:
            FORMAT.spec_of(config, QWEN3_8B)
        assert "\n" not in str(error.value), name


def variants(models: dict) -> list[tuple[DFlashBackbone, str]]:
    return [(models["dflash"], "specviz"), (models["dflash"], "zlab-dflash"), (models["dspark"], "specviz"),
            (models["dspark"], "deepspec"), (models["dspark"], "specforge-dspark")]


def drafted(model: DFlashBackbone, target, budget: DraftBudget) -> list[tuple]:
    drafter = DSparkDrafter(model, VOCAB, cost_curve=STEEP) if model.spec.kind == "dspark" else \
        DFlashDrafter(model, VOCAB)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=16), drafter, budget)
    return [(r.tokens, r.parents, [round(q, 6) for q in r.q_draft], r.confidence) for r in run.rounds]


def test_our_drafters_resaved_in_each_layout_draft_identically(tmp_path, setup):
    targets, _, models = setup
    target = targets["hf"]
    for index, (model, layout) in enumerate(variants(models)):
        folder = save_drafter(model, tmp_path / f"{index}-{layout}", target_name="tiny", layout=layout)
        config = read_config(folder)
        assert FORMAT.layout_of(config).name == layout
        loaded = load_drafter(folder, target.model)
        assert loaded.spec == model.spec, layout
        budget = DraftBudget(tree=True, width=3, depth=4, max_nodes=8) if model.spec.kind == "dflash" else \
            DraftBudget(k=6)
        assert drafted(loaded, target, budget) == drafted(model, target, budget), layout


def tied_target() -> Target:
    """A tiny target whose output layer is its embedding (as SmolLM2's), peaked as ``setup``'s."""
    net = tiny.model("llama", VOCAB, layers=LAYERS)
    net.config.tie_word_embeddings = True
    net.lm_head.weight = net.model.embed_tokens.weight
    with torch.no_grad():
        net.model.embed_tokens.weight.mul_(25)
    assert net.lm_head.weight.data_ptr() == net.get_input_embeddings().weight.data_ptr()
    return Target(model=net, tokenizer=tiny.tokenizer(VOCAB), name="tiny-tied")


def test_drafters_for_a_tied_target_resave_in_each_layout_and_draft_identically(tmp_path, monkeypatch):
    """The DeepSpec layout carries embed_tokens and lm_head: for a tied target they are one tensor, written as two
    copies (safetensors refuses shared memory). Every layout re-saves and drafts as the original, DSpark's greedy
    calibration curve included; a write that fails leaves no folder behind."""
    import safetensors.torch

    target = tied_target()
    models = {kind: new_model(target.model, kind, mask_token_id=MASK, seed=1, **options)
              for kind, options in (("dflash", {}), ("dspark", {"markov_rank": 16}))}
    # as the shipped DSpark: a greedy calibration curve, which its schedule starts from (kept in every layout)
    models["dspark"].greedy_calibration = ReliabilityCurve(((0.0, 0.1), (1.0, 0.6)), samples=100)
    for index, (model, layout) in enumerate(variants(models)):
        folder = save_drafter(model, tmp_path / f"{index}-{layout}", target_name="tiny-tied", layout=layout)
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"], layout
        loaded = load_drafter(folder, target.model)
        assert loaded.spec == model.spec, layout
        assert getattr(loaded, "greedy_calibration", None) == getattr(model, "greedy_calibration", None), layout
        budget = DraftBudget(tree=True, width=3, depth=4, max_nodes=8) if model.spec.kind == "dflash" else \
            DraftBudget(k=6)
        assert drafted(loaded, target, budget) == drafted(model, target, budget), layout

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        save_drafter(models["dspark"], tmp_path / "failed" / "deepspec", target_name="tiny-tied", layout="deepspec")
    assert not (tmp_path / "failed" / "deepspec").exists()


def test_written_layouts_hold_the_published_names(tmp_path, setup):
    """z-lab checkpoints hold the body only (speculators' converter fixture names it); DeepSpec's carry copies of the
    target's embedding and output layer; ours records them instead of storing them."""
    targets, _, models = setup
    keys = {}
    for model, layout in variants(models):
        keys[layout] = set(read_tensors(save_drafter(model, tmp_path / layout, target_name="tiny", layout=layout)))
    lines = (LAYOUT_DIR / "dflash__keys__vllm-project_speculators_src_speculators_convert_dflash_converter.txt")
    body = [line.split("\t")[0] for line in lines.read_text().splitlines()[:9] if line and not line.startswith("#")]
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} == {k for k in body if "{" not in k}
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"} <= keys["zlab-dflash"]
    assert not {"embed_tokens.weight", "lm_head.weight"} & (keys["zlab-dflash"] | keys["specviz"])
    assert {"embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight", "confidence_head.proj.bias"} \
        <= keys["deepspec"]
    assert keys["specforge-dspark"] == keys["deepspec"] - {"embed_tokens.weight", "lm_head.weight"}


def test_flattened_model_optimizer_names_load(tmp_path, setup):
    from safetensors.torch import save_file

    targets, _, models = setup
    folder = save_drafter(models["dspark"], tmp_path / "modelopt", target_name="tiny", layout="specforge-dspark")
    tensors = read_tensors(folder)
    flat = {"markov_head.markov_w1.weight": "markov_w1.weight", "markov_head.markov_w2.weight": "markov_w2.weight",
            "confidence_head.proj.weight": "confidence_proj.weight",
            "confidence_head.proj.bias": "confidence_proj.bias"}  # NVIDIA Model-Optimizer's flattened names
    renamed = {flat.get(name, name): value for name, value in tensors.items()}
    assert "markov_w1.weight" in renamed and "confidence_proj.bias" in renamed
    save_file(renamed, str(folder / "model.safetensors"))
    loaded = load_drafter(folder, targets["hf"].model)
    for name, value in models["dspark"].state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)


def test_bin_checkpoints_load_only_as_plain_tensors(tmp_path, setup):
    targets, _, models = setup
    folder = save_drafter(models["dflash"], tmp_path / "st", target_name="tiny", layout="zlab-dflash")
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((folder / "config.json").read_text())
    torch.save(read_tensors(folder), binary / "pytorch_model.bin")
    assert load_drafter(binary, targets["hf"].model).spec == models["dflash"].spec
    torch.save({"fc.weight": tiny.Unpicklable()}, binary / "pytorch_model.bin")
    with pytest.raises(SpecvizError, match="weights_only=True") as error:
        load_drafter(binary, targets["hf"].model)
    assert "\n" not in str(error.value)
    # the reason (the blocked global), not torch's advice to re-run with weights_only=False
    assert "GLOBAL" in str(error.value) and "Unpicklable" in str(error.value) and "Re-running" not in str(error.value)



def test_bad_checkpoints_fail_in_one_line(tmp_path, setup):
    from safetensors.torch import save_file

    targets, _, models = setup
    net = targets["hf"].model

    def broken(name: str, kind: str, layout: str, edit) -> Path:
        folder = save_drafter(models[kind], tmp_path / name, target_name="tiny", layout=layout)
        tensors, config = read_tensors(folder), read_config(folder)
        edit(tensors, config)
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    def deeper(tensors, config):
        config["dflash_config"]["target_layer_ids"] = [1, 2, 3, 4, 8]

    other_embedding = torch.randn(VOCAB, 32)
    cases = {
        "missing": (broken("missing", "dflash", "zlab-dflash", lambda t, c: t.pop("layers.0.self_attn.k_norm.weight")),
                    "missing tensor layers.0.self_attn.k_norm.weight"),
        "shape": (broken("shape", "dspark", "deepspec",
                         lambda t, c: t.update({"markov_head.markov_w2.weight": torch.zeros(VOCAB, 8)})),
                  "tensor markov_head.markov_w2.weight has shape"),
        "extra": (broken("extra", "dflash", "zlab-dflash",
                         lambda t, c: t.update({"layers.0.self_attn.qkv_proj.weight": torch.zeros(4, 4)})),
                  "fused qkv_proj"),
        "hidden": (broken("hidden", "dflash", "zlab-dflash", lambda t, c: c.update({"hidden_size": 48})),
                   "hidden size mismatch"),
        "vocab": (broken("vocab", "dspark", "specforge-dspark", lambda t, c: c.update({"vocab_size": 96})),
                  "vocabulary mismatch"),
        "depth": (broken("depth", "dflash", "zlab-dflash", lambda t, c: c.update({"num_target_layers": 30})),
                  "made for a 30-layer target"),
        "layer ids": (broken("ids", "dflash", "zlab-dflash", deeper), r"hidden_states\[8\] is after the final norm"),
        "markov": (broken("markov", "dspark", "deepspec", lambda t, c: c.update({"markov_head_type": "rnn"})),
                   "'rnn' Markov head is not supported"),
        "other embedding": (broken("emb", "dspark", "deepspec",
                                   lambda t, c: t.update({"embed_tokens.weight": other_embedding})),
                            "embed_tokens.weight is not this target's"),
    }
    for name, (folder, message) in cases.items():
        with pytest.raises(SpecvizError, match=message) as error:
            load_drafter(folder, net)
        assert "\n" not in str(error.value) and str(error.value).startswith("block drafter "), name
    with pytest.raises(SpecvizError, match="it is a DSpark block drafter, not a DFlash"):
        load_drafter(save_drafter(models["dspark"], tmp_path / "kind", target_name="tiny"), net, kind="dflash")
    with pytest.raises(SpecvizError, match="config.json is missing"):
        load_drafter(tmp_path, net)
    with pytest.raises(SpecvizError, match="no such directory, and not a hub id"):
        load_drafter(tmp_path / "nowhere" / "deeper", net)
    with pytest.raises(SpecvizError, match="hub is offline") as error:  # conftest keeps the hub off
        load_drafter("no-such-owner/no-such-dflash", net)
    assert "\n" not in str(error.value)
    with pytest.raises(SpecvizError, match="the z-lab layout holds plain DFlash"):
        save_drafter(models["dspark"], tmp_path / "nope", target_name="tiny", layout="zlab-dflash")


@pytest.mark.parametrize("layout", ["specviz", "deepspec"])
def test_a_different_target_is_refused(tmp_path, setup, layout):
    """Same shapes, other weights: the recorded (ours) or carried (DeepSpec) embedding does not match."""
    targets, _, models = setup
    folder = save_drafter(models["dspark"], tmp_path / layout, target_name="tiny", layout=layout)
    other = tiny.model("llama", VOCAB, layers=LAYERS, scale=25, seed=7)
    with pytest.raises(SpecvizError, match="trained for") as error:
        load_drafter(folder, other)
    assert "\n" not in str(error.value)


def test_spec_round_trip_state_names_and_borrowed_tensors(setup):
    targets, _, models = setup
    for model in models.values():
        spec = model.spec
        assert layouts.BlockSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == FORMAT.expected_shapes(spec)
        assert not any("embed" in k or "lm_head" in k for k in model.state_dict())
    before = models["dflash"]._rope[0].clone()
    copy_model(models["dflash"], targets["hf"].model).to(torch.float16)
    assert torch.equal(models["dflash"]._rope[0], before)


# ---- the mask token and the registry --------------------------------------------------------------------------------
def test_mask_token_choice():
    with pytest.raises(SpecvizError, match="no mask token") as error:
        mask_token_for(tiny.tiny_tokenizer())
    assert "\n" not in str(error.value)
    assert mask_token_for(tiny.tiny_tokenizer(("<empty_output>",))) == len(tiny.SPECIALS) + len(tiny.WORDS)
    shipped = resources.MODELS / "smollm2-135m-draft" / "tokenizer.json"
    if shipped.is_file():  # SmolLM2's own tokenizer, when the assets are checked out
        added = {t["id"]: t for t in json.loads(shipped.read_text())["added_tokens"]}
        assert added[SMOLLM2_MASK_TOKEN_ID]["content"] == "<empty_output>" and added[SMOLLM2_MASK_TOKEN_ID]["special"]


def test_registry_specs(tmp_path, setup):
    targets, _, models = setup
    target = targets["fast"]
    assert registry.parse(f"dflash:{tmp_path}") == (registry.get("dflash"), str(tmp_path))
    for kind in ("dflash", "dspark"):
        title = registry.get(kind).title
        with pytest.raises(SpecvizError, match=f"no {title} is shipped for tiny-llama yet") as error:
            registry.build(kind, target, {})
        assert "\n" not in str(error.value)
    dflash_dir = save_drafter(models["dflash"], tmp_path / "dflash", target_name="tiny")
    dspark_dir = save_drafter(models["dspark"], tmp_path / "dspark", target_name="tiny", layout="deepspec")
    drafter = registry.build(f"dflash:{dflash_dir}", target, {})
    assert isinstance(drafter, DFlashDrafter) and drafter.describe()["feature_layers"] == [2, 3, 4, 5, 6]
    scheduled = registry.build(f"dspark:{dspark_dir}", target, {})
    assert isinstance(scheduled, DSparkDrafter) and scheduled.schedule
    assert scheduled.cost_curve.source == "measured on tiny-llama" and scheduled.cost_curve.widths[-1] == 8
    fixed = registry.build(f"dspark:fixed:{dspark_dir}", target, {})
    assert not fixed.schedule and fixed.name == f"dspark:fixed:{dspark_dir}"
    raw = registry.build(f"dspark:raw:{dspark_dir}", target, {})
    assert raw.schedule and not raw.calibrate and raw.describe()["confidence_calibration"] == "off"
    assert scheduled.calibrate and scheduled.describe()["confidence_calibration"] == "online"
    with pytest.raises(SpecvizError, match="load it as dspark:"):
        registry.build(f"dflash:{dspark_dir}", target, {})
    assert registry.trainers()["dflash"].name == "dflash" and registry.trainers()["dspark"].name == "dspark"


def _is_chain(parents: list[int]) -> bool:
    return all(parent == i - 1 for i, parent in enumerate(parents))


# ---- the greedy reliability curve ----------------------------------------------------------------------------------
def test_a_reliability_curve_pools_sparse_bins_and_rises():
    generator = torch.Generator().manual_seed(0)
    samples = [(raw, float(torch.rand(1, generator=generator)) < raw / 2)
               for raw in (i / 4000 for i in range(4000))]
    curve = ReliabilityCurve.fit(samples)
    assert len(curve.points) >= 5 and curve.samples == 4000
    assert all(b[0] >= a[0] and b[1] >= a[1] for a, b in zip(curve.points, curve.points[1:]))
    assert curve(0.5) == pytest.approx(0.25, abs=0.05) and curve(1.0) == curve.points[-1][1]
    assert curve(0.0) == curve.points[0][1]  # flat beyond the ends
    sparse = ReliabilityCurve.fit([(0.05, True)] * 5 + [(0.55, False)] * 30 + [(0.95, True)] * 30)
    assert sparse.points == ((pytest.approx((5 * 0.05 + 30 * 0.55) / 35, abs=1e-6), pytest.approx(5 / 35, abs=1e-6)),
                             (0.95, 1.0))
    sparse_top = ReliabilityCurve.fit([(0.15, False)] * 30 + [(0.55, True)] * 30 + [(0.95, True)] * 3)
    assert sparse_top.points == ((0.15, 0.0), (pytest.approx((30 * 0.55 + 3 * 0.95) / 33, abs=1e-6), 1.0))
    falling = ReliabilityCurve.fit([(0.15, True)] * 30 + [(0.85, False)] * 30)  # pooled into one rate
    assert falling.points == ((0.5, 0.5),)
    assert ReliabilityCurve.from_dict(curve.to_dict()) == curve
    for bad, message in (({}, "needs 'points'"), ({"points": "xy", "samples": 1}, "needs 'points'"),
                         ({"points": [[0.5, 2.0]], "samples": 1}, r"in \[0, 1\]"),
                         ({"points": [[0.9, 0.3], [0.2, 0.1]], "samples": 1}, "non-decreasing"),
                         ({"points": [[0.5, 0.3]], "samples": 0}, "at least one draft"),
                         ({"points": [[0.5, 0.3]], "samples": 2.5}, "whole number")):
        with pytest.raises(SpecvizError, match=message) as error:
            ReliabilityCurve.from_dict(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(SpecvizError, match="no judged drafts"):
        ReliabilityCurve.fit([])


def test_a_greedy_run_starts_from_the_shipped_curve(tmp_path, setup):
    """The curve in config.json is where a greedy run's calibration starts (its first round's ĉ are the curve's);
    a sampled run starts from the raw values; a malformed curve is refused in one line."""
    targets, baselines, models = setup
    target = targets["fast"]
    folder = save_drafter(models["dspark"], tmp_path / "dspark", target_name="tiny")
    config = json.loads((folder / "config.json").read_text())
    curve = ReliabilityCurve(((0.2, 0.1), (0.9, 0.3)), 100)
    (folder / "config.json").write_text(json.dumps({**config, GREEDY_CALIBRATION_KEY: curve.to_dict()}))
    drafter = registry.build(f"dspark:{folder}", target, {})
    assert drafter.greedy_prior == curve
    described = drafter.describe()["confidence_calibration"]
    assert described == "online (a greedy run starts from a curve fitted on 100 drafts)"
    assert drafter.describe()["greedy_curve"] == curve.to_dict()  # the views draw it
    assert registry.build(f"dspark:raw:{folder}", target, {}).describe()["greedy_curve"] is None  # not used there
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, DraftBudget(k=7))
    assert run.token_ids == baselines["fast"]
    first = run.rounds[0].meta
    assert first["calibrated"] == pytest.approx([curve(c) for c in first["confidence_head"]], abs=1e-5)
    sampled = generate(target, PROMPT, GenerationConfig(max_new_tokens=4, sampling=CONFIG), drafter, DraftBudget(k=7))
    first = sampled.rounds[0].meta
    assert first["calibrated"] == pytest.approx(first["confidence_head"], abs=1e-5)
    (folder / "config.json").write_text(json.dumps({**config, GREEDY_CALIBRATION_KEY: {"points": [[0.9, 0.3],
                                                                                                 [0.2, 0.1]],
                                                                                      "samples": 1}}))
    with pytest.raises(SpecvizError, match="non-decreasing") as error:
        registry.build(f"dspark:{folder}", target, {})
    assert "\n" not in str(error.value)
    (folder / "config.json").write_text(json.dumps({**config, GREEDY_CALIBRATION_KEY: {**curve.to_dict(),
                                                                                      "rule": "sampling"}}))
    with pytest.raises(SpecvizError, match="fitted under 'sampling', not greedy"):
        registry.build(f"dspark:{folder}", target, {})


def test_calibrate_collects_the_judged_drafts_of_every_verified_block(setup):
    targets, _, models = setup
    drafter = DSparkDrafter(models["dspark"], VOCAB, schedule=False)
    collected = calibrate.collect(targets["fast"], drafter, [PROMPT, PROMPT[:6]], 24, log=lambda *_: None)
    lengths = [len(raws) for rounds in collected for raws, _ in rounds]
    assert len(collected) == 2 and set(lengths) <= set(range(1, 8)) and lengths.count(7) >= len(lengths) - 2
    samples = calibrate.judged(collected)
    assert len(samples) == sum(min(len(raws), accepted + 1) for rounds in collected for raws, accepted in rounds)
    assert all(0 <= raw <= 1 for raw, _ in samples) and {hit for _, hit in samples} == {True, False}
    assert len(ReliabilityCurve.fit(samples).points) >= 1
    with pytest.raises(SpecvizError, match="verifies every draft"):
        calibrate.collect(targets["fast"], DSparkDrafter(models["dspark"], VOCAB), [PROMPT], 8)


def test_calibrate_evaluates_each_prediction_on_the_same_drafts():
    """Two prompts' rounds by hand: the online calibration learns each round after predicting it, per prompt."""
    collected = [[([0.9, 0.9], 2), ([0.9, 0.9], 0)], [([0.9], 0)]]
    assert calibrate.judged(collected) == [(0.9, True), (0.9, True), (0.9, False), (0.9, False)]
    online = calibrate.judged(collected, lambda raw, calibration: calibration(raw))
    assert [round(p, 6) for p, _ in online] == [0.9, 0.9, round((2 + 4 * 0.9) / 6, 6), 0.9]  # fresh per prompt
    curve = ReliabilityCurve(((0.1, 0.1), (0.9, 0.5)), 10)
    results = calibrate.evaluate(collected, curve, draws=5)
    assert list(results) == ["the head's raw ĉ", "the curve alone", "online from the raw ĉ", "online from the curve"]
    assert results["the head's raw ĉ"][0] == pytest.approx(abs(0.9 - 0.5))  # one bin: 4 drafts, half accepted
    assert results["the curve alone"][0] == pytest.approx(0.0)  # 0.5 predicted, 0.5 realised
    assert all(0 <= floor <= 1 for _, floor in results.values())
