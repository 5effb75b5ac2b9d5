"""Cascade attention (prefix kernel + dense tree block, merged by log-sum-exp) equals SDPA with the 4D tree mask.

Tolerances: float32 atol 1e-5 (rtol 1e-4) on attention outputs and logits; bfloat16 atol 2e-2 (rtol 2e-2) on attention
outputs of unit-scale random tensors (bf16 keeps 8 bits of mantissa: one rounding of a value near 1 is 4e-3) and 5e-2
on logits. Controls: the same comparison with the merge broken (the two halves added, or averaged, without the
log-sum-exp weights) misses by far more than the tolerance, so these tests can fail.

The GPU check runs this file with ``SPECVIZ_TEST_DEVICE=cuda`` (``tests/tiny.py``): the kernels compared are then
CUDA's (torch's flash and memory-efficient kernels, and the flash_attn package when installed).
"""


import pytest
import tiny
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specviz import api
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.engine import attention
from specviz.engine import cache as kv
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.tree import DraftTree
from specviz.engine.verify import additive_mask, forward_tree, prefill, tree_visibility
from specviz.models import cascade_attention, device, fast_forward
from specviz.models.fast_forward import fast_copy

cascade_attention.register()

ON_CPU = tiny.DEVICE == "cpu"
HALF_ONLY = {"torch_flash", "flash_attn"}
if ON_CPU:
    KERNELS = ["math", "torch_cpu_flash"]
else:
    KERNELS = ["math", "torch_efficient", "torch_flash", *(["flash_attn"] if device.flash_attn_available() else [])]
TOLERANCE = tiny.TOLERANCE
LOGIT_TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-4}, torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2}}


def random_parents(n: int, generator: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]


def visibility(parents: list[int], prefix: int) -> torch.Tensor:
    """``[q, prefix + q]``: the prefix visible to all, then each node's ancestors and itself."""
    tree = DraftTree(tokens=[0] * len(parents), parents=parents)
    visible = torch.ones(len(parents), prefix + len(parents), dtype=torch.bool)
    visible[:, prefix:] = tree.ancestor_mask()
    return visible


def attention_inputs(arch: str, dtype: torch.dtype, prefix: int, q_len: int, seed: int = 0):
    """A real attention module of a tiny model and unit-scale random queries, keys and values of its shape."""
    module = tiny.model(arch, 32, layers=1, dtype=dtype).model.layers[0].self_attn
    generator = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = module.config.num_attention_heads, module.config.num_key_value_heads, module.head_dim
    query = torch.randn(1, q_len, heads, dim, generator=generator).transpose(1, 2)  # the model's own layout
    key = torch.randn(1, kv_heads, prefix + q_len, dim, generator=generator)
    value = torch.randn(1, kv_heads, prefix + q_len, dim, generator=generator)
    return module, *(t.to(device=tiny.DEVICE, dtype=dtype) for t in (query, key, value))


def reference(module, query, key, value, visible: torch.Tensor) -> torch.Tensor:
    """transformers' SDPA with the engine's 4D additive mask: what tree verification runs today."""
    mask = additive_mask(visible.to(query.device), query.dtype)
    return sdpa_attention_forward(module, query, key, value, mask, scaling=module.scaling)[0]


SHAPES = [(0, 5), (7, 1), (7, 6), (37, 16), (200, 24)]  # (prefix P, new tokens q)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_cascade_matches_masked_sdpa(arch, dtype, kernel, shape):
    if kernel in HALF_ONLY and dtype == torch.float32:
        pytest.skip(f"{kernel} runs in half precision only")
    generator = torch.Generator().manual_seed(1)
    for prefix, q_len in SHAPES:
        parents = list(range(-1, q_len - 1)) if shape == "chain" else random_parents(q_len, generator)
        module, query, key, value = attention_inputs(arch, dtype, prefix, q_len)
        visible = visibility(parents, prefix).to(tiny.DEVICE)
        expected = reference(module, query, key, value, visible)
        masks = [additive_mask(visible, dtype), visible[None, None]]  # the engine's additive mask, and a bool one
        if shape == "chain":
            masks.append(None)  # a chain comes with no mask at all: causal from the bottom right
        for mask in masks:
            with cascade_attention.use_kernel(kernel):
                out, _ = cascade_attention.cascade_attention_forward(module, query, key, value, mask,
                                                                     scaling=module.scaling)
            assert out.shape == expected.shape and out.dtype == dtype
            torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype],
                                       msg=lambda m, p=prefix, q=q_len: f"P={p} q={q}: {m}")


