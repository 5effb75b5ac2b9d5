"""Small pieces: the tree type, the sampler, metrics, n-gram lookup."""

import pytest
import tiny
import torch

from specviz.drafters.ngram import NgramDrafter
from specviz.engine import metrics
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, plain_decode
from specviz.engine.round import Round
from specviz.engine.sampling import SamplingConfig, draw, make_generator, probabilities, sample
from specviz.engine.tree import DraftTree


def test_tree_derivations():
    tree = DraftTree(tokens=[5, 6, 7, 8, 9], parents=[-1, -1, 0, 2, 1])
    assert tree.depth == [1, 1, 2, 3, 2]
    assert tree.children[-1] == [0, 1] and tree.children[2] == [3] and tree.children[3] == []
    assert tree.path_to(3) == [0, 2, 3]
    mask = tree.ancestor_mask()
    assert mask[3].tolist() == [True, False, True, True, False]
    assert mask[4].tolist() == [False, True, False, False, True]
    assert not tree.is_chain and DraftTree.chain([1, 2, 3]).is_chain


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-2], [-1, 0, 5]])
def test_tree_rejects_non_topological_parents(parents):
    with pytest.raises(ValueError):
        DraftTree(tokens=list(range(len(parents))), parents=parents)


def test_sampler_top_k_top_p_and_greedy():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    greedy = probabilities(logits, SamplingConfig())
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    top2 = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (top2[2:] == 0).all() and top2.sum().item() == pytest.approx(1.0)
    nucleus = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.5))
    assert nucleus[0] == 1.0  # the first token already holds more than half the mass
    hot = probabilities(logits, SamplingConfig(temperature=2.0))
    assert hot[0] < torch.softmax(logits, -1)[0]


def test_draw_is_multinomial_token_for_token():
    """The cheaper draw gives multinomial's tokens and leaves the generator where multinomial leaves it, over a
    spread of peaked and flat rows (one shared generator for a batch, as the padded answer batches use)."""
    logits = torch.randn(64, 49152, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.5, 8, 64)[:, None]
    probs = torch.softmax(logits, -1)
    ours, theirs = make_generator(7), make_generator(7)
    tokens = [sample(row, ours) for row in probs]
    assert tokens == [int(torch.multinomial(row, 1, generator=theirs)) for row in probs]
    assert torch.equal(draw(probs, ours), torch.multinomial(probs, 1, generator=theirs).flatten())
    assert torch.equal(ours.get_state(), theirs.get_state())
    per_row = [make_generator(seed) for seed in range(len(probs))]
    assert draw(probs, per_row).tolist() == [int(torch.multinomial(row, 1, generator=make_generator(seed)))
                                             for seed, row in enumerate(probs)]
    assert len(set(tokens)) > 32  # the flat rows really sample


@pytest.mark.parametrize("probs", [torch.zeros(5), torch.tensor([0.5, -0.1, 0.6]), torch.tensor([float("nan"), 1.0])])
def test_draw_refuses_what_is_not_a_distribution(probs):
    with pytest.raises(ValueError, match="invalid distribution"):
        sample(probs, make_generator(0))


def _round(index, start, tokens, parents, accepted, committed_extra=1):
    committed = [tokens[i] for i in accepted] + [99][:committed_extra]
    return Round(index=index, start=start, tokens=tokens, parents=parents, text=[], q_draft=None, confidence=None,
                 sampled=False, p_target=[0.5] * len(tokens), target_top=[], draft_top=None, target_entropy=[],
                 accepted=accepted, extra_token=99, extra_text="", extra_kind="bonus", committed=committed,
                 committed_text=[], draws=[], residual_top=None, rule="greedy", lossless=True, draft_ms=1.0,
                 verify_ms=4.0, other_ms=0.5)


def test_metrics_formulas():
    rounds = [
        _round(0, 0, [1, 2, 3], [-1, 0, 1], [0, 1, 2]),  # all 3 accepted + bonus: 4 tokens
        _round(1, 4, [1, 2, 3], [-1, 0, 1], [0]),  # 1 accepted + correction: 2 tokens
        _round(2, 6, [1, 2, 3], [-1, 0, 1], []),  # none accepted: 1 token
    ]
    m = metrics.compute(rounds, elapsed_s=0.5)
    assert m.tau == pytest.approx(7 / 3)
    assert m.acceptance_rate == pytest.approx(4 / 9)
    assert m.histogram == [1, 1, 0, 1]
    assert m.cumulative == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert m.conditional == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert m.tokens_per_s == pytest.approx(14.0)
    assert m.wasted == pytest.approx((12 - 7) / 12)
    assert set(metrics.FORMULAS) >= {"tau", "acceptance_rate", "speedup", "tokens_per_s"}


def test_plain_decoding_has_tau_one():
    target = tiny.target("llama", 32, layers=1)
    run = plain_decode(target, [1, 2, 3], GenerationConfig(max_new_tokens=12))
    assert metrics.compute(run.rounds, run.elapsed_s).tau == 1.0 and len(run.token_ids) == 12


def test_ngram_chain_and_tree():
    drafter = NgramDrafter(max_ngram=2)
    context = [1, 2, 3, 4, 1, 2, 5, 6, 9, 1, 2]
    drafter.begin(context)
    chain = drafter.propose(context, DraftBudget(k=3), SamplingConfig(), make_generator(0))
    assert chain.tokens == [5, 6, 9]  # the most recent continuation of "1 2"
    tree = drafter.propose(context, DraftBudget(tree=True, width=3, depth=2, max_nodes=8), SamplingConfig(),
                           make_generator(0))
    assert sorted(zip(tree.tokens, tree.parents)) == sorted([(5, -1), (3, -1), (6, 0), (4, 1)])
    assert drafter.propose([7, 8], DraftBudget(k=3), SamplingConfig(), make_generator(0)).tokens == []


def test_tree_forward_switches_attention_only_for_masked_calls():
    """A model on a kernel that takes no 4D mask (a flash-attention stand-in) is switched to SDPA for trees only."""
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from transformers.modeling_utils import AttentionInterface

    from specviz.engine.loop import generate

    seen = []

    def recording_attention(module, query, key, value, attention_mask, **kwargs):
        """Like flash attention: no mask argument, causal aligned to the end of the cache."""
        seen.append(attention_mask is None)
        assert attention_mask is None, "a mask reached a kernel that cannot take one"
        q_len, kv_len = query.shape[-2], key.shape[-2]
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        return AttentionInterface._global_mapping["sdpa"](module, query, key, value, causal[None, None], **kwargs)

    AttentionInterface.register("specviz_test_maskless", recording_attention)
    AttentionMaskInterface.register("specviz_test_maskless", flash_attention_mask)
    target = tiny.target("llama", 32, layers=1, scale=20)
    reference = plain_decode(target, [1, 2, 3], GenerationConfig(max_new_tokens=10)).token_ids
    target.model.config._attn_implementation = "specviz_test_maskless"
    try:
        tree = DraftBudget(tree=True, width=2, depth=2, max_nodes=4)
        run = generate(target, [1, 2, 3], GenerationConfig(max_new_tokens=10), NgramDrafter(), tree)
        chain = plain_decode(target, [1, 2, 3], GenerationConfig(max_new_tokens=10))
    finally:
        target.model.config._attn_implementation = "sdpa"
    assert run.token_ids == reference == chain.token_ids
    assert seen and all(seen)
