"""Where the retrieval drafter looks for continuations: texts searched for their longest match with the context's end.

Two stores behind one interface (``longest_match`` then ``continuations``):

- ``LiveText``: the prompt and this generation, which grow every round. Each token's positions are indexed as it
  arrives; a match is extended backwards from the positions of the context's last token.
- ``SuffixIndex``: texts fixed for a run (a session's earlier answers, a corpus): a suffix array over the token
  sequence *reversed*, so that extending a match by one more context token narrows an interval of the array by two
  binary searches (SuffixDecoding's suffix tree walk, in an array). Documents are separated by tokens no text has,
  so no match and no continuation crosses from one document into the next.

Memory is bounded: ``SessionMemory`` keeps at most ``SESSION_CAP`` tokens of answers (the oldest go first) and a
corpus is read up to ``CORPUS_CAP`` tokens; an index costs two 8-byte integers per token.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

#: Tokens of earlier answers one session's memory keeps (oldest answers dropped first).
SESSION_CAP = 65_536
#: Tokens of a corpus the retrieval drafter reads (the rest of the corpus is left out, and the drafter says so).
CORPUS_CAP = 2_000_000
#: Occurrences of a match read per store and round: the most recent in the live text, the first in the array's order
#: elsewhere (a frequent short match would otherwise cost a pass over thousands of continuations).
OCCURRENCES = 256
#: Below every token and separator: what "the text ends here" compares as, in the array's order.
_END = -(2**62)


@dataclass(frozen=True)
class Continuation:
    """What followed one occurrence of the match: ``tokens``, in document ``source`` from position ``at`` on."""

    tokens: tuple[int, ...]
    source: str
    at: int


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of ``tokens``' suffixes in lexicographic order (a shorter suffix first when one is the other's
    prefix), by prefix doubling: O(n log² n) in numpy."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)
    step = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)
        if step < n:
            second[: n - step] = rank[step:]
        order = np.lexsort((second, rank))
        first_sorted, second_sorted = rank[order], second[order]
        new_group = np.ones(n, dtype=bool)
        new_group[1:] = (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new_group) - 1
        if rank.max() == n - 1 or step >= n:
            return order
        step *= 2


class SuffixIndex:
    """Fixed documents (label, token ids), searchable by their longest match with the end of a context."""

    def __init__(self, documents: list[tuple[str, list[int]]]):
        parts, self.labels, starts = [], [], []
        length = 0
        for number, (label, tokens) in enumerate(documents):
            starts.append(length)
            self.labels.append(label)
            parts.append(np.asarray(tokens, dtype=np.int64))
            parts.append(np.array([-1 - number], dtype=np.int64))  # a separator no text holds
            length += len(tokens) + 1
        self.forward = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._reversed = self.forward[::-1].copy()
        self._order = suffix_array(self._reversed)

    def __len__(self) -> int:
        return len(self.forward)

    def _interval(self, context: list[int], longest: int) -> tuple[int, int, int]:
        """(matched length m, lo, hi): the suffixes ``_order[lo:hi]`` of the reversed text start with the context's
        last m tokens, reversed; m is the longest with an occurrence (at most ``longest``)."""
        lo, hi, matched, n = 0, len(self._order), 0, len(self._reversed)
        order, text = self._order, self._reversed
        for i in range(min(longest, len(context))):
            token = context[-1 - i]

            def key(j: int, i: int = i) -> int:
                position = int(order[j]) + i
                return int(text[position]) if position < n else _END
            new_lo = bisect_left(range(len(order)), token, lo, hi, key=key)
            new_hi = bisect_right(range(len(order)), token, new_lo, hi, key=key)
            if new_lo == new_hi:
                break
            lo, hi, matched = new_lo, new_hi, i + 1
        return matched, lo, hi

    def longest_match(self, context: list[int], longest: int) -> int:
        return self._interval(context, longest)[0]

    def continuations(self, context: list[int], length: int, depth: int) -> list[Continuation]:
        """What followed each occurrence of the context's last ``length`` tokens (up to ``OCCURRENCES``)."""
        matched, lo, hi = self._interval(context, length)
        if matched < length or length == 0:
            return []
        found = []
        n = len(self.forward)
        for j in range(lo, min(hi, lo + OCCURRENCES)):
            start = n - int(self._order[j])  # the forward position right after the occurrence
            tokens = self.forward[start: start + depth]
            cut = np.flatnonzero(tokens < 0)
            tokens = tokens[: cut[0]] if len(cut) else tokens
            if len(tokens):
                document = int(np.searchsorted(self.starts, start, side="right")) - 1
                found.append(Continuation(tuple(int(t) for t in tokens), self.labels[document],
                                          start - int(self.starts[document])))
        return found


