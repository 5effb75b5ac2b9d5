"""The lean draft forward must give transformers' logits and cache, and refuse what it does not reproduce."""

import pytest
import tiny
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.lean_llama import LeanLlama, lean_forward_for
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig
from specviz.engine.verify import masked_forward
from specviz.errors import SpecvizError
from specviz.models import thin_kernel
from tools.draft_forward import compare

VOCAB = 64


def both(model):
    return lean_forward_for(model), model


def test_logits_and_cache_match_transformers_through_prefill_steps_and_a_tree():
    model = tiny.model("llama", VOCAB, layers=3, scale=5)  # 4 query heads over 2 KV heads
    lean, _ = both(model)
    assert isinstance(lean, LeanLlama)
    caches = {"lean": DynamicCache(config=model.config), "hf": DynamicCache(config=model.config)}
    runner = {"lean": lean, "hf": model}
    steps = [  # (tokens, positions, visibility over cached + new, or None for causal)
        (list(range(5, 30)), list(range(25)), None),
        ([7], [25], None),
        ([8, 9, 10], [26, 27, 28], None),
        ([11, 12, 13], [29, 30, 30], torch.tensor([[1] * 29 + [1, 0, 0], [1] * 29 + [1, 1, 0], [1] * 29 + [1, 0, 1]],
                                                  dtype=torch.bool)),
    ]
    for tokens, positions, visible in steps:
        out = {name: masked_forward(runner[name], caches[name], tokens, positions, visible) for name in runner}
        assert out["lean"].shape == (len(tokens), VOCAB)
        assert torch.allclose(out["lean"], out["hf"], atol=1e-5), (out["lean"] - out["hf"]).abs().max()
        for a, b in zip(caches["lean"].layers, caches["hf"].layers):
            assert torch.allclose(a.keys, b.keys, atol=1e-6) and torch.allclose(a.values, b.values, atol=1e-6)
    last = masked_forward(lean, caches["lean"], [3, 4], [31, 32], None, last_only=True)
    assert last.shape == (1, VOCAB)


@pytest.mark.parametrize("change", [
    {"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
])
def test_configurations_it_does_not_reproduce_keep_the_transformers_forward(change):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, **change)
    assert lean_forward_for(LlamaForCausalLM(config)) is None
    assert lean_forward_for(tiny.model("qwen2", VOCAB)) is None  # biased q/k/v projections


def test_drafts_are_identical_with_and_without_the_lean_forward():
    model = tiny.model("llama", VOCAB, layers=2, scale=5)
    sampling = SamplingConfig()
    context = [3, 17, 5, 9, 3, 17]
    drafters = [DraftModelDrafter(model, VOCAB, lean=lean) for lean in (True, False)]
    assert isinstance(drafters[0].model, LeanLlama) and drafters[1].model is model
    for budget in (DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=3, max_nodes=9)):
        trees = [d.propose(context, budget, sampling, torch.Generator().manual_seed(0)) for d in drafters]
        assert trees[0].tokens == trees[1].tokens and trees[0].parents == trees[1].parents
        assert torch.allclose(trees[0].q_dist, trees[1].q_dist, atol=1e-6)
        for drafter, tree in zip(drafters, trees):
            drafter.commit(context, tree, [0])
        context = context + [trees[0].tokens[0], 21]


def test_draft_forward_timing_compares_both_paths_and_refuses_other_architectures():
    model = tiny.model("llama", VOCAB, layers=2)
    result = compare(model, list(range(3, 40)), repeats=2, rounds=1)
    assert result["transformers"] > 0 and result["lean"] > 0 and result["context"] == 37
    assert result["speedup"] == pytest.approx(result["transformers"] / result["lean"])
    assert result["lean int8"] > 0 and result["int8_speedup"] == pytest.approx(result["lean"] / result["lean int8"])
    with pytest.raises(SpecvizError, match="not a Llama configuration"):
        compare(tiny.model("qwen2", VOCAB), list(range(3, 10)))
    with pytest.raises(SpecvizError, match="at least 2 tokens"):
        compare(model, [3])


@pytest.mark.parametrize("kernel", ["thin", "dequantised"])
def test_int8_draft_weights_approximate_the_draft_and_leave_the_transformers_model_alone(kernel, monkeypatch):
    """Through the thin kernel where it builds, else the same rounded weights dequantised for torch's F.linear."""
    if kernel == "thin" and thin_kernel.load() is None:
        pytest.skip(f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
    if kernel == "dequantised":
        monkeypatch.setattr(thin_kernel, "load", lambda: None)
    model = tiny.model("llama", VOCAB, layers=2, hidden=64, scale=5)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    full, int8 = lean_forward_for(model), lean_forward_for(model, "int8")
    assert int8.quant == "int8"
    tokens = list(range(3, 43))
    logits = {}
    for name, forward in (("full", full), ("int8", int8)):
        cache = DynamicCache(config=model.config)
        logits[name] = masked_forward(forward, cache, tokens, list(range(len(tokens))), None)
    error = (logits["int8"] - logits["full"]).norm() / logits["full"].norm()
    assert 0 < error < 0.05, error  # approximate, not a copy
    assert (logits["int8"].argmax(-1) == logits["full"].argmax(-1)).float().mean() > 0.9
    assert all(torch.equal(p, before[name]) for name, p in model.state_dict().items())


def test_int8_draft_refuses_what_it_cannot_run():
    for lean in (True, False):
        with pytest.raises(SpecvizError, match="draft-quant must be one of auto, off, int8, got 'int4'"):
            DraftModelDrafter(tiny.model("llama", VOCAB), VOCAB, draft_quant="int4", lean=lean)
    with pytest.raises(SpecvizError, match="needs a Llama-architecture draft"):
        DraftModelDrafter(tiny.model("qwen2", VOCAB), VOCAB, draft_quant="int8")
    with pytest.raises(SpecvizError, match="needs a Llama-architecture draft"):
        DraftModelDrafter(tiny.model("llama", VOCAB), VOCAB, draft_quant="int8", lean=False)
    with pytest.raises(SpecvizError, match="needs a float32 draft"):
        DraftModelDrafter(tiny.model("llama", VOCAB, dtype=torch.bfloat16), VOCAB, draft_quant="int8")
    drafter = DraftModelDrafter(tiny.model("llama", VOCAB), VOCAB, draft_quant="int8", draft_vocab=VOCAB // 2)
    assert drafter.describe()["draft_quant"] == "int8" and drafter.describe()["draft_vocab"] == VOCAB // 2
    assert DraftModelDrafter(tiny.model("llama", VOCAB), VOCAB).describe()["draft_quant"] is None


def test_auto_draft_quant_is_int8_only_where_it_runs():
    """``"auto"``: int8 for a float32 Llama draft on CPU; the draft's own weights where int8 has no forward to run
    in (another architecture, no lean forward, half precision), instead of the error an explicit int8 gets."""
    assert DraftModelDrafter(tiny.model("llama", VOCAB), VOCAB, draft_quant="auto").describe()["draft_quant"] == "int8"
    for model, lean in ((tiny.model("qwen2", VOCAB), True), (tiny.model("llama", VOCAB), False),
                        (tiny.model("llama", VOCAB, dtype=torch.bfloat16), True)):
        assert DraftModelDrafter(model, VOCAB, draft_quant="auto", lean=lean).describe()["draft_quant"] is None
