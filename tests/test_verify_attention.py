"""``specviz::verify_attention``: a step's or a verify's new tokens over the target's float32 cache.

It must compute attention over each row's own visible positions (against float64 arithmetic), give a row the same
bits whatever the other rows see (so a verify row is the one-token step's, bit for bit, through a whole model), read
transformers' masks into those positions or leave the call to ``specviz_grouped_sdpa``, refuse what its raw pointers
cannot check in one line, and show in the profiler and under ``torch.compile``.
"""

from __future__ import annotations

import pytest
import tiny
import torch

from specviz import api
from specviz.engine import cache as kv
from specviz.engine.attention import attention_implementation
from specviz.engine.tree import DraftTree
from specviz.engine.verify import masked_forward, prefill, tree_visibility
from specviz.errors import SpecvizError
from specviz.models import (
    DEFAULT_TARGET,
    embedded,
    fast_forward,
    get_entry,
    grouped_sdpa,
    thin_kernel,
    verify_attention,
)
from specviz.models.verify_attention import Visibility

KERNEL = thin_kernel.load()
pytestmark = pytest.mark.skipif(KERNEL is None, reason=f"thin kernel unavailable: {thin_kernel.unavailable_reason()}")
DEFAULT_ENTRY = get_entry(DEFAULT_TARGET)
EMBEDDED_HERE = embedded.available(DEFAULT_ENTRY.package or "", DEFAULT_ENTRY.location, DEFAULT_ENTRY.wheel) is not None
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 8, 30, 11, 2, 19, 44, 6, 3, 17, 5, 9, 50, 12, 7]


def _cache(kv_heads: int, length: int, dim: int, capacity: int, seed: int = 0):
    """Keys and values as the fast path's cache hands them over: views of the first ``length`` of ``capacity``."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    values = torch.randn(1, kv_heads, capacity, dim, generator=generator)
    return keys[:, :, :length], values[:, :, :length]


def _query(rows: int, heads: int, dim: int, seed: int = 1) -> torch.Tensor:
    """``[1, heads, rows, dim]`` laid out as ``[rows, heads, dim]``: transformers' query after its transpose."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, rows, heads, dim, generator=generator) * 2).transpose(1, 2)


