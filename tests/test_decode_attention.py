"""``specviz::decode_attention``: one query per row against a bfloat16 cache, through the thin library.

It must compute attention (against float64 arithmetic on the same bfloat16 cache, for every grouped-query shape it
inlines and the generic one), refuse what its raw pointers cannot check in one line, show in the profiler under its
name and trace under ``torch.compile``; and the slot decoder's bfloat16 steps and prefills must attend through it to
what torch's attention gives.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.errors import SpecvizError
from specviz.models import decode_attention, thin_kernel
from specviz.training.slot_decoder import SlotDecoder

KERNEL = thin_kernel.load()
pytestmark = pytest.mark.skipif(KERNEL is None, reason=f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")


def _case(rows: int, kv_heads: int, group: int, dim: int, capacity: int, seed: int = 0, slots: int | None = None):
    generator = torch.Generator().manual_seed(seed)
    cache_rows = slots or rows
    keys = torch.randn(cache_rows, kv_heads, capacity, dim, generator=generator).to(torch.bfloat16)
    values = torch.randn(cache_rows, kv_heads, capacity, dim, generator=generator).to(torch.bfloat16)
    q = torch.randn(rows, kv_heads, group, dim, generator=generator) * 2
    lengths = torch.randint(0, capacity, (rows,), generator=generator)
    lengths[0], lengths[-1] = 0, capacity - 1  # one key only; the whole cache
    return q, keys, values, lengths


def _reference(q, keys, values, lengths, scale, slots=None):
    out = torch.empty(q.shape, dtype=torch.float64)
    for row in range(q.shape[0]):
        slot = row if slots is None else int(slots[row])
        span = int(lengths[row]) + 1
        k, v = keys[slot, :, :span].double(), values[slot, :, :span].double()
        out[row] = torch.softmax(q[row].double() @ k.transpose(-1, -2) * scale, dim=-1) @ v
    return out


@pytest.mark.parametrize(("kv_heads", "group", "dim"), [(3, 3, 64), (2, 1, 32), (1, 8, 128), (2, 4, 96), (1, 9, 64)],
                         ids=["smollm2", "no-grouping", "group-8", "generic-head-size", "generic-group"])
def test_it_is_attention_over_each_rows_own_length(kv_heads, group, dim):
    """Against float64 softmax(q k^T * scale) v over positions 0..lengths[r] of row r's cache: the kernel's float32
    sums on the bfloat16 cache agree to float32 rounding (torch's bfloat16 products miss by orders more)."""
    q, keys, values, lengths = _case(rows=7, kv_heads=kv_heads, group=group, dim=dim, capacity=45)
    out = decode_attention.attend(q, keys, values, lengths, dim ** -0.5)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), _reference(q, keys, values, lengths, dim ** -0.5), atol=2e-5, rtol=1e-5)


def test_rows_read_the_slots_they_are_given():
    """With ``slots`` (a prefill: many rows of one prompt read one slot), row r reads slot ``slots[r]``."""
    q, keys, values, lengths = _case(rows=6, kv_heads=2, group=3, dim=64, capacity=30, slots=4, seed=1)
    slots = torch.tensor([3, 3, 0, 2, 3, 1])
    out = decode_attention.attend(q, keys, values, lengths, 0.125, slots)
    torch.testing.assert_close(out.double(), _reference(q, keys, values, lengths, 0.125, slots), atol=2e-5, rtol=1e-5)