@pytest.mark.parametrize("kernel", sorted(cascade_attention.CHAIN_DIRECT))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chains_run_as_one_call_with_torchs_kernels(monkeypatch, arch, kernel):
    """With torch's CUDA prefix kernels a chain is one SDPA call with the bottom-right causal bias, not a cascade
    (on a CPU that call materialises the mask; on CUDA it reaches the flash or efficient kernel)."""
    monkeypatch.setattr(cascade_attention, "cascade", lambda *args: pytest.fail("a chain ran as a cascade"))
    for prefix, q_len in SHAPES:
        module, query, key, value = attention_inputs(arch, torch.float32, prefix, q_len)
        expected = reference(module, query, key, value, visibility(list(range(-1, q_len - 1)), prefix).to(tiny.DEVICE))
        with cascade_attention.use_kernel(kernel):
            out, _ = cascade_attention.cascade_attention_forward(module, query, key, value, None,
                                                                 scaling=module.scaling)
        torch.testing.assert_close(out, expected, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("broken", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merge_without_log_sum_exp_is_caught(monkeypatch, dtype, broken):
    """Control: adding or averaging the two halves without their log-sum-exp weights is far outside tolerance."""
    wrong = {"sum": lambda a, la, b, lb: a.float() + b.float(),
             "mean": lambda a, la, b, lb: (a.float() + b.float()) / 2}
    monkeypatch.setattr(cascade_attention, "merge", wrong[broken])
    module, query, key, value = attention_inputs("llama", dtype, 37, 8)
    visible = visibility(random_parents(8, torch.Generator().manual_seed(2)), 37).to(tiny.DEVICE)
    expected = reference(module, query, key, value, visible).float()
    out = cascade_attention.cascade_attention_forward(module, query, key, value, additive_mask(visible, dtype),
                                                      scaling=module.scaling)[0].float()
    assert (out - expected).abs().max() > 20 * TOLERANCE[dtype]["atol"]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


@pytest.mark.skipif(not ON_CPU, reason="the check runs where it is free (CPU masks); on a GPU the engine's holds")
def test_a_mask_hiding_prefix_columns_falls_back_to_sdpa():
    """The split assumes every new token sees the whole prefix; a mask that hides a prefix column (the draft model's
    incremental tree forwards) is not split on the CPU, and the engine never sends one to the cascade."""
    module, query, key, value = attention_inputs("llama", torch.float32, 12, 4)
    visible = visibility([-1, 0, 1, 2], 12)
    visible[2, 5] = False
    mask = additive_mask(visible, torch.float32)
    out = cascade_attention.cascade_attention_forward(module, query, key, value, mask, scaling=module.scaling)[0]
    torch.testing.assert_close(out, reference(module, query, key, value, visible), atol=1e-6, rtol=1e-5)
    assert attention.shares_prefix(visibility([-1, 0], 12)) and not attention.shares_prefix(visible)


def random_tree(size: int, vocab: int, chain: bool, generator: torch.Generator) -> DraftTree:
    tokens = torch.randint(0, vocab, (size,), generator=generator).tolist()
    return DraftTree.chain(tokens) if chain else DraftTree(tokens=tokens, parents=random_parents(size, generator))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("forward", ["hf", "fast"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_verify_rounds_with_rejections_and_rollback(arch, forward, dtype):
    """Round after round on two caches, one verified through SDPA and one through the cascade: random chains and
    trees, random accepted paths (empty ones included: full rejection), ``keep_path`` rollback between rounds. The
    logits agree at every round, and the cascade really ran (not a silent fallback)."""
    vocab, generator = 64, torch.Generator().manual_seed(3)
    if forward == "fast" and not ON_CPU:
        pytest.skip("the fast forward runs on the CPU only")
    if forward == "fast" and not fast_forward.available("cpu", dtype):  # the fast path runs float32 and bfloat16 on CPU
        pytest.skip(f"the fast forward does not run in {dtype} on this CPU")
    net = tiny.model(arch, vocab, layers=2, dtype=dtype, scale=4)
    model = fast_copy(net) if forward == "fast" else net
    caches = {name: kv.new_cache(model, 256, "tiny", preallocate=forward == "fast") for name in ("sdpa", "cascade")}
    context = torch.randint(0, vocab, (20,), generator=generator).tolist()
    for name, cache in caches.items():
        with attention.attention_implementation(model, name if name == "sdpa" else cascade_attention.NAME):
            prefill(model, cache, context[:-1])
    calls = []
    real = cascade_attention.cascade
    try:
        cascade_attention.cascade = lambda *args: calls.append(1) or real(*args)
        for round_index in range(8):
            tree = random_tree(int(torch.randint(1, 12, (1,), generator=generator)), vocab, round_index % 2 == 0,
                               generator)
            past = len(context) - 1
            logits = {}
            for name, cache in caches.items():
                with attention.attention_implementation(model, "sdpa" if name == "sdpa" else cascade_attention.NAME):
                    logits[name] = forward_tree(model, cache, tree, context[-1], past).float()
            torch.testing.assert_close(logits["cascade"], logits["sdpa"], **LOGIT_TOLERANCE[dtype],
                                       msg=lambda m, r=round_index: f"round {r}: {m}")
            node = int(torch.randint(-1, len(tree), (1,), generator=generator))
            path = tree.path_to(node) if node >= 0 else []
            for cache in caches.values():
                kv.keep_path(cache, len(context), path)
            context += [tree.tokens[i] for i in path] + [int(logits["sdpa"][len(path)].argmax())]
    finally:
        cascade_attention.cascade = real
    # every tree forward, both layers; chains too, unless the prefix kernel takes them in one call (torch's CUDA
    # kernels with the bottom-right causal mask, or the flash-attn package)
    kernel = cascade_attention.kernel_for(torch.device(tiny.DEVICE), dtype)
    chains_direct = kernel in cascade_attention.CHAIN_DIRECT or kernel == "flash_attn"
    assert len(calls) == 2 * (4 if chains_direct else 8)
    assert all(cache.get_seq_length() == len(context) - 1 for cache in caches.values())


VOCAB, NEW_TOKENS, PROMPT = 64, 48, [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
BUDGETS = [DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=4, max_nodes=12)]


@pytest.fixture(scope="module", params=["llama", "qwen2/fast"])
def cascade_target(request):
    """A tiny target whose model runs the cascade, and plain decoding of it with SDPA (the reference)."""
    arch, _, forward = request.param.partition("/")
    target = tiny.target(arch, VOCAB, forward=forward or "hf", layers=3, scale=25)
    reference = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS)).token_ids
    target.model.config._attn_implementation = cascade_attention.NAME
    return target, reference


@pytest.mark.parametrize("budget", BUDGETS, ids=["chain", "tree"])
@pytest.mark.parametrize("drafter_name", ["other-model", "self-model", "ngram"])
def test_greedy_with_cascade_matches_plain_decoding(cascade_target, drafter_name, budget):
    """Greedy output with cascade verification is token-identical to plain decoding (with SDPA and with the cascade),
    and every round drafts the same tree with the same draft probabilities as with SDPA.

    ``self-model`` drafts with the target's own model object through transformers' forward: its incremental tree
    forwards hide earlier fed nodes from later frontiers, so the engine must run those on SDPA; a wrong split would
    change the draft probabilities (not the output), which the round-by-round comparison sees."""
    target, reference = cascade_target
    other = tiny.truncated(target.model, 1)
    make = {"other-model": lambda: DraftModelDrafter(other, VOCAB),
            "self-model": lambda: DraftModelDrafter(target.model, VOCAB, lean=False),
            "ngram": lambda: NgramDrafter(max_ngram=3)}[drafter_name]
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    run = generate(target, PROMPT, config, make(), budget)
    with attention.attention_implementation(target.model, "sdpa"):
        with_sdpa = generate(target, PROMPT, config, make(), budget)
    assert run.token_ids == with_sdpa.token_ids == reference
    assert plain_decode(target, PROMPT, config).token_ids == reference
    for ours, theirs in zip(run.rounds, with_sdpa.rounds, strict=True):
        assert (ours.tokens, ours.parents, ours.accepted) == (theirs.tokens, theirs.parents, theirs.accepted)
        if ours.q_draft is not None:
            torch.testing.assert_close(torch.tensor(ours.q_draft), torch.tensor(theirs.q_draft), atol=1e-5, rtol=1e-4)
    if drafter_name == "self-model":  # the target drafting for itself: every round ends in a bonus token
        assert all(r.extra_kind == "bonus" for r in run.rounds)


def test_engine_sends_the_cascade_only_masks_that_share_the_prefix(cascade_target):
    """A visibility matrix hiding a prefix column switches the model to SDPA for that call; a verify forward's keeps
    the cascade. The switch is per call: the config keeps naming the cascade throughout."""
    model = cascade_target[0].model
    tree = DraftTree(tokens=[1, 2, 3], parents=[-1, -1, 0])
    hidden = tree_visibility(tree, 6).clone()
    hidden[3, 2] = False
    with attention.mask_capable_attention(model, tree_visibility(tree, 6)):
        assert attention.implementation(model) == cascade_attention.NAME
    with attention.mask_capable_attention(model, hidden):
        assert attention.implementation(model) == "sdpa"
        assert model.config._attn_implementation == cascade_attention.NAME
    assert attention.implementation(model) == model.config._attn_implementation == cascade_attention.NAME


def test_header_names_the_attention_that_ran(cascade_target):
    target, _ = cascade_target
    run = api.start(target, PROMPT, NgramDrafter(), DraftBudget(k=2), GenerationConfig(max_new_tokens=4)).run()
    header = api.header_for(run)
    assert header["attention"]["implementation"] == "specviz_cascade"
    assert header["attention"]["prefix_kernel"] == device.choose_cascade_kernel(tiny.DEVICE, tiny.DTYPE)
    assert "log-sum-exp" in header["attention"]["tree"]
    with attention.attention_implementation(target.model, "sdpa"):
        assert attention.describe(target.model)["tree"] == "sdpa (4D tree mask)"
    with attention.attention_implementation(target.model, "flash_attention_2"):  # trees switch to SDPA there
        assert attention.describe(target.model) == {"implementation": "flash_attention_2",
                                                    "chain": "flash_attention_2", "tree": "sdpa (4D tree mask)"}


def test_padded_batch_falls_back_to_sdpa():
    """A left-padded batch (not what the engine sends, but what a loaded model may see) gives SDPA's answer."""
    net = tiny.model("qwen2", 32, layers=2)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]], device=tiny.DEVICE)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], device=tiny.DEVICE)
    with torch.inference_mode():
        expected = net(input_ids=ids, attention_mask=mask).logits
        with attention.attention_implementation(net, cascade_attention.NAME):
            got = net(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[:, 2:], expected[:, 2:], atol=1e-5, rtol=1e-4)


