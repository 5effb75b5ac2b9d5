"""Medusa heads: lossless drafting, the feature offset, static trees and choices, and the published layouts.

Heads are built in-process on tiny random targets and fitted for a few seconds to the target's own greedy
continuations (head h on the token h + 2 after the feature's position), so their drafts are partly accepted.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path

import pytest
import tiny
import torch
from test_eagle_training import feature_set
from test_sampling_lossless import CONFIG, FAIL_P, PASS_P, Table, V, chi_square_p
from test_sampling_lossless import PROMPT as SAMPLING_PROMPT

from specviz.drafters import medusa_layouts as layouts
from specviz.drafters import registry
from specviz.drafters.checkpoint_files import TargetShape, tensor_index
from specviz.drafters.medusa import (
    FORMAT,
    MedusaDrafter,
    MedusaHeads,
    build_heads,
    check_choices,
    default_choices,
    fit_choices,
    load_heads,
    new_heads,
    save_heads,
)
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.metrics import acceptance_by_label
from specviz.errors import SpecvizError
from specviz.training.batches import make_batch
from specviz.training.trainers import TrainConfig, fit, get_trainer
from specviz.training.trainers.medusa import derive_choices

VOCAB = 64
LAYERS = 4
HEADS = 3
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
NEW_TOKENS = 40
LAYOUT_DIR = Path(__file__).resolve().parent / "data" / "layouts"  # published configs and key names, see README.md
CHOICES = ((0,), (0, 0), (1,), (0, 1), (0, 0, 0), (2,), (1, 0), (0, 0, 1))


def fit_heads(heads: MedusaHeads, net: torch.nn.Module, steps: int = 150) -> MedusaHeads:
    """A stand-in for Medusa-1 training: head h learns the target's argmax of x[t+2+h] on its greedy text."""
    generator = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, VOCAB, (16, 4), generator=generator)
    with torch.no_grad():
        for _ in range(40):
            seqs = torch.cat([seqs, net(seqs).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        out = net(seqs, output_hidden_states=True)
    feats, chosen = out.hidden_states[-1], out.logits.argmax(-1)
    optimizer = torch.optim.Adam(heads.parameters(), lr=1e-2)
    heads.train()
    for _ in range(steps):
        states = heads.states(feats)
        loss = sum(0.8 ** h * torch.nn.functional.cross_entropy(
            heads.head_logits(h, states[:, : -1 - h, h]).reshape(-1, VOCAB), chosen[:, 1 + h:].reshape(-1))
            for h in range(heads.num_heads))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


@pytest.fixture(scope="module")
def setup():
    targets = tiny.both_forwards("llama", VOCAB, layers=LAYERS, scale=25)
    baselines = tiny.plain_outputs(targets, PROMPT, NEW_TOKENS)
    model = targets["hf"].model
    return targets, baselines, fit_heads(new_heads(model, HEADS, 1, seed=1), model)


def copy_heads(heads: MedusaHeads, model: torch.nn.Module) -> MedusaHeads:
    return build_heads(model, heads.spec, heads.state_dict())


SHAPES = [(DraftBudget(k=1), None), (DraftBudget(k=4), None),
          (DraftBudget(tree=True, width=3, depth=3, max_nodes=8), CHOICES),
          (DraftBudget(tree=True, width=2, depth=3, max_nodes=6), None)]


@pytest.mark.parametrize("budget, choices", SHAPES, ids=["chain_k1", "chain_k4", "tree_choices", "tree_default"])
@pytest.mark.parametrize("forward", ["hf", "fast"])
def test_greedy_matches_plain(setup, forward, budget, choices):
    targets, baselines, heads = setup
    target = targets[forward]
    drafter = MedusaDrafter(copy_heads(heads, target.model), target.vocab_size, choices=choices)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, budget)
    assert run.token_ids == baselines[forward]
    assert all(r.rule == "greedy" and r.lossless and not r.sampled for r in run.rounds)
    assert all(len(r.tokens) <= (budget.max_nodes if budget.tree else min(budget.k, HEADS)) for r in run.rounds)


def test_drafts_are_partly_accepted_and_labelled_by_head(setup):
    targets, _, heads = setup
    run = generate(targets["hf"], PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS),
                   MedusaDrafter(heads, VOCAB, choices=CHOICES), DraftBudget(tree=True, width=3, depth=3, max_nodes=8))
    accepted, drafted = sum(len(r.accepted) for r in run.rounds), sum(len(r.tokens) for r in run.rounds)
    assert 0 < accepted < drafted
    assert any(len(r.accepted) >= 2 for r in run.rounds), "head 1 should be right sometimes"
    for record in run.rounds:
        depth: list[int] = []
        for parent in record.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        assert record.meta["head"] == [d - 1 for d in depth]
        for node, parent in enumerate(record.parents):  # confidence: the path product of the heads' q
            expected = record.q_draft[node] * (1.0 if parent < 0 else record.confidence[parent])
            assert record.confidence[node] == pytest.approx(expected, rel=1e-5)
    per_head = acceptance_by_label(run.rounds, "head")
    assert per_head[0].offered == len(run.rounds)
    assert per_head[0].accepted == sum(1 for r in run.rounds if r.accepted)
    assert per_head[1].offered == per_head[0].accepted
    assert [list(stats.depths) for stats in per_head.values()] == [[h + 1] for h in per_head]
    json.dumps([r.meta for r in run.rounds])


