"""How well a drafter would do against its target, measured on held-out target answers.

``top1_agreement``: the fraction of answer positions where the drafter's argmax equals the target's argmax.
``simulated_chain_tau``: greedy chain speculative decoding replayed on the target's own greedy answer. With greedy
verification a drafted token is accepted iff it equals the target's argmax, and while the drafter agrees its context
equals the target's, so teacher-forced agreement gives the exact accepted lengths:
τ = mean over rounds of (accepted drafts + 1 bonus/correction token). It ignores batch-vs-single numeric noise;
the engine's benchmark measures the real τ.
"""

from __future__ import annotations

import torch

from specviz.training.features import FeatureSet


def chain_tau(matches: list[bool], k: int) -> float:
    """Replay chain drafting of ``k`` tokens per round over a per-position match sequence; return mean τ."""
    i, rounds, committed = 0, 0, 0
    n = len(matches)
    while i < n:
        accepted = 0
        while accepted < k and i + accepted < n and matches[i + accepted]:
            accepted += 1
        step = min(accepted + 1, n - i)
        committed += step
        rounds += 1
        i += step
    return committed / max(1, rounds)


@torch.no_grad()
def evaluate_agreement(predict_argmax, heldout: FeatureSet, *, ks: tuple[int, ...] = (3, 4, 5, 6)) -> dict:
    """Agreement metrics for ``predict_argmax(ids [1, T], hidden) -> argmax [T]`` over each held-out answer.

    ``hidden`` is ``{layer: [1, T, H]}``, the target's cached hidden states of the sequence (empty when none were
    cached); drafters that read target features predict from them.
    """
    agree = total = 0
    taus = {k: [] for k in ks}
    per_category: dict[str, list[int]] = {}
    for i in range(heldout.num_sequences):
        span = heldout.sequence(i)
        mask = heldout.loss_mask[span]
        if not mask.any():
            continue
        ids = heldout.input_ids[span]
        draft = predict_argmax(ids[None], {layer: h[span][None].float() for layer, h in heldout.hidden.items()})
        target = heldout.topk_ids[span][:, 0]
        matches = (draft[mask] == target[mask]).tolist()
        agree += sum(matches)
        total += len(matches)
        category = heldout.categories[i] if heldout.categories else "all"
        stats = per_category.setdefault(category, [0, 0])
        stats[0] += sum(matches)
        stats[1] += len(matches)
        for k in ks:
            taus[k].append(chain_tau(matches, k))
    return {
        "top1_agreement": agree / max(1, total),
        "positions": total,
        "sequences": heldout.num_sequences,
        "simulated_chain_tau": {str(k): sum(v) / max(1, len(v)) for k, v in taus.items()},
        "per_category_agreement": {c: a / max(1, n) for c, (a, n) in sorted(per_category.items())},
    }
