"""Node labels: which part of a drafter drafted each node (Medusa's head, MTP's module), read from ``Round.meta``.

A drafter may put one label per draft node under a key of ``LABEL_KEYS``: ``"head"`` and ``"module"`` hold 0-based
indices and are shown 1-based, as the Medusa and DeepSeek-V3 papers number heads and modules ("head 1" drafts
depth 1); ``"node_labels"`` holds text shown as is. Views read labels from rounds only, so a replayed trace shows
them too, and they never import a drafter. Text returned here is plain: each view escapes it for its medium.
"""

from __future__ import annotations

from collections.abc import Iterable

from specviz.engine.round import Round

#: ``Round.meta`` keys with one label per node, in order of preference.
LABEL_KEYS = ("node_labels", "head", "module")
INDEXED = ("head", "module")  # 0-based indices, shown 1-based


def label_key(round_: Round) -> str | None:
    """The first ``LABEL_KEYS`` entry this round carries as one plain label per node, if any."""
    for key in LABEL_KEYS:
        labels = (round_.meta or {}).get(key)
        if isinstance(labels, list) and len(labels) == len(round_.tokens) and labels and \
                all(isinstance(v, int) if key in INDEXED else isinstance(v, (int, str)) for v in labels):
            return key
    return None


def run_label_key(rounds: Iterable[Round]) -> str | None:
    """The label key of the first labelled round (a run's drafter labels every round the same way)."""
    return next((key for key in map(label_key, rounds) if key is not None), None)


def label_text(key: str, value: int | str) -> str:
    """How a label reads: ``head 2`` for head index 1, the text itself for ``node_labels``."""
    return f"{key} {value + 1}" if key in INDEXED and isinstance(value, int) else str(value)


def node_labels(round_: Round) -> list[str] | None:
    """Each draft node's label as text, or None when the round carries none."""
    key = label_key(round_)
    return None if key is None else [label_text(key, value) for value in round_.meta[key]]


def pruned_label(node: dict) -> str | None:
    """The label of a pruned node's record (``meta["pruned"][i]``: MTP records its module there too)."""
    for key in INDEXED:
        if isinstance(node.get(key), int):
            return label_text(key, node[key])
    return None


def depth_labels(round_: Round) -> dict[int, str]:
    """Depth -> the labels of the nodes drafted at that depth, joined ("head 2"; "module 1 / module 2" if mixed)."""
    seen: dict[int, dict[str, None]] = {}
    for depth, text in zip(round_.depth, node_labels(round_) or []):
        seen.setdefault(depth, {})[text] = None
    return {depth: " / ".join(texts) for depth, texts in sorted(seen.items())}