def test_heads_read_the_feature_of_the_position_before_the_pending_token(setup):
    """After ``context`` the drafter applies the heads to hidden_states[L] of position len(context) - 2 (the newest
    feature a verify forward has seen): depth d is head d - 1 there, exactly the training forward's output."""
    targets, _, heads = setup
    target = targets["hf"]
    trees, contexts = [], []

    class Keeping(MedusaDrafter):
        def propose(self, context, *args):
            contexts.append(list(context))
            trees.append(super().propose(context, *args))
            return trees[-1]

    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=16), Keeping(heads, VOCAB, choices=CHOICES,
                                                                                 pack=False),
                     DraftBudget(tree=True, width=3, depth=3, max_nodes=8))
    for _ in run:
        pass
    order = sorted(CHOICES, key=lambda c: (len(c), c))  # Medusa's buffer order: by depth, then ranks
    checked = 0
    for context, tree in zip(contexts, trees):
        if len(tree) < len(CHOICES):  # the last rounds cap the depth at the tokens still to generate
            continue
        checked += 1
        with torch.inference_mode():
            feats = target.model(torch.tensor([context]), output_hidden_states=True).hidden_states[LAYERS]
            logits = heads(feats[0, -2])  # the training forward, at position len(context) - 2
        q, top = logits.softmax(-1), logits.topk(3).indices
        assert tree.tokens == [int(top[len(c) - 1, c[-1]]) for c in order]
        assert tree.meta["head"] == [len(c) - 1 for c in order]
        torch.testing.assert_close(tree.q_dist[0], q[0], atol=1e-5, rtol=1e-4)
        for node, h in enumerate(tree.meta["head"]):
            expected = q[h + 1] if h + 1 < HEADS else torch.zeros(VOCAB)  # what the node's children are drawn from
            torch.testing.assert_close(tree.q_dist[node + 1], expected, atol=1e-5, rtol=1e-4)
    assert checked >= 3


# ---- choices ----------------------------------------------------------------------------------------------------
def test_choices_are_checked_in_one_line():
    assert check_choices([[0], [0, 0], [1], (0, 1)]) == ((0,), (0, 0), (1,), (0, 1))
    for bad, message in (([[0, 0], [0]], "before its parent"), ([[0], [0]], "listed twice"),
                         ([[]], "non-empty"), ([[-1]], "ranks >= 0"), ([[0.5]], "ranks >= 0"), ([3], "list of lists"),
                         ("ab", "list of lists"), ([["a"]], "ranks >= 0"), ([[float("nan")]], "ranks >= 0"),
                         ([[True]], "ranks >= 0"), (5, "list of lists"), ([[10**30]], None)):
        if message is None:  # a huge rank is a valid path (the heads' top-k caps it when drafting)
            check_choices(bad)
            continue
        with pytest.raises(SpecvizError, match=message) as error:
            check_choices(bad)
        assert "\n" not in str(error.value)


