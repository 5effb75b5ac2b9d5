"""The base of every drafter that reads the target's hidden states (EAGLE, MTP, Medusa, DFlash/DSpark).

The engine hands such a drafter the rows of newly committed positions after each forward it runs anyway
(``observe``); the drafter consumes them in order when it next drafts (``take``). What is the same for every family
lives here once: the queue of rows not consumed yet, the checks that rows arrive in order and of the declared
layers, the guard against a context that changed under the drafter (its caches hold the old text's features), and
the size of its own caches, from the run's real length (``begin`` is told the prompt, the most new tokens and the
budget). A family keeps only its network, how it drafts and what it registers.
"""

from __future__ import annotations

import torch
from torch import nn

from specviz.drafters.head_parts import drafting_copy
from specviz.engine.drafter import DraftBudget, Drafter, cache_capacity
from specviz.engine.features import TargetFeatures
from specviz.errors import SpecvizError


class FeatureDrafter(Drafter):
    """A drafter fed target features. Subclasses call ``super().__init__`` with the layers they read and where the
    rows should live, override ``reset`` to empty their caches, and call ``follow`` then ``take`` when they draft.

    ``what`` names the drafter in errors ("the EAGLE head"). ``device`` None: rows stay where the target made them.
    """

    what = "drafter"

    def __init__(self, feature_layers: tuple[int, ...], device: torch.device | None, dtype: torch.dtype):
        self.feature_layers = tuple(feature_layers)
        self._device, self._dtype = device, dtype
        self.capacity = 0  # positions the drafter's own caches hold this run (set by ``begin``)
        self._begun = False
        self._queue: list[torch.Tensor] = []  # rows of positions taken, taken + 1, ... features_end - 1
        self._taken = 0
        self.features_end = 0  # the next position whose row the engine will hand over
        self._seen: list[int] = []  # the context the drafter's caches were built from

    def adopt(self, network: nn.Module, draft_vocab: int, vocab_size: int, *, pack: bool, draft_quant: str,
              exact: bool = False) -> nn.Module:
        """Take ``network`` (drafting over ``draft_vocab`` ids) for a target whose logits are ``vocab_size`` wide:
        checked, in eval mode, with its drafting copy (``runner``: packed kernels, ``draft_quant``) beside it."""
        if draft_vocab > vocab_size or (exact and draft_vocab != vocab_size):
            raise SpecvizError(f"{draft_vocab} draft token ids for the {self.what}, but the target's logits have "
                               f"{vocab_size}")
        self.vocab_size = vocab_size
        self.runner, self.draft_quant = drafting_copy(network.eval(), pack, draft_quant)
        return network

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        self.capacity = cache_capacity(len(prompt_ids), max_new_tokens, budget) + self.extra_room()
        self._begun = True
        self._queue, self._taken, self.features_end = [], 0, 0
        self._seen = [int(t) for t in prompt_ids[:1]]
        self.reset(prompt_ids)

    def extra_room(self) -> int:
        """Cache positions a round needs beyond the budget's draft room (a block drafter's whole block)."""
        return 0

    def reset(self, prompt_ids: list[int]) -> None:
        """Empty the family's own caches for a new run (``self.capacity`` positions)."""

    def observe(self, features: TargetFeatures) -> None:
        if not self._begun:
            raise SpecvizError(f"the {self.what} got target features before begin()")
        if features.start != self.features_end:
            raise SpecvizError(f"target features arrived for position {features.start}, expected "
                               f"{self.features_end}: the engine and the {self.what} lost step")
        if tuple(features.layers) != self.feature_layers:
            raise SpecvizError(f"target features of layers {list(features.layers)}, the {self.what} reads "
                               f"{list(self.feature_layers)}")
        self._queue.append(features.hidden.reshape(len(features), -1).to(device=self._device, dtype=self._dtype))
        self.features_end += len(features)

    def follow(self, context: list[int]) -> None:
        """Accept ``context`` only as a continuation of the one the caches were built from (begin the run if no one
        did: a drafter used on its own)."""
        if not self._begun:
            self.begin(context)
        if context[: len(self._seen)] != self._seen:
            raise SpecvizError(f"the context changed under the {self.what} (it needs the target features of the new "
                               f"text: start a new generation)")
        self._seen = list(context)

    def take(self, end: int) -> torch.Tensor | None:
        """The rows of positions not consumed yet up to ``end`` (exclusive), in order; None when there are none."""
        count = end - self._taken
        if count <= 0:
            return None
        if self.features_end < end:
            raise SpecvizError(f"the {self.what} has target features up to position {self.features_end - 1}, it "
                               f"needs {end - 1} (start a new generation)")
        queued = torch.cat(self._queue) if len(self._queue) > 1 else self._queue[0]
        rows, rest = queued[:count], queued[count:]
        self._queue = [rest] if len(rest) else []
        self._taken = end
        return rows
