"""The round record: everything one propose -> verify -> accept -> commit step did, as plain data.

Views, the trace file, replay and the benchmark consume ``Round`` and nothing else, so it holds only JSON types.
Field meanings are the trace schema (see ``specviz/engine/trace.py`` and docs/trace-schema.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from specviz.engine import tree


@dataclass
class TokenChoice:
    """One entry of a top-k list: token id, probability, display text."""

    id: int
    p: float
    text: str


@dataclass
class Round:
    index: int
    start: int  # new tokens committed before this round
    tokens: list[int]  # draft tree, topological order
    parents: list[int]  # -1 = child of the last committed token
    text: list[str]  # display text of each node's token
    q_draft: list[float] | None  # drafter's probability of each node's token (None: deterministic drafter)
    confidence: list[float] | None
    sampled: bool  # children were drawn at random from the draft distribution
    p_target: list[float]  # target's probability of each node's token, at the node's parent
    target_top: list[list[TokenChoice]]  # per verified row: row 0 = root, row i + 1 = after node i
    draft_top: list[list[TokenChoice]] | None  # same rows, from the drafter's distribution
    target_entropy: list[float]  # nats, per verified row
    accepted: list[int]  # node indices of the accepted path, root side first
    extra_token: int
    extra_text: str
    extra_kind: str  # "correction" | "bonus"
    committed: list[int]  # ids appended to the text this round (may be cut short by EOS / max-new-tokens)
    committed_text: list[str]
    draws: list[dict]  # decisions of the accept rule (see accept.Draw)
    residual_top: list[TokenChoice] | None  # the distribution a correction was sampled from, if not p itself
    rule: str
    lossless: bool
    draft_ms: float
    verify_ms: float
    other_ms: float
    finished: bool = False  # this round ended the generation (EOS or max-new-tokens)
    meta: dict = field(default_factory=dict)

    @property
    def verified(self) -> int:
        """Target tokens processed by this round's verify forward (newest committed token + tree nodes + the side
        rows a lookahead window adds, ``meta["side_rows"]``)."""
        return len(self.tokens) + 1 + int((self.meta or {}).get("side_rows", 0))

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms

    @property
    def is_chain(self) -> bool:
        """One child per node (``DraftTree.is_chain`` of the tree this round verified)."""
        return tree.is_chain(self.parents)

    @property
    def depth(self) -> list[int]:
        return tree.depths(self.parents)

    def to_dict(self) -> dict:
        return {"type": "round", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> Round:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}

        def choices(rows):
            return None if rows is None else [[TokenChoice(**c) for c in row] for row in rows]

        values["target_top"] = choices(values.get("target_top"))
        values["draft_top"] = choices(values.get("draft_top"))
        if values.get("residual_top") is not None:
            values["residual_top"] = [TokenChoice(**c) for c in values["residual_top"]]
        return cls(**values)
