"""The trace: JSON Lines, a header, one object per round, a summary. Views, replay and the benchmark read only this.

Schema ``specviz.trace`` version 1 is documented in docs/trace-schema.md; ``validate`` enforces it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

from specviz.engine.round import Round
from specviz.errors import SpecvizError

SCHEMA = "specviz.trace"
VERSION = 1
MAX_TRACE_BYTES = 64 * 1024 * 1024
EXTRA_KINDS = {"correction", "bonus"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _is_token(value) -> bool:
    return _is_int(value) and value >= 0


def _is_probability(value) -> bool:
    return _is_number(value) and 0.0 <= value <= 1.0 + 1e-4  # float32 softmax can round a little above 1


def _is_nonnegative(value) -> bool:
    return _is_number(value) and value >= 0.0


def _list_of(check):
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


def _or_none(check):
    return lambda value: value is None or check(value)


def _is_bool(value) -> bool:
    return isinstance(value, bool)


def _is_str(value) -> bool:
    return isinstance(value, str)


def _is_dict(value) -> bool:
    return isinstance(value, dict)


def _entries(checks: dict):
    """A dict whose entries named in ``checks``, where present, pass their checks."""
    return lambda value: _is_dict(value) and all(check(value[k]) for k, check in checks.items() if k in value)


def _is_choice(value) -> bool:
    return (isinstance(value, dict) and _is_token(value.get("id")) and _is_probability(value.get("p"))
            and _is_str(value.get("text")))


_CHOICES = _list_of(_is_choice)
#: Every field of a round, with the check its value must pass (docs/trace-schema.md): the views read these without
#: further guards, so a hand-edited trace is refused here with one line rather than failing in a view.
ROUND_FIELDS = {
    "index": _is_int, "start": _is_int, "tokens": _list_of(_is_token), "parents": _list_of(_is_int),
    "text": _list_of(_is_str), "q_draft": _or_none(_list_of(_is_probability)),
    "confidence": _or_none(_list_of(_is_probability)), "sampled": _is_bool,
    "p_target": _list_of(_is_probability), "target_top": _list_of(_CHOICES),
    "draft_top": _or_none(_list_of(_CHOICES)), "target_entropy": _list_of(_is_nonnegative),
    "accepted": _list_of(_is_int), "extra_token": _is_token, "extra_text": _is_str,
    "extra_kind": _is_str, "committed": _list_of(_is_token),
    "committed_text": _list_of(_is_str), "draws": _list_of(_is_dict),
    "residual_top": _or_none(_CHOICES), "rule": _is_str,
    "lossless": _is_bool, "draft_ms": _is_nonnegative, "verify_ms": _is_nonnegative,
    "other_ms": _is_nonnegative,
}
#: Optional round fields (a trace may leave them out).
OPTIONAL_ROUND_FIELDS = {"finished": _is_bool, "meta": _is_dict}
#: The run's generation settings and draft budget, as the views read them (``GenerationConfig`` / ``DraftBudget``).
CONFIG_ENTRIES = {"max_new_tokens": _is_int, "seed": _or_none(_is_int), "temperature": _is_nonnegative,
                  "top_p": _is_probability, "top_k": _is_int}
BUDGET_ENTRIES = {"tree": _is_bool, "k": _is_int, "width": _is_int, "depth": _is_int, "max_nodes": _is_int,
                  "min_draft_prob": _or_none(_is_probability)}
#: The prompt as the views read it: its text, its token ids and one display text per token.
PROMPT_ENTRIES = {"text": _or_none(_is_str), "token_ids": _list_of(_is_token), "pieces": _list_of(_is_str)}
#: Header entries the views read, and what each must be when present.
HEADER_FIELDS = {"target": _is_dict, "drafter": _or_none(_is_dict),
                 "config": _entries(CONFIG_ENTRIES), "budget": _or_none(_entries(BUDGET_ENTRIES)),
                 "prompt": _entries(PROMPT_ENTRIES)}
#: Header entries every trace has (the others may be absent or null).
REQUIRED_HEADER_FIELDS = ("target", "config", "prompt")
#: Summary entries the views read, when present.
SUMMARY_FIELDS = {"token_ids": _list_of(_is_int), "text": _is_str,
                  "elapsed_s": _or_none(_is_nonnegative), "prefill_ms": _or_none(_is_nonnegative),
                  "stop_reason": _is_str, "metrics": _is_dict,
                  "calibration": _or_none(_entries(dict.fromkeys(("tokens_per_s", "decode_tokens_per_s", "new_tokens"),
                                                                 _is_number))),
                  "plain_beside": _or_none(_entries(dict.fromkeys(("tokens_per_s", "low", "high", "samples"),
                                                                  _is_number))),
                  "baseline": _or_none(_entries({"tokens_per_s": _or_none(_is_number)})),
                  "speedup": _or_none(_is_number)}


class TraceError(SpecvizError):
    """A trace that does not follow the schema."""


@dataclass
class Trace:
    header: dict
    rounds: list[Round]
    summary: dict | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.committed]


def versions() -> dict:
    import torch
    import transformers

    from specviz import __version__

    return {"specviz": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def make_header(*, target: dict, drafter: dict | None, config: dict, budget: dict | None, prompt: dict,
                attention: dict | None = None) -> dict:
    """``attention``: the kernels the target's forwards ran (``specviz.engine.attention.describe``); optional, so
    traces written before it existed still read."""
    header = {
        "type": "header", "schema": SCHEMA, "version": VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "target": target, "drafter": drafter, "config": config, "budget": budget, "prompt": prompt,
        "versions": versions(),
    }
    if attention is not None:
        header["attention"] = attention
    return header


def dumps(header: dict, rounds: list[Round], summary: dict | None = None) -> str:
    lines = [json.dumps(header, ensure_ascii=False)]
    lines += [json.dumps(r.to_dict(), ensure_ascii=False) for r in rounds]
    if summary is not None:
        lines.append(json.dumps({"type": "summary", **summary}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def write(path: str | Path, header: dict, rounds: list[Round], summary: dict | None = None) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(header, rounds, summary), encoding="utf-8")
    except OSError as error:
        raise SpecvizError(f"cannot write the trace to {path}: {error.strerror}") from None
    return path


def read(path: str | Path) -> Trace:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"{path.name} is larger than {MAX_TRACE_BYTES >> 20} MiB; not a specviz trace")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"cannot read trace {path.name}: {getattr(error, 'strerror', None) or error}") from None
    return loads(text)


def loads(text: str) -> Trace:
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"trace line {number} is not JSON ({error.msg})") from None
        except (RecursionError, ValueError) as error:  # nesting too deep for the parser; numbers too long to read
            raise TraceError(f"trace line {number} is not a JSON object a trace holds ({type(error).__name__})") \
                from None
        if not isinstance(obj, dict):
            raise TraceError(f"trace line {number} is not a JSON object")
        objects.append(obj)
    validate(objects)
    rounds = [Round.from_dict(o) for o in objects if o.get("type") == "round"]
    summary = objects[-1] if objects[-1].get("type") == "summary" else None
    return Trace(header=objects[0], rounds=rounds, summary=summary)


def validate(objects: list[dict]) -> None:
    """Raise ``TraceError`` naming the first line that breaks the schema."""
    if not objects:
        raise TraceError("the trace is empty")
    header = objects[0]
    if header.get("type") != "header" or header.get("schema") != SCHEMA:
        raise TraceError("trace line 1 is not a specviz trace header")
    if header.get("version") != VERSION:
        raise TraceError(f"trace version {header.get('version')!r} is not supported (this specviz reads {VERSION})")
    missing = [name for name in REQUIRED_HEADER_FIELDS if name not in header]
    if missing:
        raise TraceError(f"trace line 1 (header): missing field {missing[0]!r}")
    _check_fields(header, HEADER_FIELDS, "trace line 1 (header)")
    produced = 0
    committed_all: list[int] = []
    for number, obj in enumerate(objects[1:], start=2):
        kind = obj.get("type")
        if kind == "summary":
            if number != len(objects):
                raise TraceError(f"trace line {number}: the summary must be the last line")
            _check_fields(obj, SUMMARY_FIELDS, f"trace line {number} (summary)")
            if "token_ids" in obj and obj["token_ids"] != committed_all:
                raise TraceError(f"trace line {number}: summary token_ids differ from the rounds' committed tokens")
            continue
        if kind != "round":
            raise TraceError(f"trace line {number}: unknown record type {kind!r}")
        _validate_round(obj, number, expected_index=number - 2, expected_start=produced)
        produced += len(obj["committed"])
        committed_all.extend(obj["committed"])


def _check_fields(obj: dict, checks: dict, where: str) -> None:
    """Each present entry of ``obj`` named in ``checks`` passes its check, else one line naming it."""
    for name, check in checks.items():
        if name in obj and not check(obj[name]):
            raise TraceError(f"{where}: field {name!r} has the wrong type or value")


def _validate_round(obj: dict, number: int, expected_index: int, expected_start: int) -> None:
    def fail(message: str):
        raise TraceError(f"trace line {number} (round {obj.get('index')}): {message}")

    for name in ROUND_FIELDS:
        if name not in obj:
            fail(f"missing field {name!r}")
    _check_fields(obj, {**ROUND_FIELDS, **OPTIONAL_ROUND_FIELDS}, f"trace line {number} (round {obj.get('index')})")
    if obj["index"] != expected_index or obj["start"] != expected_start:
        fail("rounds are out of order or a round is missing")
    tokens, parents, accepted = obj["tokens"], obj["parents"], obj["accepted"]
    if any(len(obj[name]) != len(tokens) for name in ("parents", "p_target", "text")) or any(
            obj[name] is not None and len(obj[name]) != len(tokens) for name in ("q_draft", "confidence")):
        fail("tokens, parents, text, p_target (and q_draft, confidence) must have one entry per node")
    if any(not -1 <= p < i for i, p in enumerate(parents)):
        fail("parents must satisfy -1 <= parent < node index (topological order)")
    previous = -1
    for node in accepted:
        if not 0 <= node < len(tokens) or parents[node] != previous:
            fail("the accepted path does not follow parent links from the root")
        previous = node
    for draw in obj["draws"]:
        if not _is_draw(draw, len(tokens)):
            fail(f"draw {draw!r} is not a decision at a node of this round")
    pruned = obj.get("meta", {}).get("pruned")
    if pruned is not None and not (isinstance(pruned, list) and all(
            _is_pruned(node, i, len(tokens)) for i, node in enumerate(pruned))):
        fail("meta.pruned must list drafted-then-pruned nodes hanging off this round's nodes or earlier pruned ones")
    if obj["extra_kind"] not in EXTRA_KINDS:
        fail(f"extra_kind must be one of {sorted(EXTRA_KINDS)}")
    full = [tokens[i] for i in accepted] + [obj["extra_token"]]
    committed = obj["committed"]
    if not committed or committed != full[: len(committed)]:
        fail("committed tokens are not the accepted path followed by the extra token")


#: A draw's entries besides ``parent``, ``node`` and ``accepted`` (``accept.Draw``).
DRAW_ENTRIES = {"target_token": _is_token, "u": _is_probability, "ratio": _is_probability, "p": _is_probability,
                "q": _is_probability}


def _is_draw(draw, nodes: int) -> bool:
    """An accept-rule decision: at ``parent`` (-1 = root) over ``node`` (None: no child matched)."""
    return (isinstance(draw, dict) and _is_int(draw.get("parent")) and -1 <= draw["parent"] < nodes
            and (draw.get("node") is None or (_is_int(draw["node"]) and 0 <= draw["node"] < nodes))
            and _is_bool(draw.get("accepted")) and _entries(DRAW_ENTRIES)(draw))


PRUNED_REQUIRED = {"token", "depth", "q", "confidence"}
#: A pruned node's entries besides its links (``dynamic_tree._pruned``, ``cost_curve.cut_tail``).
PRUNED_ENTRIES = {"token": _is_token, "depth": _is_int, "q": _or_none(_is_probability),
                  "confidence": _is_probability, "score": _is_number, "text": _is_str,
                  "reason": _is_str, "head": _is_int, "module": _is_int}


def _is_pruned(node, index: int, nodes: int) -> bool:
    """A drafted-then-pruned node hanging off a kept node (``parent``, -1 = root) or an earlier pruned one."""
    if not (isinstance(node, dict) and _entries(PRUNED_ENTRIES)(node) and PRUNED_REQUIRED <= node.keys()):
        return False
    parent, pruned_parent = node.get("parent"), node.get("pruned_parent")
    if parent is not None:
        return pruned_parent is None and _is_int(parent) and -1 <= parent < nodes
    return _is_int(pruned_parent) and 0 <= pruned_parent < index
