"""DFlash / DSpark training: the training forward computes exactly what drafting computes, the losses mean what
they say, and a short run learns and saves a loadable drafter."""

import math
import random

import pytest
import tiny
import torch
from test_eagle_training import feature_set

from specviz.drafters import dflash, registry
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig
from specviz.training.batches import Batch, make_batch
from specviz.training.trainers import TRAINERS, TrainConfig, fit, get_trainer
from specviz.training.trainers.dflash import (
    block_outputs,
    confidence_loss,
    confidence_target,
    expected_calibration_error,
    forward_blocks,
    position_gamma,
    position_weights,
    sample_anchors,
    total_variation,
)

VOCAB = 64
LAYERS = 8
MASK = VOCAB - 1
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]


def sequence_batch(target_model, sequence: list[int], layers: tuple[int, ...]) -> Batch:
    """One sequence as a training batch: the target's hidden states and top-8 at every position."""
    data = feature_set(target_model, [sequence], layers, topk=8)
    return make_batch(data, [0], len(sequence))


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_training_forward_reproduces_the_drafted_block(kind):
    """The trainer's blocks (anchors sampled in a batch, all blocks in one masked forward, the Markov head
    teacher-forced on the true tokens) give, at the anchor drafting used, the drafted tokens and the very
    distributions and confidences drafting computed, when the true tokens are the drafted ones."""
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=25)
    model = dflash.new_model(target.model, kind, mask_token_id=MASK, seed=3, markov_rank=16)
    drafter = (dflash.DSparkDrafter(model, VOCAB, schedule=False, pack=False) if kind == "dspark" else
               dflash.DFlashDrafter(model, VOCAB, pack=False))
    trees = []
    propose = drafter.propose
    drafter.propose = lambda *args: trees.append(propose(*args)) or trees[-1]
    context = list(PROMPT)
    for index, record in enumerate(Generation(target, PROMPT, GenerationConfig(max_new_tokens=30), drafter,
                                              DraftBudget(k=model.spec.drafts))):
        if index == 2:
            break
        context += record.committed
    tree = trees[-1]  # drafted after ``context``
    assert tree.is_chain and len(tree) == model.spec.drafts
    batch = sequence_batch(target.model, context + tree.tokens, model.feature_layers)
    batch.loss_mask[:] = True  # every draft position is compared (the last one's top-k is the target's too)
    with torch.no_grad():
        out = block_outputs(model, batch, torch.tensor([[len(context) - 1]]))
    assert out.draft_index.tolist() == list(range(model.spec.drafts))
    q = out.logits.float().softmax(-1)
    torch.testing.assert_close(q, tree.q_dist[: len(tree)], atol=1e-5, rtol=1e-4)
    assert q.argmax(-1).tolist() == tree.tokens
    if kind == "dspark":
        torch.testing.assert_close(out.confidence, torch.tensor(trees[-1].meta["confidence_head"]), atol=1e-5,
                                   rtol=1e-4)
    # the held-out evaluation's guess at position a is the first draft of the block anchored at a (what the drafter
    # proposed here), compared there with the target's argmax for token a + 1
    trainer = get_trainer(kind)(target, {"mask_token_id": MASK, "markov_rank": 16})
    guess = trainer.predict_argmax(model, batch.input_ids, batch.hidden)
    assert guess[len(context) - 1] == tree.tokens[0] and guess[-1] == -1


def test_blocks_see_only_their_context_and_themselves():
    """One forward over many anchors equals one forward per anchor (no block sees another, nor the future)."""
    target = tiny.model("llama", VOCAB, layers=LAYERS, scale=10)
    model = dflash.new_model(target, "dspark", mask_token_id=MASK, seed=1, markov_rank=8)
    seq = [random.Random(0).randrange(VOCAB) for _ in range(20)]
    batch = sequence_batch(target, seq, model.feature_layers)
    features = torch.cat([batch.hidden[layer] for layer in model.feature_layers], dim=-1)
    anchors = torch.tensor([[2, 9, 15]])
    with torch.no_grad():
        together = forward_blocks(model, features, batch.input_ids, anchors)
        for column, anchor in enumerate(anchors[0].tolist()):
            alone = forward_blocks(model, features[:, :anchor], batch.input_ids[:, : anchor + 1],
                                   torch.tensor([[anchor]]))
            torch.testing.assert_close(together[:, column], alone[:, 0], atol=1e-5, rtol=1e-4)


def test_anchor_sampling_uses_trained_positions_only():
    batch = sequence_batch(tiny.model("llama", VOCAB, layers=2), list(range(10)), (1,))
    batch.loss_mask[0, :6] = False
    torch.manual_seed(0)
    anchors, usable = sample_anchors(batch, 6)
    real = anchors[usable]
    assert sorted(real.tolist()) == [6, 7, 8] and int((~usable).sum()) == 3  # position 9 predicts nothing


