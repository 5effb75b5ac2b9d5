"""Sampled speculative decoding must leave the target's output distribution unchanged.

The exact distribution of the first two generated tokens, P(x1, x2) = p(x1) p(x2 | x1), is computed from the
target; the speculative samples are compared to it with a chi-square test. Threshold: with fixed seeds each test is
deterministic; a correct rule gives p-values spread uniformly, so requiring p > 1e-3 fails a correct implementation
for one seed in a thousand, while the broken-residual control below reaches p < 1e-6 at these sample sizes.

Two levels: the accept rules on distributions from real tiny models (10,000 samples each), and the whole
engine (drafter + verify forward + cache + accept) with fewer samples, since each generation runs real forwards.
"""

import itertools

import pytest
import tiny
import torch
from scipy.stats import chisquare

from specviz.drafters.draft_model import DraftModelDrafter
from specviz.engine import accept as accept_module
from specviz.engine import sampling
from specviz.engine.accept import accept
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig
from specviz.engine.sampling import SamplingConfig, probabilities
from specviz.engine.tree import DraftTree

V = 8
PROMPT = [1, 5, 2]
CONFIG = SamplingConfig(temperature=1.0)
PASS_P = 1e-3
FAIL_P = 1e-6


class Table:
    """All next-token distributions of a model for prefixes of up to two generated tokens."""

    def __init__(self, net: torch.nn.Module, config: SamplingConfig = CONFIG):
        self.logits: dict[tuple[int, ...], torch.Tensor] = {}
        with torch.inference_mode():
            for extra in [(), *[(a,) for a in range(V)], *itertools.product(range(V), range(V))]:
                ids = torch.tensor([PROMPT + list(extra)], device=net.device)
                self.logits[extra] = net(ids).logits[0, -1].float().cpu()  # the accept-rule tests run on the CPU
        self.probs = {k: probabilities(v, config) for k, v in self.logits.items()}

    def joint(self) -> dict[tuple[int, int], float]:
        return {(a, b): float(self.probs[()][a] * self.probs[(a,)][b]) for a in range(V) for b in range(V)}


def chi_square_p(counts: dict, expected: dict[tuple[int, int], float]) -> float:
    """Chi-square p-value of observed pair counts against exact probabilities (cells with < 5 expected pooled)."""
    total = sum(counts.values())
    observed, predicted, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, prob in expected.items():
        if prob * total >= 5:
            observed.append(counts.get(cell, 0))
            predicted.append(prob * total)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * total
    if pooled_exp > 0:
        observed.append(pooled_obs)
        predicted.append(pooled_exp)
    scale = sum(observed) / sum(predicted)
    return float(chisquare(observed, [e * scale for e in predicted]).pvalue)


@pytest.fixture(scope="module")
def tables():
    target = Table(tiny.model("llama", V, layers=2, seed=0, scale=15))
    fair = Table(tiny.model("qwen2", V, layers=1, seed=3, scale=15))  # unrelated random draft
    bad = Table(tiny.model("llama", V, layers=1, seed=11, scale=60))  # very peaked, mostly on the wrong tokens
    return target, fair, bad


def gumbel_draws(q: torch.Tensor, count: int, generator: torch.Generator) -> list[int]:
    """``count`` draws without replacement from q, in draw order."""
    keys = q.clamp_min(1e-30).log() - (-torch.rand(q.shape, generator=generator).clamp_min(1e-12).log()).log()
    keys = keys.masked_fill(q <= 0, float("-inf"))
    return torch.topk(keys, min(count, int((q > 0).sum()))).indices.tolist()


def build_tree(draft: Table, width: int, sampled: bool, generator: torch.Generator) -> DraftTree:
    """A depth-2 tree from the draft table: children drawn (sampled) or its top-w (deterministic)."""
    tokens, parents, rows = [], [], [draft.probs[()]]
    def pick(q: torch.Tensor) -> list[int]:
        return gumbel_draws(q, width, generator) if sampled else torch.topk(q, width).indices.tolist()

    for a in pick(draft.probs[()]):
        tokens.append(a)
        parents.append(-1)
    for i in range(len(tokens)):
        rows.append(draft.probs[(tokens[i],)])
        for b in pick(draft.probs[(tokens[i],)]):
            tokens.append(b)
            parents.append(i)
    rows += [torch.zeros(V)] * (len(tokens) + 1 - len(rows))
    return DraftTree(tokens=tokens, parents=parents, q_dist=torch.stack(rows), sampled=sampled)


def run_rule(target: Table, draft: Table, width: int, sampled: bool, samples: int, seed: int) -> dict:
    """First two committed tokens over many rounds; a round that commits one token is completed from the target."""
    generator = sampling.make_generator(seed)
    counts: dict[tuple[int, int], int] = {}
    for _ in range(samples):
        tree = build_tree(draft, width, sampled, generator)
        prefix_of = [tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))]
        logits = torch.stack([target.logits[()]] + [target.logits[prefix_of[i]] for i in range(len(tree))])
        result = accept(tree, logits, CONFIG, generator)
        out = [tree.tokens[i] for i in result.path] + [result.extra_token]
        if len(out) == 1:
            out.append(sampling.sample(target.probs[(out[0],)], generator))
        counts[(out[0], out[1])] = counts.get((out[0], out[1]), 0) + 1
    return counts


