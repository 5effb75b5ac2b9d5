"""Greedy speculative decoding must be token-identical to plain greedy decoding, for every drafter and shape."""

import pytest
import tiny
import torch
from transformers import DynamicCache

from specviz import settings
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.hybrid import HybridDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.engine.cost_curve import CostCurve
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, generate, plain_decode
from specviz.engine.verify import prefill
from specviz.errors import SpecvizError
from tools.gpu import near_ties

VOCAB = 64
NEW_TOKENS = 120
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]
RISING = CostCurve.from_points({1: 10.0, 2: 12.0, 9: 30.0})  # the hybrid's lookup: verifying more costs more
SHAPES = [
    DraftBudget(k=1),
    DraftBudget(k=4),
    DraftBudget(k=8),
    DraftBudget(tree=True, width=2, depth=3, max_nodes=6),
    DraftBudget(tree=True, width=4, depth=5, max_nodes=24),
    DraftBudget(tree=True, width=3, depth=8, max_nodes=40),
    DraftBudget(k=8, min_draft_prob=0.3),
    DraftBudget(tree=True, width=3, depth=6, max_nodes=24, min_draft_prob=0.3),
]

@pytest.fixture(scope="module", params=["llama", "qwen2", "llama/fast", "qwen2/fast"])
def setup(request):
    arch, _, forward = request.param.partition("/")
    target = tiny.target(arch, VOCAB, forward=forward or "hf", layers=3, scale=25)
    other = tiny.truncated(target.model, 1)  # a shallower draft that agrees only sometimes
    baseline = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert len(baseline.token_ids) == NEW_TOKENS
    return target, other, baseline

def int8_draft(target, other):
    if tiny.DEVICE != "cpu" or tiny.DTYPE != torch.float32:
        pytest.skip("int8 draft weights take a float32 draft on the CPU (elsewhere refused in one line)")
    if other.config.model_type != "llama":
        pytest.skip("int8 draft weights run through the Llama lean forward")
    return DraftModelDrafter(other, VOCAB, draft_quant="int8")


DRAFTERS = {
    "other-model": lambda target, other: DraftModelDrafter(other, VOCAB),
    "int8-model": int8_draft,  # the draft's own weights in int8/fp16: its argmax moves, the output must not
    "self-model": lambda target, other: DraftModelDrafter(target.model, VOCAB),  # everything accepted
    "half-vocab-model": lambda target, other: DraftModelDrafter(other, VOCAB, draft_vocab=VOCAB // 2),
    "ngram": lambda target, other: NgramDrafter(max_ngram=3),
    # lookup rounds and draft-model rounds interleaved: the draft catches up on the text it sat out
    "hybrid-model": lambda target, other: HybridDrafter(NgramDrafter(schedule=RISING), DraftModelDrafter(other, VOCAB)),
    "hybrid-self-model": lambda target, other: HybridDrafter(NgramDrafter(schedule=RISING),
                                                             DraftModelDrafter(target.model, VOCAB)),
}

@pytest.mark.parametrize("budget", SHAPES, ids=lambda b: b.describe().replace(" ", "_"))
@pytest.mark.parametrize("drafter_name", list(DRAFTERS))
def test_greedy_matches_plain(setup, drafter_name, budget):
    target, other, baseline = setup
    drafter = DRAFTERS[drafter_name](target, other)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=NEW_TOKENS), drafter, budget)
    tiny.assert_same_or_near_tie(target, PROMPT, baseline.token_ids, run.token_ids)
    assert all(r.rule == "greedy" and r.lossless for r in run.rounds)
    if tiny.DTYPE != torch.float32:  # below: what holds in exact arithmetic (a draft by the target itself matches)
        return
    if drafter_name == "self-model":  # the target drafting for itself: its argmax child is always kept and accepted
        assert all(r.extra_kind == "bonus" for r in run.rounds)
        assert all(len(r.accepted) == len(r.tokens) or budget.tree for r in run.rounds)
        if not budget.tree and not budget.min_draft_prob:
            assert all(len(r.accepted) == min(budget.k, NEW_TOKENS - r.start) or r.finished for r in run.rounds)
    if drafter_name == "other-model":
        assert any(not r.accepted and r.extra_kind == "correction" for r in run.rounds)
    if drafter_name.startswith("hybrid"):
        assert {"lookup", "draft-model"} <= {r.meta["source"] for r in run.rounds}
    if drafter_name == "hybrid-self-model":  # the model's rounds are all accepted, after lookup rounds too
        model_rounds = [r for r in run.rounds if r.meta["source"] == "draft-model"]
        assert all(len(r.accepted) == len(r.tokens) or budget.tree for r in model_rounds)
        first_lookup = next(r.index for r in run.rounds if r.meta["source"] == "lookup")
        assert any(r.accepted and r.index > first_lookup for r in model_rounds)

def test_rounds_cover_full_acceptance_and_full_rejection(setup):
    target, other, _ = setup
    runs = [generate(target, PROMPT, GenerationConfig(max_new_tokens=60), DraftModelDrafter(m, VOCAB), DraftBudget(k=4))
            for m in (target.model, other)]
    rounds = [r for run in runs for r in run.rounds]
    assert any(len(r.accepted) == len(r.tokens) == 4 for r in rounds)
    assert any(len(r.tokens) == 4 and not r.accepted for r in rounds)