def test_derive_choices_follows_the_product_of_accuracies():
    accuracy = [[0.7, 0.2, 0.05], [0.6, 0.15, 0.1], [0.5, 0.2, 0.1]]
    choices = derive_choices(accuracy, 6)
    # products: (0,) .7, (0,0) .42, (0,0,0) .21, (1,) .2, (1,0) .12, (0,1) .105; then (0,0,1) .084 ...
    assert choices == ((0,), (0, 0), (0, 0, 0), (1,), (1, 0), (0, 1))
    assert check_choices(choices) == choices  # parents first
    assert derive_choices(accuracy, 100)[-1] == (2, 2, 2) and len(derive_choices(accuracy, 100)) == 3 + 9 + 27


def test_budget_cuts_the_choices_and_the_default_tree():
    budget = DraftBudget(tree=True, width=2, depth=2, max_nodes=4)
    assert fit_choices(CHOICES, budget, HEADS) == ((0,), (0, 0), (1,), (0, 1))
    assert fit_choices(CHOICES, replace(budget, max_nodes=32), 1) == ((0,), (1,))
    tree = default_choices(HEADS, 2, 3, 6)
    assert tree[:3] == ((0,), (0, 0), (0, 0, 0)) and len(tree) == 6 and check_choices(tree) == tree


# ---- sampling ---------------------------------------------------------------------------------------------------
class _SampledLie(MedusaDrafter):
    """The broken rule of the control: a deterministic tree verified as if its nodes were drawn from q."""

    def propose(self, *args):
        tree = super().propose(*args)
        tree.sampled = True
        return tree


def engine_counts(target, drafter, budget, samples: int) -> dict:
    counts: dict[tuple[int, int], int] = {}
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        tokens = Generation(target, SAMPLING_PROMPT, config, drafter, budget).run().token_ids
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


@pytest.fixture(scope="module")
def sampling_target():
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    return target, Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()


def test_deterministic_tree_under_target_sampling_keeps_the_distribution(sampling_target):
    target, exact = sampling_target
    drafter = MedusaDrafter(new_heads(target.model, 2, 1, seed=4, std=0.5), V, choices=((0,), (1,), (0, 0), (1, 0)))
    counts = engine_counts(target, drafter, DraftBudget(tree=True, width=2, depth=2, max_nodes=4), 1_000)
    assert chi_square_p(counts, exact) > PASS_P


def test_verifying_the_tree_as_sampled_is_detected(sampling_target):
    """Control: rejection sampling against the heads' q, for nodes that were not drawn from q, biases the output."""
    target, exact = sampling_target
    drafter = _SampledLie(new_heads(target.model, 2, 1, seed=4, std=0.5), V, choices=((0,), (1,), (0, 0), (1, 0)))
    counts = engine_counts(target, drafter, DraftBudget(tree=True, width=2, depth=2, max_nodes=4), 600)
    assert chi_square_p(counts, exact) < FAIL_P


# ---- published layouts ------------------------------------------------------------------------------------------
def drafted(heads: MedusaHeads, target, choices=CHOICES) -> list[tuple]:
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=16), MedusaDrafter(heads, VOCAB, choices=choices),
                   DraftBudget(tree=True, width=3, depth=3, max_nodes=8))
    return [(r.tokens, r.parents, [round(q, 5) for q in r.q_draft]) for r in run.rounds]


