"""EAGLE training: the unrolled training-time test computes exactly what drafting computes, and training learns."""

import random

import pytest
import tiny
import torch
from transformers import DynamicCache

from specviz.drafters import eagle
from specviz.training.batches import make_batch
from specviz.training.features import FeatureSet
from specviz.training.trainers import TrainConfig, fit, get_trainer
from specviz.training.trainers.eagle import unroll

VOCAB = 64
LAYERS = 8  # EAGLE-3's default feature layers are then hs[2], hs[4], hs[5]


def feature_set(target_model, sequences: list[list[int]], layers: tuple[int, ...], topk: int = 4) -> FeatureSet:
    """Sequences annotated with the tiny target's own top-k and hidden states (what the feature cache holds)."""
    layers = tuple(dict.fromkeys(layers))
    ids, starts, tops, probs, hidden = [], [0], [], [], {layer: [] for layer in layers}
    with torch.inference_mode():
        for seq in sequences:
            out = target_model(torch.tensor([seq]), output_hidden_states=True)
            p = out.logits[0].softmax(-1)
            values, index = p.topk(topk, dim=-1)
            ids.append(torch.tensor(seq))
            tops.append(index)
            probs.append(values)
            for layer in layers:
                hidden[layer].append(out.hidden_states[layer][0])
            starts.append(starts[-1] + len(seq))
    flat = torch.cat(ids)
    return FeatureSet(input_ids=flat, starts=torch.tensor(starts), loss_mask=torch.ones(len(flat), dtype=torch.bool),
                      topk_ids=torch.cat(tops), topk_probs=torch.cat(probs),
                      hidden={layer: torch.cat(h) for layer, h in hidden.items()})


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_time_test_equals_drafting(kind):
    """Step i of the unrolled training pass at index t equals the head drafting i steps past committed position t."""
    target = tiny.model("llama", VOCAB, layers=LAYERS, scale=10)
    head = eagle.new_head(target, kind, seed=1)
    seq = [random.Random(0).randrange(VOCAB) for _ in range(12)]
    data = feature_set(target, [seq], head.feature_layers)
    features = torch.cat([data.hidden[layer] for layer in head.feature_layers], dim=-1)[None]
    ids = torch.tensor([seq])
    with torch.no_grad():
        outs = unroll(head, features, ids, steps=3)
        for t in (0, 4, 8):
            cache = DynamicCache()
            out = head(features[:, : t + 1], ids[:, 1 : t + 2], torch.arange(t + 1), cache=cache)  # committed pairs
            state = head.next_hidden(out[:, -1:])
            assert torch.allclose(out[0, -1], outs[0][0, t], atol=1e-5)
            for step in (1, 2):  # draft steps on the head's own output, with the true next tokens
                out = head(state, ids[:, t + 1 + step : t + 2 + step], torch.tensor([t + step]), from_target=False,
                           cache=cache)
                assert torch.allclose(out[0, -1], outs[step][0, t], atol=1e-5), (kind, t, step)
                state = head.next_hidden(out)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_short_training_lowers_the_loss_and_predicts(kind, tmp_path):
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(0)
    sequences = [[rng.randrange(VOCAB) for _ in range(24)] for _ in range(16)]
    trainer = get_trainer(kind)(target, {"draft_vocab": 48, "target_name": "tiny"})
    data = feature_set(target.model, sequences, trainer.features().layers)
    trainer.prepare(data)
    head = trainer.build_student()
    if kind == "eagle3":
        assert head.draft_ids().numel() == 48 and head.feature_layers == (2, 4, 5)
    batch = make_batch(data, list(range(8)), 24)
    before = trainer.loss(head, batch)[0].item()
    config = TrainConfig(steps=30, batch_size=8, seq_len=24, lr=3e-3, warmup=3, save_every=100, log_every=10)
    fit(trainer, head, data, config, tmp_path, log=lambda line: None)
    after = trainer.loss(head, batch)[0].item()
    assert after < before * 0.9, (before, after)
    span = data.sequence(0)
    guess = trainer.predict_argmax(head, data.input_ids[span][None],
                                   {layer: h[span][None] for layer, h in data.hidden.items()})
    assert guess.shape == (24,) and guess[0] == -1 and (guess[1:] >= 0).all()
    trainer.save_pretrained(head, tmp_path / "final")
    loaded = eagle.load_head(tmp_path / "final", target.model)
    assert loaded.feature_layers == head.feature_layers


def test_a_resumed_eagle3_run_keeps_its_draft_vocabulary_on_new_data(tmp_path):
    """Resuming on more (different) data must not re-pick the draft vocabulary under the trained head's rows."""
    target = tiny.target("llama", VOCAB, layers=LAYERS, scale=10)
    rng = random.Random(0)
    low = [[rng.randrange(VOCAB // 2) for _ in range(24)] for _ in range(8)]
    high = [[VOCAB // 2 + rng.randrange(VOCAB // 2) for _ in range(24)] for _ in range(8)]
    config = TrainConfig(steps=10, batch_size=8, seq_len=24, lr=3e-3, warmup=3, save_every=10, log_every=10)

    first = get_trainer("eagle3")(target, {"draft_vocab": 24})
    data = feature_set(target.model, low, first.features().layers)
    first.prepare(data)
    head = first.build_student()
    fit(first, head, data, config, tmp_path, log=lambda line: None)
    batch = make_batch(data, list(range(8)), 24)
    trained = first.loss(head, batch)[0].item()

    second = get_trainer("eagle3")(target, {"draft_vocab": 24})
    second.prepare(feature_set(target.model, low + high, second.features().layers))
    resumed = second.build_student()
    assert not torch.equal(resumed.draft_ids(), head.draft_ids())  # the new data alone would pick another one
    fit(second, resumed, data, TrainConfig(**{**config.__dict__, "resume": True}), tmp_path, log=lambda line: None)
    assert torch.equal(resumed.draft_ids(), head.draft_ids())
    assert second.loss(resumed, batch)[0].item() == pytest.approx(trained, rel=1e-5)