def test_total_variation_with_the_target_top_k():
    """Exact when p's mass is all in its top-k; a lower bound (the rest lumped) otherwise."""
    generator = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(5, 12, generator=generator), -1)
    p = torch.softmax(torch.randn(5, 12, generator=generator) * 3, -1)
    exact = 0.5 * (p - q).abs().sum(-1)
    values, ids = p.topk(8, dim=-1)
    lumped = total_variation(q, ids, values)
    assert bool((lumped <= exact + 1e-6).all()) and bool((lumped > 0).all())
    full_values, full_ids = p.topk(12, dim=-1)
    torch.testing.assert_close(total_variation(q, full_ids, full_values), exact)
    assert float(total_variation(p, full_ids, full_values).abs().max()) < 1e-6


def test_position_decay_constants():
    assert [position_gamma(b) for b in (16, 10, 8, 7)] == [7, 5, 4, 4]


def test_position_weights_decay_as_exp_minus_k_minus_1_over_gamma():
    """The k-th draft (0-based index j = k − 1) weighs exp(−(k − 1)/γ), γ = 7 for blocks of 16, 4 for 8."""
    index = torch.tensor([0.0, 1.0, 2.0, 5.0, 0.0])
    torch.testing.assert_close(position_weights(index, 16), torch.tensor([math.exp(-j / 7) for j in index.tolist()]))
    torch.testing.assert_close(position_weights(index, 8), torch.tensor([1.0, math.exp(-1 / 4), math.exp(-2 / 4),
                                                                        math.exp(-5 / 4), 1.0]))