def _reference(query, keys, values, seen: Visibility, scale: float) -> torch.Tensor:
    heads, kv_heads = query.shape[1], keys.shape[1]
    out = torch.empty(1, query.shape[2], heads, query.shape[3], dtype=torch.float64)
    for row in range(query.shape[2]):
        positions = [*range(seen.prefix), *seen.extras[row, : int(seen.counts[row])].tolist()]
        for head in range(heads):
            k = keys[0, head // (heads // kv_heads), positions].double()
            v = values[0, head // (heads // kv_heads), positions].double()
            scores = query[0, head, row].double() @ k.T * scale
            out[0, row, head] = torch.softmax(scores, dim=-1) @ v
    return out


def _lanes_fit(dim: int) -> None:
    if dim % KERNEL.lanes:
        pytest.skip(f"head size {dim} is not a multiple of this machine's {KERNEL.lanes} lanes")


@pytest.mark.parametrize(("kv_heads", "group", "dim"), [(3, 3, 64), (2, 1, 32), (1, 8, 128), (2, 4, 48), (1, 9, 16),
                                                        (2, 2, 8)],
                         ids=["smollm2", "no-grouping", "group-8", "generic-head-size", "generic-group", "head-8"])
def test_it_is_attention_over_each_rows_own_positions(kv_heads, group, dim):
    """Rows with a shared prefix and their own new positions (a tree's ancestors, out of order among the rows), over
    more than one block of positions: float64 softmax(q k^T * scale) v to float32 rounding."""
    _lanes_fit(dim)
    keys, values = _cache(kv_heads, 77, dim, capacity=90)
    query = _query(5, kv_heads * group, dim)
    seen = Visibility([[72], [72, 73], [72, 74], [72, 73, 75, 76], [72, 74, 76]], prefix=72)
    out = verify_attention.attend(query, keys, values, seen.extras, seen.counts, seen.prefix, dim ** -0.5)
    assert out.dtype == torch.float32 and out.shape == (1, 5, kv_heads * group, dim)
    torch.testing.assert_close(out.double(), _reference(query, keys, values, seen, dim ** -0.5), atol=2e-5, rtol=1e-5)


def test_a_rows_result_has_the_same_bits_whatever_the_other_rows_see():
    """A row alone, the same row among others, and a row whose positions hold the same keys and values in other cache
    slots (a tree node and the chain of its path): identical bits."""
    keys, values = _cache(2, 70, 32, capacity=80, seed=2)
    query = _query(4, 6, 32, seed=3)
    seen = Visibility([[60], [60, 61], [60, 62], [60, 61, 63]], prefix=60)
    together = verify_attention.attend(query, keys, values, seen.extras, seen.counts, seen.prefix, 0.2)
    for row in range(4):
        alone = Visibility([seen.extras[row, : int(seen.counts[row])].tolist()], prefix=60)
        single = verify_attention.attend(query[:, :, row:row + 1], keys, values, alone.extras, alone.counts, 60, 0.2)
        assert torch.equal(single[0, 0], together[0, row])
    moved = keys.clone(), values.clone()  # row 3's path (60, 61, 63) laid out as a chain: 60, 61, 62
    for tensor, source in zip(moved, (keys, values)):
        tensor[:, :, 62] = source[:, :, 63]
    chain = Visibility([[60, 61, 62]], prefix=60)
    as_chain = verify_attention.attend(query[:, :, 3:4], *moved, chain.extras, chain.counts, 60, 0.2)
    assert torch.equal(as_chain[0, 0], together[0, 3])


def test_large_scores_do_not_overflow():
    keys, values = _cache(1, 40, 16 if KERNEL.lanes == 8 else 32, capacity=40, seed=4)
    query = _query(2, 2, keys.shape[-1], seed=5) * 300
    seen = Visibility.causal(2, 40)
    out = verify_attention.attend(query, keys, values, seen.extras, seen.counts, seen.prefix, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _reference(query, keys, values, seen, 1.0), atol=2e-5, rtol=1e-5)


def test_visibility_reads_transformers_masks():
    """None: causal over the last rows. A bool mask and a 0 / minimum additive mask: the shared prefix, then each row's
    visible new positions. Anything else (a bias, a prefix not every row sees, a row that sees nothing, another shape)
    is not the kernel's: None."""
    causal = Visibility.causal(3, 10)
    assert causal.prefix == 7 and causal.counts.tolist() == [1, 2, 3]
    assert causal.extras.tolist() == [[7, 0, 0], [7, 8, 0], [7, 8, 9]]
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, -1, 0, 1])
    visible = tree_visibility(tree, 6)  # [5, 11]: the pending token at 6, the nodes at 7 .. 10
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    for mask in (visible[None, None], additive):
        seen = Visibility.of_mask(mask, 5, 11)
        assert seen.prefix == 6 and seen.counts.tolist() == [1, 2, 2, 3, 3]
        assert [row[:n].tolist() for row, n in zip(seen.extras, seen.counts)] == [[6], [6, 7], [6, 8], [6, 7, 9],
                                                                                  [6, 8, 10]]
    bias = additive.clone()
    bias[0, 0, 0, 0] = -1.5
    hidden_prefix = visible.clone()
    hidden_prefix[2, 3] = False
    blind = visible.clone()
    blind[1] = False
    for mask, rows, keys in ((bias, 5, 11), (hidden_prefix[None, None], 5, 11), (blind[None, None], 5, 11),
                             (visible[None, None], 5, 12), (visible[None].expand(2, 1, 5, 11), 5, 11)):
        assert Visibility.of_mask(mask, rows, keys) is None


def _forward(net, cache, tokens: list[int], past: int, tree: DraftTree | None = None) -> torch.Tensor:
    if tree is None:
        logits = masked_forward(net, cache, tokens, list(range(past, past + len(tokens))), None)
    else:
        positions = [past + depth for depth in (0, *tree.depth)]
        logits = masked_forward(net, cache, [tokens[0], *tree.tokens], positions, tree_visibility(tree, past))
    kv.crop_to(cache, past)
    return logits


