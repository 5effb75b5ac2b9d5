"""Where a command writes: checked before the work starts, so a bad path costs one line, not a finished run.

A leaf module (nothing of specviz but ``errors``): the CLI's ``generate --trace``, ``bench --out`` and ``train --out``
all call it before any model loads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specviz.errors import SpecvizError


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a folder that exists, or can be created, and can be written to. Nothing is created here: the
    command makes the folder when it writes, so a command refused by a later check leaves no empty folder behind."""
    if not str(path).strip():
        raise SpecvizError(f"{option} is empty: give a folder to write into")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SpecvizError(f"{option} {folder} is a file, not a folder")
    nearest = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not nearest.is_dir():
        raise SpecvizError(f"{option} {folder}: cannot create that folder ({nearest} is a file)")
    try:  # write a file there: permission bits say nothing to root, and some file systems refuse writes anyway
        with tempfile.NamedTemporaryFile(dir=nearest, prefix=".specviz-write-check-"):
            pass
    except OSError as error:
        verb = "write there" if nearest == folder else f"create that folder in {nearest}"
        raise SpecvizError(f"{option} {folder}: cannot {verb} ({_reason(error)})") from None
    return folder


def output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a file that can be written (its folder can be created; an existing file will be replaced)."""
    if not str(path).strip():
        raise SpecvizError(f"{option} is empty: give a file to write")
    file = Path(path)
    if file.is_dir():
        raise SpecvizError(f"{option} {file} is a folder, not a file")
    output_dir(file.parent, f"{option}'s folder")
    if file.exists():
        try:  # opened for appending, so nothing it holds is lost by the check
            with file.open("a", encoding="utf-8"):
                pass
        except OSError as error:
            raise SpecvizError(f"{option} {file}: cannot write it ({_reason(error)})") from None
    return file
