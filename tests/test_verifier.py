"""The verifier seam: the round loop runs unchanged over another implementation of ``Verifier``.

``Recomputing`` keeps no KV cache at all: every forward recomputes the whole text, as a stateless server without
prefix caching would. Runs through it must produce the tokens and rounds of the in-process verifier, for chains and
trees, with drafters that read no features (n-gram) and that read target hidden states (EAGLE-3)."""

from __future__ import annotations

import pytest
import tiny
import torch

from specviz import api
from specviz.drafters.eagle import EagleDrafter, new_head
from specviz.engine.drafter import DraftBudget
from specviz.engine.features import capture, check_layers
from specviz.engine.loop import GenerationConfig
from specviz.engine.sampling import SamplingConfig
from specviz.engine.tree import DraftTree
from specviz.engine.verifier import Scored, Verifier
from specviz.engine.verify import masked_forward, tree_visibility
from specviz.errors import SpecvizError

VOCAB = 64
PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 40, 3, 17, 5, 9, 3, 17, 5]


class Recomputing(Verifier):
    """A verifier with no cache: it keeps the committed tokens and runs the model over all of them every time."""

    def __init__(self, target):
        self.target, self.name = target, target.name
        self.tokens: list[int] = []
        self.forwards = 0

    @property
    def device(self) -> torch.device:
        return self.target.device

    def reserve(self, positions: int, layers: tuple[int, ...], sampling: SamplingConfig) -> None:
        if layers:
            check_layers(self.target.model, layers)
        self.layers = layers

    def _run(self, tokens: list[int], positions: list[int], visible: torch.Tensor | None, rows: int) -> Scored:
        self.forwards += 1
        with capture(self.target.model, self.layers) as found:
            logits = masked_forward(self.target.model, None, tokens, positions, visible)
        return Scored(logits[-rows:], {layer: hidden[-rows:] for layer, hidden in found.items()})

    def prefill(self, token_ids: list[int]) -> Scored:
        self.tokens = list(token_ids)
        if not token_ids:
            return Scored(None)
        return self._run(token_ids, list(range(len(token_ids))), None, len(token_ids))

    def verify(self, tree: DraftTree, pending_token: int, past_length: int) -> Scored:
        assert past_length == len(self.tokens)
        self._tree = (pending_token, tree)
        n = len(tree) + 1
        visible = torch.ones(past_length + n, past_length + n, dtype=torch.bool).tril()
        tree_rows = tree_visibility(tree, past_length)
        if tree_rows is not None:
            visible[past_length:] = tree_rows
        positions = [*range(past_length), *(past_length + d for d in (0, *tree.depth))]
        return self._run([*self.tokens, pending_token, *tree.tokens], positions, visible, n)

    def keep(self, committed: int, path: list[int]) -> None:
        pending, tree = self._tree
        self.tokens = [*self.tokens, pending, *(tree.tokens[i] for i in path)]
        assert len(self.tokens) == committed + len(path)


@pytest.fixture(scope="module")
def target():
    return tiny.target("llama", VOCAB, layers=4, scale=25)


def runs(target, make_drafter, budget: DraftBudget, config: GenerationConfig) -> tuple[list, list]:
    """(rounds through the in-process verifier, rounds through ``Recomputing``) of the same run."""
    out = []
    for verifier in (None, Recomputing(target)):
        run = api.start(target, PROMPT, make_drafter(), budget, config, verifier=verifier).run()
        out.append([(r.tokens, r.parents, r.accepted, r.committed) for r in run.rounds])
    return out[0], out[1]


BUDGETS = {"chain": DraftBudget(k=4), "tree": DraftBudget(tree=True, width=3, depth=3, max_nodes=8)}
GREEDY = GenerationConfig(max_new_tokens=32, seed=3)


@pytest.mark.parametrize("shape", BUDGETS)
@pytest.mark.parametrize("family", ["ngram", "eagle3"])
def test_the_loop_runs_unchanged_over_a_verifier_without_a_cache(target, family, shape):
    head = new_head(target.model, "eagle3", seed=1) if family == "eagle3" else None

    def make():
        return api.make_drafter("ngram", target) if head is None else EagleDrafter(head, VOCAB)

    local, recomputed = runs(target, make, BUDGETS[shape], GREEDY)
    assert local == recomputed and len(local) > 3
    assert any(len(tokens) > 1 for tokens, *_ in local)  # drafts were verified, not just plain steps


def test_sampled_runs_agree_too(target):
    config = GenerationConfig(max_new_tokens=24, seed=5, sampling=SamplingConfig(temperature=0.9))
    local, recomputed = runs(target, lambda: api.make_drafter("ngram", target), BUDGETS["tree"], config)
    assert local == recomputed


def test_the_verifier_is_what_the_loop_talks_to(target):
    verifier = Recomputing(target)
    run = api.start(target, PROMPT, None, None, GenerationConfig(max_new_tokens=6), verifier=verifier).run()
    assert verifier.forwards == 1 + len(run.rounds)  # the prefill, then one forward per round
    assert verifier.tokens == PROMPT + run.new_tokens[:-1]  # every committed token but the newest one


def test_a_verifier_refuses_layers_its_target_lacks(target):
    drafter = EagleDrafter(new_head(target.model, "eagle3", seed=1), VOCAB)
    drafter.feature_layers = (0, 99)
    with pytest.raises(SpecvizError, match="layers \\[99\\] do not exist"):
        api.start(target, PROMPT, drafter, BUDGETS["chain"], GREEDY, verifier=Recomputing(target))
