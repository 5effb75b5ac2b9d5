"""Drafts that borrow their target's embedding and output layer instead of shipping a copy.

A draft built from the target's own layers (``specviz train draft-lm --init-layers ...``) needs the target's
[vocab × hidden] embedding, which for SmolLM2-135M alone is 54 MiB in fp16: more than the whole assets budget. Since
the draft only ever runs next to that target, its folder leaves those tensors out and records where they come from
in ``config.json``::

    "specviz_shared_weights": {"from": "smollm2-135m", "tensors": ["model.embed_tokens.weight"],
                               "fingerprint": [row norms of a few fixed rows]}

The loader loads the donor (cached in-process, so usually already there as the target), checks shape and
fingerprint, and points the draft's parameters at the donor's: no copy in memory either. A draft paired with the
wrong donor fails with one line instead of drafting garbage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from specviz.errors import SpecvizError

CONFIG_KEY = "specviz_shared_weights"
#: Rows whose norms fingerprint the shared tensor; spread over the vocabulary, all below 4096 so small vocabs work.
FINGERPRINT_ROWS = tuple(range(0, 4096, 256))
#: Relative tolerance of the fingerprint: a bf16 copy of an fp32 donor differs only by bf16 rounding, another model
#: by far more.
FINGERPRINT_RTOL = 2e-2


def fingerprint(weight: torch.Tensor) -> list[float]:
    """L2 norms of the ``FINGERPRINT_ROWS`` rows that exist in ``weight``."""
    rows = [r for r in FINGERPRINT_ROWS if r < weight.shape[0]]
    return [round(float(v), 5) for v in weight.detach()[rows].float().norm(dim=-1)]


def check_fingerprint(tensor: torch.Tensor, expected: list[float], message: str) -> None:
    """``tensor``'s fingerprint matches ``expected`` within a bf16 copy's rounding, else ``message`` (one line): a
    draft trained for another model would draft garbage."""
    found = fingerprint(tensor)
    numbers = isinstance(expected, list) and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                  for v in expected)
    if not numbers or len(found) != len(expected) or any(abs(a - b) > FINGERPRINT_RTOL * max(abs(b), 1e-6)
                                          for a, b in zip(found, expected, strict=True)):
        raise SpecvizError(message)


def shared_names(model: torch.nn.Module) -> list[str]:
    """Parameter names of the input embedding and, when untied, the output layer."""
    names = ["model.embed_tokens.weight"]
    if not getattr(model.config, "tie_word_embeddings", False):
        names.append("lm_head.weight")
    return names


def mark_shared(student: torch.nn.Module, donor: torch.nn.Module, donor_name: str) -> None:
    """Freeze ``student``'s embedding/output tensors (copies of ``donor``'s) and record the donor in its config."""
    names = shared_names(student)
    params = dict(student.named_parameters(remove_duplicate=False))
    for name in names:
        params[name].requires_grad_(False)
    setattr(student.config, CONFIG_KEY, {
        "from": donor_name, "tensors": names,
        "fingerprint": fingerprint(donor.get_input_embeddings().weight)})


def spec_of(config) -> dict | None:
    """The ``specviz_shared_weights`` entry of a config object or dict, if any."""
    spec = config.get(CONFIG_KEY) if isinstance(config, dict) else getattr(config, CONFIG_KEY, None)
    return spec or None


def strip_shared(tensors: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """The tensors to ship: all but the shared ones (and the tied output layer, which HF may or may not write)."""
    spec = spec_of(config)
    if not spec:
        return tensors
    dropped = {*spec["tensors"], "lm_head.weight"} if config.get("tie_word_embeddings") else set(spec["tensors"])
    return {name: value for name, value in tensors.items() if name not in dropped}


@contextmanager
def quiet_if_shared(config) -> Iterator[None]:
    """Silence transformers' "missing weights / checkpoint seems corrupted" report for tensors left out on purpose."""
    if not spec_of(config):
        yield
        return
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def attach_shared(model: torch.nn.Module, load_donor: Callable[[str], torch.nn.Module], source: str) -> None:
    """Point ``model``'s shared parameters at its donor's (loaded with ``load_donor(name)``), after checking them."""
    spec = spec_of(model.config)
    if not spec:
        return
    donor_name = spec.get("from")
    if not donor_name or not spec.get("tensors"):
        raise SpecvizError(f"{source}: config.json has a malformed {CONFIG_KEY} entry")
    donor = load_donor(donor_name)
    donor_params = dict(donor.named_parameters(remove_duplicate=False))
    own = dict(model.named_parameters(remove_duplicate=False))
    for name in spec["tensors"]:
        theirs = donor_params.get(name)
        if theirs is None or name not in own or theirs.shape != own[name].shape:
            raise SpecvizError(f"{source}: its {name} comes from {donor_name}, which has no matching tensor "
                               f"(shape {tuple(own[name].shape) if name in own else '?'})")
    check_fingerprint(donor.get_input_embeddings().weight, spec.get("fingerprint") or [],
                      f"{source}: the embedding of {donor_name} is not the one this draft was trained with")
    for name in spec["tensors"]:
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, donor_params[name])
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.get_input_embeddings().weight
