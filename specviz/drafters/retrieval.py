"""Retrieval drafting with cache reuse (REST, He et al. 2024; SuffixDecoding, Oliaro et al. 2024; vLLM's ``suffix``).

Each round looks up the longest suffix of the context (up to ``MAX_MATCH`` tokens) that occurs in any store: the
prompt and this answer, the earlier answers of this app session (cache reuse), and a corpus the user names. Every
occurrence of that match contributes what followed it; the continuations merge into a prefix tree whose nodes count
how many occurrences went through them. The draft keeps the nodes with the best path score, the product of each
step's empirical frequency (count ÷ its parent's count), up to SuffixDecoding's adaptive size, ``SPEC_FACTOR`` ×
the match length (a long match earns a long draft), within the run's budget, dropping nodes scored below
``MIN_PROBABILITY``. Each node's confidence is its path score, and the round records where each node came from
(``node_labels``: the store; ``retrieval``: its count, its parent's, and every source's share), so the app can say
"this prompt", "answer 2 of this session" or "corpus" for each drafted token.

Deterministic (no draft distribution): verified with the target-sampling rule like the n-gram lookup, so output is
exactly the target's. A session's memory holds only that session's answers: the app keeps one per visitor, and one
shared by all visitors only where the operator turns it on (``SPECVIZ_SHARED_RETRIEVAL=1``; off by default).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specviz.drafters.registry import DrafterFamily, register
from specviz.drafters.suffix_store import CORPUS_CAP, Continuation, LiveText, SessionMemory, SuffixIndex
from specviz.engine.drafter import DraftBudget, Drafter
from specviz.engine.sampling import SamplingConfig
from specviz.engine.target import Target
from specviz.engine.tree import ROOT, DraftTree
from specviz.errors import SpecvizError

#: The longest context suffix looked up (SuffixDecoding walks its tree this deep at most).
MAX_MATCH = 32
#: Draft at most this many tokens per matched token (SuffixDecoding's ``max_spec_factor``, 1 in vLLM, where a batch
#: shares the GPU). Four here: one stream verifies a few more tokens almost for free on a CPU (the verify-cost curve
#: in BENCHMARKS.md), and the draft budget caps the tree anyway.
SPEC_FACTOR = 4.0
#: Nodes whose path score (the product of the steps' empirical frequencies) falls below this are not drafted
#: (SuffixDecoding's ``min_token_prob``).
MIN_PROBABILITY = 0.1
#: The operator's switch for one memory shared by every visitor of an app (off unless set to 1).
SHARED_ENV = "SPECVIZ_SHARED_RETRIEVAL"
#: Files a corpus folder contributes.
CORPUS_SUFFIXES = (".txt", ".md", ".py", ".json", ".jsonl", ".csv", ".html", ".rst")


@dataclass
class _Node:
    token: int
    parent: int  # index into the candidate list, ROOT for the root's children
    depth: int
    count: int = 0
    sources: dict[str, int] = field(default_factory=dict)
    children: dict[int, int] = field(default_factory=dict)


class RetrievalDrafter(Drafter):
    """Drafts the most frequent continuations of the context's longest match in its stores (see the module)."""

    name = "retrieval"

    def __init__(self, *, memory: SessionMemory | None = None, corpus: SuffixIndex | None = None,
                 corpus_name: str = "", decode: Callable[[list[int]], str] | None = None, name: str | None = None,
                 max_match: int = MAX_MATCH, spec_factor: float = SPEC_FACTOR,
                 min_probability: float = MIN_PROBABILITY):
        self.memory = memory if memory is not None else SessionMemory()
        self.corpus, self.corpus_name = corpus, corpus_name
        self.decode = decode
        self.name = name or self.name
        self.max_match, self.spec_factor, self.min_probability = max_match, spec_factor, min_probability
        self.live: LiveText | None = None
        self._stores: list = []

    def describe(self) -> dict:
        return {"name": self.name, "kind": "retrieval", "max_match": self.max_match, "spec_factor": self.spec_factor,
                "min_probability": self.min_probability, "session_answers": len(self.memory),
                "corpus": {"name": self.corpus_name, "tokens": len(self.corpus)} if self.corpus is not None else None}

    def begin(self, prompt_ids: list[int], max_new_tokens: int | None = None,
              budget: DraftBudget | None = None) -> None:
        self.live = LiveText(prompt_ids)
        session = self.memory.index()  # fixed for the run: answers added meanwhile count from the next run on
        self._stores = [store for store in (self.live, session, self.corpus) if store is not None]

    def propose(self, context: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator) -> DraftTree:
        if self.live is None or len(context) < len(self.live.tokens) or \
                context[: len(self.live.tokens)] != self.live.tokens:
            self.begin(context)  # used on its own, or on another text: start over
        self.live.extend(context)
        length = max((store.longest_match(context, self.max_match) for store in self._stores), default=0)
        if length == 0:
            return DraftTree.empty()
        depth = budget.max_depth
        found: list[Continuation] = []
        for store in self._stores:
            found += store.continuations(context, length, depth)
        size = min(budget.widest, max(1, int(self.spec_factor * length)))
        width = budget.width if budget.tree else 1
        threshold = max(self.min_probability, budget.min_draft_prob)
        return self._tree(found, size, width, threshold, context[-length:])

    def _tree(self, found: list[Continuation], size: int, width: int, threshold: float,
              matched: list[int]) -> DraftTree:
        """The best-scored nodes of the continuations' prefix tree: at most ``size``, ``width`` per parent."""
        nodes, roots = _prefix_tree(found)
        total = len(found)
        kept: list[int] = []  # candidate indices in the order they are drafted (parents first)
        index_of: dict[int, int] = {}
        scores: dict[int, float] = {}
        frontier = [(-nodes[c].count / total, c) for c in roots.values()]
        heapq.heapify(frontier)
        taken: dict[int, int] = {}  # parent (ROOT or candidate) -> children drafted
        while frontier and len(kept) < size:
            negative, candidate = heapq.heappop(frontier)
            node = nodes[candidate]
            if -negative < threshold or taken.get(node.parent, 0) >= width:
                continue
            taken[node.parent] = taken.get(node.parent, 0) + 1
            index_of[candidate], scores[candidate] = len(kept), -negative
            kept.append(candidate)
            for child in node.children.values():
                heapq.heappush(frontier, (negative * nodes[child].count / node.count, child))
        if not kept:
            return DraftTree.empty()
        tokens = [nodes[c].token for c in kept]
        parents = [ROOT if nodes[c].parent == ROOT else index_of[nodes[c].parent] for c in kept]
        origin = []
        for c in kept:
            node = nodes[c]
            above = total if node.parent == ROOT else nodes[node.parent].count
            origin.append({"source": max(node.sources, key=node.sources.get), "count": node.count, "of": above,
                           "sources": dict(sorted(node.sources.items(), key=lambda item: -item[1])[:4])})
        meta = {"node_labels": [o["source"] for o in origin], "retrieval": origin,
                "retrieved": {"length": len(matched), "occurrences": total,
                              **({"text": self.decode(matched[-12:])} if self.decode else {})}}
        return DraftTree(tokens=tokens, parents=parents, confidence=[round(scores[c], 6) for c in kept], meta=meta)


