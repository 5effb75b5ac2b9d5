"""The live baseline: plain decoding stepped between a run's rounds, its mean and spread, and the tau limit."""

import pytest
import tiny

from specviz.drafters.ngram import NgramDrafter
from specviz.engine import baseline
from specviz.engine.drafter import DraftBudget
from specviz.engine.loop import Generation, GenerationConfig, plain_decode

PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17]


def test_estimate_is_the_mean_rate_and_quartiles_of_plain_token_times():
    est = baseline.estimate([10.0, 20.0, 30.0, 40.0, 50.0])
    assert est.tokens_per_s == pytest.approx(1e3 / 30) and est.samples == 5
    assert (est.low, est.high) == (pytest.approx(1e3 / 40), pytest.approx(1e3 / 20))  # slow and fast quartiles
    assert est.speedup_range(60.0) == (pytest.approx(60 / 50), pytest.approx(60 / 25))
    # one slow token (a load spike) counts in the rate, as it does in the run's own rate: the median would drop it
    spiked = baseline.estimate([20.0, 20.0, 20.0, 20.0, 220.0])
    assert spiked.tokens_per_s == pytest.approx(1e3 / 60)
    assert spiked.low == pytest.approx(1e3 / 60) and spiked.high == pytest.approx(1e3 / 20)  # holds the estimate
    assert baseline.estimate([]) is None and baseline.estimate([0.0]) is None
    assert baseline.estimate([25.0]) == baseline.BaselineEstimate(40.0, 40.0, 40.0, 1, samples_ms=(25.0,))
    assert baseline.BaselineEstimate.from_dict(est.to_dict()) == est
    assert baseline.BaselineEstimate.from_dict({"tokens_per_s": "x"}) is None
    assert baseline.BaselineEstimate.from_dict({**est.to_dict(), "low": -1}) is None
    assert baseline.BaselineEstimate.from_dict({**est.to_dict(), "samples_ms": [10.0, "x"]}) is None
    assert baseline.BaselineEstimate.from_dict({**est.to_dict(), "samples_ms": [10.0, -2.0]}) is None
    older = {key: value for key, value in est.to_dict().items() if key != "samples_ms"}  # traces before the interval
    assert baseline.BaselineEstimate.from_dict(older).samples_ms == ()


def test_the_speedup_interval_resamples_both_sides():
    """Rounds that all commit alike at one speed, and plain tokens all timed alike, leave no uncertainty; a run
    whose rounds differ, or a plain side whose tokens differ, widens it around the run's own speedup; the draws are
    seeded, so a replayed trace shows the interval it was shown with."""
    steady = baseline.speedup_interval([2] * 10, [40.0] * 10, [25.0] * 8)
    assert steady == (pytest.approx(1.25), pytest.approx(1.25))  # 2 tokens / 40 ms against 1 / 25 ms
    tokens, ms = [1, 4, 1, 3, 2, 1, 4, 2, 1, 3], [30.0, 60.0, 28.0, 55.0, 40.0, 31.0, 62.0, 41.0, 29.0, 52.0]
    plain = [24.0, 25.0, 26.0, 25.0, 40.0, 24.0, 25.0, 26.0]
    low, high = baseline.speedup_interval(tokens, ms, plain)
    speedup = sum(tokens) / sum(ms) * sum(plain) / len(plain)
    assert low < speedup < high and high - low > 0.1
    assert baseline.speedup_interval(tokens, ms, plain) == (low, high)  # seeded
    narrow = baseline.speedup_interval(tokens, ms, plain, level=0.5)
    assert low < narrow[0] < narrow[1] < high
    assert baseline.speedup_interval([2], [40.0], plain) is None
    assert baseline.speedup_interval(tokens, ms, [25.0]) is None


def test_beyond_limit_flags_a_speedup_tau_cannot_explain():
    assert not baseline.beyond_limit(1.5, tau=1.8) and not baseline.beyond_limit(1.9, tau=1.8)
    assert baseline.beyond_limit(2.5, tau=1.8)


def test_plain_rounds_run_between_the_runs_rounds_and_change_nothing():
    """Warm rounds first, then one plain round every few; the run's tokens are plain decoding's (greedy), and the
    baseline's plain rounds decode the same text on their own cache."""
    target = tiny.target("llama", 64, layers=2, scale=25)
    config = GenerationConfig(max_new_tokens=40)
    probe = baseline.InterleavedBaseline(target, PROMPT, config, warm=3, every=4)
    run = Generation(target, PROMPT, config, NgramDrafter(), DraftBudget(k=4))
    stepped = [probe.after_round() is not None for _ in run]
    rounds = len(run.rounds)
    assert stepped == [i < 3 or (i + 1) % 4 == 0 for i in range(rounds)]
    assert len(probe.samples_ms) == sum(stepped) and all(ms > 0 for ms in probe.samples_ms)
    assert run.token_ids == plain_decode(target, PROMPT, config).token_ids
    est = probe.estimate()
    assert est.samples == sum(stepped) and est.low <= est.tokens_per_s <= est.high


def test_the_plain_side_stops_at_the_runs_length():
    target = tiny.target("llama", 64, layers=2, scale=25)
    probe = baseline.InterleavedBaseline(target, PROMPT, GenerationConfig(max_new_tokens=3), warm=10)
    assert [probe.after_round() is not None for _ in range(5)] == [True, True, True, False, False]
    assert len(probe.samples_ms) == 3
