"""``draft_quant="int8"`` for the feature-reading drafters (EAGLE, MTP, Medusa, DFlash/DSpark): their output layer in
int8 (and their own layers, where the thin kernel runs) moves the draft distribution a little and never the output."""

import pytest
import tiny
import torch
from test_eagle import engine_counts, sampling_head
from test_sampling_lossless import PASS_P, Table, V, chi_square_p

from specviz.drafters import head_parts, quantized
from specviz.drafters.dflash import DFlashDrafter, DSparkDrafter, new_model
from specviz.drafters.eagle import EagleDrafter, new_head
from specviz.drafters.head_layer import Attention, GatedMLP
from specviz.drafters.medusa import MedusaDrafter, new_heads
from specviz.drafters.mtp import MtpDrafter, new_stack
from specviz.drafters.quantized import resolve_draft_quant
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.errors import SpecvizError
from specviz.models import thin_kernel

VOCAB = 64
LAYERS = 8  # room for EAGLE-3's (2, L//2, L-3) and DFlash's five feature layers
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
NEW_TOKENS = 32

BUILDERS = {
    "eagle": lambda net, **kw: EagleDrafter(new_head(net, "eagle", seed=1), VOCAB, **kw),
    "eagle3": lambda net, **kw: EagleDrafter(new_head(net, "eagle3", seed=1, draft_ids=torch.arange(56)), VOCAB,
                                             **kw),
    "mtp": lambda net, **kw: MtpDrafter(new_stack(net, 2, seed=1), VOCAB, **kw),
    "medusa": lambda net, **kw: MedusaDrafter(new_heads(net, 3, seed=1), VOCAB, **kw),
    "dflash": lambda net, **kw: DFlashDrafter(new_model(net, "dflash", mask_token_id=VOCAB - 1, seed=1), VOCAB,
                                              **kw),
    "dspark": lambda net, **kw: DSparkDrafter(new_model(net, "dspark", mask_token_id=VOCAB - 1, seed=1,
                                                        markov_rank=16), VOCAB, schedule=False, **kw),
}
SHAPES = {"chain": DraftBudget(k=4), "tree": DraftBudget(tree=True, width=3, depth=3, max_nodes=8)}


@pytest.fixture(scope="module", params=["hf", "fast"])
def setup(request):
    target = tiny.target("llama", VOCAB, forward=request.param, layers=LAYERS, scale=25)
    return target, plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS)).token_ids


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("family", list(BUILDERS))
def test_int8_output_layer_changes_the_draft_not_the_output(setup, family, shape):
    target, baseline = setup
    config, budget = GenerationConfig(max_new_tokens=NEW_TOKENS), SHAPES[shape]
    full = generate(target, PROMPT, config, BUILDERS[family](target.model), budget)
    int8 = generate(target, PROMPT, config, BUILDERS[family](target.model, draft_quant="int8"), budget)
    assert full.token_ids == int8.token_ids == baseline
    assert all(r.rule == "greedy" and r.lossless for r in int8.rounds)
    # the same first round (same context, same drafter weights): the int8 draft distribution is close, not equal
    first_full = {c.id: c.p for c in full.rounds[0].draft_top[0]}
    first_int8 = {c.id: c.p for c in int8.rounds[0].draft_top[0]}
    shared = sorted(first_full.keys() & first_int8.keys())
    probs_full, probs_int8 = (torch.tensor([probs[i] for i in shared]) for probs in (first_full, first_int8))
    assert len(shared) >= 3 and not torch.equal(probs_full, probs_int8)
    assert torch.allclose(probs_full, probs_int8, atol=0.05)