def test_large_scores_do_not_overflow():
    """Softmax subtracts the largest score: scores in the thousands give the one-hot attention they should."""
    q, keys, values, lengths = _case(rows=3, kv_heads=1, group=2, dim=32, capacity=20, seed=2)
    q = q * 400
    out = decode_attention.attend(q, keys, values, lengths, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _reference(q, keys, values, lengths, 1.0), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: {**a, "q": a["q"].to(torch.bfloat16)}, "q must be float32"),
    (lambda a: {**a, "keys": a["keys"].float()}, "keys must be bfloat16"),
    (lambda a: {**a, "values": a["values"][:, :, :10].contiguous()}, "differ in shape"),
    (lambda a: {**a, "keys": a["keys"].transpose(2, 3)}, "keys must be contiguous"),
    (lambda a: {**a, "lengths": a["lengths"].int()}, "lengths must be int64"),
    (lambda a: {**a, "lengths": a["lengths"] + 100}, r"lengths must lie in \[0, 45\)"),
    (lambda a: {**a, "slots": torch.full((7,), 7)}, r"slots must lie in \[0, 7\)"),
    (lambda a: {**a, "slots": torch.zeros(3, dtype=torch.long)}, r"slots must be int64 of shape \(7,\)"),
    (lambda a: {**a, "q": torch.zeros(7, 3, 3, 48), "keys": torch.zeros(7, 3, 45, 48, dtype=torch.bfloat16),
                "values": torch.zeros(7, 3, 45, 48, dtype=torch.bfloat16)}, "head size 48 is not a multiple"),
], ids=["q-dtype", "cache-dtype", "shapes", "strides", "lengths-dtype", "lengths-range", "slots-range", "slots-shape",
        "head-size"])
def test_bad_arguments_are_one_line_errors_before_any_pointer(change, message):
    q, keys, values, lengths = _case(rows=7, kv_heads=3, group=3, dim=64, capacity=45)
    arguments = change({"q": q, "keys": keys, "values": values, "lengths": lengths, "slots": None})
    if "48" in message and KERNEL.lanes < 16:
        pytest.skip("48 is a multiple of twice this machine's vector width")
    with pytest.raises(SpecvizError, match=message) as error:
        decode_attention.attend(arguments["q"], arguments["keys"], arguments["values"], arguments["lengths"], 0.125,
                                arguments["slots"])
    assert "\n" not in str(error.value)


def test_usable_names_what_keeps_torchs_attention():
    assert decode_attention.usable(torch.bfloat16, "cpu", 64) is None
    assert "bfloat16 caches" in decode_attention.usable(torch.float32, "cpu", 64)
    assert "not a multiple" in decode_attention.usable(torch.bfloat16, "cpu", 2 * KERNEL.lanes + 8)


def test_the_profiler_and_torch_compile_see_the_operator():
    q, keys, values, lengths = _case(rows=4, kv_heads=2, group=3, dim=64, capacity=16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        eager = decode_attention.attend(q, keys, values, lengths, 0.125)
    assert any(event.name == decode_attention.OP for event in prof.events())
    compiled = torch.compile(lambda *a: decode_attention.attend(*a, 0.125), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, keys, values, lengths), eager)


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=64)
    return LlamaForCausalLM(config).eval()


def test_the_slot_decoders_bfloat16_steps_attend_through_it_to_torchs_attention():
    """A bfloat16 decoder's prefill and steps run the operator (seen by the profiler) and, on the same cache, the
    operator's attention is torch's to bfloat16 precision; float32 decoding keeps torch's (exact) attention."""
    model = _tiny_llama()
    decoder = SlotDecoder(model, slots=4, dtype=torch.bfloat16)
    assert decoder.describe_attention() == decode_attention.OP
    assert "bfloat16 caches" in SlotDecoder(model, slots=4).describe_attention()
    assert "attention_kernel=False" in SlotDecoder(model, slots=4, dtype=torch.bfloat16,
                                                   attention_kernel=False).describe_attention()
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=generator).tolist() for n in (5, 17, 9)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        answers = decoder.answer(prompts, max_new_tokens=6, eos=set())
    assert sum(event.name == decode_attention.OP for event in prof.events()) >= 2 * 6  # both layers, every step
    assert [len(a.ids) for a in answers] == [6, 6, 6]

    shape = (4, 2, 40, 64)
    keys, values = torch.randn(shape).to(torch.bfloat16), torch.randn(shape).to(torch.bfloat16)
    lengths = torch.tensor([39, 30, 12, 0])
    q = torch.randn(4, 6, 1, 64).to(torch.bfloat16)
    kernel = decoder._attend_kernel(q, keys, values, lengths)
    torch_attention = decoder._attend_groups(lengths)(q, keys, values, lengths)
    assert kernel.dtype == torch.bfloat16 and kernel.shape == torch_attention.shape == (4, 6, 1, 64)
    torch.testing.assert_close(kernel.float(), torch_attention.float(), atol=3e-2, rtol=3e-2)
