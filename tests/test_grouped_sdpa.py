"""The fast path's SDPA (where its float32 kernel does not run: ``test_verify_attention``): transformers' SDPA with
grouped-query heads passed to torch's kernel as they are.

It must compute exactly what transformers' SDPA computes where it takes over (masked forwards of several tokens:
chains and trees on top of a cache), and hand everything else to transformers' own function.
"""

import pytest
import tiny
import torch
from transformers.integrations import sdpa_attention

from specviz.engine import cache as kv
from specviz.engine.attention import attention_implementation
from specviz.engine.tree import DraftTree
from specviz.engine.verify import forward_tree, masked_forward, prefill
from specviz.models import grouped_sdpa

PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 8, 30]


def _refuse(*args, **kwargs):
    raise AssertionError("transformers' repeat_kv ran: the forward did not take the grouped path")


def _logits(net, attention: str, step) -> torch.Tensor:
    """``step(net, cache)`` on top of the prompt, with every layer on ``attention``."""
    grouped_sdpa.register()
    with attention_implementation(net, attention):
        cache = kv.new_cache(net, 64, "tiny", preallocate=True)
        prefill(net, cache, PROMPT[:-1])
        return step(net, cache)


@pytest.mark.skipif(tiny.DEVICE != "cpu" or tiny.ATTENTION != "sdpa", reason="compares with transformers' CPU SDPA")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_grouped_sdpa_is_bit_identical_to_transformers_sdpa(arch, shape):
    """Chain (causal mask) and tree (4D additive mask) verifies: the same logits, bit for bit, as ``repeat_kv``."""
    net = tiny.model(arch, 64, layers=3, scale=25)
    assert net.config.num_attention_heads != net.config.num_key_value_heads  # grouped heads: the case it changes
    draft = DraftTree(tokens=[7, 8, 9, 10, 11], parents=[-1, 0, 1, 2, 3] if shape == "chain" else [-1, 0, -1, 2, 0])

    def verify(model, cache):
        return forward_tree(model, cache, draft, PROMPT[-1], len(PROMPT) - 1)

    reference = _logits(net, "sdpa", verify)
    with pytest.MonkeyPatch.context() as patch:  # the grouped path itself ran: transformers' head copy never did
        patch.setattr(sdpa_attention, "repeat_kv", _refuse)
        grouped = _logits(net, grouped_sdpa.NAME, verify)
    assert torch.equal(reference, grouped), (reference - grouped).abs().max()


@pytest.mark.skipif(tiny.DEVICE != "cpu" or tiny.ATTENTION != "sdpa", reason="compares with transformers' CPU SDPA")
def test_one_token_and_prefill_match_transformers_sdpa():
    """One token (transformers folds the grouped heads into rows there: float tolerance) and the prefill (handed to
    transformers' own function: exact)."""
    net = tiny.model("llama", 64, layers=3, scale=25)

    def one(model, cache):
        return masked_forward(model, cache, [PROMPT[-1]], [len(PROMPT) - 1], None)

    reference, grouped = (_logits(net, name, one) for name in ("sdpa", grouped_sdpa.NAME))
    assert torch.allclose(reference, grouped, atol=1e-5), (reference - grouped).abs().max()
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        with attention_implementation(net, grouped_sdpa.NAME):
            prefill_grouped = net(input_ids=ids).logits
        assert torch.equal(net(input_ids=ids).logits, prefill_grouped)