def _prefix_tree(found: list[Continuation]) -> tuple[list[_Node], dict[int, int]]:
    """The continuations merged into a prefix tree: (nodes, the root's children by token)."""
    nodes: list[_Node] = []
    roots: dict[int, int] = {}
    for continuation in found:
        children, parent = roots, ROOT
        for depth, token in enumerate(continuation.tokens, start=1):
            if token not in children:
                children[token] = len(nodes)
                nodes.append(_Node(token, parent, depth))
            parent = children[token]
            node = nodes[parent]
            node.count += 1
            node.sources[continuation.source] = node.sources.get(continuation.source, 0) + 1
            children = node.children
    return nodes, roots


# ---- stores the family builds -----------------------------------------------------------------------------------
_CORPORA: dict[tuple, SuffixIndex] = {}
_SHARED = SessionMemory()


def shared_memory_on() -> bool:
    """Whether the operator shares one memory among every visitor (``SPECVIZ_SHARED_RETRIEVAL=1``)."""
    return os.environ.get(SHARED_ENV, "") == "1"


def session_memory() -> SessionMemory:
    """A fresh memory for one app session, or the app's shared one where the operator turned sharing on."""
    return _SHARED if shared_memory_on() else SessionMemory()


def corpus_index(path: str, target: Target) -> SuffixIndex:
    """A text or code corpus (a file, or a folder's text files) tokenized by the target's tokenizer, at most
    ``CORPUS_CAP`` tokens; kept per file state and tokenizer while the process runs."""
    root = Path(path).expanduser()
    if not root.exists():
        raise SpecvizError(f"retrieval corpus {path} does not exist")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in CORPUS_SUFFIXES
                                                 and p.is_file())
    if not files:
        raise SpecvizError(f"retrieval corpus {path} holds no text files ({', '.join(CORPUS_SUFFIXES)})")
    key = (str(root.resolve()), target.name, tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key not in _CORPORA:
        documents, total = [], 0
        for file in files:
            if total >= CORPUS_CAP:
                break
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError) as error:
                raise SpecvizError(f"retrieval corpus file {file} is not readable UTF-8 text ({error})") from None
            ids = [int(t) for t in target.tokenizer.encode(text, add_special_tokens=False)][: CORPUS_CAP - total]
            documents.append((f"corpus: {file.name}", ids))
            total += len(ids)
        _CORPORA.clear()  # one corpus at a time: they can be large
        _CORPORA[key] = SuffixIndex(documents)
    return _CORPORA[key]


def _build(argument: str, target: Target, settings: Mapping[str, Any]) -> RetrievalDrafter:
    corpus = corpus_index(argument, target) if argument else None
    return RetrievalDrafter(corpus=corpus, corpus_name=Path(argument).name if argument else "",
                            decode=target.decode, name=f"retrieval:{argument}" if argument else None)


def _check(argument: str) -> str:
    if argument and not Path(argument).expanduser().exists():
        raise SpecvizError(f"retrieval corpus {argument} does not exist (retrieval:<file or folder of text>)")
    return argument


FAMILY = register(DrafterFamily(
    name="retrieval",
    syntax="retrieval[:<corpus file or folder>]",
    title="retrieval (suffix match, cache reuse)",
    plain_name="Retrieval (suffix match)",
    plain_line="reuses the most common continuations of the longest repeat in the prompt and in earlier answers",
    description="SuffixDecoding/REST: the most frequent continuations of the context's longest match in the prompt, "
                "this answer, this session's earlier answers and an optional corpus, as a tree scored by frequency "
                f"and sized by the match length (up to {SPEC_FACTOR:g} tokens per matched token); no model, no draft "
                "probabilities",
    build=_build,
    check=_check,
    default_spec="retrieval",
    order=80,
))
