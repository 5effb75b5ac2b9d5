"""Model registry and loading: every user mistake is a one-line SpecvizError; tiny in-process models only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import save_tiny_model, tiny_tokenizer

from specviz.errors import SpecvizError, UnsupportedModelError
from specviz.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    check_same_tokenizer,
    choose_runtime,
    clear_cache,
    drafts_for,
    get_entry,
    list_models,
    load_model,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """Fresh in-process cache and no inherited policy variables."""
    clear_cache()
    for name in ("SPECVIZ_MODEL_ALLOWLIST", "SPECVIZ_TRUST_REMOTE_CODE", "SPECVIZ_MAX_MEMORY_GB", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    yield
    clear_cache()


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    return save_tiny_model(tmp_path / "tiny")


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_registry_lists_target_and_its_drafter():
    assert DEFAULT_TARGET in list_models() and DEFAULT_DRAFT in list_models()
    assert list_models("target") == [DEFAULT_TARGET]
    assert [e.name for e in drafts_for(DEFAULT_TARGET)] == [DEFAULT_DRAFT]
    assert get_entry(DEFAULT_DRAFT).role == "draft" and get_entry(DEFAULT_DRAFT).target == DEFAULT_TARGET


def test_unknown_name_lists_known_names():
    with pytest.raises(SpecvizError) as error:
        load_model("no-such-model")
    assert DEFAULT_TARGET in one_line(error) and DEFAULT_DRAFT in str(error.value)


def test_hub_id_offline_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SpecvizError) as error:
        load_model("someone/some-model-that-is-not-cached")
    assert "offline" in one_line(error)


@pytest.fixture
def hub_on(monkeypatch, tmp_path):
    """The hub switched on (conftest keeps it off), no proxy, an empty cache and no remembered reachability."""
    from specviz.models import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in hub.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(hub, "_ANSWERS", {})
    return hub


def test_an_unreachable_hub_is_one_line_at_once(monkeypatch, hub_on):
    """No network (the hub's host does not resolve): the local cache only, at once, not half a minute of retries."""
    import socket


    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert hub_on.local_only()
    with pytest.raises(SpecvizError) as error:
        load_model("someone/some-model-that-is-not-cached")
    assert "unreachable from this machine" in one_line(error)


def test_a_proxy_is_asked_and_a_dead_one_is_one_line_at_once(monkeypatch, hub_on):
    """With a proxy set the first hop is the proxy: one that answers may reach what DNS here does not; one that
    refuses (a stale HTTPS_PROXY) used to cost half a minute of retries and a dozen log lines."""
    import socket


    hops = []

    class Answer:
        def close(self):
            pass

    def connect(address, timeout=None):
        hops.append(address)
        if address == ("dead.example", 9):
            raise ConnectionRefusedError(111, "Connection refused")
        return Answer()

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert not hub_on.local_only() and hops == [("proxy.example", 3128)]
    monkeypatch.setenv("HTTPS_PROXY", "http://dead.example:9")
    assert hub_on.local_only()
    with pytest.raises(SpecvizError) as error:
        load_model("someone/some-model-that-is-not-cached")
    assert "a proxy that does not answer" in one_line(error)
    assert hops.count(("dead.example", 9)) == 1  # asked once a minute, not on every check


def test_missing_path_is_one_line(tmp_path):
    with pytest.raises(SpecvizError) as error:
        load_model(str(tmp_path / "nowhere" / "model.gguf"))
    assert "no such file" in one_line(error)


def test_local_dir_loads_in_eval_mode_and_is_cached(tiny_dir):
    loaded = load_model(str(tiny_dir))
    assert not loaded.model.training and loaded.device == "cpu" and loaded.dtype == torch.float32
    assert loaded.attn_implementation == "sdpa" and loaded.source == str(tiny_dir)
    assert load_model(str(tiny_dir)) is loaded  # switching back does not reload
    ids = loaded.tokenizer("the cat sat", return_tensors="pt").input_ids
    assert loaded.model(input_ids=ids).logits.shape[-1] == loaded.vocab_size


def test_missing_safetensors(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "model.safetensors" in one_line(error)


def test_pickle_only_checkpoint_is_refused(tiny_dir):
    (tiny_dir / "model.safetensors").rename(tiny_dir / "pytorch_model.bin")
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "pickle" in one_line(error)


def test_truncated_safetensors_is_corrupt(tiny_dir):
    weights = tiny_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "corrupt" in one_line(error) and "truncated" in one_line(error)


def test_garbage_safetensors_is_corrupt(tiny_dir):
    (tiny_dir / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "corrupt" in one_line(error)


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, says", [
    ({"num_hidden_layers": 0}, "tensors config.json has no place for"),  # weights silently dropped before
    ({"num_hidden_layers": 9}, "lacks"),  # layers transformers would have initialised at random
    ({"intermediate_size": 7}, "do not match config.json"),
    ({"hidden_size": 5}, "cannot read the config"),  # transformers' own check: heads must divide it
])
def test_a_config_that_does_not_describe_its_weights_is_refused(tiny_dir, changes, says):
    _edit_config(tiny_dir, **changes)
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert says in one_line(error)


def test_a_tied_checkpoint_may_hold_either_copy_of_the_embedding(tiny_dir):
    from safetensors.torch import load_file, save_file

    _edit_config(tiny_dir, tie_word_embeddings=True)
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    embedding = tensors.pop("model.embed_tokens.weight").clone()
    tensors["lm_head.weight"] = embedding  # saved under the output layer's name only
    save_file(tensors, str(tiny_dir / "model.safetensors"))
    loaded = load_model(str(tiny_dir)).model
    assert torch.equal(loaded.get_input_embeddings().weight, embedding)


def test_a_mixture_of_experts_checkpoint_is_checked_as_saved(tmp_path):
    """transformers saves a mixture of experts' matrices one expert at a time and fuses them on load: the check
    compares the checkpoint with the names as saved (it refused every MoE target before), and still refuses a
    config that does not describe the weights."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(config).eval()
    folder = tmp_path / "moe"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as saved:
        assert "model.layers.0.mlp.experts.3.down_proj.weight" in set(saved.keys())  # one expert at a time
    loaded = load_model(str(folder)).model
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    clear_cache()
    _edit_config(folder, num_experts=8)
    with pytest.raises(SpecvizError) as error:
        load_model(str(folder))
    assert "config.json" in one_line(error)


def _write_gguf(path: Path, architecture: str) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_of_unsupported_architecture(tmp_path):
    path = _write_gguf(tmp_path / "weird.gguf", "mamba9000")
    with pytest.raises(UnsupportedModelError) as error:
        load_model(str(path))
    assert "mamba9000" in one_line(error)


def test_gguf_encoder_architecture_is_refused(tmp_path):
    path = _write_gguf(tmp_path / "enc.gguf", "bert")
    with pytest.raises(UnsupportedModelError):
        load_model(str(path))


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"definitely not gguf")
    with pytest.raises(SpecvizError) as error:
        load_model(str(path))
    assert "GGUF" in one_line(error)


def test_allowlist_refuses_and_allows(tiny_dir, monkeypatch):
    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", "smollm2-*,HuggingFaceTB/*")
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "not allowed" in one_line(error)
    with pytest.raises(SpecvizError, match="not allowed"):
        load_model("someone/else")
    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", f"{tiny_dir.parent}/*")
    assert load_model(str(tiny_dir)).model is not None


def test_a_path_climbing_out_of_an_allowed_folder_is_refused(tiny_dir, tmp_path, monkeypatch):
    """``allowed/../elsewhere`` matches ``allowed/*`` as text (a glob's * matches '/'): paths are judged resolved."""
    from specviz.models import check_spec

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", f"{allowed}/*")
    with pytest.raises(SpecvizError) as error:
        check_spec(f"{allowed}/../{tiny_dir.relative_to(tmp_path)}")
    assert "not allowed" in one_line(error)
    (allowed / "link").symlink_to(tiny_dir)
    with pytest.raises(SpecvizError, match="not allowed"):
        check_spec(str(allowed / "link"))


def test_a_space_allows_the_registry_names_unless_told(monkeypatch):
    """On a Hugging Face Space (SPACE_ID set) with no allowlist, a visitor cannot load any hub id or server path."""
    from specviz.models import check_spec

    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    with pytest.raises(SpecvizError, match="not allowed"):
        check_spec("someone/else")
    with pytest.raises(SpecvizError, match="not allowed"):
        check_spec("/")
    check_spec(DEFAULT_TARGET)
    monkeypatch.setenv("SPECVIZ_MODEL_ALLOWLIST", "*")  # the operator opens it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecvizError, match="offline"):
        check_spec("someone/else")


def test_memory_estimate_counts_the_stored_parameters(tiny_dir):
    from specviz.models.memory import stored_numel
    from specviz.models.safetensors_check import stored_shapes, weight_files

    loaded = load_model(str(tiny_dir))
    stored = stored_numel(stored_shapes(weight_files(tiny_dir)))
    assert stored == sum(p.numel() for p in loaded.model.parameters())


def test_memory_estimate_refuses_models_that_do_not_fit(tiny_dir, monkeypatch):
    monkeypatch.setenv("SPECVIZ_MAX_MEMORY_GB", "0.000001")
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "GiB" in one_line(error)


def test_remote_code_config_needs_opt_in(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    config["model_type"] = "custom_thing"
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (tiny_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecvizError) as error:
        load_model(str(tiny_dir))
    assert "SPECVIZ_TRUST_REMOTE_CODE" in one_line(error)


def test_same_tokenizer_accepts_padded_vocab(tmp_path):
    target = load_model(str(save_tiny_model(tmp_path / "t")))
    draft = load_model(str(save_tiny_model(tmp_path / "d", seed=1, vocab_pad=6)))
    check_same_tokenizer(target, draft)


def test_tokenizer_mismatch_names_both_models(tmp_path):
    target = load_model(str(save_tiny_model(tmp_path / "t")))
    other = load_model(str(save_tiny_model(tmp_path / "o", tokenizer=tiny_tokenizer(shuffle_seed=3))))
    with pytest.raises(SpecvizError) as error:
        check_same_tokenizer(target, other)
    message = one_line(error)
    assert str(tmp_path / "t") in message and str(tmp_path / "o") in message


def test_runtime_choice_on_cpu():
    runtime = choose_runtime("cpu")
    assert runtime.dtype == torch.float32 and runtime.attn_implementation == "sdpa"
    with pytest.raises(SpecvizError):
        choose_runtime("tpu")


def test_embedded_default_target_loads():
    loaded = load_model(DEFAULT_TARGET)
    config = loaded.model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama", 30, 576, 49152)
    assert loaded.tokenizer.chat_template and loaded.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        logits = loaded.model(input_ids=ids["input_ids"]).logits
    assert torch.isfinite(logits).all()


def test_attention_backend_choice(monkeypatch):
    from specviz.models import device

    for installed in (True, False):  # CUDA: the cascade (its prefix kernel is chosen apart); elsewhere SDPA
        monkeypatch.setattr(device, "flash_attn_available", lambda installed=installed: installed)
        assert device.choose_attn_implementation("cuda:0", torch.bfloat16) == "specviz_cascade"
        assert device.choose_attn_implementation("cuda", torch.float32) == "specviz_cascade"
        assert device.choose_attn_implementation("cpu", torch.bfloat16) == "sdpa"
        assert device.choose_attn_implementation("mps", torch.float16) == "sdpa"
    from specviz.engine.attention import MASK_CAPABLE, SHARED_PREFIX_MASK_CAPABLE

    chosen = {device.choose_attn_implementation(d, torch.float32) for d in ("cuda", "cpu", "mps")}
    assert chosen <= MASK_CAPABLE | SHARED_PREFIX_MASK_CAPABLE  # every backend chosen takes the tree mask
    assert device.choose_dtype("cpu") == torch.float32 and device.choose_dtype("cpu", "bf16") == torch.bfloat16


def test_shipped_drafter_loads_and_matches_the_target_tokenizer():
    from specviz.models.registry import ASSETS_MODELS

    folder = get_entry(DEFAULT_DRAFT).resolve_path()
    files = [p for p in ASSETS_MODELS.parent.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 96 * 2**20  # all of specviz/assets/ stays within 96 MiB
    assert (folder / "README.md").is_file() and json.loads((folder / "config.json").read_text())["dtype"] == "float16"
    draft = load_model(DEFAULT_DRAFT, role="draft")
    assert draft.target == DEFAULT_TARGET and draft.dtype == torch.float32 and draft.model.config.vocab_size == 49152
    target = load_model(DEFAULT_TARGET)
    check_same_tokenizer(target, draft)
    # the draft borrows the target's embedding and tied output layer: same tensor, not a copy
    embedding = target.model.get_input_embeddings().weight
    assert draft.model.get_input_embeddings().weight.data_ptr() == embedding.data_ptr()
    assert draft.model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()


def test_registry_drafter_without_tokenizer_files_uses_its_targets(tmp_path, monkeypatch):
    from specviz.models import REGISTRY, RegistryEntry

    target_dir = save_tiny_model(tmp_path / "t")
    draft_dir = save_tiny_model(tmp_path / "d", seed=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (draft_dir / name).unlink(missing_ok=True)
    monkeypatch.setitem(REGISTRY, "tiny-t", RegistryEntry("tiny-t", "target", "local", str(target_dir), "tiny"))
    monkeypatch.setitem(REGISTRY, "tiny-d", RegistryEntry("tiny-d", "draft", "local", str(draft_dir), "tiny draft",
                                                          target="tiny-t", tokenizer_from="tiny-t"))
    assert [e.name for e in drafts_for("tiny-t")] == ["tiny-d"]
    draft = load_model("tiny-d", role="draft")
    assert draft.target == "tiny-t" and draft.role == "draft"
    check_same_tokenizer(load_model("tiny-t"), draft)
    with pytest.raises(SpecvizError, match="no tokenizer"):
        load_model(str(draft_dir))


def test_gguf_float_copies_are_keyed_by_content_and_pruned(tmp_path, monkeypatch):
    """The same GGUF at another path (a fresh checkout) reuses its converted copy; a changed file gets a new one, and
    old copies of the same name are removed (each is the whole float model)."""
    import os
    import time

    import tiny

    from specviz.models import gguf_file

    monkeypatch.setenv(gguf_file.CACHE_ENV, str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(b"GGUF" + bytes(range(200)))
    os.utime(second, ns=(1, 1))  # another mtime: the key must not depend on it
    assert gguf_file.cache_dir_for(first) == gguf_file.cache_dir_for(second)
    model, tokenizer = tiny.model("llama", 64, layers=1), tiny.tokenizer(64)
    written = []
    for version in range(4):
        first.write_bytes(b"GGUF" + bytes([version]) * 50)
        folder = gguf_file.cache_dir_for(first)
        assert folder not in written
        gguf_file.write_cache(model, tokenizer, folder)
        written.append(folder)
        time.sleep(0.01)
    kept = sorted(p for p in (tmp_path / "cache").iterdir())
    assert kept == sorted(written[-gguf_file.KEEP_PER_NAME:]) and all(gguf_file.is_cached(p) for p in kept)


def test_a_gguf_float_copy_another_process_finished_first_is_kept(tmp_path):
    """Two processes converting the same GGUF at once (test workers, a Space's replicas): the second to finish keeps
    the first one's complete copy, which the first may be reading, instead of replacing it."""
    import tiny
    from safetensors.torch import load_file

    from specviz.models import gguf_file

    folder = tmp_path / "cache" / "m-0123"
    first, second = tiny.model("llama", 64, layers=1, seed=0), tiny.model("llama", 64, layers=1, seed=1)
    gguf_file.write_cache(first, tiny.tokenizer(64), folder)
    gguf_file.write_cache(second, tiny.tokenizer(64), folder)
    kept = load_file(str(folder / "model.safetensors"))
    assert all(torch.equal(kept[name], value) for name, value in first.state_dict().items() if name in kept)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["m-0123"]  # no temporary folder left behind
