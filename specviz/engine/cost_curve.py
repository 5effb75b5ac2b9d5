"""What one target forward costs as the number of tokens it verifies grows, as a curve a drafter can plan with.

A drafter that chooses how many tokens to verify (DSpark's confidence-scheduled verification) weighs the tokens it
expects to keep against ``cost(n)``, the milliseconds of one target forward of ``n`` tokens over a cached context.
The curve is measured here on the real target (a short timing, the first time a drafter needs it on this machine,
then kept: ``measured``), or given (e.g. the bench's verify-cost measurement, whose rows ``{"width", "ms"}``
``CostCurve.from_rows`` reads). It lives in the engine so
drafters may use it; the bench's own curve (``specviz.bench.verify_cost``) times forwards the same way.
"""

from __future__ import annotations

import statistics
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from specviz.engine import cache as kv
from specviz.engine import timings
from specviz.engine.loop import Clock
from specviz.engine.target import Target
from specviz.engine.verify import masked_forward, prefill
from specviz.errors import SpecvizError


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of a target forward at each measured width; ``cost(n)`` interpolates between them.

    ``source`` says where the numbers come from (``measured on <target>``, ``given``, ``flat``), for the views.
    Between widths the cost is linear; past the widest it grows with the last segment's slope; below the narrowest
    it is the narrowest's.
    """

    widths: tuple[int, ...]
    ms: tuple[float, ...]
    source: str = "given"

    def __post_init__(self) -> None:
        if not self.widths or len(self.widths) != len(self.ms):
            raise SpecvizError(f"a cost curve needs as many widths as timings, got {len(self.widths)} and "
                               f"{len(self.ms)}")
        if any(b <= a for a, b in zip(self.widths, self.widths[1:])) or self.widths[0] < 1:
            raise SpecvizError(f"cost curve widths must be increasing integers >= 1, got {list(self.widths)}")
        if any(not value > 0 for value in self.ms):
            raise SpecvizError(f"cost curve timings must be positive milliseconds, got {list(self.ms)}")

    @classmethod
    def from_points(cls, points: Mapping[int, float], source: str = "given") -> CostCurve:
        """From ``{width: ms}``."""
        widths = sorted(int(w) for w in points)
        return cls(tuple(widths), tuple(float(points[w]) for w in widths), source)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping], source: str = "given") -> CostCurve:
        """From the bench's verify-cost rows ``[{"width": w, "ms": t, ...}, ...]`` (a one-line error otherwise)."""
        try:
            pairs = [(int(row["width"]), float(row["ms"])) for row in rows]
        except (KeyError, TypeError, ValueError) as error:
            raise SpecvizError(f"a cost curve is a list of {{'width', 'ms'}} rows ({error!r})") from None
        points = dict(pairs)
        if len(points) != len(pairs):
            raise SpecvizError(f"a cost curve names a width twice: {sorted(w for w, _ in pairs)}")
        return cls.from_points(points, source)

    @classmethod
    def flat(cls, source: str = "flat") -> CostCurve:
        """Every width costs the same: verifying more is free (the GPU ideal)."""
        return cls((1,), (1.0,), source)

    def cost(self, n: int) -> float:
        """Milliseconds of one target forward over ``n`` new tokens."""
        widths, ms = self.widths, self.ms
        if n <= widths[0] or len(widths) == 1:
            return ms[0]
        for (w0, m0), (w1, m1) in zip(zip(widths, ms), zip(widths[1:], ms[1:])):
            if n <= w1:
                return m0 + (m1 - m0) * (n - w0) / (w1 - w0)
        slope = max(0.0, (ms[-1] - ms[-2]) / (widths[-1] - widths[-2]))
        return ms[-1] + slope * (n - widths[-1])

    def to_dict(self) -> dict:
        return {"widths": list(self.widths), "ms": [round(m, 4) for m in self.ms], "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        """``to_dict``'s output back (a one-line ``SpecvizError``, or a ``TypeError``/``KeyError``, when it is not)."""
        return cls(tuple(int(w) for w in data["widths"]), tuple(float(m) for m in data["ms"]), str(data["source"]))


def widths_up_to(widest: int) -> list[int]:
    """Every width up to 8, then every fourth, then ``widest``: enough points for a piecewise-linear curve."""
    return sorted({*range(1, min(widest, 8) + 1), *range(8, widest + 1, 4), widest})


def forward_ms(target: Target, context: list[int], widths: list[int], repeats: int) -> dict[int, float]:
    """Median milliseconds of a causal target forward of ``w`` new tokens after ``context``, for each width.

    The cache is cropped back after every forward, so each sees the same context; the first forward warms up
    kernels and is not kept. The bench's verify-cost report and the drafters' curves both time it this way.
    """
    if not context:
        raise SpecvizError("verify cost: the context is empty")
    if not widths or min(widths) < 1 or repeats < 1:
        raise SpecvizError(f"verify cost: widths and repeats must be at least 1, got {widths} and {repeats}")
    if len(context) + max(widths) > target.max_positions:
        raise SpecvizError(f"verify cost: {len(context)} context tokens plus width {max(widths)} exceed the "
                           f"target's {target.max_positions} positions")
    cache = kv.new_cache(target.model, len(context) + max(widths), target.name, preallocate=target.preallocated_cache)
    prefill(target.model, cache, context)
    past = len(context)
    filler = (context * (max(widths) // len(context) + 1))[: max(widths)]  # real token ids, never out of range
    timings: dict[int, float] = {}
    for width in [widths[0], *widths]:
        timings[width] = statistics.median(time_forward(target.model, cache, filler[:width], past, repeats))
    return timings


def time_forward(model, cache, tokens: list[int], past: int, repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` causal forwards of ``tokens`` after ``past`` cached ones (cropped back each time;
    on CUDA the clock waits for queued work)."""
    clock, samples = Clock(next(model.parameters()).device), []
    for _ in range(repeats):
        started = clock()
        masked_forward(model, cache, tokens, list(range(past, past + len(tokens))), None)
        samples.append((clock() - started) * 1e3)
        kv.crop_to(cache, past)
    return samples


def measure(target: Target, widest: int, *, context_length: int = 32, repeats: int = 3) -> CostCurve:
    """The target's curve for widths up to ``widest`` over a cached context of ``context_length`` tokens
    (``forward_ms``), made non-decreasing in w (a wider forward never costs less; a dip is noise)."""
    if widest < 1 or repeats < 1 or context_length < 1:
        raise SpecvizError(f"cost curve: widest, repeats and context length must be >= 1, got {widest}, {repeats}, "
                           f"{context_length}")
    context_length = max(1, min(context_length, target.max_positions - widest - 1))
    vocab = target.vocab_size
    context = [(7 + 31 * i) % vocab for i in range(context_length)]  # any valid ids: the cost ignores the text
    widths = widths_up_to(widest)
    timings = forward_ms(target, context, widths, repeats)
    running, ms = 0.0, []
    for width in widths:
        running = max(running, timings[width])
        ms.append(max(running, 1e-6))
    return CostCurve(tuple(widths), tuple(ms), f"measured on {target.name}")


_CURVES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target model -> {widest: CostCurve}


def measured(target: Target, widest: int) -> CostCurve:
    """``measure``'s curve up to ``widest`` tokens, timed once per machine and model and kept
    (``specviz.engine.timings``): the app builds a drafter per run, and every run must schedule on the same curve for
    the same seed and settings to give the same rounds."""
    if target.model is None:  # a served target: its forward runs on the server, not here
        raise SpecvizError(f"{target.name}'s forward runs on its server: its verify cost is not timed here, so a "
                           f"schedule on it (ngram:auto, DSpark, hybrid) cannot run")
    curves = _CURVES.setdefault(target.model, {})
    if widest not in curves:
        key = {"model": timings.model_key(target.model), "forward": target.forward, "widest": widest}
        curves[widest] = timings.remembered("cost-curve", key, lambda: measure(target, widest).to_dict(),
                                            CostCurve.from_dict)
    return curves[widest]


@dataclass(frozen=True)
class Schedule:
    """A chosen verify length and the scan behind it: ``values[l - 1]`` is the expected committed tokens per
    millisecond at length l and ``cost_ms[l - 1]`` the cost of verifying it, for every length scanned (the chosen
    ``length``, plus the first one that did not improve on it, when the scan stopped before the cap)."""

    length: int
    values: tuple[float, ...]
    cost_ms: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"length": self.length, "values": [round(v, 6) for v in self.values],
                "cost_ms": [round(c, 4) for c in self.cost_ms]}


def best_prefix(survival: list[float], curve: CostCurve, cap: int) -> Schedule:
    """The prefix length l (1 <= l <= cap) maximising (1 + s_1 + ... + s_l) / cost(1 + l), scanned upward and
    stopped at the first l that does not improve on l - 1.

    ``survival[j]`` is the drafter's estimate that draft j + 1 and all before it are accepted; 1 + the sum is the
    expected committed tokens (the bonus or correction included). Stopping early makes the choice
    non-anticipating: whether token l + 1 is verified depends on the survival estimates up to l + 1 only, which a
    drafter computes from drafted tokens up to l, never from token l + 1 itself (DSpark, Appendix A).
    """
    scan = PrefixScan(curve, min(cap, len(survival)))
    for value in survival:
        if scan.add(value):
            break
    return scan.schedule


class PrefixScan:
    """``best_prefix`` fed one survival at a time, so a drafter can stop drafting where the scan stops.

    ``add(s_l)`` scans candidate length l and answers whether the scan is over (l did not improve on l - 1, or l is
    the cap): nothing drafted after that can change the choice, so DSpark drafts no further.
    """

    def __init__(self, curve: CostCurve, cap: int):
        self.curve, self.cap = curve, cap
        self.total, self.length = 1.0, 0
        self.values: list[float] = []
        self.costs: list[float] = []
        self.done = cap <= 0

    def add(self, survival: float) -> bool:
        if self.done:
            return True
        candidate = len(self.values) + 1
        self.total += survival
        self.costs.append(self.curve.cost(1 + candidate))
        self.values.append(self.total / self.costs[-1])
        if self.length and self.values[-1] <= self.values[self.length - 1]:
            self.done = True
        else:
            self.length = candidate
            self.done = candidate >= self.cap
        return self.done

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.length, tuple(self.values), tuple(self.costs))


def survival(estimates: Iterable[float]) -> list[float]:
    """Prefix survival s_k = ĉ_1 ⋯ ĉ_k of per-position acceptance estimates."""
    out, running = [], 1.0
    for value in estimates:
        running *= value
        out.append(running)
    return out


def cut_tail(tokens: list[int], q_token: list[float] | None, survival: list[float], length: int) -> list[dict]:
    """The drafts a schedule did not verify, as ``meta["pruned"]`` records (a chain hanging off the last verified
    draft), so the views draw them faded beside the verified prefix."""
    return [{"token": tokens[j], "depth": j + 1, "q": None if q_token is None else q_token[j],
             "confidence": survival[j], "parent": (length - 1) if j == length else None,
             "pruned_parent": None if j == length else j - length - 1,
             "reason": "drafted, then cut by the confidence schedule"} for j in range(length, len(tokens))]