def with_own_heads(heads: MedusaHeads, model, seed: int = 5) -> MedusaHeads:
    """The same blocks with their own (perturbed) output layers."""
    spec = replace(heads.spec, own_lm_head=True)
    own = build_heads(model, spec)
    state = {k: v for k, v in heads.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    for i in range(spec.num_heads):
        weight = model.lm_head.weight.detach()
        state[f"heads.{i}.{spec.num_layers}.weight"] = weight + 0.3 * torch.randn(weight.shape, generator=generator)
    own.load_state_dict(state)
    return own.eval()


def test_our_heads_resaved_in_each_layout_draft_identically(tmp_path, setup):
    targets, _, heads = setup
    target = targets["hf"]
    own = with_own_heads(heads, target.model)
    for index, (source, layout) in enumerate([(h, layout) for h in (heads, own) for layout in layouts.DIALECTS]):
        folder = save_heads(source, tmp_path / f"{index}-{layout}", target_name="tiny", layout=layout,
                            choices=CHOICES)
        loaded, choices = load_heads(folder, target.model)
        assert loaded.spec == source.spec, layout  # copies of the target's head come back borrowed
        assert choices == CHOICES
        assert drafted(loaded, target) == drafted(source, target), layout
    assert (tmp_path / "1-medusa" / "medusa_lm_head.safetensors").is_file()


def test_fasterdecoding_pt_and_legacy_heads(tmp_path, setup):
    """``medusa_lm_head.pt`` loads only as plain tensors; Medusa-1's legacy file (no output layers) uses the
    target's; an unsafe pickle is refused in one line."""
    targets, _, heads = setup
    model, target = targets["hf"].model, targets["hf"]
    folder = save_heads(heads, tmp_path / "st", target_name="tiny", layout="medusa")
    tensors = tensor_index(folder)[1](lambda _: True)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((folder / "config.json").read_text())
    blocks_only = {k: v for k, v in tensors.items() if not re.fullmatch(r"\d+\.1\.weight", k)}
    torch.save(blocks_only, legacy / "medusa_lm_head.pt")
    loaded, _ = load_heads(legacy, model)
    assert not loaded.spec.own_lm_head and drafted(loaded, target) == drafted(heads, target)
    full = tmp_path / "medusa2"  # a Medusa-2 full model: the heads under ``medusa_head.`` among the base weights
    full.mkdir()
    (full / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                  "architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    from safetensors.torch import save_file

    save_file({**{f"medusa_head.{k}": v for k, v in tensors.items()}, "model.norm.weight": torch.ones(32)},
              str(full / "model.safetensors"))
    assert drafted(load_heads(full, model)[0], target) == drafted(heads, target)
    torch.save({**tensors, "0.0.linear.weight": tiny.Unpicklable()}, legacy / "medusa_lm_head.pt")
    with pytest.raises(SpecvizError, match="weights_only=True") as error:
        load_heads(legacy, model)
    assert "\n" not in str(error.value)



def test_vllm_truncated_vocabulary(tmp_path, setup):
    """vLLM's ``token_map``: the heads' own output rows cover some ids; the others are never drafted (q = 0)."""
    targets, _, heads = setup
    target = targets["hf"]
    keep = torch.arange(0, VOCAB, 2)
    own = with_own_heads(heads, target.model)
    spec = replace(own.spec, draft_vocab_size=len(keep))
    state = {k: (v[keep] if re.fullmatch(r"heads\.\d+\.1\.weight", k) else v) for k, v in own.state_dict().items()}
    small = build_heads(target.model, spec, {**state, "token_map": keep})
    folder = save_heads(small, tmp_path / "vllm", target_name="tiny", layout="vllm")
    assert json.loads((folder / "config.json").read_text())["truncated_vocab_size"] == len(keep)
    loaded, _ = load_heads(folder, target.model)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=16), MedusaDrafter(loaded, VOCAB),
                   DraftBudget(tree=True, width=3, depth=3, max_nodes=8))
    assert all(t % 2 == 0 for r in run.rounds for t in r.tokens)
    assert run.token_ids == plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=16)).token_ids


