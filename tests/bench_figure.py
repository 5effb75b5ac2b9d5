"""The bench's figure for one app request, for tests that compare the page's live speedup with it.

``specviz bench``'s method on one prompt: whole speculative runs, each between two whole plain runs of the same
prompt (``bench.runners.run_specviz``, wall clock, prefill included on both sides), the median of their ratios.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager

import torch

from specviz import api
from specviz.bench.runners import run_specviz
from specviz.engine import metrics
from specviz.ui import runner


@contextmanager
def threads(count: int):
    """Run with ``count`` torch threads, as the served app does under its ``OMP_NUM_THREADS``."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bench_speedup(request: runner.RunRequest, repeats: int = 3) -> float:
    """The median over ``repeats`` of a speculative run's tokens/s over the mean of the plain runs either side."""
    target, _, _ = runner.load_target(request.target)
    drafter = api.make_drafter(request.drafter, target, request.values())
    ids = target.encode_prompt(request.prompt, chat=request.chat)
    config, budget = request.config(), request.budget()
    run_specviz(target, ids, config, drafter, budget)  # warm-up, as the bench's
    ratios = []
    for _ in range(repeats):
        before = run_specviz(target, ids, config)
        speculative = run_specviz(target, ids, config, drafter, budget)
        after = run_specviz(target, ids, config)
        ratios.append(metrics.speedup(speculative.tokens_per_s,
                                      statistics.mean([before.tokens_per_s, after.tokens_per_s])))
    return statistics.median(ratios)
