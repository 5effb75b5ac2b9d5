"""The thin kernel: a product for a few rows, compiled for this machine on first use.

It must compute ``x @ W.T + b`` to float32 tolerance for any shape (outputs that do not fill a panel, rows beyond
one register block), give each row bit for bit the same result whatever rows sit beside it (so a verify forward's
logits equal a plain step's), and, where it cannot be built, say why and leave the fast path on oneDNN.
"""

import pytest
import tiny
import torch

from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.models import fast_forward, thin_kernel

KERNEL = thin_kernel.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]


@needs_kernel
@pytest.mark.parametrize("n,k", [(16, 8), (37, 23), (48, 9), (200, 64), (5, 1)])
@pytest.mark.parametrize("biased", [False, True])
def test_thin_linear_is_x_times_w_transposed(n, k, biased):
    generator = torch.Generator().manual_seed(n * k)
    weight = torch.randn(n, k, generator=generator)
    bias = torch.randn(n, generator=generator) if biased else None
    packed = KERNEL.pack(weight)
    for rows in (1, 2, 3, KERNEL.pair_rows, KERNEL.pair_rows + 1, KERNEL.max_rows, KERNEL.max_rows + 1,
                 2 * KERNEL.max_rows + 3):  # two panels at once up to pair_rows, one above
        x = torch.randn(2, rows, k, generator=generator)  # a leading batch dimension, as in a forward
        expected = (x.double() @ weight.double().T + (0 if bias is None else bias.double())).float()
        got = KERNEL.linear(x, packed, bias)
        assert got.shape == (2, rows, n)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_rows_sit_beside_it():
    weight, x = torch.randn(100, 96), torch.randn(400, 96)  # 400 rows: interleaved on the heap, not the stack
    packed = KERNEL.pack(weight)
    alone = torch.cat([KERNEL.linear(x[i:i + 1], packed) for i in range(len(x))])
    for rows in (2, 5, KERNEL.pair_rows, KERNEL.pair_rows + 1, KERNEL.max_rows, 19, 400):
        assert torch.equal(KERNEL.linear(x[:rows], packed), alone[:rows])


@needs_kernel
def test_non_contiguous_and_strided_inputs_are_read_right():
    weight = torch.randn(24, 32)
    x = torch.randn(32, 6).T  # [6, 32], not contiguous
    torch.testing.assert_close(KERNEL.linear(x, KERNEL.pack(weight)), x @ weight.T, rtol=1e-5, atol=1e-4)