@pytest.mark.parametrize("budget", [DraftBudget(k=4), DraftBudget(tree=True, width=3, depth=4, max_nodes=12)],
                         ids=["chain", "tree"])
def test_cache_matches_fresh_prefill_after_every_round(setup, budget):
    target, other, _ = setup
    run = Generation(target, PROMPT, GenerationConfig(max_new_tokens=40), DraftModelDrafter(other, VOCAB), budget)
    context = list(PROMPT)
    for record in run:
        context += record.committed
        if record.finished:
            break

        fresh = DynamicCache(config=target.model.config)
        prefill(target.model, fresh, context[:-1])
        assert run.verifier.cache.get_seq_length() == len(context) - 1
        for ours, theirs in zip(run.verifier.cache.layers, fresh.layers):
            torch.testing.assert_close(ours.keys, theirs.keys, **tiny.TOLERANCE[tiny.DTYPE])
            torch.testing.assert_close(ours.values, theirs.values, **tiny.TOLERANCE[tiny.DTYPE])


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_min_draft_prob_ends_branches_at_unsure_tokens(setup, tree):
    """A node under the threshold is kept but never extended; with no threshold every branch runs to full depth."""
    target, other, _ = setup
    shape = {"tree": True, "width": 2, "depth": 6, "max_nodes": 64} if tree else {"k": 8}
    sizes = {}
    for stop in (0.0, 0.5):
        run = generate(target, PROMPT, GenerationConfig(max_new_tokens=60), DraftModelDrafter(other, VOCAB),
                       DraftBudget(**shape, min_draft_prob=stop))
        rounds = [r for r in run.rounds if r.start + 8 < 60]  # budgets are capped near the end
        sizes[stop] = sum(len(r.tokens) for r in rounds) / len(rounds)
        for r in rounds:
            for parent in r.parents:
                if parent >= 0:
                    assert r.q_draft[parent] >= stop, (stop, r.q_draft, r.parents)
            if not tree:
                depth_reached = len(r.tokens) == 8
                assert depth_reached or (stop and r.q_draft[-1] < stop)
    assert sizes[0.5] < sizes[0.0]


def test_draft_vocab_trims_a_copy_and_drafts_only_the_first_ids(setup):
    target, other, _ = setup
    head = other.get_output_embeddings()
    drafter = DraftModelDrafter(other, VOCAB, draft_vocab=10)
    assert other.get_output_embeddings() is head and head.out_features == VOCAB  # the loaded model is untouched
    assert drafter.model.get_output_embeddings().out_features == 10
    assert drafter.model.get_output_embeddings().weight.data_ptr() == head.weight.data_ptr()  # shared, not copied
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=40), drafter,
                   DraftBudget(tree=True, width=3, depth=3, max_nodes=12))
    drafted = [t for r in run.rounds for t in r.tokens]
    assert drafted and max(drafted) < 10
    with pytest.raises(SpecvizError, match="draft-vocab must be in"):
        DraftModelDrafter(other, VOCAB, draft_vocab=VOCAB + 1)
    with pytest.raises(SpecvizError, match=r"draft-vocab must be an integer in \[0, "):
        settings.check("draft_vocab", -1)  # the user's value is checked by the declaration


def test_the_widest_tree_fits_the_draft_cache_at_the_end_of_the_longest_run():
    """A dynamic tree feeds the draft every frontier node it expands: at the largest width and depth the settings
    allow, 10 tokens before the end of a 4096-token run, that must fit the draft model's preallocated cache."""
    from specviz.engine.loop import MAX_NEW_TOKENS
    from specviz.engine.sampling import SamplingConfig, make_generator

    drafter = DraftModelDrafter(tiny.model(max_positions=8192, seed=1), 64)
    prompt = [1, 2, 3, 4]
    drafter.begin(prompt)
    context = prompt + [(i * 7) % 64 for i in range(MAX_NEW_TOKENS - 10)]
    widest = DraftBudget(tree=True, width=settings.get("width").high, depth=settings.get("depth").high,
                         max_nodes=settings.get("max_nodes").high).capped(10)
    tree = drafter.propose(context, widest, SamplingConfig(), make_generator(0))
    assert len(tree) == widest.max_nodes


def test_near_tie_rule_refuses_a_wrong_token():
    """The bf16 rule of the GPU check (identical, or parting at a near tie) still fails a wrong token: the control
    replaces one plain token by the target's least likely one there."""
    net = tiny.model("llama", VOCAB, layers=2, seed=0, scale=4, dtype=torch.bfloat16)
    target = tiny.Target(model=net, tokenizer=tiny.tokenizer(VOCAB), name="tiny-bf16", source="test")
    plain = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=12)).token_ids
    tiny.assert_same_or_near_tie(target, PROMPT, plain, list(plain), dtype=torch.bfloat16)
    worst = int(near_ties.next_logits(target, PROMPT + plain[:5]).argmin())
    with pytest.raises(AssertionError, match="not a near tie"):
        tiny.assert_same_or_near_tie(target, PROMPT, plain, plain[:5] + [worst] + plain[6:], dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="parts from plain decoding"):
        tiny.assert_same_or_near_tie(target, PROMPT, plain, plain[:5] + [worst] + plain[6:], dtype=torch.float32)
