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
from specviz.engine.round import Round, TokenChoice
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
        model, eos = self.target.model, self.target.eos_ids if config.stop_at_eos else set()
        start = clock()
        prefill(model, self.cache, self.prompt_ids[:-1])
        if self.drafter is not None:
            self.drafter.begin(self.prompt_ids)
        self.prefill_ms = (clock() - start) * 1e3
        self.elapsed_s = self.prefill_ms / 1e3
        context = list(self.prompt_ids)
        while len(self.new_tokens) < config.max_new_tokens:
            remaining = config.max_new_tokens - len(self.new_tokens)
            t0 = clock()
            if self.drafter is None:
                tree = DraftTree.empty()
            else:
                tree = self.drafter.propose(context, self.budget.capped(remaining), config.sampling, self._generator)
                tree.validate_against_vocab(self.target.vocab_size)
            t1 = clock()
            logits = forward_tree(model, self.cache, tree, context[-1], len(context) - 1)
            t2 = clock()
            p_target = None if config.sampling.greedy else probabilities(logits, config.sampling)
            acceptance = accept(tree, logits, config.sampling, self._generator, p_target)
            kv.keep_path(self.cache, len(context), acceptance.path)
            committed = [tree.tokens[i] for i in acceptance.path] + [acceptance.extra_token]
            committed, finished = _truncate(committed, remaining, eos)
            context.extend(committed)
            self.new_tokens.extend(committed)
            t3 = clock()
            if self.drafter is not None:
                self.drafter.commit(context, tree, acceptance.path)
            t4 = clock()
            record = self._record(tree, logits, p_target, acceptance, committed, finished)
            t5 = clock()
            record.draft_ms = (t1 - t0 + t4 - t3) * 1e3
            record.verify_ms = (t2 - t1) * 1e3
            record.other_ms = (t3 - t2 + t5 - t4) * 1e3
            self.elapsed_s += (t5 - t0)
            self.rounds.append(record)
            if finished:
                self.stop_reason = "eos" if committed and committed[-1] in eos else "max_new_tokens"
                yield record
                return
            yield record
        self.stop_reason = "max_new_tokens"

    def _record(
        self,
        tree: DraftTree,
        logits: torch.Tensor,
        p_target: torch.Tensor | None,
        acceptance: Acceptance,
        committed: list[int],
        finished: bool,
    ) -> Round:
        """Build the round's plain-data record (the detail views need, skipped for the lean baseline)."""
        target, config = self.target, self.config
        n = len(tree)
        display = None
        if p_target is not None:
            display = p_target
        elif n or config.detail:  # greedy: show the untempered softmax (the processed one is one-hot)
            display = logits.float().softmax(-1)  # one pass; log_softmax + exp costs 4x as much on CPU
        p_nodes = []
        if n:
            rows = torch.tensor([parent + 1 for parent in tree.parents], dtype=torch.long, device=logits.device)
            token_index = torch.tensor(tree.tokens, dtype=torch.long, device=logits.device)
            p_nodes = display[rows, token_index].tolist()
        target_top, draft_top, entropy, residual_top = [], None, [], None
        if config.detail:
            target_top = self._top(display)
            entropy = (-(display * display.clamp_min(1e-30).log()).sum(-1)).tolist()
            if tree.q_dist is not None:
                draft_top = self._top(tree.q_dist.float())
            if acceptance.residual is not None:
                residual_top = self._top(acceptance.residual[None])[0]
        return Round(
            index=len(self.rounds),
            start=len(self.new_tokens) - len(committed),
            tokens=list(tree.tokens),
            parents=list(tree.parents),
            text=target.pieces(tree.tokens) if config.detail else [],
            q_draft=None if tree.q_token is None else [float(q) for q in tree.q_token],
            confidence=None if tree.confidence is None else [float(c) for c in tree.confidence],
            sampled=tree.sampled,
            p_target=p_nodes,
            target_top=target_top,
            draft_top=draft_top,
            target_entropy=entropy,
            accepted=list(acceptance.path),
            extra_token=acceptance.extra_token,
            extra_text=target.piece(acceptance.extra_token) if config.detail else "",
            extra_kind=acceptance.extra_kind,
            committed=committed,
            committed_text=target.pieces(committed) if config.detail else [],
            draws=[d.to_dict() for d in acceptance.draws],
            residual_top=residual_top,
            rule=acceptance.rule,
            lossless=acceptance.lossless,
            draft_ms=0.0,
            verify_ms=0.0,
            other_ms=0.0,
            finished=finished,
            meta=dict(tree.meta),
        )

    def _top(self, probs: torch.Tensor) -> list[list[TokenChoice]]:
        k = min(self.config.top_k_report, probs.shape[-1])
        if k == 0:
            return [[] for _ in range(probs.shape[0])]
        values, ids = torch.topk(probs, k, dim=-1)
        return [
            [TokenChoice(id=i, p=round(p, 6), text=self.target.piece(i)) for i, p in zip(id_row, p_row)]
            for id_row, p_row in zip(ids.tolist(), values.tolist())
        ]


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
