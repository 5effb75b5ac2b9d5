"""One target forward over the whole draft: the newest committed token plus every tree node.

Row 0 of the returned logits is the target's distribution after the committed text (it scores the root's
children); row ``i + 1`` is the distribution after node i (it scores node i's children, or gives the bonus token).
Unmodified Hugging Face models do this with three inputs: position ids, a 4D attention mask and the cache.
"""

from __future__ import annotations

import torch

from specviz.engine.attention import mask_capable_attention
from specviz.engine.tree import DraftTree


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[q, kv]`` bool visibility -> ``[1, 1, q, kv]`` additive mask (0 = attend), which sdpa and eager accept."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill(~visible, torch.finfo(dtype).min)[None, None]


@torch.inference_mode()
def masked_forward(
    model: torch.nn.Module,
    cache,
    token_ids: list[int],
    positions: list[int],
    visible: torch.Tensor | None,
    last_only: bool = False,
) -> torch.Tensor:
    """Forward ``token_ids`` at ``positions`` on top of ``cache``; ``visible`` is ``[n, cached + n]`` or None (causal).

    Returns ``[n, V]`` logits (``[1, V]`` for the last token with ``last_only``, which skips the output head
    everywhere else: for a draft catching up on a long prompt that head is most of the work); the cache grows by n.
    """
    parameter = next(model.parameters())
    device = parameter.device
    input_ids = torch.tensor([token_ids], device=device)
    position_ids = torch.tensor([positions], device=device)
    keep = {"logits_to_keep": 1} if last_only else {}
    if visible is None:
        return model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True, **keep).logits[0]
    mask = additive_mask(visible.to(device), parameter.dtype)
    with mask_capable_attention(model, visible):
        output = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True,
                       **keep)
    return output.logits[0]


def tree_visibility(tree: DraftTree, past_length: int) -> torch.Tensor | None:
    """Who sees whom when verifying ``[pending] + tree`` after ``past_length`` cached tokens (None for a chain).

    The prefix and the pending token are visible to every node; each node also sees itself and its ancestors.
    Chains keep the model's own causal mask, which also keeps flash-attention usable.
    """
    if tree.is_chain:
        return None
    n = len(tree)
    visible = torch.zeros(n + 1, past_length + n + 1, dtype=torch.bool)
    visible[:, : past_length + 1] = True
    visible[1:, past_length + 1 :] = tree.ancestor_mask()
    return visible


def forward_tree(model: torch.nn.Module, cache, tree: DraftTree, pending_token: int, past_length: int) -> torch.Tensor:
    """Run the target once over ``[pending] + tree``; returns ``[n + 1, V]`` logits (cache grows by n + 1)."""
    positions = [past_length + d for d in (0, *tree.depth)]
    return masked_forward(model, cache, [pending_token, *tree.tokens], positions, tree_visibility(tree, past_length))


@torch.inference_mode()
def prefill(model: torch.nn.Module, cache, token_ids: list[int]) -> None:
    """Fill the cache with ``token_ids`` (the prompt minus its last token, which the first round feeds)."""
    if not token_ids:
        return
    device = next(model.parameters()).device
    model(input_ids=torch.tensor([token_ids], device=device), cache=cache, use_cache=True, logits_to_keep=1)