@pytest.mark.parametrize("family", list(BUILDERS))
def test_int8_reaches_the_heads_own_layers_only_through_the_thin_kernel(setup, family, monkeypatch):
    """Every own linear layer goes int8 where the thin kernel runs (float32 activations); without it they stay
    float32, since dequantised int8 weights would save nothing there."""
    if thin_kernel.load() is None:
        pytest.skip(f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
    target, _ = setup
    packed = []
    monkeypatch.setattr(head_parts, "int8_layer", lambda w, b=None: packed.append(w) or quantized.int8_layer(w, b))
    drafter = BUILDERS[family](target.model, draft_quant="int8")
    trainable = {id(p) for p in drafter_module(drafter).parameters()}
    own = [m.weight for m in drafter_module(drafter).modules() if isinstance(m, torch.nn.Linear)]
    stacks = [w for w in packed if id(w) not in trainable]  # sibling projections stacked into one product
    assert own and [id(w) for w in packed if id(w) in trainable] == [id(w) for w in own]
    assert len(stacks) == sum(hasattr(m, "stack_projections") for m in drafter_module(drafter).modules())
    packed.clear()
    monkeypatch.setattr(thin_kernel, "load", lambda: None)
    BUILDERS[family](target.model, draft_quant="int8")
    assert packed == []


@pytest.mark.parametrize("quant", ["off", "int8"])
@pytest.mark.parametrize("family", [f for f in BUILDERS if f != "medusa"])
def test_stacked_projections_give_each_projection_its_own_product(setup, family, quant):
    """The drafting copy runs attention's q/k/v and the MLP's gate/up as one product each: every column is what its
    own projection gives, bit for bit (per-output int8 scales, per-output sums), so drafts cannot move."""
    if thin_kernel.load() is None:
        pytest.skip(f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
    target, _ = setup
    runner = BUILDERS[family](target.model, draft_quant=quant).runner
    attentions = [m for m in runner.modules() if isinstance(m, Attention)]
    mlps = [m for m in runner.modules() if isinstance(m, GatedMLP)]
    assert attentions and mlps and all(m.qkv is not None for m in attentions) and all(m.gate_up for m in mlps)
    with torch.inference_mode():
        for attention in attentions:
            x = torch.randn(3, attention.q_proj.weight.shape[1])
            separate = (attention.q_proj(x), attention.k_proj(x), attention.v_proj(x))
            assert all(torch.equal(a, b) for a, b in zip(attention.project(x, x), separate, strict=True))
        for mlp in mlps:
            x = torch.randn(3, mlp.gate_proj.weight.shape[1])
            stacked = mlp(x)
            mlp.gate_up, gate_up = None, mlp.gate_up
            assert torch.equal(stacked, mlp(x))
            mlp.gate_up = gate_up


def drafter_module(drafter) -> torch.nn.Module:
    """The trainable module a drafter drafts with a copy of."""
    for name in ("head", "stack", "heads", "model"):
        module = getattr(drafter, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise AssertionError(f"no drafting module on {type(drafter).__name__}")


@pytest.mark.parametrize("family", list(BUILDERS))
def test_int8_needs_the_packed_copy_and_says_so(setup, family):
    target, _ = setup
    with pytest.raises(SpecvizError, match="draft-quant int8 needs the drafter's packed inference copy"):
        BUILDERS[family](target.model, pack=False, draft_quant="int8")
    with pytest.raises(SpecvizError, match="draft-quant must be one of auto, off, int8"):
        BUILDERS[family](target.model, draft_quant="int4")
    assert BUILDERS[family](target.model, draft_quant="int8").describe()["draft_quant"] == "int8"


@pytest.mark.parametrize("family", list(BUILDERS))
def test_auto_drafts_in_int8_where_it_runs(setup, family):
    """``"auto"`` (the setting's default) is int8 for a float32 head on CPU where the thin kernel runs, the same draft
    as asking for int8; the unpacked reference path and a half-precision head keep their own weights."""
    if thin_kernel.load() is None:
        pytest.skip(f"thin kernel unavailable (auto keeps the weights): {thin_kernel.unavailable_reason()}")
    target, _ = setup
    auto, int8 = (BUILDERS[family](target.model, draft_quant=quant) for quant in ("auto", "int8"))
    assert auto.describe()["draft_quant"] == "int8"
    budget, config = SHAPES["tree"], GenerationConfig(max_new_tokens=8)
    rounds = [generate(target, PROMPT, config, drafter, budget).rounds[0] for drafter in (auto, int8)]
    assert [c.p for c in rounds[0].draft_top[0]] == [c.p for c in rounds[1].draft_top[0]]
    assert BUILDERS[family](target.model, pack=False, draft_quant="auto").describe()["draft_quant"] is None
    half = tiny.target("llama", VOCAB, layers=LAYERS, scale=25, dtype=torch.bfloat16)
    assert BUILDERS[family](half.model, draft_quant="auto").describe()["draft_quant"] is None


def test_auto_resolves_by_device_and_dtype(monkeypatch):
    assert resolve_draft_quant("auto", "cpu", torch.float32) == ("int8" if thin_kernel.load() else "off")
    assert resolve_draft_quant("auto", "cpu", torch.bfloat16) == "off"
    assert resolve_draft_quant("auto", "cuda", torch.float32) == "off"
    assert resolve_draft_quant("off", "cpu", torch.float32) == "off"
    assert resolve_draft_quant("int8", "cuda", torch.float16) == "int8"  # refused where the weights are packed
    with pytest.raises(SpecvizError, match="draft-quant must be one of auto, off, int8, got 'int4'"):
        resolve_draft_quant("int4", "cpu", torch.float32)
    monkeypatch.setattr(thin_kernel, "load", lambda: None)  # int8 would save nothing: auto keeps the weights
    assert resolve_draft_quant("auto", "cpu", torch.float32) == "off"
    assert resolve_draft_quant("int8", "cpu", torch.float32) == "int8"


def test_int8_products_without_the_kernel_are_the_same_rounded_weights(monkeypatch):
    """Where the thin kernel does not run, ``int8`` multiplies by the same rounded weights dequantised to float32:
    the kernel's product to float tolerance, not the float32 weights' product."""
    if thin_kernel.load() is None:
        pytest.skip(f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
    generator = torch.Generator().manual_seed(5)
    weight, bias, x = (torch.randn(*shape, generator=generator) for shape in ((70, 48), (70,), (3, 48)))
    kernel = quantized.int8_projection(weight, bias)(x)
    monkeypatch.setattr(thin_kernel, "load", lambda: None)
    torch_ = quantized.int8_projection(weight, bias)(x)
    torch.testing.assert_close(torch_, kernel, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(torch_, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    with pytest.raises(SpecvizError, match="needs a float32 draft"):
        quantized.int8_projection(weight.double())


def test_int8_head_keeps_the_target_distribution():
    """Rejection sampling with the int8 head's q: the output is still distributed as the target's."""
    target = tiny.target("llama", V, layers=2, seed=0, scale=15)
    exact = Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()
    drafter = EagleDrafter(sampling_head(target, "eagle3"), V, draft_quant="int8")
    assert chi_square_p(engine_counts(target, drafter, DraftBudget(k=2)), exact) > PASS_P