@pytest.mark.skipif(tiny.DEVICE != "cpu", reason="the fast forward runs on the CPU only")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_verify_row_is_the_one_token_step_bit_for_bit(arch):
    """Through a whole fast model: each row of a chain verify is the logits of the one-token step after the same
    text, and each tree node's row is the chain's along its path; every layer ran the kernel."""
    net = fast_forward.fast_copy(tiny.model(arch, 64, layers=3, hidden=128, scale=25))
    assert net.config._attn_implementation == verify_attention.NAME
    cache = kv.new_cache(net, 64, "tiny", preallocate=True)
    prefill(net, cache, PROMPT)
    past, chain = len(PROMPT), [4, 21, 33, 9, 14]
    steps = []
    for i, token in enumerate(chain):
        steps.append(masked_forward(net, cache, [token], [past + i], None)[0])
    kv.crop_to(cache, past)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        verified = _forward(net, cache, chain, past)
    assert sum(event.name == verify_attention.OP for event in prof.events()) == 3
    assert all(torch.equal(verified[i], steps[i]) for i in range(len(chain)))
    tree = DraftTree(tokens=[21, 7, 33, 2], parents=[-1, -1, 0, 2])  # node 3's path: 4, 21, 33, 2
    rows = _forward(net, cache, [4], past, tree)
    path = _forward(net, cache, [4, 21, 33, 2], past)
    assert torch.equal(rows[0], steps[0]) and torch.equal(rows[1], steps[1]) and torch.equal(rows[3], steps[2])
    assert torch.equal(rows[4], path[3])


@pytest.mark.skipif(not EMBEDDED_HERE, reason="the embedded default target is neither installed nor fetched")
def test_the_default_targets_tree_verify_rows_are_its_steps_bit_for_bit():
    """The shipped default (SmolLM2-135M, 64-wide heads, 3 query heads a key/value head) on a chat prompt: the
    pending token's row and a tree node's row are the one-token steps' logits along the same text, bit for bit."""
    target = api.load_target("smollm2-135m")
    net = target.model
    assert net.config._attn_implementation == verify_attention.NAME
    prompt = target.encode_prompt("Explain what a hash map is.", chat=True)
    cache = kv.new_cache(net, len(prompt) + 8, target.name, preallocate=True)
    prefill(net, cache, prompt[:-1])
    past = len(prompt) - 1
    tree = DraftTree(tokens=[330, 2135, 314], parents=[-1, -1, 0])  # node 2's path: pending, 330, 314
    rows = _forward(net, cache, [prompt[-1]], past, tree)
    steps = [masked_forward(net, cache, [token], [past + i], None)[0] for i, token in enumerate([prompt[-1], 330, 314])]
    assert torch.equal(rows[0], steps[0]) and torch.equal(rows[1], steps[1]) and torch.equal(rows[3], steps[2])


@pytest.mark.skipif(tiny.DEVICE != "cpu", reason="the fast forward runs on the CPU only")
def test_calls_it_does_not_take_run_grouped_sdpa(monkeypatch):
    """A prefill longer than ``MAX_ROWS``, dropout, keys whose positions are not contiguous and more rows than keys
    go to ``specviz_grouped_sdpa``, with its results."""
    net = fast_forward.fast_copy(tiny.model("llama", 64, layers=2, hidden=128, scale=25))
    ids = torch.tensor([(PROMPT * 4)[: verify_attention.MAX_ROWS + 1]])
    with torch.inference_mode():
        with attention_implementation(net, grouped_sdpa.NAME):
            reference = net(input_ids=ids).logits
        monkeypatch.setattr(verify_attention, "attend", _refuse)
        assert torch.equal(net(input_ids=ids).logits, reference)
        layer = net.model.layers[0].self_attn
        query, keys = _query(2, 4, 32), _cache(2, 10, 32, capacity=10)
        out, _ = verify_attention.attention_forward(layer, query, *keys, None, dropout=0.5)
        assert out.shape == (1, 2, 4, 32)
        strided = [k.transpose(2, 3).contiguous().transpose(2, 3) for k in keys]  # positions not contiguous
        for arguments in ((query, *strided, None), (_query(12, 4, 32), *keys, None)):  # more rows than keys
            out, _ = verify_attention.attention_forward(layer, *arguments)
            assert torch.equal(out, grouped_sdpa.grouped_sdpa_forward(layer, *arguments)[0])


