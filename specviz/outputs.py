"""Where a command writes: checked before the work starts, so a bad path costs one line, not a finished run.

A leaf module (nothing of specviz but ``errors``): the CLI's ``generate --trace``, ``bench --out`` and ``train --out``
all call it before any model loads.
"""

from __future__ import annotations

import os
from pathlib import Path

from specviz.errors import SpecvizError


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def output_dir(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a folder that exists and can be written to (created with its parents if missing)."""
    if not str(path).strip():
        raise SpecvizError(f"{option} is empty: give a folder to write into")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SpecvizError(f"{option} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecvizError(f"{option} {folder}: cannot create that folder ({_reason(error)})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecvizError(f"{option} {folder}: that folder is not writable")
    return folder


def output_file(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a file that can be written (its folder created if missing; an existing file is replaced)."""
    if not str(path).strip():
        raise SpecvizError(f"{option} is empty: give a file to write")
    file = Path(path)
    if file.is_dir():
        raise SpecvizError(f"{option} {file} is a folder, not a file")
    output_dir(file.parent, f"{option}'s folder")
    if file.exists() and not os.access(file, os.W_OK):
        raise SpecvizError(f"{option} {file}: that file is not writable")
    return file
