"""Plain-text training sources: corpus files (Gutenberg clean-up), folders, globs, and the Python stdlib.

Sources are given on the command line as paths, globs or the word ``stdlib``; the text never enters the repo.
"""

from __future__ import annotations

import glob
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specviz.errors import SpecvizError

_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_STDLIB_SKIP = ("test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo", "__pycache__")


@dataclass(frozen=True)
class Document:
    """One cleaned text with where it came from and its kind (``prose`` or ``code``)."""

    source: str
    text: str
    kind: str = "prose"


def clean_text(raw: str) -> str:
    """Drop a BOM, normalise CRLF and strip a Project Gutenberg licence header/footer if present."""
    text = raw.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    return text.strip() + "\n"


def stdlib_files(limit: int | None = None, seed: int = 0) -> list[Path]:
    """Python files of the standard library, without tests and tool folders; a seeded sample when limited."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not any(part in _STDLIB_SKIP for part in p.relative_to(root).parts))
    if limit is not None and len(files) > limit:
        files = sorted(random.Random(seed).sample(files, limit))
    return files


def resolve_sources(specs: list[str]) -> list[Path | str]:
    """Expand each ``--data`` item: a file, a folder (its .txt/.py files), a glob, or ``stdlib``."""
    resolved: list[Path | str] = []
    for spec in specs:
        if spec == "stdlib":
            resolved.append("stdlib")
            continue
        path = Path(spec).expanduser()
        if path.is_file():
            resolved.append(path)
        elif path.is_dir():
            resolved.extend(sorted(p for p in path.rglob("*") if p.suffix in {".txt", ".py"}))
        else:
            matches = sorted(Path(m) for m in glob.glob(str(path)))
            if not matches:
                raise SpecvizError(f"--data {spec}: no such file, folder or glob match")
            resolved.extend(m for m in matches if m.is_file())
    return resolved


def iter_documents(specs: list[str], *, stdlib_limit: int | None = 400, seed: int = 0) -> Iterator[Document]:
    """Cleaned documents for the given sources (code files keep their text as is, apart from line ends)."""
    for item in resolve_sources(specs):
        files = stdlib_files(stdlib_limit, seed) if item == "stdlib" else [item]
        for file in files:
            raw = Path(file).read_text(encoding="utf-8", errors="replace")
            kind = "code" if Path(file).suffix == ".py" else "prose"
            text = clean_text(raw)
            if text.strip():
                yield Document(source=str(file), text=text, kind=kind)


def passages(doc: Document, *, min_words: int = 60, max_words: int = 220) -> list[str]:
    """Split prose into paragraph-aligned passages of roughly min..max words (for prompt templates)."""
    paragraphs = [p.strip().replace("\n", " ") for p in re.split(r"\n\s*\n", doc.text) if p.strip()]
    out: list[str] = []
    current: list[str] = []
    count = 0
    for para in paragraphs:
        words = len(para.split())
        if count + words > max_words and count >= min_words:
            out.append("\n\n".join(current))
            current, count = [], 0
        if words > max_words:
            continue
        current.append(para)
        count += words
    if count >= min_words:
        out.append("\n\n".join(current))
    return out


def code_snippets(doc: Document, *, min_lines: int = 6, max_lines: int = 30) -> list[str]:
    """Top-level functions of a Python file, short enough to put in a prompt."""
    lines = doc.text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("def ")]
    out = []
    for i in starts:
        j = i + 1
        while j < len(lines) and (not lines[j] or lines[j].startswith((" ", "\t"))):
            j += 1
        block = "\n".join(lines[i:j]).rstrip()
        if min_lines <= block.count("\n") + 1 <= max_lines:
            out.append(block)
    return out