class LiveText:
    """The prompt and this generation: every position of each token, so a match grows backwards from the
    positions of the context's last token. Positions before ``prompt_length`` are the prompt's."""

    def __init__(self, prompt: list[int]):
        self.prompt_length = len(prompt)
        self.tokens: list[int] = []
        self._positions: dict[int, list[int]] = defaultdict(list)
        self.extend(prompt)

    def extend(self, context: list[int]) -> None:
        """Index the tokens of ``context`` past those already seen (the context only ever grows within a run)."""
        for token in context[len(self.tokens):]:
            self._positions[int(token)].append(len(self.tokens))
            self.tokens.append(int(token))

    def _ends(self, context: list[int], longest: int) -> tuple[int, list[int]]:
        """(m, the end positions of earlier occurrences of the context's last m tokens, latest first)."""
        best, ends = 0, []
        last = len(context) - 1
        for end in reversed(self._positions.get(context[-1], []) if context else []):
            if end >= last:
                continue  # the context's own end
            length = 1
            while length < longest and end - length >= 0 and self.tokens[end - length] == context[last - length]:
                length += 1
            if length > best:
                best, ends = length, [end]
            elif length == best and len(ends) < OCCURRENCES:
                ends.append(end)
        return best, ends

    def longest_match(self, context: list[int], longest: int) -> int:
        return self._ends(context, longest)[0]

    def continuations(self, context: list[int], length: int, depth: int) -> list[Continuation]:
        matched, ends = self._ends(context, length)
        if matched < length or length == 0:
            return []
        found = []
        for end in ends:
            tokens = tuple(self.tokens[end + 1: end + 1 + depth])
            if tokens:
                in_prompt = end + 1 < self.prompt_length
                found.append(Continuation(tokens, "this prompt" if in_prompt else "this answer",
                                          end + 1 if in_prompt else end + 1 - self.prompt_length))
        return found


class SessionMemory:
    """Earlier answers of one app session (or of the whole app, where the operator shares it), at most ``cap``
    tokens, searchable as a ``SuffixIndex`` that is rebuilt only when an answer was added since the last run."""

    def __init__(self, cap: int = SESSION_CAP):
        self.cap = cap
        self._answers: deque[tuple[str, list[int]]] = deque()
        self._tokens = 0
        self._count = 0
        self._index: SuffixIndex | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._answers)

    def __getstate__(self) -> dict:  # copied or pickled (a GPU worker's copy): the answers, not the lock or index
        with self._lock:
            return {"cap": self.cap, "answers": list(self._answers), "tokens": self._tokens, "count": self._count}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cap"])
        self._answers.extend(state["answers"])
        self._tokens, self._count = state["tokens"], state["count"]

    def add(self, tokens: list[int], label: str | None = None) -> None:
        """Keep an answer (the oldest ones leave once the memory holds more than ``cap`` tokens)."""
        tokens = [int(t) for t in tokens][-self.cap:]
        if not tokens:
            return
        with self._lock:
            self._count += 1
            self._answers.append((label or f"answer {self._count} of this session", tokens))
            self._tokens += len(tokens)
            while self._tokens > self.cap:
                self._tokens -= len(self._answers.popleft()[1])
            self._index = None

    def index(self) -> SuffixIndex | None:
        """The answers as one index (None while there are none)."""
        with self._lock:
            if self._index is None and self._answers:
                self._index = SuffixIndex(list(self._answers))
            return self._index
