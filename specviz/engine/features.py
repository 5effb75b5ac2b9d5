"""The target's hidden states for drafters that read them (EAGLE, MTP, Medusa, DFlash, DSpark).

Numbering is Hugging Face's ``output_hidden_states``: ``hidden_states[0]`` is the embedding output,
``hidden_states[i]`` the output of decoder layer ``i - 1``, and ``hidden_states[L]`` (L decoder layers) the output
of the final norm. A drafter declares the indices it reads; the engine captures exactly those with forward hooks
on the forwards that run anyway (the prefill and each round's verify forward), so a drafter that declares none costs
nothing, and nothing is computed twice.

What a drafter receives, and when: after the prefill, the rows of the prompt minus its last token; after each
round, the rows of the newly committed positions that the verify forward saw: the pending token (the previous
round's bonus or correction, verified as row 0) and the accepted path. The new bonus or correction token's row
arrives with the next round, as in EAGLE.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from specviz.errors import SpecvizError

#: How drafters' ``describe()`` states the feature layers' numbering (the views and traces show it).
NUMBERING = "hidden_states index (0 = embeddings, i < L = output of decoder layer i-1, L = after the final norm)"


@dataclass
class TargetFeatures:
    """Hidden states of consecutive committed positions ``start, start + 1, ...``: ``hidden[row, layer, :]``.

    ``layers`` are the ``hidden_states`` indices, in the order the drafter declared them.
    """

    start: int
    layers: tuple[int, ...]
    hidden: torch.Tensor  # [positions, len(layers), hidden size]

    def __len__(self) -> int:
        return self.hidden.shape[0]


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers"):
        raise SpecvizError(f"{type(model).__name__} has no decoder layers to read hidden states from")
    return decoder


def check_layers(model: torch.nn.Module, layers: tuple[int, ...]) -> None:
    """Every index must name a ``hidden_states`` entry of ``model`` (0 … number of decoder layers)."""
    count = len(_decoder(model).layers)
    bad = [i for i in layers if not 0 <= i <= count]
    if bad:
        raise SpecvizError(f"hidden-state layers {bad} do not exist: this target has hidden_states[0..{count}] "
                           f"({count} decoder layers)")


def _module_for(decoder: torch.nn.Module, index: int) -> torch.nn.Module:
    """The module whose output is ``hidden_states[index]``."""
    if index == 0:
        return decoder.embed_tokens
    if index == len(decoder.layers):
        return decoder.norm
    return decoder.layers[index - 1]


@contextmanager
def capture(model: torch.nn.Module, layers: tuple[int, ...]) -> Iterator[dict[int, torch.Tensor]]:
    """Within this block every forward of ``model`` records ``hidden_states[i]`` for ``i`` in ``layers``.

    Yields a dict filled by the forward: index -> ``[tokens, hidden]`` of the latest forward (batch 1). The hooks
    are removed on exit, so a generation that is abandoned midway leaves the shared model as it was. Only forwards
    run by the thread that opened the block are recorded: the app's sessions share one target, and a forward of
    another session's run must not overwrite this run's rows.
    """
    found: dict[int, torch.Tensor] = {}
    if not layers:
        yield found
        return
    decoder = _decoder(model)
    handles = []
    owner = threading.get_ident()
    for index in dict.fromkeys(layers):
        def hook(module, inputs, output, index=index):
            if threading.get_ident() != owner:
                return
            tensor = output[0] if isinstance(output, tuple) else output
            found[index] = tensor[0].detach()
        handles.append(_module_for(decoder, index).register_forward_hook(hook))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def rows(found: dict[int, torch.Tensor], layers: tuple[int, ...], start: int, picked: list[int]) -> TargetFeatures:
    """The captured ``picked`` rows (in order) as features of positions ``start, start + 1, ...``."""
    index = torch.tensor(picked, dtype=torch.long, device=found[layers[0]].device)
    hidden = torch.stack([found[layer].index_select(0, index) for layer in layers], dim=1)
    return TargetFeatures(start=start, layers=layers, hidden=hidden)
