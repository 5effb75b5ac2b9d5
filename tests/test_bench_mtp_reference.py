"""transformers' own MTP generation (``generate(use_mtp=True)``) as a bench reference row, for a target whose
checkpoint carries MTP layers transformers can run, and no such row for one without them.

The target is a tiny ERNIE-4.5 (a class whose MTP generation transformers implements, dense here) whose layers
add nothing to the residual stream, so it predicts from the current token alone; its MTP layer is built so that it
predicts, from the next token, exactly what the target will: every MTP draft is accepted and τ nears 2 at one layer
(transformers' first round drafts nothing). A row that ran plain ``generate`` would show τ 1.
"""

import json

import pytest
import tiny
import torch

from specviz import cli
from specviz.bench.runners import transformers_mtp_layers
from specviz.bench.summary import OVERALL

VOCAB = 64
MTP_ROW = "hf mtp k=1"

mtp_generation = pytest.importorskip("transformers.modeling_layers", reason="transformers without MTP generation")
if not hasattr(mtp_generation, "MtpModel"):
    pytest.skip("the installed transformers has no MTP generation", allow_module_level=True)


def _ernie(folder, with_mtp_tensors: bool = True) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM
    from transformers.modeling_layers import MtpModel

    config = Ernie4_5_MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, moe_k=2, moe_num_experts=4,
        moe_layer_start_index=10, max_position_embeddings=256, num_mtp_layers=1, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)  # every layer dense (MoE would start at layer 10)
    torch.manual_seed(0)
    model = Ernie4_5_MoeForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # peaked distributions: no near-ties
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    tiny.tokenizer(VOCAB).save_pretrained(folder)
    if not with_mtp_tensors:
        return
    mtp = MtpModel(model, 1)
    with torch.no_grad():
        layer = mtp.layers[0]
        layer.mtp_block.self_attn.o_proj.weight.zero_()
        layer.mtp_block.mlp.down_proj.weight.zero_()
        hidden = config.hidden_size
        layer.eh_proj.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1))  # embedding
    weights = load_file(str(folder / "model.safetensors"))
    weights.update({f"mtp.{name}": tensor.clone() for name, tensor in mtp.state_dict().items()
                    if not name.startswith(("embed_tokens", "shared_head"))})
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp-targets")
    _ernie(root / "with-mtp")
    _ernie(root / "no-mtp", with_mtp_tensors=False)
    with open(root / "prompts.jsonl", "w") as f:
        for i, text in enumerate(["w3 w5 w7 w3 w5", "w9 w8 w7 w9"]):
            f.write(json.dumps({"question_id": i, "category": f"c{i}", "turns": [text]}) + "\n")
    return root


def test_mtp_layers_are_found_only_where_the_checkpoint_holds_them(folders):
    from specviz import api

    assert transformers_mtp_layers(api.load_target(str(folders / "with-mtp"), target_forward="hf").model) == 1
    # the class says one MTP layer by default, but none was saved: transformers would draft with random layers
    assert transformers_mtp_layers(api.load_target(str(folders / "no-mtp"), target_forward="hf").model) == 0
    assert transformers_mtp_layers(tiny.model("llama", VOCAB, layers=1)) == 0


def _bench(folders, tmp_path, target: str, capsys) -> dict:
    out = tmp_path / target
    code = cli.main(["bench", "--target", str(folders / target), "--drafters", "ngram", "--shapes", "chain",
                     "--prompts", str(folders / "prompts.jsonl"), "--no-chat", "--max-new-tokens", "16", "--k", "2",
                     "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return json.loads((out / "results.json").read_text())["summary"]


def test_bench_runs_transformers_mtp_generation_as_a_reference_row(folders, tmp_path, capsys):
    summary = _bench(folders, tmp_path, "with-mtp", capsys)
    assert MTP_ROW in summary["rows"]
    row = summary["table"][MTP_ROW][OVERALL]
    assert row["exact"] == row["prompts"] == 2  # greedy: identical to plain decoding
    # every MTP draft accepted: 16 tokens in 1 + 15 / 2 forwards and a last short round, where plain would be 1.0
    assert row["tau"] >= 1.7
    assert summary["configs"][MTP_ROW]["hf_kwargs"] == {"use_mtp": True}

    assert MTP_ROW not in _bench(folders, tmp_path, "no-mtp", capsys)["rows"]
