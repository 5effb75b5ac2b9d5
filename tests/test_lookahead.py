"""Lookahead (Jacobi) decoding: the window's rows sit where the paper's mask puts them, the pool fills from the
window's trajectories, and output is exactly the target's (greedy, and sampled with the broken-rule control): the
window's rows are verified but never accepted."""

from __future__ import annotations

import pytest
import tiny
import torch
from test_ngram_schedule import FAIL_P, PASS_P, engine_pairs, trust_every_draft
from test_sampling_lossless import chi_square_p

from specviz import api
from specviz.drafters.lookahead import LookaheadDrafter, NgramPool, parse_argument
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import GenerationConfig, generate, plain_decode
from specviz.engine.sampling import SamplingConfig
from specviz.errors import SpecvizError

VOCAB = 64
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 5, 9, 3, 17]


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", VOCAB, layers=2, scale=25)


def test_the_window_is_the_papers_staircase():
    drafter = LookaheadDrafter(window=4, ngram=4, guesses=2)
    drafter.begin(PROMPT)
    drafter.levels = [[10, 11, 12], [20, 21, 22, 23], [30, 31, 32, 33]]
    side = drafter._window_rows()
    # level 0 is a chain after the root; level l, column i sits under level l-1's column i, at depth l + i
    depth = dict(zip(side.tokens, side.depth))
    assert [depth[t] for t in (10, 11, 12)] == [1, 2, 3]
    assert [depth[t] for t in (20, 21, 22, 23)] == [1, 2, 3, 4]
    assert [depth[t] for t in (30, 31, 32, 33)] == [2, 3, 4, 5]
    sees = {t: {side.tokens[a] for a in side.path_to(i)} for i, t in enumerate(side.tokens)}
    assert sees[32] == {10, 11, 22, 32}  # the staircase: level 0 up to its column, then down its column
    assert sees[20] == {20}  # column 0 of level 1 hangs under the root


def test_the_pool_keeps_the_latest_guesses_per_key():
    pool = NgramPool(2)
    for gram in ((1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7)):
        pool.add(gram, "test")
    assert pool.candidates(1) == [(6, 7), (2, 3)]  # (4, 5) was the least recently seen


def test_jacobi_rounds_fill_the_window_then_the_pool(target):
    drafter = LookaheadDrafter(window=4, ngram=3, guesses=4)
    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=24), drafter, DraftBudget(k=2))
    first, second, third = (r.meta["lookahead"] for r in run.rounds[:3])
    assert len(first["levels"]) == 1 and len(second["levels"]) == 2 and len(third["levels"]) == 2
    assert [len(level) for level in third["levels"]] == [3, 4]  # W - 1, then W
    assert run.rounds[0].verified == 1 + len(run.rounds[0].tokens) + 3  # the root, the drafts, level 0
    assert run.rounds[2].verified == 1 + len(run.rounds[2].tokens) + 3 + 4
    harvested = [origin for origin in drafter.pool.origin.values() if origin.startswith("the window")]
    assert harvested  # n-grams from the Jacobi trajectories


@pytest.mark.parametrize("sizes", [(4, 3, 4), (3, 2, 2), (5, 4, 3)], ids=["W4N3G4", "W3N2G2", "W5N4G3"])
@pytest.mark.parametrize("budget", [DraftBudget(k=3), DraftBudget(tree=True, width=3, depth=3, max_nodes=8)],
                         ids=["chain", "tree"])
def test_greedy_output_is_the_targets(target, sizes, budget):
    config = GenerationConfig(max_new_tokens=40, seed=1)
    plain = plain_decode(target, PROMPT, config).token_ids
    run = generate(target, PROMPT, config, LookaheadDrafter(*sizes), budget)
    assert run.token_ids == plain
    assert sum(len(r.accepted) for r in run.rounds) > 0  # pool n-grams were accepted


def test_two_runs_replay(target):
    rounds = []
    for _ in range(2):
        run = generate(target, PROMPT, GenerationConfig(max_new_tokens=20), api.make_drafter("lookahead", target),
                       DraftBudget(tree=True, width=2, depth=2, max_nodes=4))
        rounds.append([(r.tokens, r.parents, r.accepted, r.meta["lookahead"]["levels"]) for r in run.rounds])
    assert rounds[0] == rounds[1]


