"""The fast target path: declared linear kernels over transformers' own modeling code, and the preallocated cache.

It must compute what transformers computes (to float tolerance), leave the loaded model untouched, roll back like
``DynamicCache``, give the same greedy output as transformers' own ``generate``, and choose its kernels the same way
at every load.
"""

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
from specviz.models import DEFAULT_TARGET, embedded, fast_forward, get_entry, linear_backend, linear_ops
from specviz.models.device import choose_target_forward
from specviz.models.linear_backend import KernelChoice

DEFAULT_ENTRY = get_entry(DEFAULT_TARGET)
EMBEDDED_HERE = embedded.available(DEFAULT_ENTRY.package or "", DEFAULT_ENTRY.location, DEFAULT_ENTRY.wheel) is not None

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
    assert fast.state_dict().keys() == net.state_dict().keys()  # the stacked and packed copies are not state
    norms = [m for m in fast.modules() if type(m).__name__ == fast_forward.ARCHITECTURES[arch]]
    assert norms and all("forward" in vars(m) for m in norms)
    for layer in fast.model.layers:  # one stacked kernel per group, on the parent
        assert isinstance(layer.self_attn.qkv_proj, linear_backend.LinearKernel)
        assert isinstance(layer.mlp.gate_up_proj, linear_backend.LinearKernel)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_rms_norm_is_bit_identical(arch):
    """The one-call norm computes exactly what transformers' RMSNorm computes (not merely close)."""
    net = tiny.model(arch, 64, layers=1, hidden=48)
    norm = net.model.norm
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    x = torch.randn(3, 7, 48) * 5
    fast = fast_forward.fast_copy(net)
    assert "forward" in vars(fast.model.norm) and "forward" not in vars(norm)
    assert torch.equal(fast.model.norm(x), norm(x))


@pytest.mark.parametrize("arch", ARCHS)
def test_sibling_projections_run_as_one_stacked_product(arch, monkeypatch):
    """q/k/v (qwen2: with biases) and gate/up are stacked once at load: one product per group per forward, each
    projection its own columns of it, and a member called on its own says to call the parent."""
    products = []
    forward = linear_backend.LinearKernel.forward
    monkeypatch.setattr(linear_backend.LinearKernel, "forward",
                        lambda self, x: products.append(self.out_features) or forward(self, x))
    net = tiny.model(arch, 64, layers=1, hidden=48)
    attention, mlp = net.model.layers[0].self_attn, net.model.layers[0].mlp
    reference = {name: (m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone())
                 for name, m in attention.named_children() if isinstance(m, torch.nn.Linear)}
    x = torch.randn(1, 5, 48)
    with torch.no_grad():
        expected = mlp(x)
        choice = linear_backend.choose("cpu", torch.float32)
        assert fast_forward.fuse_siblings(attention, "qkv_proj", ("q_proj", "k_proj", "v_proj"), choice)
        assert fast_forward.fuse_siblings(mlp, "gate_up_proj", ("gate_proj", "up_proj"), choice)
        assert not fast_forward.fuse_siblings(attention, "qk_proj", ("q_proj", "missing_proj"), choice)
        assert not fast_forward.fuse_siblings(mlp, "again_proj", ("gate_proj", "up_proj"), choice)  # fused once
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-6)
        assert products == [2 * 96]  # gate/up stacked; down is a plain nn.Linear here (fast_copy gives it a kernel)
        stacked = attention.qkv_proj(x)
        start = 0
        for name in ("q_proj", "k_proj", "v_proj"):
            weight, bias = reference[name]
            got = getattr(attention, name)(stacked)
            torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
            assert got.data_ptr() == stacked[..., start:].data_ptr()  # a view of the one product, not a copy
            start += weight.shape[0]
        with pytest.raises(SpecvizError, match="fused with its siblings.*call its parent module"):
            attention.k_proj(x)


