"""Find and validate a local model directory's safetensors weights before transformers touches them.

We never load pickled ``.bin`` checkpoints (arbitrary code execution), and a truncated download should be a
clear one-line error, not a deep stack trace. The ``safetensors`` library reads the headers (here only: the memory
check reads tensor shapes through ``tensor_shapes`` too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from specviz.errors import SpecvizError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory (single file or sharded index), validated; errors are one line."""
    if not (directory / "config.json").is_file():
        raise SpecvizError(f"{directory} is not a model directory: config.json is missing")
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as error:
            raise SpecvizError(f"{index} is not a valid safetensors index ({error})") from None
        files = [directory / shard for shard in shards]
    elif single.is_file():
        files = [single]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise SpecvizError(f"{directory} has only pickle weights ({', '.join(pickles)}); specviz loads "
                               f"safetensors only: convert them first")
        raise SpecvizError(f"no model.safetensors in {directory}")
    for file in files:
        validate_safetensors(file)
    return files


def validate_safetensors(file: Path) -> None:
    """Check that a safetensors file exists and its header covers exactly its data (catches truncation and garbage)."""
    tensor_shapes(file)


def tensor_shapes(file: Path) -> dict[str, list[int]]:
    """Name -> shape of every tensor in a safetensors file, from its header only; a bad file is a one-line error.

    The library checks the header length, its JSON, and that the data offsets cover the file exactly.
    """
    if not file.is_file():
        raise SpecvizError(f"weights file {file} is missing")
    try:
        with safe_open(str(file), framework="pt") as handle:
            return {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        reason = str(error).removeprefix("Error while deserializing header: ")
        if "not fully covered" in reason:
            reason += " (truncated?)"
        raise SpecvizError(f"corrupt safetensors file {file}: {reason}") from None


def stored_shapes(files: list[Path]) -> dict[str, list[int]]:
    """Name -> shape of every tensor over a checkpoint's files, from their headers."""
    return {name: shape for file in files for name, shape in tensor_shapes(file).items()}


def check_matches_config(found: dict[str, list[int]], expected: dict[str, list[int]], source: str,
                         may_be_missing: set[str] = frozenset(), ignored: tuple[str, ...] = ()) -> None:
    """The checkpoint's tensors (``found``, from ``stored_shapes``) are the ones its config describes, shape for shape
    (``expected``: the model the config builds). transformers would re-initialise a missing tensor at random and
    drop an unexpected one, so a config that does not describe its weights (a wrong layer count, hidden size or
    vocabulary) would run silently as garbage; here it is one line naming the first difference. ``ignored``:
    regular expressions of checkpoint tensors the model class drops on purpose."""
    mismatched = [name for name in expected if name in found and list(found[name]) != list(expected[name])]
    if mismatched:
        name = mismatched[0]
        raise SpecvizError(f"{source}: the weights do not match config.json: {name} is {found[name]} in the "
                           f"checkpoint but {list(expected[name])} by the config ({len(mismatched)} tensors differ)")
    unexpected = sorted(name for name in found
                        if name not in expected and not any(re.search(pattern, name) for pattern in ignored))
    if unexpected:
        raise SpecvizError(f"{source}: the checkpoint holds {len(unexpected)} tensors config.json has no place for "
                           f"(first: {unexpected[0]}); its config does not describe these weights")
    missing = sorted(name for name in expected if name not in found and name not in may_be_missing)
    if missing:
        raise SpecvizError(f"{source}: the checkpoint lacks {len(missing)} tensors config.json asks for (first: "
                           f"{missing[0]})")