def sampled_pairs(samples: int) -> tuple[dict, dict]:
    counts, exact, rounds = engine_pairs(lambda: LookaheadDrafter(3, 2, 3),
                                         DraftBudget(tree=True, width=3, depth=1, max_nodes=3), samples)
    # the prompt's n-grams after "5" are drafted in every first round
    assert sum(len(run[0].tokens) for run in rounds) >= samples
    return counts, exact


def test_sampled_output_keeps_the_target_distribution():
    counts, exact = sampled_pairs(1_500)
    assert chi_square_p(counts, exact) > PASS_P


def test_a_verifier_that_trusts_the_pool_is_detected(monkeypatch):
    trust_every_draft(monkeypatch)
    counts, exact = sampled_pairs(300)
    assert chi_square_p(counts, exact) < FAIL_P


def test_the_spec_declares_w_n_g(target):
    assert parse_argument("") == (4, 3, 4) and parse_argument("6:4:5") == (6, 4, 5)
    for bad, message in (("6:4", "takes W:N:G"), ("a:b:c", "takes W:N:G"), ("6,4,5", "takes W:N:G"),
                         ("1:3:3", "W must be"), ("4:9:3", "N must be"), ("4:3:0", "G must be")):
        with pytest.raises(SpecvizError, match=message) as error:
            parse_argument(bad)
        assert "\n" not in str(error.value)
    drafter = api.make_drafter("lookahead:6:4:5", target)
    assert (drafter.window, drafter.ngram, drafter.guesses, drafter.name) == (6, 4, 5, "lookahead:6:4:5")
    assert drafter.window_rows == 5 + 2 * 6


def test_the_window_meta_carries_texts(target):
    drafter = api.make_drafter("lookahead", target)
    drafter.begin(PROMPT)
    tree = drafter.propose(PROMPT, DraftBudget(k=2), SamplingConfig(), torch.Generator())
    meta = tree.meta["lookahead"]
    assert meta["texts"][0] == [target.piece(t) for t in meta["levels"][0]] and meta["pool"] > 0


def test_the_app_draws_the_window_and_explains_pool_drafts(target):
    from specviz.viz.debugger import why_proposed
    from specviz.viz.lookahead import window_spec

    run = generate(target, PROMPT, GenerationConfig(max_new_tokens=16), api.make_drafter("lookahead", target),
                   DraftBudget(k=3))
    spec = window_spec(run.rounds[-1])
    cells = spec["data"][0]
    assert len(cells["x"]) == 3 + 4 and sorted(set(cells["y"])) == [0, 1]  # level 0: W - 1 guesses, level 1: W
    assert min(x for x, y in zip(cells["x"], cells["y"]) if y == 0) == 1  # level 0 starts right after the root
    assert "W=4, N=3" in spec["layout"]["title"]["text"]
    drafted = next(r for r in run.rounds if r.tokens)
    assert "lookahead's n-gram pool held" in why_proposed(drafted, 0)
    plain_round = plain_decode(target, PROMPT, GenerationConfig(max_new_tokens=2)).rounds[0]
    assert window_spec(plain_round) is None


def test_the_targets_cache_has_room_for_the_window(target):
    """The last round of a run still verifies the whole window: the cache is sized for the declared side rows."""
    config = GenerationConfig(max_new_tokens=12)
    drafter = LookaheadDrafter(8, 4, 8)
    run = generate(target, PROMPT, config, drafter, DraftBudget(k=1))
    assert len(run.token_ids) == 12 and run.rounds[-1].verified >= 1 + drafter.window_rows
    class Sneaky(LookaheadDrafter):
        side_room = 2  # declares less than its window adds

    sneaky = Sneaky(4, 3, 4)
    with pytest.raises(SpecvizError, match="added 3 side rows to the verify forward, more than the 2 it declared"):
        generate(target, PROMPT, config, sneaky, DraftBudget(k=1))
