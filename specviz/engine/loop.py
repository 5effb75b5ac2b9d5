"""The round loop: propose -> verify (one target forward) -> accept -> commit, one ``Round`` at a time.

Plain decoding is the same loop with no drafter (an empty tree each round), so the baseline is timed exactly
like speculation: same sampler, same cache, same clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from specviz.engine import cache as kv
from specviz.engine.accept import Acceptance, accept
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.features import capture, check_layers, rows
from specviz.engine.record import build_round
from specviz.engine.round import Round
from specviz.engine.sampling import SamplingConfig, make_generator, probabilities
from specviz.engine.target import Target
from specviz.engine.tree import DraftTree
from specviz.engine.verify import forward_tree, prefill
from specviz.errors import SpecvizError

MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = 0
    top_k_report: int = 5  # alternatives recorded per verified position
    detail: bool = True  # record top-k lists, entropies and texts (the plain baseline turns this off)
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise SpecvizError(f"max-new-tokens must be an integer in [1, {MAX_NEW_TOKENS}], got {self.max_new_tokens}")
        if not 0 <= self.top_k_report <= 50:
            raise SpecvizError(f"top-k report must be in [0, 50], got {self.top_k_report}")

    def to_dict(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "seed": self.seed, **self.sampling.to_dict()}

    def lean(self) -> GenerationConfig:
        """The same run without what only views need (top-k lists, entropies, texts): for timed baselines."""
        return replace(self, top_k_report=0, detail=False)


class Clock:
    """Wall clock that waits for the accelerator first, so GPU work is charged where it happens."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


@dataclass
class Step:
    """What one round computed (the input of its view record) and where its time went, in seconds."""

    tree: DraftTree
    logits: torch.Tensor
    p_target: torch.Tensor | None
    acceptance: Acceptance
    committed: list[int]
    finished: bool
    draft_s: float
    verify_s: float
    other_s: float