def test_published_module_layout_is_recognised():
    """FasterDecoding's printed ``medusa_head`` (4 heads, ResBlock 4096 -> 4096 with bias, Linear 4096 -> 32000
    without): the names and shapes our medusa layout reads for that config are exactly those modules'."""
    text = (LAYOUT_DIR / "medusa__keys__FasterDecoding_Medusa_notebooks_medusa_introduction_module_repr.txt"
            ).read_text()
    heads = int(re.search(r"\(0-(\d+)\): (\d+) x Sequential", text).group(2))
    linears = [(int(a), int(b), c == "True") for a, b, c in
               re.findall(r"Linear\(in_features=(\d+), out_features=(\d+), bias=(\w+)\)", text)]
    (block_in, block_out, block_bias), (head_in, vocab, head_bias) = linears
    expected = {}
    for i in range(heads):
        expected[f"{i}.0.linear.weight"] = (block_out, block_in)
        if block_bias:
            expected[f"{i}.0.linear.bias"] = (block_out,)
        expected[f"{i}.1.weight"] = (vocab, head_in)
    assert not head_bias and len(expected) == 12
    config = {"medusa_num_heads": heads, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    shape = TargetShape(hidden_size=4096, num_layers=32, vocab_size=vocab)
    spec = FORMAT.spec_of(config, shape, expected)
    assert spec.own_lm_head and spec.block_bias and spec.num_heads == 4 and spec.feature_layer == 32
    env = FORMAT.env(spec)
    ours = {FORMAT["medusa"].theirs(k, env): s for k, s in FORMAT.expected_shapes(spec).items()}
    assert ours == expected
    assert FORMAT.layout_of(config, set(expected)).name == "medusa"
    reason = None
    try:
        FORMAT.spec_of(config, TargetShape(576, 30, 49152), expected)
    except SpecvizError as error:
        reason = str(error)
    assert reason.startswith("hidden size mismatch") and "\n" not in reason


def test_bad_checkpoints_fail_in_one_line(tmp_path, setup):
    from safetensors.torch import save_file

    targets, _, heads = setup
    model = targets["hf"].model

    def broken(name: str, layout: str, edit) -> Path:
        folder = save_heads(heads, tmp_path / name, target_name="tiny", layout=layout)
        file = next(folder.glob("*.safetensors"))
        tensors = tensor_index(folder)[1](lambda _: True)
        config = json.loads((folder / "config.json").read_text())
        edit(tensors, config)
        save_file(tensors, str(file))
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    cases = {
        "missing": (broken("missing", "medusa", lambda t, c: t.pop("1.0.linear.weight")),
                    "missing tensor 1.0.linear.weight"),
        "shape": (broken("shape", "vllm", lambda t, c: t.update({"blocks.0.layers.0.weight": torch.zeros(32, 16)})),
                  "tensor blocks.0.layers.0.weight has shape"),
        "heads": (broken("heads", "medusa", lambda t, c: c.update({"medusa_num_heads": 5})), "missing tensor 3."),
        "vocab": (broken("vocab", "vllm", lambda t, c: c.update({"vocab_size": 96})), "vocabulary mismatch"),
        "extra": (broken("extra", "vllm", lambda t, c: t.update({"blocks.0.layers.1.weight": torch.zeros(32, 32)})),
                  "unexpected tensors"),
        "choices": (broken("choices", "specviz", lambda t, c: c.update({"medusa_choices": [[0, 1], [0]]})),
                    "before its parent"),
    }
    for name, (folder, message) in cases.items():
        with pytest.raises(SpecvizError, match=message) as error:
            load_heads(folder, model)
        assert "\n" not in str(error.value) and str(error.value).startswith("Medusa heads "), name
    other = tiny.model("llama", VOCAB, layers=LAYERS, scale=25, seed=7)
    with pytest.raises(SpecvizError, match="trained for tiny"):
        load_heads(save_heads(heads, tmp_path / "ours", target_name="tiny"), other)
    with pytest.raises(SpecvizError, match="not a Medusa config"):
        FORMAT.layout_of({"model_type": "llama"})
    with pytest.raises(SpecvizError, match="config.json is missing"):
        load_heads(tmp_path, model)
    with pytest.raises(SpecvizError, match="hub is offline") as error:
        load_heads("no-such-owner/no-such-medusa", model)
    assert "\n" not in str(error.value)


def test_registry(tmp_path, setup):
    targets, _, heads = setup
    target = targets["hf"]
    family = registry.get("medusa")
    assert family.trainer == "medusa" and family.layers_for(30) == (30,)
    assert family.reads == ("min_draft_prob", "draft_quant")
    with pytest.raises(SpecvizError, match="no Medusa heads are shipped for tiny-") as error:
        registry.build("medusa", target, {"min_draft_prob": 0.0})
    assert "\n" not in str(error.value)
    folder = save_heads(heads, tmp_path / "h", target_name="tiny", choices=CHOICES)
    drafter = registry.build(f"medusa:{folder}", target, {"min_draft_prob": 0.0})
    assert isinstance(drafter, MedusaDrafter) and drafter.choices == CHOICES
    assert drafter.describe()["heads"] == HEADS
    assert layouts.MedusaSpec.from_dict(json.loads(json.dumps(heads.spec.to_dict()))) == heads.spec
    assert {k: tuple(v.shape) for k, v in heads.state_dict().items()} == FORMAT.expected_shapes(heads.spec)


def test_min_draft_prob_prunes_below_unsure_nodes(setup):
    targets, _, heads = setup
    run = generate(targets["hf"], PROMPT, GenerationConfig(max_new_tokens=12), MedusaDrafter(heads, VOCAB,
                                                                                            choices=CHOICES),
                   DraftBudget(tree=True, width=3, depth=3, max_nodes=8, min_draft_prob=0.5))
    for record in run.rounds:
        assert all(record.q_draft[p] >= 0.5 for p in record.parents if p >= 0)


# ---- training ---------------------------------------------------------------------------------------------------
def test_trainer_learns_and_ships_derived_choices(tmp_path):
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(0)
    sequences = [[rng.randrange(VOCAB) for _ in range(24)] for _ in range(16)]
    trainer = get_trainer("medusa")(target, {"layers": 1, "target_name": "tiny"})
    data = feature_set(target.model, sequences, trainer.features().layers)
    assert trainer.features().layers == (LAYERS,)
    trainer.prepare(data)
    heads = trainer.build_student()
    batch = make_batch(data, list(range(8)), 24)
    before = trainer.loss(heads, batch)[0].item()
    config = TrainConfig(steps=25, batch_size=8, seq_len=24, lr=1e-2, warmup=3, save_every=100, log_every=10)
    fit(trainer, heads, data, config, tmp_path, log=lambda line: None)
    after, stats = trainer.loss(heads, batch)
    assert after.item() < before * 0.95 and {"loss0", "loss3"} <= set(stats)
    ids = torch.tensor([sequences[0]])
    feats = data.hidden[LAYERS][data.sequence(0)]
    guesses = trainer.predict_argmax(heads, ids, {LAYERS: feats[None]})  # also records held-out accuracy
    assert torch.equal(guesses[1:], heads(feats[:-1])[:, 0].argmax(-1))
    choices, accuracy, measured = trainer.tree_choices(heads)
    assert measured == "held-out target answers" and len(accuracy) == 4 and len(accuracy[0]) == 10
    assert choices == derive_choices(accuracy, 24) and check_choices(choices) == choices
    trainer.save_pretrained(heads, tmp_path / "final")
    loaded, shipped = load_heads(tmp_path / "final", target.model)
    assert shipped == choices and loaded.spec == heads.spec
    saved = json.loads((tmp_path / "final" / "config.json").read_text())
    assert len(saved["medusa_head_accuracy"]) == 4
    assert generate(target, PROMPT, GenerationConfig(max_new_tokens=12), MedusaDrafter(loaded, VOCAB, choices=shipped),
                    DraftBudget(tree=True, width=10, depth=4, max_nodes=24)).token_ids == \
        plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=12)).token_ids
