"""The thin kernel: a product for a few rows, compiled for this machine on first use, run through its torch operator.

It must compute ``x @ W.T + b`` to float32 tolerance for any shape (outputs that do not fill a panel, rows beyond
one register block), give each row bit for bit the same result whatever rows sit beside it (so a verify forward's
linear rows equal a plain step's), and, where it cannot be built, say why and leave the fast path on torch's kernel.
"""

import pytest
import tiny
import torch

from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.target import Target
from specviz.errors import SpecvizError
from specviz.models import fast_forward, linear_ops, thin_kernel
from specviz.models.linear_ops import linear, pack

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
    packed = pack(weight)
    for rows in (1, 2, 3, KERNEL.pair_rows, KERNEL.pair_rows + 1, KERNEL.max_rows, KERNEL.max_rows + 1,
                 2 * KERNEL.max_rows + 3):  # two panels at once up to pair_rows, one above
        x = torch.randn(2, rows, k, generator=generator)  # a leading batch dimension, as in a forward
        expected = (x.double() @ weight.double().T + (0 if bias is None else bias.double())).float()
        got = linear(x, packed, bias)
        assert got.shape == (2, rows, n)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_rows_sit_beside_it():
    weight, x = torch.randn(100, 96), torch.randn(400, 96)  # 400 rows: interleaved on the heap, not the stack
    packed = pack(weight)
    alone = torch.cat([linear(x[i:i + 1], packed) for i in range(len(x))])
    for rows in (2, 5, KERNEL.pair_rows, KERNEL.pair_rows + 1, KERNEL.max_rows, 19, 400):
        assert torch.equal(linear(x[:rows], packed), alone[:rows])


@needs_kernel
def test_non_contiguous_and_strided_inputs_are_read_right():
    weight = torch.randn(24, 32)
    x = torch.randn(32, 6).T  # [6, 32], not contiguous
    torch.testing.assert_close(linear(x, pack(weight)), x @ weight.T, rtol=1e-5, atol=1e-4)


def test_pack_lays_out_panels_and_refuses_what_it_cannot_pack():
    weight = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)  # 20 outputs: two panels, the second padded
    packed = pack(weight)
    panels = packed.values.view(2, 3, linear_ops.PANEL)  # panel, input, output within the panel
    assert (packed.out_features, packed.in_features, packed.scale) == (20, 3, None)
    assert torch.equal(panels[0].T, weight[:16]) and torch.equal(panels[1].T[:4], weight[16:])
    assert not panels[1].T[4:].any()
    with pytest.raises(SpecvizError, match="2-D float32 CPU weights"):
        pack(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(SpecvizError, match="float32 or int8 weights, not torch.float16"):
        pack(torch.randn(4, 4), torch.float16)


@needs_kernel
@pytest.mark.parametrize("n,k", [(16, 8), (37, 23), (200, 64)])
def test_int8_weights_are_widened_exactly_and_rows_stay_independent(n, k):
    """int8 panels (drafters' weights) give ``x @ W'.T + b`` for the rounded weight W' = round(W / s) * s with
    s = max |row| / 127 per output, and each row the same bits alone."""
    generator = torch.Generator().manual_seed(n + k)
    weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
    packed = pack(weight, torch.int8)
    assert packed.values.dtype == torch.int8 and packed.values.numel() == -(-n // 16) * 16 * k
    scale = weight.abs().amax(dim=1, keepdim=True) / 127
    rounded = (torch.round(weight / scale).clamp(-127, 127) * scale).double()
    assert (rounded - weight.double()).abs().max() <= scale.max() / 2 + 1e-6
    x = torch.randn(KERNEL.max_rows + 3, k, generator=generator)
    expected = (x.double() @ rounded.T + bias.double()).float()
    got = linear(x, packed, bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * k ** 0.5)
    alone = torch.cat([linear(x[i:i + 1], packed, bias) for i in range(len(x))])
    assert torch.equal(got, alone)


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_thin_fast_path_greedy_equals_transformers_generate(arch):
    """The whole model through the thin kernel (qwen2: biased q/k/v): transformers' own greedy output, and chain
    and tree drafts verified through it reproduce plain decoding."""
    from specviz.drafters.ngram import NgramDrafter

    reference = tiny.model(arch, 64, layers=3, scale=25)
    thin = fast_forward.fast_copy(reference, thin=True)
    assert {kernel.packed is not None for kernel in fast_forward.linear_kernels(thin)} == {True}
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
    assert fast_forward.fast_copy(net, thin=True).kernel_choice == {"wide": "thin", "plain_rows": 0}
    library = fast_forward.fast_copy(net, thin=False)
    assert library.kernel_choice == {"wide": "torch", "plain_rows": 0}
    assert {kernel.packed for kernel in fast_forward.linear_kernels(library)} == {None}


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


def test_without_the_kernel_the_fast_path_runs_torchs_kernel(monkeypatch):
    """Where the kernel cannot run, the declared choice gives way to torch's ``F.linear`` and records why; asking
    for it is a one-line error, and so is calling its operator."""
    monkeypatch.setattr(thin_kernel, "_loaded", None)
    monkeypatch.setattr(thin_kernel, "_reason", "no C compiler (cc) on PATH")
    net = tiny.model("llama", 64, layers=1)
    fast = fast_forward.fast_copy(net)
    assert fast.kernel_choice == {"wide": "torch", "plain_rows": 0, "thin_unavailable": "no C compiler (cc) on PATH"}
    assert {kernel.packed for kernel in fast_forward.linear_kernels(fast)} == {None}
    with pytest.raises(SpecvizError, match="thin kernel cannot run here: no C compiler"):
        fast_forward.fast_copy(net, thin=True)
    with pytest.raises(SpecvizError, match="thin_linear: the thin kernel did not build here: no C compiler"):
        linear(torch.randn(2, 4), pack(torch.randn(3, 4)))
