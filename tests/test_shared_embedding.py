"""Drafts built from the target's own layers: training, export without the embedding, loading it from the target."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny import save_tiny_model

from specviz.errors import SpecvizError
from specviz.models import clear_cache, load_model
from specviz.models.shared_embedding import CONFIG_KEY
from specviz.training.cli import main
from specviz.training.trainers import TrainConfig, fit, get_trainer
from tests.test_training import _fresh_cache, _tiny_data, story  # noqa: F401  (_fresh_cache: autouse fixture)


@pytest.fixture
def target_dir(tmp_path):
    return save_tiny_model(tmp_path / "target", hidden=32, layers=3)


def test_student_starts_as_the_chosen_target_layers_and_trains_only_them(target_dir, tmp_path):
    target = load_model(str(target_dir))
    trainer = get_trainer("draft-lm")(target, {"init_layers": "0,2", "topk": 4})
    student = trainer.build_student()
    assert student.config.num_hidden_layers == 2 and student.config.hidden_size == 32
    source = target.model.model
    assert torch.equal(student.model.layers[1].mlp.down_proj.weight, source.layers[2].mlp.down_proj.weight)
    assert torch.equal(student.model.norm.weight, source.norm.weight)
    embedding = student.get_input_embeddings().weight
    assert not embedding.requires_grad and torch.equal(embedding, target.model.get_input_embeddings().weight)
    before = embedding.clone()
    data = _tiny_data(target)
    config = TrainConfig(steps=30, batch_size=8, seq_len=64, lr=1e-2, warmup=3, save_every=30, log_every=1,
                         autocast="bf16")
    history = fit(trainer, student, data, config, tmp_path / "run", log=lambda _m: None)["history"]
    # a random tiny target's top-k is nearly flat, so the loss has a high floor (its entropy): ask for a clear fall
    assert sum(h["loss"] for h in history[-5:]) / 5 < sum(h["loss"] for h in history[:5]) / 5 - 0.05
    assert torch.equal(student.get_input_embeddings().weight, before)  # frozen: it is the target's, not ours
    assert not torch.equal(student.model.layers[1].mlp.down_proj.weight, source.layers[2].mlp.down_proj.weight)


def _train_cli(target_dir, tmp_path, *extra: str) -> int:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(story(5, 600))
    return main(["draft-lm", "--target", str(target_dir), "--data", str(corpus), "--out", str(tmp_path / "run"),
                 "--steps", "3", "--batch-size", "2", "--seq-len", "48", "--prompts", "4", "--eval-prompts", "2",
                 "--gen-tokens", "5", "--gen-batch", "4", "--corpus-tokens", "100", "--cache-dir",
                 str(tmp_path / "cache"), *extra])


def test_export_leaves_the_embedding_out_and_the_loader_borrows_the_targets(target_dir, tmp_path):
    export = tmp_path / "export"
    assert _train_cli(target_dir, tmp_path, "--init-layers", "1", "--autocast", "bf16", "--export", str(export)) == 0
    shipped = load_file(str(export / "model.safetensors"))
    assert "model.embed_tokens.weight" not in shipped and "lm_head.weight" not in shipped
    assert "model.layers.0.mlp.down_proj.weight" in shipped
    config = json.loads((export / "config.json").read_text())
    assert config[CONFIG_KEY]["from"] == str(target_dir) and config["num_hidden_layers"] == 1
    card = (export / "README.md").read_text()
    assert "decoder layers 1 (then trained)" in card and "**not stored here**" in card and "bf16 autocast" in card
    # --gen-dtype auto: the dtype this machine chose is recorded, since the command line does not say it
    chosen = json.loads((tmp_path / "run" / "metrics.json").read_text())["answers_dtype"]
    assert chosen in ("bfloat16", "float32") and f"template, decoded in {chosen})" in card
    clear_cache()
    target = load_model(str(target_dir))
    draft = load_model(str(export), role="draft")
    shared = draft.model.get_input_embeddings().weight
    assert shared.data_ptr() == target.model.get_input_embeddings().weight.data_ptr()  # no copy
    assert draft.model.lm_head.weight.data_ptr() == shared.data_ptr()
    full = load_model(str(tmp_path / "run" / "final"), role="draft")  # the run's own fp32 copy, embedding included
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    with torch.no_grad():
        assert torch.allclose(draft.model(input_ids=ids).logits, full.model(input_ids=ids).logits, atol=2e-2)


def test_a_draft_paired_with_another_donor_is_refused(target_dir, tmp_path):
    export = tmp_path / "export"
    assert _train_cli(target_dir, tmp_path, "--init-layers", "0", "--export", str(export)) == 0
    other = save_tiny_model(tmp_path / "other", hidden=32, layers=3, seed=7)
    config_path = export / "config.json"
    config = json.loads(config_path.read_text())
    for donor, message in ((str(other), "is not the one this draft was trained with"),
                           (str(tmp_path / "gone"), "no such file or directory"),
                           ("", "malformed")):
        config[CONFIG_KEY]["from"] = donor
        config_path.write_text(json.dumps(config))
        clear_cache()
        with pytest.raises(SpecvizError, match=message):
            load_model(str(export), role="draft")
    config[CONFIG_KEY]["from"] = str(target_dir)
    for corrupt in (["x"] * 4, "abc", [True]):  # a hand-edited fingerprint: one line, no TypeError
        config[CONFIG_KEY]["fingerprint"] = corrupt
        config_path.write_text(json.dumps(config))
        clear_cache()
        with pytest.raises(SpecvizError, match="is not the one this draft was trained with"):
            load_model(str(export), role="draft")


@pytest.mark.parametrize("extra, message", [
    (["--init-layers", "0,0"], "distinct layer numbers from 0 to 2"),
    (["--init-layers", "3"], "distinct layer numbers from 0 to 2"),
    (["--init-layers", "a,b"], "comma-separated layer numbers"),
    (["--init-layers", "0", "--hidden", "16"], "leave out --hidden and --layers"),
])
def test_bad_init_layers_are_one_line_errors(target_dir, tmp_path, capsys, extra, message):
    assert _train_cli(target_dir, tmp_path, *extra) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_loading_a_sharing_draft_silences_transformers_missing_weights_report():
    from transformers.utils import logging as hf_logging

    from specviz.models.shared_embedding import quiet_if_shared

    before = hf_logging.get_verbosity()
    with quiet_if_shared({CONFIG_KEY: {"from": "t", "tensors": ["model.embed_tokens.weight"]}}):
        assert hf_logging.get_verbosity() == hf_logging.ERROR
    assert hf_logging.get_verbosity() == before
    with quiet_if_shared({"hidden_size": 8}):  # an ordinary model keeps every warning
        assert hf_logging.get_verbosity() == before
