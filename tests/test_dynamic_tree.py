"""EAGLE-2's dynamic tree, driven by a scripted drafter: which nodes are expanded and which are kept.

The drafter's next-token distribution depends only on the last token (a table), so every node's path probability
can be computed here independently of ``grow`` and compared with what it expanded, kept and pruned.
"""

from __future__ import annotations

import math

import pytest
import torch

from specviz.drafters.dynamic_tree import grow
from specviz.engine.drafter import DraftBudget
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import ROOT

VOCAB = 8
# NEXT[t] = the drafter's distribution after token t. Token 1 is the root's favourite but flat after; token 2 is
# second at the root but nearly certain after, so by path probability its line overtakes token 1's.
NEXT = torch.full((VOCAB, VOCAB), 0.01)
NEXT[0, 1], NEXT[0, 2], NEXT[0, 3] = 0.50, 0.30, 0.14  # the root (after the committed token 0)
NEXT[1, 4:8] = 0.24                                      # flat: the best child of 1 has path 0.5 * 0.24 = 0.12
NEXT[2, 5], NEXT[2, 6] = 0.90, 0.04                      # peaked: 0.3 * 0.9 = 0.27
NEXT[3, 7], NEXT[3, 6] = 0.80, 0.10                      # 0.14 * 0.8 = 0.112
for _t in (4, 5, 6, 7):
    NEXT[_t, (_t + 1) % VOCAB] = 0.9
NEXT = NEXT / NEXT.sum(-1, keepdim=True)


def _path(candidates, index: int) -> list[int]:
    tokens = []
    while index != ROOT:
        tokens.append(candidates[index].token)
        index = candidates[index].parent
    return tokens[::-1]


def _path_probability(tokens: list[int]) -> float:
    probability, last = 1.0, 0
    for token in tokens:
        probability *= float(NEXT[last, token])
        last = token
    return probability


def _grow(width: int, depth: int, max_nodes: int, min_draft_prob: float = 0.0):
    expanded: list[list[int]] = []

    def expand(frontier, candidates):
        expanded.append(list(frontier))
        return torch.stack([NEXT[candidates[i].token].log() for i in frontier])

    budget = DraftBudget(tree=True, width=width, depth=depth, max_nodes=max_nodes, min_draft_prob=min_draft_prob)
    grown = grow(NEXT[0].log()[None], expand, budget, SamplingConfig(temperature=0.0), torch.Generator(), VOCAB)
    return grown, expanded


@pytest.mark.parametrize("width,depth,max_nodes", [(2, 3, 5), (3, 3, 6), (3, 4, 10)])
def test_each_level_expands_the_best_paths_and_the_rerank_keeps_the_best_nodes(width, depth, max_nodes):
    grown, expanded = _grow(width, depth, max_nodes)
    candidates = grown.candidates
    probability = [_path_probability(_path(candidates, i)) for i in range(len(candidates))]
    assert [math.exp(c.score) for c in candidates] == pytest.approx(probability)

    assert len(expanded) == depth - 1
    for level, frontier in enumerate(expanded, start=1):  # the frontier of level + 1 is level's best `width` paths
        at_level = [i for i, c in enumerate(candidates) if c.depth == level]
        best = sorted(at_level, key=lambda i: -probability[i])[:width]
        assert sorted(frontier) == sorted(best)
        assert {probability[i] for i in frontier} == {probability[i] for i in best}

    # The rerank keeps the max_nodes most probable paths of everything drafted, in topological order.
    kept = grown.kept
    assert sorted(probability[i] for i in kept) == sorted(probability, reverse=True)[:max_nodes][::-1]
    tree = grown.tree
    assert len(tree.tokens) == max_nodes
    for node, parent in enumerate(tree.parents):
        assert parent < node
    assert tree.confidence == pytest.approx([probability[i] for i in kept])
    pruned = tree.meta["pruned"]
    assert len(pruned) == len(candidates) - len(kept)
    assert max(p["confidence"] for p in pruned) <= min(tree.confidence) + 1e-9


def test_the_dynamic_tree_follows_the_probable_line_not_the_first_token():
    """Token 2's line (0.3, then 0.9) is expanded at depth 3 ahead of token 1's flat children (0.12 each)."""
    grown, expanded = _grow(width=2, depth=3, max_nodes=5)
    frontier = sorted(tuple(_path(grown.candidates, i)) for i in expanded[1])
    assert frontier[1] == (2, 5) and frontier[0][0] == 1  # (2, 5) at 0.27, then one of token 1's children at 0.12
    kept_paths = {tuple(_path(grown.candidates, i)) for i in grown.kept}
    assert (2, 5, 6) in kept_paths  # 0.3 * 0.9 * 0.9 = 0.243 beats every child of token 1


def test_an_unsure_node_is_kept_but_not_extended():
    grown, expanded = _grow(width=3, depth=3, max_nodes=10, min_draft_prob=0.2)
    candidates = grown.candidates
    extended = {i for frontier in expanded for i in frontier}
    assert extended, "some node is sure enough to extend"
    for i in extended:
        assert candidates[i].q >= 0.2
    assert any(c.q < 0.2 and c.depth == 1 for c in candidates)  # token 3 (0.14) was drafted...
    assert all(candidates[i].token != 3 or candidates[i].depth != 1 for i in extended)  # ...and not extended


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("tree", [True, False])
def test_a_drafter_scoring_a_reduced_vocabulary_grows_the_tree_the_whole_one_would(temperature, tree):
    """Logits over some ids only (``ids=``, EAGLE-3's draft vocabulary) give the tree, q and draws of the same logits
    spread over the whole vocabulary with -inf elsewhere: the columns map back to their ids, the kept rows are
    spread with q = 0 at the missing ids, and a sampled draft draws the same uniforms per id."""
    ids = torch.tensor([0, 2, 3, 5, 6])  # ids 1, 4 and 7 are outside the draft vocabulary
    scores = torch.randn(VOCAB, len(ids), generator=torch.Generator().manual_seed(3)) * 2

    def expand_narrow(frontier, candidates):
        return torch.stack([scores[candidates[i].token] for i in frontier])

    def widened(rows):
        return torch.full((rows.shape[0], VOCAB), float("-inf")).index_copy_(1, ids, rows)

    budget = DraftBudget(tree=tree, k=3, width=3, depth=3, max_nodes=6)
    sampling = SamplingConfig(temperature=temperature, top_p=0.9)
    narrow = grow(scores[0][None], expand_narrow, budget, sampling, torch.Generator().manual_seed(7), VOCAB,
                  stochastic_tree=True, ids=ids).tree
    whole = grow(widened(scores[0][None]), lambda f, c: widened(expand_narrow(f, c)), budget, sampling,
                 torch.Generator().manual_seed(7), VOCAB, stochastic_tree=True).tree
    assert narrow.tokens == whole.tokens and narrow.parents == whole.parents
    assert set(narrow.tokens) <= set(ids.tolist())
    assert narrow.q_token == pytest.approx(whole.q_token)
    assert narrow.q_dist.shape == (len(narrow.tokens) + 1, VOCAB)
    torch.testing.assert_close(narrow.q_dist, whole.q_dist)
    assert float(narrow.q_dist[:, [1, 4, 7]].abs().sum()) == 0.0