def test_one_shared_fast_model_serves_two_threads_at_once():
    """Nothing is kept between a group's calls, so two sessions' threads on one shared target each get their own
    input's logits (the app runs two engine threads on one cached target)."""
    net = tiny.model("qwen2", 64, layers=2, scale=25)
    fast = fast_forward.fast_copy(net)
    inputs = [torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    with torch.inference_mode():
        expected = [net(input_ids=ids).logits for ids in inputs]
    got, errors = [None, None], []

    def run(index: int) -> None:
        try:
            with torch.inference_mode():
                for _ in range(20):
                    got[index] = fast(input_ids=inputs[index]).logits
                    torch.testing.assert_close(got[index], expected[index], atol=1e-4, rtol=1e-4)
        except Exception as error:  # raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


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
    assert choose_target_forward("auto", "cpu", torch.float16) == "hf"  # float16 products are slow on a CPU
    with pytest.raises(SpecvizError, match="target-forward must be one of"):
        choose_target_forward("turbo", "cpu", torch.float32)
    with pytest.raises(SpecvizError, match="runs on CPU"):
        choose_target_forward("fast", "cuda", torch.bfloat16)
    with pytest.raises(SpecvizError, match="fast target forward needs a CPU model"):
        fast_forward.fast_copy(tiny.model("llama", 16, layers=1, dtype=torch.float16))


def test_bfloat16_runs_the_fast_path_through_torchs_kernel():
    """bfloat16 on a CPU: the fast path (stacked siblings, grouped attention) with torch's own linear kernel, the
    declaration for every dtype but float32; its logits are transformers' to bfloat16 tolerance."""
    assert fast_forward.available("cpu", torch.bfloat16)
    assert choose_target_forward("auto", "cpu", torch.bfloat16) == "fast"
    net = tiny.model("llama", 64, layers=2, dtype=torch.bfloat16)
    fast = fast_forward.fast_copy(net)
    assert fast.kernel_choice == {"wide": "torch", "plain_rows": 0}
    assert {kernel.packed is None for kernel in fast_forward.linear_kernels(fast)} == {True}
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        torch.testing.assert_close(fast(input_ids=ids).logits, net(input_ids=ids).logits, atol=2e-2, rtol=2e-2)
    weight, x = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
    torch.testing.assert_close(fast_forward.packed_linear(weight)(x), x @ weight.T, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not EMBEDDED_HERE,
                    reason="the embedded default target is neither installed nor fetched (make test fetches it)")
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


needs_thin = pytest.mark.skipif(not linear_ops.available(), reason="the thin kernel does not build here")


def test_kernel_choice_is_declared_and_the_same_at_every_load():
    """No timing at load: two loads get the same choice, the declared one for the device and dtype, on every
    kernel, and the copy records it for the trace header."""
    choices = []
    for seed in (0, 1):
        fast = fast_forward.fast_copy(tiny.model("llama", 64, layers=2, seed=seed))
        kernels = fast_forward.linear_kernels(fast)
        assert len(kernels) == 2 * 4 + 1  # per layer: q/k/v stacked, o, gate/up stacked, down; and the output layer
        assert {kernel.choice for kernel in kernels} == {linear_backend.choose("cpu", torch.float32)}
        choices.append(fast.kernel_choice)
    assert choices[0] == choices[1]
    declared = linear_backend.DECLARED["cpu", torch.float32]
    expected = declared.to_dict() if linear_ops.available() else {"wide": "torch", "plain_rows": 0,
                                                                  "thin_unavailable": choices[0]["thin_unavailable"]}
    assert choices[0] == expected


def test_the_declaration_by_device_dtype_and_rows(monkeypatch):
    choice = KernelChoice("thin", plain_rows=2)
    assert [choice.backend(rows) for rows in (1, 2, 3, 16)] == ["torch", "torch", "thin", "thin"]
    for device, dtype in (("cuda", torch.float32), ("cpu", torch.bfloat16), ("mps", torch.float16)):
        assert linear_backend.choose(device, dtype) == linear_backend.TORCH
    assert linear_backend.choose("cpu", torch.float32, thin=False) == linear_backend.TORCH
    with pytest.raises(SpecvizError, match="the thin kernel cannot run here: it runs float32 CPU weights"):
        linear_backend.choose("cpu", torch.bfloat16, thin=True)
    with pytest.raises(ValueError, match="runs thin or torch"):
        KernelChoice("onednn")
    monkeypatch.setattr(linear_ops.thin_kernel, "_loaded", None)
    monkeypatch.setattr(linear_ops.thin_kernel, "_reason", "no C compiler (cc) on PATH")
    assert linear_backend.choose("cpu", torch.float32) == KernelChoice("torch", thin_unavailable="no C compiler "
                                                                                                 "(cc) on PATH")


@needs_thin
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("plain_rows", [0, 6, 16])
def test_either_kernel_computes_transformers_logits(arch, plain_rows, monkeypatch):
    """Whichever backend a product's row count is declared to (torch's ``F.linear`` up to ``plain_rows``, the thin
    kernel above), the verify forward's logits are transformers' own."""
    thin_calls = []
    linear = linear_ops.linear
    monkeypatch.setattr(linear_ops, "linear",
                        lambda x, *args: thin_calls.append(x.numel() // x.shape[-1]) or linear(x, *args))
    monkeypatch.setitem(linear_backend.DECLARED, ("cpu", torch.float32), KernelChoice("thin", plain_rows=plain_rows))
    net = tiny.model(arch, 64, layers=3, scale=25)
    fast = fast_forward.fast_copy(net)
    assert fast.kernel_choice == {"wide": "thin", "plain_rows": plain_rows}
    draft = DraftTree(tokens=[7, 8, 9, 10], parents=[-1, 0, -1, 2])  # 5 rows with the pending token
    outputs = []
    for model, preallocate in ((net, False), (fast, True)):
        cache = kv.new_cache(model, 64, "tiny", preallocate=preallocate)
        prefill(model, cache, PROMPT[:-1])  # 10 rows
        thin_calls.clear()
        outputs.append(forward_tree(model, cache, draft, PROMPT[-1], len(PROMPT) - 1))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-4, rtol=1e-4)
    assert bool(thin_calls) == (plain_rows < 5)  # the 5-row verify ran the thin kernel only above plain_rows


@needs_thin
def test_greedy_decoding_with_narrow_products_through_f_linear_equals_transformers_generate(monkeypatch):
    """Plain 1-row steps through F.linear, the prefill through the thin kernel: transformers' greedy output."""
    monkeypatch.setitem(linear_backend.DECLARED, ("cpu", torch.float32), KernelChoice("thin", plain_rows=1))
    target = tiny.target("llama", 64, forward="fast", layers=3, scale=25)
    assert target.model.kernel_choice["plain_rows"] == 1
    reference = tiny.model("llama", 64, layers=3, scale=25)
    with torch.inference_mode():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, min_new_tokens=40)
    assert plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=40)).token_ids == out[0, len(PROMPT):].tolist()


def test_a_model_of_an_undeclared_architecture_runs_each_projection_alone():
    """Fusing relies on a parent reading its input only through the group: undeclared architectures are not fused,
    and their own norms stay, but their linear layers still run through the declared kernel."""
    net = tiny.model("llama", 64, layers=2, scale=25)
    net.config.model_type = "not-a-declared-one"
    fast = fast_forward.fast_copy(net)
    assert fast_forward.architecture(fast) is None
    assert len(fast_forward.linear_kernels(fast)) == 2 * 7 + 1 and not hasattr(fast.model.layers[0].mlp, "gate_up_proj")
    assert "forward" not in vars(fast.model.norm)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        torch.testing.assert_close(fast(input_ids=ids).logits, net(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