@needs_kernel
def test_pack_refuses_what_it_cannot_pack():
    with pytest.raises(SpecvizError, match="2-D float32 CPU weights"):
        KERNEL.pack(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(SpecvizError, match="float32, float16 or int8 weights, not torch.bfloat16"):
        KERNEL.pack(torch.randn(4, 4), torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("n,k", [(16, 8), (37, 23), (200, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8])
def test_narrow_weights_are_widened_exactly_and_rows_stay_independent(n, k, dtype):
    """float16 and int8 panels (drafters' weights) give ``x @ W'.T + b`` for the rounded weight W' (float16: W's
    nearest half; int8: round(W / s) * s with s = max |row| / 127 per output), and each row the same bits alone."""
    generator = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
    packed = KERNEL.pack(weight, dtype)
    assert packed.values.dtype == dtype and packed.values.numel() == -(-n // 16) * 16 * k
    if dtype == torch.float16:
        rounded = weight.half().double()
    else:
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        rounded = (torch.round(weight / scale).clamp(-127, 127) * scale).double()
        assert (rounded - weight.double()).abs().max() <= scale.max() / 2 + 1e-6
    x = torch.randn(KERNEL.max_rows + 3, k, generator=generator)
    expected = (x.double() @ rounded.T + bias.double()).float()
    got = KERNEL.linear(x, packed, bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * k ** 0.5)
    alone = torch.cat([KERNEL.linear(x[i:i + 1], packed, bias) for i in range(len(x))])
    assert torch.equal(got, alone)


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_thin_fast_path_greedy_equals_transformers_generate(arch):
    """The whole model through the thin kernel (qwen2: biased q/k/v): transformers' own greedy output, and chain
    and tree drafts verified through it reproduce plain decoding."""
    from specviz.drafters.ngram import NgramDrafter

    reference = tiny.model(arch, 64, layers=3, scale=25)
    thin = fast_forward.fast_copy(reference, thin=True, choose_kernels=False)
    assert {kernel.thin is KERNEL for kernel in fast_forward.linear_kernels(thin)} == {True}
    target = Target(model=thin, tokenizer=tiny.tokenizer(64), name=f"tiny-{arch}", forward="fast")
    with torch.inference_mode():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=60, do_sample=False, min_new_tokens=60)
    config = GenerationConfig(max_new_tokens=60)
    plain = plain_decode(target, PROMPT, config).token_ids
    assert plain == out[0, len(PROMPT):].tolist()
    for budget in (DraftBudget(k=5), DraftBudget(tree=True, width=3, depth=4, max_nodes=12)):
        assert generate(target, PROMPT, config, NgramDrafter(), budget).token_ids == plain


@needs_kernel
def test_kernel_choice_records_the_wide_kernel():
    net = tiny.model("llama", 64, layers=1)
    assert fast_forward.fast_copy(net, thin=True).kernel_choice["wide"] == "thin"
    onednn = fast_forward.fast_copy(net, thin=False)
    assert onednn.kernel_choice["wide"] == "onednn"
    assert {kernel.thin for kernel in fast_forward.linear_kernels(onednn)} == {None}


def test_a_kernel_that_cannot_be_built_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv(thin_kernel.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(thin_kernel.DISABLE_ENV, "0")
    with pytest.raises(thin_kernel._Unavailable, match="turned off"):
        thin_kernel._build_and_load()
    monkeypatch.delenv(thin_kernel.DISABLE_ENV)
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(thin_kernel._Unavailable) as why:
        thin_kernel._build_and_load()
    # here: no compiler; on a machine that fails an earlier check, that check's reason
    assert any(reason in str(why.value) for reason in ("no C compiler", "x86-64", "AVX2", "OpenMP"))
    assert not list(tmp_path.rglob("*.so"))


def test_without_the_kernel_the_fast_path_packs_for_onednn(monkeypatch):
    """Where the kernel cannot run, ``auto`` keeps oneDNN and records why; asking for it is a one-line error."""
    monkeypatch.setattr(thin_kernel, "_loaded", None)
    monkeypatch.setattr(thin_kernel, "_reason", "no C compiler (cc) on PATH")
    net = tiny.model("llama", 64, layers=1)
    fast = fast_forward.fast_copy(net)
    assert fast.kernel_choice["wide"] == "onednn"
    assert fast.kernel_choice["thin_unavailable"] == "no C compiler (cc) on PATH"
    with pytest.raises(SpecvizError, match="thin kernel cannot run here: no C compiler"):
        fast_forward.fast_copy(net, thin=True)


@needs_kernel
@pytest.mark.parametrize("onednn_wins", [False, True])
def test_the_wide_kernel_is_chosen_by_measurement(onednn_wins, monkeypatch):
    """The thin kernel stays unless oneDNN's packed product beats it at every timed width; then every kernel is
    repacked for oneDNN and still computes transformers' logits."""
    net = tiny.model("llama", 64, layers=2, hidden=48)
    fast = fast_forward.fast_copy(net, choose_kernels=False)
    kernels = fast_forward.linear_kernels(fast)

    def fake(run, members, inputs):
        thin = members[0].thin is not None
        return 10.0 if thin else (5.0 if onednn_wins else 9.8)  # 9.8: within the margin, not a win

    monkeypatch.setattr(fast_forward, "_median_ms", fake)
    choice = fast_forward.choose_wide(kernels)
    assert choice["wide"] == ("onednn" if onednn_wins else "thin")
    assert set(choice["wide_ms"]) == set(fast_forward.WIDE_ROWS)
    assert {kernel.thin is None for kernel in kernels} == {onednn_wins}
    x = torch.randn(1, 5, 48)
    attention = fast.model.layers[0].self_attn
    torch.testing.assert_close(attention.k_proj(x), torch.nn.functional.linear(x, net.model.layers[0].self_attn
                                                                               .k_proj.weight), rtol=1e-5, atol=1e-5)