def _refuse(*args, **kwargs):
    raise AssertionError("the kernel ran")


def test_fast_copy_switches_float32_sdpa_models_to_it(monkeypatch):
    net = tiny.model("llama", 64, layers=1, attention="sdpa")
    assert fast_forward.fast_copy(net).config._attn_implementation == verify_attention.NAME
    assert net.config._attn_implementation == "sdpa"  # the loaded model keeps transformers' own attention
    eager = tiny.model("llama", 64, layers=1, attention="eager")
    assert fast_forward.fast_copy(eager).config._attn_implementation == "eager"
    bfloat16 = tiny.model("llama", 64, layers=1, attention="sdpa", dtype=torch.bfloat16)
    assert fast_forward.fast_copy(bfloat16).config._attn_implementation == grouped_sdpa.NAME
    monkeypatch.setattr(verify_attention, "usable", lambda *args: "the thin kernel did not build here")
    assert fast_forward.fast_copy(net).config._attn_implementation == grouped_sdpa.NAME


def test_usable_names_what_keeps_torchs_attention():
    assert verify_attention.usable(torch.float32, "cpu", 64) is None
    assert "float32 caches" in verify_attention.usable(torch.bfloat16, "cpu", 64)
    assert "not a multiple" in verify_attention.usable(torch.float32, "cpu", KERNEL.lanes + 4)


def _arguments():
    keys, values = _cache(3, 12, 64, capacity=20)
    seen = Visibility.causal(2, 12)
    return {"query": _query(2, 9, 64), "keys": keys, "values": values, "extras": seen.extras, "counts": seen.counts,
            "prefix": seen.prefix}


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: {**a, "query": a["query"].double()}, "query must be float32"),
    (lambda a: {**a, "query": a["query"].contiguous()}, r"laid out as \[rows, heads, dim\]"),
    (lambda a: {**a, "keys": a["keys"].transpose(2, 3)}, "keys must be float32"),
    (lambda a: {**a, "values": a["values"][:, :, :8]}, "differ in shape"),
    (lambda a: {**a, "keys": a["keys"][:, :2], "values": a["values"][:, :2]}, "kv_heads dividing 9"),
    (lambda a: {**a, "extras": a["extras"].long()}, "extras must be contiguous int32"),
    (lambda a: {**a, "counts": a["counts"][:1]}, r"counts must be int64 of shape \(2,\)"),
    (lambda a: {**a, "prefix": 13}, r"prefix must lie in \[0, 12\]"),
    (lambda a: {**a, "extras": a["extras"] + 5}, "position outside the cache's 12"),
    (lambda a: {**a, "counts": a["counts"] + 1}, "count past extras' width 2"),
    (lambda a: {**a, "counts": torch.zeros(2, dtype=torch.long), "prefix": 0}, "see no position"),
], ids=["query-dtype", "query-layout", "key-layout", "shapes", "heads", "extras-dtype", "counts-shape", "prefix",
        "extras-range", "counts-range", "no-position"])
def test_bad_arguments_are_one_line_errors_before_any_read(change, message):
    arguments = change(_arguments())
    with pytest.raises(SpecvizError, match=message) as error:
        verify_attention.attend(**arguments, scale=0.125)
    assert "\n" not in str(error.value)


def test_torch_compile_traces_the_operator():
    arguments = _arguments()
    eager = verify_attention.attend(**arguments, scale=0.125)
    compiled = torch.compile(lambda **a: verify_attention.attend(**a, scale=0.125), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(**arguments), eager)
