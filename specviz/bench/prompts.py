"""Spec-Bench prompt files: read, validate, pick a subset per category.

The format is Spec-Bench's ``question.jsonl``: one JSON object per line with ``question_id``, ``category`` and
``turns`` (a list of user messages). The benchmark uses the first turn only, as single-turn instructions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specviz import resources
from specviz.errors import SpecvizError

#: The shipped dev set (Apache-2.0, see specviz/examples/LICENSE-spec-bench.md).
DEFAULT_PROMPTS = resources.EXAMPLES / "spec_bench_dev.jsonl"


@dataclass(frozen=True)
class BenchPrompt:
    question_id: str
    category: str
    text: str


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Every prompt in ``path``; any malformed line is a one-line error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise SpecvizError(f"prompts file {path} is a folder, not a file" if path.is_dir() else
                           f"prompts file {path} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SpecvizError(f"cannot read prompts file {path}: {error}") from None
    prompts = [_parse(line, f"{path}:{number}") for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise SpecvizError(f"prompts file {path} has no prompts")
    return prompts


def _parse(line: str, where: str) -> BenchPrompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise SpecvizError(f"{where}: not valid JSON ({error.msg}); expected Spec-Bench question.jsonl lines") from None
    if not isinstance(record, dict):
        raise SpecvizError(f"{where}: expected a JSON object with question_id, category and turns")
    missing = [key for key in ("question_id", "category", "turns") if key not in record]
    if missing:
        raise SpecvizError(f"{where}: missing {', '.join(missing)}; Spec-Bench lines have question_id, category, turns")
    category, turns = record["category"], record["turns"]
    if not isinstance(category, str) or not category.strip():
        raise SpecvizError(f"{where}: category must be a non-empty string, got {category!r}")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise SpecvizError(f"{where}: turns must be a list whose first entry is a non-empty string")
    return BenchPrompt(question_id=str(record["question_id"]), category=category.strip(), text=turns[0])


def categories_of(prompts: Sequence[BenchPrompt]) -> list[str]:
    """Categories in order of first appearance."""
    return list(dict.fromkeys(p.category for p in prompts))


def select(
    prompts: Sequence[BenchPrompt], categories: Sequence[str] | None = None, limit_per_category: int | None = None
) -> list[BenchPrompt]:
    """The first ``limit_per_category`` prompts (file order) of each requested category; an empty one is an error."""
    known = categories_of(prompts)
    wanted = list(categories) if categories else known
    for name in wanted:
        if name not in known:
            raise SpecvizError(f"category {name!r} has no prompts in this file; it has: {', '.join(known)}")
    if limit_per_category is not None and limit_per_category < 1:
        raise SpecvizError(f"limit-per-category must be at least 1, got {limit_per_category}")
    chosen: list[BenchPrompt] = []
    for name in wanted:
        members = [p for p in prompts if p.category == name]
        chosen.extend(members[:limit_per_category] if limit_per_category else members)
    return chosen