def test_kernel_choice(monkeypatch):
    """flash_attn when installed (CUDA, half precision), else torch's flash (Ampere+) or efficient kernel; CPU: the
    fused CPU kernel. The choice is cached per process, so each case clears it."""
    choose = device.choose_cascade_kernel
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cases = [(True, "cuda", torch.bfloat16, "flash_attn"), (True, "cuda:0", torch.float32, "torch_efficient"),
             (False, "cuda", torch.float16, "torch_flash"), (False, "cuda", torch.float32, "torch_efficient"),
             (True, "cpu", torch.bfloat16, "torch_cpu_flash"), (False, "mps", torch.float16, "math")]
    for installed, where, dtype, expected in cases:
        monkeypatch.setattr(device, "flash_attn_available", lambda installed=installed: installed)
        choose.cache_clear()
        assert choose(where, dtype) == expected, (installed, where, dtype)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    choose.cache_clear()
    assert choose("cuda", torch.float16) == "torch_efficient"  # torch's flash kernel needs Ampere or newer
    choose.cache_clear()
    with cascade_attention.use_kernel("math"):
        assert cascade_attention.kernel_for("cpu", torch.float32) == "math"
    with pytest.raises(ValueError, match="unknown attention kernel"):
        cascade_attention.use_kernel("nope").__enter__()
    assert tree_visibility(DraftTree.chain([1, 2]), 5) is None  # chains pass no mask: the cascade sees None


def test_loader_gives_the_cascade_backend_by_name(tmp_path):
    """``load_model(..., attn_implementation="specviz_cascade")`` (what ``device.py`` picks on CUDA) loads an
    unmodified model whose forwards run the cascade and agree with SDPA."""
    from specviz.models import load_model

    folder = tiny.save_tiny_model(tmp_path / "tiny")
    where = {"device": tiny.DEVICE, "dtype": torch.float32}
    loaded = load_model(str(folder), **where, attn_implementation=cascade_attention.NAME)
    plain = load_model(str(folder), **where, attn_implementation="sdpa")
    assert loaded.model.config._attn_implementation == cascade_attention.NAME and loaded.model is not plain.model
    ids = torch.tensor([[5, 9, 12, 7, 30, 2]], device=tiny.DEVICE)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, plain.model(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-4)
