"""The base of every drafter that reads the target's hidden states (EAGLE, MTP, Medusa, DFlash/DSpark).

The engine hands such a drafter the rows of newly committed positions after each forward it runs anyway
(``observe``); the drafter consumes them in order when it next drafts (``take``). What is the same for every family
lives here once: the queue of rows not consumed yet, the checks that rows arrive in order and of the declared
layers, the guard against a context that changed under the drafter (its caches hold the old text's features), and
the size of its own caches, from the run's real length (``begin`` is told the prompt, the most new tokens and the
budget). A family keeps only its network, how it drafts and what it registers.

``CommittedRowsDrafter`` adds what the drafters with a KV cache of their own per step share (EAGLE, MTP): the cache
kept in step with the committed text and rolled back after every round; ``draft_mask`` is the tree mask of the draft
rows such a cache takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from specviz.drafters.dynamic_tree import Candidate
from specviz.drafters.head_parts import drafting_copy
from specviz.engine import cache as kv
from specviz.engine.drafter import DraftBudget, Drafter, cache_capacity
from specviz.engine.features import NUMBERING, TargetFeatures
from specviz.engine.tree import ROOT, DraftTree
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

    def describe(self) -> dict:
        """What a run's header records of the drafter; a family adds its own entries."""
        return {"name": self.name, "feature_layers": list(self.feature_layers), "feature_numbering": NUMBERING,
                "draft_quant": None if self.draft_quant == "off" else self.draft_quant}

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

    def new_cache(self, layers: int = 1) -> DynamicCache:
        """An empty KV cache of ``layers`` preallocated layers for this run: rolling it back is a length change."""
        cache = DynamicCache()
        cache.layers = [kv.PreallocatedLayer(self.capacity) for _ in range(layers)]
        return cache

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


