"""Find and validate a local model directory's safetensors weights before transformers touches them.

We never load pickled ``.bin`` checkpoints (arbitrary code execution), and a truncated download should be a
clear one-line error, not a deep stack trace. The ``safetensors`` library reads the headers (here only: the memory
check reads tensor shapes through ``tensor_shapes`` too).
"""

from __future__ import annotations

import json
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