def test_confidence_target_is_one_minus_the_total_variation():
    """DSpark's confidence learns the per-step acceptance 1 − ½‖p − q‖₁: by hand on a 4-token vocabulary
    (p = [.5, .3, .2, 0], q uniform: ½(.25 + .05 + .05 + .25) = .3), with p's top 2 only (rest lumped: the same
    here), and the BCE against it."""
    q = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.6, 0.2, 0.1]])
    full_ids, full_p = torch.tensor([[0, 1, 2, 3]] * 2), torch.tensor([[0.5, 0.3, 0.2, 0.0]] * 2)
    # second row: ½(|.5 − .1| + |.3 − .6| + 0 + |0 − .1|) = .4
    torch.testing.assert_close(confidence_target(total_variation(q, full_ids, full_p)), torch.tensor([0.7, 0.6]))
    top_ids, top_p = full_ids[:, :2], full_p[:, :2]  # rest: p .2, q .5 and .3 → ½(.25 + .05 + .3), ½(.4 + .3 + .1)
    torch.testing.assert_close(confidence_target(total_variation(q, top_ids, top_p)), torch.tensor([0.7, 0.6]))
    tv = torch.tensor([0.3, 0.0, 1.0, 1.2, -0.1], requires_grad=True)
    target = confidence_target(tv)
    torch.testing.assert_close(target, torch.tensor([0.7, 1.0, 0.0, 0.0, 1.0]))  # within [0, 1]
    assert not target.requires_grad  # a target, not a path for gradients into the draft
    c = torch.tensor([0.8, 0.5, 0.0])
    expected = [-(0.7 * math.log(0.8) + 0.3 * math.log(0.2)), -math.log(0.5), -math.log(1 - 1e-6)]
    torch.testing.assert_close(confidence_loss(c, torch.tensor([0.3, 0.0, 1.0])), torch.tensor(expected))


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_loss_values_follow_the_formulas(kind):
    """``trainer.loss`` recomputed from the same blocks by the formulas: CE to the renormalised top-k, and for DSpark
    the total variation and the confidence BCE against 1 − TV, each averaged with weights exp(−j/γ) (γ = 4 for
    DFlash's 8 and DSpark's 7); DSpark's loss = 0.1 CE + 0.9 TV + BCE. The unweighted means differ, so the decay
    is what is checked."""
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(1)
    sequences = [[rng.randrange(VOCAB - 1) for _ in range(20)] for _ in range(4)]
    trainer = get_trainer(kind)(target, {"mask_token_id": MASK, "markov_rank": 8, "anchors": 5})
    data = feature_set(target.model, sequences, trainer.features().layers, topk=8)
    trainer.prepare(data)
    student = trainer.build_student()
    batch = make_batch(data, list(range(4)), 20)
    torch.manual_seed(0)
    loss, stats = trainer.loss(student, batch)
    torch.manual_seed(0)  # the same anchors
    with torch.no_grad():
        out = block_outputs(student, batch, *sample_anchors(batch, 5))
    assert student.spec.block_size == (7 if kind == "dspark" else 8)
    weight = torch.tensor([math.exp(-j / 4) for j in out.draft_index.tolist()])
    assert len(set(out.draft_index.tolist())) > 1
    q = out.logits.float().softmax(-1)
    assert bool((out.top_ids >= 0).all())
    p = out.top_p  # the target's top 8 (their mass below 1: the rest lumped in the TV)
    ce = -(p / p.sum(-1, keepdim=True) * q.gather(-1, out.top_ids).log()).sum(-1)

    def weighted(values):
        return float((values * weight).sum() / weight.sum())

    assert stats["ce"] == pytest.approx(weighted(ce), rel=1e-5)
    assert abs(weighted(ce) - float(ce.mean())) > 1e-3 * weighted(ce)
    if kind == "dflash":
        assert loss.item() == pytest.approx(weighted(ce), rel=1e-5)
        return
    q_top = q.gather(-1, out.top_ids)
    tv = 0.5 * ((p - q_top).abs().sum(-1) + ((1 - p.sum(-1)) - (1 - q_top.sum(-1))).abs())
    c = out.confidence
    bce = -((1 - tv) * c.log() + tv * (1 - c).log())
    assert stats["tv"] == pytest.approx(weighted(tv), rel=1e-5)
    assert stats["bce"] == pytest.approx(weighted(bce), rel=1e-5)
    assert abs(weighted(bce) - float(bce.mean())) > 1e-3 * weighted(bce)
    assert loss.item() == pytest.approx(0.1 * weighted(ce) + 0.9 * weighted(tv) + weighted(bce), rel=1e-5)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_short_training_lowers_the_loss_and_saves(kind, tmp_path):
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(0)
    sequences = [[rng.randrange(VOCAB - 1) for _ in range(24)] for _ in range(16)]
    trainer = get_trainer(kind)(target, {"mask_token_id": MASK, "target_name": "tiny", "markov_rank": 8,
                                         "anchors": 6, "layers": None})
    assert trainer.features().layers == (2, 3, 4, 5, 6) and trainer.features().topk == 8
    data = feature_set(target.model, sequences, trainer.features().layers, topk=8)
    trainer.prepare(data)
    student = trainer.build_student()
    assert student.spec.kind == kind and student.spec.block_size == (7 if kind == "dspark" else 8)
    batch = make_batch(data, list(range(8)), 24)
    torch.manual_seed(0)
    before, stats = trainer.loss(student, batch)
    assert ("tv" in stats and "bce" in stats) == (kind == "dspark")
    config = TrainConfig(steps=30, batch_size=8, seq_len=24, lr=3e-3, warmup=3, save_every=100, log_every=10)
    fit(trainer, student, data, config, tmp_path, log=lambda line: None)
    torch.manual_seed(0)
    after, _ = trainer.loss(student, batch)
    assert after.item() < before.item() * 0.9, (before.item(), after.item())
    span = data.sequence(0)
    guess = trainer.predict_argmax(student, data.input_ids[span][None],
                                   {layer: h[span][None] for layer, h in data.hidden.items()})
    assert guess.shape == (24,) and guess[-1] == -1 and bool((guess[:-1] >= 0).all())
    calibration = trainer.heldout_metrics(student, data)
    if kind == "dspark":  # every block position of every answer, scored against what greedy verification accepts
        assert calibration["confidence_positions"] > 16 * 10 and 0 <= calibration["confidence_ece"] <= 1
        assert 0 < calibration["confidence_mean"] < 1 and 0 <= calibration["greedy_acceptance_mean"] <= 1
    else:
        assert calibration == {}  # DFlash has no confidence head
    trainer.save_pretrained(student, tmp_path / "final")
    loaded = dflash.load_drafter(tmp_path / "final", target.model, kind=kind)
    assert loaded.spec == student.spec


def test_trainers_are_registered():
    assert {"dflash", "dspark"} <= set(TRAINERS)
    assert registry.trainers()["dspark"].name == "dspark"


def test_expected_calibration_error():
    tenths = torch.tensor([0.9] * 10 + [0.25] * 4)
    assert expected_calibration_error(tenths, torch.tensor([1.0] * 9 + [0.0] + [1.0, 0, 0, 0])) == pytest.approx(0)
    assert expected_calibration_error(torch.ones(5), torch.zeros(5)) == pytest.approx(1)
    # two bins, each off by 0.2 and 0.4, weighted by their sizes (3 and 1)
    assert expected_calibration_error(torch.tensor([0.5, 0.5, 0.5, 0.1]),
                                      torch.tensor([0.7, 0.7, 0.7, 0.5])) == pytest.approx((3 * 0.2 + 0.4) / 4)