class Generation:
    """One generation. Iterate it for ``Round`` records; afterwards read ``new_tokens``, ``elapsed_s`` and friends."""

    def __init__(
        self,
        target: Target,
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: Drafter | None = None,
        budget: DraftBudget | None = None,
    ):
        if not prompt_ids:
            raise SpecvizError("the prompt is empty")
        self.target, self.drafter, self.config = target, drafter, config
        self.budget = budget or DraftBudget()
        self.prompt_ids = [int(t) for t in prompt_ids]
        limit = target.max_positions
        needed = len(self.prompt_ids) + config.max_new_tokens + (self.budget.max_depth if drafter else 0) + 1
        if len(self.prompt_ids) >= limit:
            raise SpecvizError(f"the prompt is {len(self.prompt_ids)} tokens; {target.name} reads at most {limit}")
        if needed > limit:
            room = max(0, limit - len(self.prompt_ids) - (self.budget.max_depth if drafter else 0) - 1)
            raise SpecvizError(f"max-new-tokens {config.max_new_tokens} overflows the {limit}-token context window; "
                               f"at most {room} fit after this prompt")
        widest = max(self.budget.k, self.budget.max_nodes) if drafter else 0  # nodes one verify forward may add
        self.cache = kv.new_cache(target.model, max(needed, len(self.prompt_ids) + config.max_new_tokens + widest + 1),
                                  target.name, preallocate=target.preallocated_cache)
        self.new_tokens: list[int] = []
        self.rounds: list[Round] = []
        self.prefill_ms = 0.0
        self.elapsed_s = 0.0
        self.stop_reason = ""
        self._clock = Clock(target.device)
        self._generator = make_generator(config.seed)
        self._eos = target.eos_ids if config.stop_at_eos else set()
        self._layers = tuple(drafter.feature_layers) if drafter is not None else ()
        if self._layers:
            check_layers(target.model, self._layers)

    @property
    def token_ids(self) -> list[int]:
        return self.new_tokens

    @property
    def text(self) -> str:
        return self.target.decode(self.new_tokens)

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def run(self) -> Generation:
        for _ in self:
            pass
        return self

    def __iter__(self) -> Iterator[Round]:
        clock, config = self._clock, self.config
        start = clock()
        self._prefill()
        self.prefill_ms = (clock() - start) * 1e3
        self.elapsed_s = self.prefill_ms / 1e3
        context = list(self.prompt_ids)
        while len(self.new_tokens) < config.max_new_tokens:
            step = self._round(context)
            t0 = clock()
            record = build_round(self.target, config, step.tree, step.logits, step.p_target, step.acceptance,
                                 step.committed, step.finished, index=len(self.rounds),
                                 start=len(self.new_tokens) - len(step.committed))
            other_s = step.other_s + clock() - t0
            record.draft_ms, record.verify_ms, record.other_ms = step.draft_s * 1e3, step.verify_s * 1e3, other_s * 1e3
            self.elapsed_s += step.draft_s + step.verify_s + other_s
            self.rounds.append(record)
            yield record
            if step.finished:
                self.stop_reason = "eos" if step.committed and step.committed[-1] in self._eos else "max_new_tokens"
                return
        self.stop_reason = "max_new_tokens"

    def _prefill(self) -> None:
        """Cache the prompt minus its last token; hand a drafter that reads target features their rows."""
        model, layers = self.target.model, self._layers
        with capture(model, layers) as found:
            prefill(model, self.cache, self.prompt_ids[:-1])
        if self.drafter is not None:
            self.drafter.begin(self.prompt_ids)
            if layers and len(self.prompt_ids) > 1:
                self.drafter.observe(rows(found, layers, 0, list(range(len(self.prompt_ids) - 1))))

    def _round(self, context: list[int]) -> Step:
        """propose → verify → accept → commit: one target forward; ``context`` grows by the committed tokens."""
        clock, config, drafter, layers = self._clock, self.config, self.drafter, self._layers
        remaining = config.max_new_tokens - len(self.new_tokens)
        t0 = clock()
        if drafter is None:
            tree = DraftTree.empty()
        else:
            tree = drafter.propose(context, self.budget.capped(remaining), config.sampling, self._generator)
            tree.validate_against_vocab(self.target.vocab_size)
        t1 = clock()
        with capture(self.target.model, layers) as found:
            logits = forward_tree(self.target.model, self.cache, tree, context[-1], len(context) - 1)
        t2 = clock()
        p_target = None if config.sampling.greedy else probabilities(logits, config.sampling)
        acceptance = accept(tree, logits, config.sampling, self._generator, p_target)
        kv.keep_path(self.cache, len(context), acceptance.path)
        committed, finished = _truncate([tree.tokens[i] for i in acceptance.path] + [acceptance.extra_token],
                                        remaining, self._eos)
        pending = len(context) - 1  # the position of the token verified as row 0
        context.extend(committed)
        self.new_tokens.extend(committed)
        t3 = clock()
        if drafter is not None:
            if layers:  # the pending token's row, then the accepted nodes that were committed (EOS may cut them)
                path = acceptance.path[: len(committed)]
                drafter.observe(rows(found, layers, pending, [0, *(i + 1 for i in path)]))
            drafter.commit(context, tree, acceptance.path)
        t4 = clock()
        return Step(tree, logits, p_target, acceptance, committed, finished,
                    draft_s=t1 - t0 + t4 - t3, verify_s=t2 - t1, other_s=t3 - t2)


def _truncate(tokens: list[int], remaining: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut a round's tokens at the first EOS (kept) and at the token budget; say whether generation ends."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: min(i + 1, remaining)], True
    if len(tokens) >= remaining:
        return tokens[:remaining], True
    return tokens, False


def generate(
    target: Target,
    prompt_ids: list[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
    budget: DraftBudget | None = None,
) -> Generation:
    """Run a whole generation and return it (rounds, tokens, timings)."""
    return Generation(target, prompt_ids, config, drafter, budget).run()


def plain_decode(target: Target, prompt_ids: list[int], config: GenerationConfig) -> Generation:
    """The baseline: the same loop with no drafter, lean records, same sampler and clock."""
    return Generation(target, prompt_ids, config.lean()).run()
