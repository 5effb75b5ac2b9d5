"""Find and validate a local model directory's safetensors weights before transformers touches them.

We never load pickled ``.bin`` checkpoints (arbitrary code execution), and a truncated download should be a
clear one-line error, not a deep stack trace.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

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
    """Check that a safetensors file exists and its header matches its size (catches truncation and garbage)."""
    if not file.is_file():
        raise SpecvizError(f"weights file {file} is missing")
    size = file.stat().st_size
    try:
        with open(file, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError("file shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise ValueError("header length larger than the file")
            header = json.loads(handle.read(length))
        end = max((info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"), default=0)
        if 8 + length + end != size:
            raise ValueError(f"expected {8 + length + end} bytes, found {size} (truncated?)")
    except (ValueError, KeyError, TypeError, struct.error) as error:
        raise SpecvizError(f"corrupt safetensors file {file}: {error}") from None