class CommittedRowsDrafter(FeatureDrafter):
    """A feature drafter whose network runs as ``steps`` chained steps, each with a KV cache of its own kept in step
    with the committed text (EAGLE's head: one step; MTP: one per module).

    Step k has a row at every committed position t whose inputs exist: the token x[t+1+k] and, as hidden state, the
    target's feature of t (k = 0) or what step k-1's output at t feeds it (``feed``). ``catch_up`` gives every step
    its committed rows once, with these real inputs; a round's draft rows (fed the network's own outputs) are dropped
    when it ends, so accepted tokens get their rows again, from the committed text (EAGLE's ``stable_kv``). A family
    says how a step runs on committed rows (``step_committed``) and drafts from ``last_output``.
    """

    steps = 1

    def __init__(self, feature_layers: tuple[int, ...], device: torch.device | None, dtype: torch.dtype):
        super().__init__(feature_layers, device, dtype)
        self._caches: list[DynamicCache] = []
        self._rows: list[int] = []  # step k holds committed rows at positions 0 .. rows[k] - 1
        self._tail: list[tuple[int, torch.Tensor] | None] = []  # step k: (first position, outputs) still needed

    def step_committed(self, k: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                       cache: DynamicCache) -> torch.Tensor:
        """Step k's outputs ``[1, T, H]`` of committed rows: ``hidden`` ``[1, T, F]``, ``tokens`` and ``positions``
        ``[1, T]``, their keys and values appended to ``cache``."""
        raise NotImplementedError

    def feed(self, k: int, out: torch.Tensor) -> torch.Tensor:
        """What step k + 1 reads as hidden state from step k's outputs (chains of several steps)."""
        raise NotImplementedError

    def reset(self, prompt_ids: list[int]) -> None:
        self._caches = [self.new_cache() for _ in range(self.steps)]
        self._rows, self._tail = [0] * self.steps, [None] * self.steps

    def last_output(self, k: int, length: int) -> torch.Tensor | None:
        """Step k's committed output at position P - k after ``length`` tokens (P = length - 2, the last position
        with a target feature): what the first draft step after it reads. None when it has no row there yet."""
        base = length - 2
        if self._rows[k] != base + 1 - k or base - k < 0:
            return None
        return self._tail[k][1][-1]

    def _outputs(self, k: int, start: int, end: int) -> torch.Tensor:
        """Committed outputs of step k at positions start .. end - 1."""
        first, outs = self._tail[k]
        if start < first or end - first > outs.shape[0]:
            raise SpecvizError(f"the {self.what} lost step {k}'s outputs of positions {start}..{end - 1}")
        return outs[start - first: end - first]

    @torch.inference_mode()
    def catch_up(self, context: list[int]) -> None:
        """Give every step its rows for the committed text: step k at positions t <= len(context) - 2 - k."""
        self.follow(context)
        self._drop_drafts()
        total = len(context)
        for k in range(self.steps):
            start, end = self._rows[k], max(0, total - 1 - k)
            if end <= start:
                continue
            hidden = self.take(end) if k == 0 else self.feed(k - 1, self._outputs(k - 1, start, end))
            tokens = torch.tensor([context[start + 1 + k: end + 1 + k]], device=self._device)
            positions = torch.arange(start, end, device=self._device)[None]
            out = self.step_committed(k, hidden[None], tokens, positions, self._caches[k])[0]
            if self._tail[k] is not None:
                first, old = self._tail[k]
                out = torch.cat([old[: start - first], out])
                start = first
            self._tail[k], self._rows[k] = (start, out), end
        for k in range(self.steps):  # keep what the next catch-up (step k + 1) and the next draft (the last row) read
            if self._tail[k] is None:
                continue
            first, outs = self._tail[k]
            keep = min(self._rows[k + 1], self._rows[k] - 1) if k + 1 < self.steps else self._rows[k] - 1
            self._tail[k] = (keep, outs[keep - first:])

    def draft_inputs(self, k: int, nodes: Sequence[int], candidates: Sequence[Candidate], slots: dict[int, int],
                     length: int) -> tuple[DynamicCache, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """What step k's draft rows of ``nodes`` take after ``length`` tokens: the step's cache (``slots`` notes the
        entry each row gets in it), their tree mask, and ``[1, n]`` tokens and positions (a node at depth d sits at
        P + d - k, P = length - 2 the last position with a target feature)."""
        cache = self._caches[k]
        cached = kv.cache_length(cache)
        slots.update({node: cached + row for row, node in enumerate(nodes)})
        mask = draft_mask(nodes, candidates, cached, self._rows[k], slots, self._device)
        tokens = torch.tensor([[candidates[node].token for node in nodes]], device=self._device)
        positions = torch.tensor([[length - 2 - k + candidates[node].depth for node in nodes]], device=self._device)
        return cache, mask, tokens, positions

    def commit(self, context: list[int], tree: DraftTree, accepted: list[int]) -> None:
        """Drop the round's draft rows: accepted tokens get theirs again, from the committed text, at ``catch_up``."""
        self._drop_drafts()

    def _drop_drafts(self) -> None:
        for cache, rows in zip(self._caches, self._rows):
            kv.crop_to(cache, rows)


def draft_mask(nodes: Sequence[int], candidates: Sequence[Candidate], cached: int, committed: int,
               slots: Mapping[int, int], device: torch.device | None) -> torch.Tensor | None:
    """What the draft rows of ``nodes`` (appended after a head cache's ``cached`` entries, in this order) may see:
    the ``committed`` entries, the entries of their ancestors in the tree (``slots``: node -> entry, where it has
    one) and themselves, as a tree mask (True = attend); None when that is every entry (one row seeing everything)."""
    visible = torch.zeros(len(nodes), cached + len(nodes), dtype=torch.bool)
    visible[:, :committed] = True
    for row, node in enumerate(nodes):
        visible[row, cached + row] = True
        ancestor = candidates[node].parent
        while ancestor != ROOT:
            if ancestor in slots:
                visible[row, slots[ancestor]] = True
            ancestor = candidates[ancestor].parent
    return None if bool(visible.all()) else visible.to(device)


def rows_by_depth(q: torch.Tensor, depths: Sequence[int]) -> torch.Tensor:
    """A tree's ``q_dist`` where the draft distribution depends on the depth alone (a DFlash / DSpark block's
    positions, Medusa's heads; ``q[d]``: the distribution at depth d + 1): row 0, the root's children, is ``q[0]``;
    the row after a node at depth d is ``q[d]``, zeros past the last."""
    rows = torch.zeros(len(depths) + 1, q.shape[-1])
    rows[0] = q[0]
    for node, depth in enumerate(depths):
        if depth < len(q):
            rows[node + 1] = q[depth]
    return rows