CASES = {
    "chain-sampled": dict(width=1, sampled=True),
    "tree-sampled": dict(width=2, sampled=True),
    "tree-deterministic": dict(width=3, sampled=False),
}


@pytest.mark.parametrize("drafter", ["fair", "bad"])
@pytest.mark.parametrize("case", list(CASES))
def test_accept_rules_preserve_target_distribution(tables, case, drafter):
    target, fair, bad = tables
    draft = fair if drafter == "fair" else bad
    counts = run_rule(target, draft, samples=10_000, seed=1, **CASES[case])
    assert chi_square_p(counts, target.joint()) > PASS_P


@pytest.mark.parametrize("case", ["chain-sampled", "tree-sampled"])
def test_broken_residual_is_detected(tables, case, monkeypatch):
    """Control: sampling the correction from p instead of the residual biases the output, and the test sees it."""
    target, _, bad = tables
    monkeypatch.setattr(accept_module.sampling, "residual", lambda p, q: p)
    counts = run_rule(target, bad, samples=10_000, seed=1, **CASES[case])
    assert chi_square_p(counts, target.joint()) < FAIL_P


@pytest.mark.parametrize(
    "budget, stochastic, draft_vocab, draft_quant, target_forward",
    [(DraftBudget(k=2), False, 0, "off", "hf"),
     (DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True, 0, "off", "hf"),
     (DraftBudget(tree=True, width=3, depth=2, max_nodes=8), False, 0, "off", "hf"),
     (DraftBudget(k=2), False, V // 2, "off", "hf"),
     (DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True, V // 2, "off", "hf"),
     (DraftBudget(k=2), False, 0, "int8", "hf"),
     (DraftBudget(k=2), False, 0, "off", "fast"),
     (DraftBudget(tree=True, width=2, depth=2, max_nodes=6), True, 0, "off", "fast")],
    ids=["chain", "stochastic-tree", "top-w-tree", "chain-half-vocab", "stochastic-tree-half-vocab", "chain-int8",
         "chain-fast-target", "stochastic-tree-fast-target"],
)
def test_engine_sampling_matches_target(budget, stochastic, draft_vocab, draft_quant, target_forward):
    """The whole loop with a real draft model: first two generated tokens follow the target's distribution.

    With ``draft_vocab`` the draft never proposes half the tokens (q = 0 there); the target's mass on them must
    come back through the residual. With ``draft_quant`` the draft's q comes from int8/fp16 weights (a Llama draft,
    which the lean forward runs). ``target_forward="fast"`` verifies through the packed-kernel path and its
    preallocated cache; the exact distribution is still transformers' own forward's.
    """
    if draft_quant != "off" and (tiny.DEVICE != "cpu" or tiny.DTYPE != torch.float32):
        pytest.skip("int8 draft weights take a float32 draft on the CPU (elsewhere refused in one line)")
    target = tiny.target("llama", V, forward=target_forward, layers=2, seed=0, scale=15)
    exact = Table(tiny.model("llama", V, layers=2, seed=0, scale=15)).joint()
    arch = "llama" if draft_quant != "off" else "qwen2"
    drafter = DraftModelDrafter(tiny.model(arch, V, layers=1, seed=3, scale=15), V, stochastic_tree=stochastic,
                                draft_vocab=draft_vocab, draft_quant=draft_quant)
    counts: dict[tuple[int, int], int] = {}
    for seed in range(1_500):
        config = GenerationConfig(max_new_tokens=2, sampling=CONFIG, seed=seed, detail=False, top_k_report=0)
        tokens = Generation(target, PROMPT, config, drafter, budget).run().token_ids
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    assert chi_square_p(counts, exact) > PASS_P


def test_top_p_top_k_applied_to_both_sides(tables):
    """With top-k / top-p the rule compares processed p and q; the output follows the processed target."""
    config = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)
    target_net = tiny.model("llama", V, layers=2, seed=0, scale=15)
    target, draft = Table(target_net, config), Table(tiny.model("qwen2", V, layers=1, seed=3, scale=15), config)
    generator = sampling.make_generator(5)
    counts: dict[tuple[int, int], int] = {}
    for _ in range(20_000):
        tree = build_tree(draft, 1, True, generator)
        prefixes = [(), (tree.tokens[0],), (tree.tokens[0], tree.tokens[1])]
        result = accept(tree, torch.stack([target.logits[p] for p in prefixes]), config, generator)
        out = [tree.tokens[i] for i in result.path] + [result.extra_token]
        if len(out) == 1:
            out.append(sampling.sample(target.probs[(out[0],)], generator))
        counts[(out[0], out[1])] = counts.get((out[0], out[1]), 0) + 1
    joint = target.joint()
    assert all(counts.get(cell, 0) == 0 for cell, prob in joint.items() if prob == 0)
    assert chi_square_p(counts, joint) > PASS_P
