"""The round loop: propose -> verify (one target forward) -> accept -> commit, one ``Round`` at a time.

The loop reaches the target's model only through a ``Verifier`` (``specviz.engine.verifier``): the model in this
process by default, or any other implementation passed in. Plain decoding is the same loop with no drafter (an empty
tree each round), so the baseline is timed exactly like speculation: same sampler, same cache, same clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from specviz import settings
from specviz.engine.accept import accept
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.record import Step, build_round
from specviz.engine.round import Round
from specviz.engine.sampling import SamplingConfig, make_generator, probabilities
from specviz.engine.target import PIECE_CONTEXT, Target
from specviz.engine.tree import DraftTree
from specviz.engine.verifier import LocalVerifier, Verifier
from specviz.errors import SpecvizError

MAX_NEW_TOKENS: int = settings.get("max_new_tokens").high


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = settings.default("max_new_tokens")
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = settings.default("seed")
    top_k_report: int = 5  # alternatives recorded per verified position
    detail: bool = True  # record top-k lists, entropies and texts (the plain baseline turns this off)
    stop_at_eos: bool = True

    def __post_init__(self) -> None:  # the ranges the settings declare, for API callers who bypass them
        settings.check_exact("max_new_tokens", self.max_new_tokens)
        if self.seed is not None:
            settings.check_exact("seed", self.seed)
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


class Generation:
    """One generation. Iterate it for ``Round`` records; afterwards read ``new_tokens``, ``elapsed_s`` and friends."""

    def __init__(
        self,
        target: Target,
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: Drafter | None = None,
        budget: DraftBudget | None = None,
        verifier: Verifier | None = None,
    ):
        if not prompt_ids:
            raise SpecvizError("the prompt is empty")
        self.target, self.drafter, self.config = target, drafter, config
        self.budget = budget or DraftBudget()
        self.prompt_ids = [int(t) for t in prompt_ids]
        limit, prompt = target.max_positions, len(self.prompt_ids)
        if prompt >= limit:
            raise SpecvizError(f"the prompt is {prompt} tokens; {target.name} reads at most {limit}")
        if prompt + config.max_new_tokens > limit:  # drafts never reach past the last new token (budget.capped)
            raise SpecvizError(f"max-new-tokens {config.max_new_tokens} overflows the {limit}-token context window; "
                               f"at most {limit - prompt} fit after this prompt")
        # draft nodes (and side rows) one verify forward adds past the committed text
        widest = self.budget.widest + drafter.side_room if drafter else 0
        self._layers = tuple(drafter.feature_layers) if drafter is not None else ()
        self.verifier = verifier or _own_verifier(target, config)
        self.verifier.reserve(prompt + config.max_new_tokens + widest, self._layers, config.sampling)
        self.new_tokens: list[int] = []
        self.rounds: list[Round] = []
        self.prefill_ms = 0.0
        self.elapsed_s = 0.0
        self.stop_reason = ""
        self._clock = Clock(self.verifier.device)
        self._generator = make_generator(config.seed)
        self._eos = target.eos_ids if config.stop_at_eos else set()

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
            record = build_round(self.target, config, step, index=len(self.rounds),
                                 start=len(self.new_tokens) - len(step.committed))
            record.other_ms += (clock() - t0) * 1e3  # building the record is the round's own bookkeeping
            self.elapsed_s += (record.draft_ms + record.verify_ms + record.other_ms) / 1e3
            self.rounds.append(record)
            yield record
            if step.finished:
                self.stop_reason = "eos" if step.committed and step.committed[-1] in self._eos else "max_new_tokens"
                return
        self.stop_reason = "max_new_tokens"

    def _prefill(self) -> None:
        """Cache the prompt minus its last token; hand a drafter that reads target features their rows."""
        cached = self.verifier.prefill(self.prompt_ids[:-1])
        if self.drafter is not None:
            self.drafter.begin(self.prompt_ids, self.config.max_new_tokens, self.budget)
            if self._layers and len(self.prompt_ids) > 1:
                self.drafter.observe(cached.features(self._layers, 0, list(range(len(self.prompt_ids) - 1))))

    def _round(self, context: list[int]) -> Step:
        """propose → verify → accept → commit: one target forward; ``context`` grows by the committed tokens."""
        clock, config, drafter, layers = self._clock, self.config, self.drafter, self._layers
        remaining = config.max_new_tokens - len(self.new_tokens)
        t0 = clock()
        if drafter is None:
            tree = DraftTree.empty()
        else:
            budget = self.budget.capped(remaining)
            tree = drafter.propose(context, budget, config.sampling, self._generator)
            tree.validate_against_vocab(self.target.vocab_size)
            budget.check_fits(tree, drafter.name)
            if tree.side and len(tree.side) > drafter.side_room:
                raise SpecvizError(f"drafter {drafter.name} added {len(tree.side)} side rows to the verify forward, "
                                   f"more than the {drafter.side_room} it declared")
        t1 = clock()
        pending = len(context) - 1  # the position of the last committed token, verified as row 0
        before = context[-PIECE_CONTEXT:]
        scored = self.verifier.verify(tree.with_side(), context[-1], pending)
        tree.meta.update(scored.meta)
        logits = scored.logits[: len(tree) + 1]
        t2 = clock()
        p_target = None if config.sampling.greedy else probabilities(logits, config.sampling)
        acceptance = accept(tree, logits, config.sampling, self._generator, p_target)
        self.verifier.keep(len(context), acceptance.path)
        committed, finished = _truncate([tree.tokens[i] for i in acceptance.path] + [acceptance.extra_token],
                                        remaining, self._eos)
        context.extend(committed)
        self.new_tokens.extend(committed)
        t3 = clock()
        if drafter is not None:
            if tree.side:  # rows verified beside the draft, never accepted: the drafter reads their logits
                tree.meta["side_rows"] = len(tree.side)
                drafter.observe_side(tree, scored.logits)
            if layers:  # the pending token's row, then the accepted nodes that were committed (EOS may cut them)
                path = acceptance.path[: len(committed)]
                drafter.observe(scored.features(layers, pending, [0, *(i + 1 for i in path)]))
            drafter.commit(context, tree, acceptance.path)
        t4 = clock()
        return Step(tree, logits, p_target, acceptance, committed, finished,
                    draft_s=t1 - t0 + t4 - t3, verify_s=t2 - t1, other_s=t3 - t2, before=before)


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
    verifier: Verifier | None = None,
) -> Generation:
    """Run a whole generation and return it (rounds, tokens, timings)."""
    return Generation(target, prompt_ids, config, drafter, budget, verifier).run()


def _own_verifier(target: Target, config: GenerationConfig) -> Verifier:
    """The verifier a target brings: a served target's server (``served.ServedTarget.new_verifier``; it accounts the
    server's time per round only in a run recorded in detail, so a lean, timed baseline pays no extra request per
    token), else its model in this process."""
    served = getattr(target, "new_verifier", None)
    return served(account=config.detail) if served is not None else LocalVerifier(target)


def plain_decode(target: Target, prompt_ids: list[int], config: GenerationConfig) -> Generation:
    """The baseline: the same loop with no drafter, lean records, same sampler and clock."""
    return Generation(target, prompt_ids, config.lean()).run()
