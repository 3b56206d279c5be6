"""What the requests of one label key cost in one slot of time: counters and three sketches.

Every sum is an integer (nanojoules, microseconds, tokens), so cells add and subtract
exactly in any order: a window is a merge of slots, a group a merge of keys, the host a
merge of workers, and "since start" never moves backwards when slots move between the
rings and the base (a float sum could, by an ulp, and Prometheus would read that as a
counter reset). Rounding a figure to the nanojoule and a duration to the microsecond is far
below what either is measured to.

A figure whose ``joules`` is unknown (``None``, zero, negative, NaN) counts as a request
and in the durations, never as 0 J in a sum or a quantile. Its carbon likewise: grams are
summed (in nanograms) over the figures whose ``carbon_grams`` is known, and counted; and its
``allocated_joules`` (above idle plus its share of the idle floor: the basis a chargeback
reconciles to the bill) over the figures where it is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..energy import MAX_TOKENS
from .labels import METHOD_MIX, OUTCOMES
from .sketch import BINS, BINS_PER_DECADE, JPT, KEYS, LOWEST_EXP, SEC, J, count, quantiles

NJ = 1e9  # nanojoules a joule
NG = 1e9  # nanograms a gram
US = 1e6  # microseconds a second
#: A figure past this (J, or g) is no request's (1e15 J: 280 GWh): a damaged record, not counted.
_MAX = 1e15
#: A count past this in another worker's row is damage, not a count (any float holds it).
MAX_COUNT = 2**128
#: Requests and figures past this are damage too: no server answers 2**53 requests, and past
#: 2**64 a count could not even be written as JSON (a hostile row of 10**30 requests made
#: /energy answer 500 for the server's life).
MAX_REQUESTS = 2**53
_log10 = math.log10
_ceil = math.ceil
_FIRST = LOWEST_EXP * BINS_PER_DECADE  # sketch.bin_of, inlined in add(): three calls a record
_TOP = BINS - 1
#: requests, joules, p50, p90, joules per token p50, contended requests, grams CO2eq (of the
#: known), requests whose joules are known (what p50 and p90 rest on)
Point = tuple[int, float | None, float | None, float | None, float | None, int, float | None, int]
Quantiles = Callable[[int, Sequence[float]], list[float | None]]


class Cell:
    """Requests, known figures, nanojoules, tokens, microseconds, contended requests, and the
    occupied bins of the three sketches (``sketch.J + bin`` and so on) in one dict."""

    __slots__ = ("alloc_known", "alloc_nj", "bins", "carbon_known", "carbon_ng", "contended",
                 "known", "nj", "requests", "tok_nj", "tok_tokens", "tokens", "us")

    def __init__(self) -> None:
        self.requests = 0
        self.known = 0  # requests whose joules are known
        self.nj = 0  # nanojoules, over known figures only
        self.tokens = 0
        self.tok_nj = 0  # nanojoules of requests with both joules and tokens known
        self.tok_tokens = 0  # their tokens
        self.us = 0  # microseconds
        self.contended = 0
        self.carbon_known = 0  # requests whose carbon grams are known
        self.carbon_ng = 0  # their nanograms
        self.alloc_known = 0  # requests whose allocated joules are known
        self.alloc_nj = 0  # their nanojoules
        self.bins: dict[int, int] = {}

    def add(self, joules: float | None, tokens: int | None, seconds: float,
            contended: bool | None, carbon: float | None = None,
            allocated: float | None = None) -> None:
        """Count one request. Checks everything before it changes anything, so a record that
        raises (a field of the wrong type) leaves the cell as it was."""
        if not 0.0 <= seconds < _MAX:
            seconds = 0.0
        if carbon is not None and not 0.0 <= carbon < _MAX:
            carbon = None
        if allocated is not None and not 0.0 < allocated < _MAX:
            allocated = None
        s = seconds if seconds > 1e-6 else 1e-6
        k = _ceil(_log10(s) * BINS_PER_DECADE) - _FIRST
        ks = KEYS[SEC + (0 if k < 0 else (_TOP if k > _TOP else k))]
        if tokens is not None and not (isinstance(tokens, int) and 0 < tokens < MAX_TOKENS):
            tokens = None
        bins = self.bins
        if joules is not None and 0.0 < joules < _MAX:
            nj = int(joules * NJ + 0.5)
            k = _ceil(_log10(joules) * BINS_PER_DECADE) - _FIRST
            kj = KEYS[0 if k < 0 else (_TOP if k > _TOP else k)]
            if tokens:
                k = _ceil(_log10(joules / tokens) * BINS_PER_DECADE) - _FIRST
                kt = KEYS[JPT + (0 if k < 0 else (_TOP if k > _TOP else k))]
                self.tok_nj += nj
                self.tok_tokens += tokens
                bins[kt] = bins.get(kt, 0) + 1
            self.known += 1
            self.nj += nj
            bins[kj] = bins.get(kj, 0) + 1
        if tokens:
            self.tokens += tokens
        if contended is True:
            self.contended += 1
        if carbon is not None:
            self.carbon_known += 1
            self.carbon_ng += int(carbon * NG + 0.5)
        if allocated is not None:
            self.alloc_known += 1
            self.alloc_nj += int(allocated * NJ + 0.5)
        self.requests += 1
        self.us += int(seconds * US + 0.5)
        bins[ks] = bins.get(ks, 0) + 1

    def merge(self, other: Cell) -> None:
        """Add ``other`` into this cell."""
        if not other.requests:
            return
        self.requests += other.requests
        self.known += other.known
        self.nj += other.nj
        self.tokens += other.tokens
        self.tok_nj += other.tok_nj
        self.tok_tokens += other.tok_tokens
        self.us += other.us
        self.contended += other.contended
        self.carbon_known += other.carbon_known
        self.carbon_ng += other.carbon_ng
        self.alloc_known += other.alloc_known
        self.alloc_nj += other.alloc_nj
        mine = self.bins
        if not mine:
            mine.update(other.bins)
            return
        get = mine.get
        for k, c in other.bins.items():
            mine[k] = get(k, 0) + c

    def merge_counters(self, other: Cell, sign: int = 1) -> None:
        """Add ``other``'s counters, not its bins, into this cell (``sign=-1``: subtract)."""
        self.requests += sign * other.requests
        self.known += sign * other.known
        self.nj += sign * other.nj
        self.tokens += sign * other.tokens
        self.tok_nj += sign * other.tok_nj
        self.tok_tokens += sign * other.tok_tokens
        self.us += sign * other.us
        self.contended += sign * other.contended
        self.carbon_known += sign * other.carbon_known
        self.carbon_ng += sign * other.carbon_ng
        self.alloc_known += sign * other.alloc_known
        self.alloc_nj += sign * other.alloc_nj

    def copy(self) -> Cell:
        cell = Cell()
        cell.merge(self)
        return cell

    @property
    def joules(self) -> float | None:
        """The sum of known figures, J (``None`` when none is known)."""
        return self.nj / NJ if self.known else None

    def summary(self, statuses: Mapping[str, int] | None = None,
                outcomes: Mapping[str, int] | None = None,
                methods: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The documented per-label figures (:func:`summary`) of this cell alone."""
        return summary(self, self.quantiles, statuses or {}, outcomes or {}, methods or {},
                       count_of=self.count)

    def count(self, sketch: int) -> int:
        return count(self.bins, sketch)

    def quantiles(self, sketch: int, qs: Sequence[float]) -> list[float | None]:
        return quantiles(self.bins, sketch, qs)

    def point(self) -> Point:
        """One point of a time series (:data:`Point`)."""
        p50, p90 = quantiles(self.bins, J, (0.5, 0.9))
        (jpt,) = quantiles(self.bins, JPT, (0.5,))
        return (self.requests, self.joules, p50, p90, jpt, self.contended, self.carbon_grams,
                self.known)

    @property
    def allocated_joules(self) -> float | None:
        """The sum of known allocated figures, J (``None`` when none is known)."""
        return self.alloc_nj / NJ if self.alloc_known else None

    @property
    def carbon_grams(self) -> float | None:
        """The sum of known carbon figures, g (``None`` when none is known)."""
        return self.carbon_ng / NG if self.carbon_known else None

    def state(self) -> list[Any]:
        return [self.requests, self.known, self.nj, self.tokens, self.tok_nj, self.tok_tokens,
                self.us, self.contended, [x for kv in self.bins.items() for x in kv],
                self.carbon_known, self.carbon_ng, self.alloc_known, self.alloc_nj]

    @classmethod
    def from_state(cls, state: Sequence[Any]) -> Cell:
        """A cell from another worker's :meth:`state`. Raises ValueError on one that makes
        no sense (a count that is not a whole number at least 0, such as a float, NaN, a
        string or a bool; a bin out of range; fewer requests than known figures)."""
        if not isinstance(state, list) or len(state) not in (11, 13) or not isinstance(state[8], list):
            raise ValueError("a cell of another shape")
        cell = cls()
        (cell.requests, cell.known, cell.nj, cell.tokens, cell.tok_nj, cell.tok_tokens, cell.us,
         cell.contended) = (_count(x) for x in state[:8])
        flat = state[8]
        if len(flat) % 2:
            raise ValueError("a cell's bins of odd length")
        cell.bins = {_count(flat[i]): _count(flat[i + 1]) for i in range(0, len(flat), 2)}
        cell.carbon_known, cell.carbon_ng = _count(state[9]), _count(state[10])
        if len(state) == 13:  # a worker that predates the allocated basis has none
            cell.alloc_known, cell.alloc_nj = _count(state[11]), _count(state[12])
        if any(not 0 <= k < 3 * BINS for k in cell.bins):
            raise ValueError("a bin out of range")
        if cell.known > cell.requests or cell.contended > cell.requests \
                or cell.carbon_known > cell.requests or cell.alloc_known > cell.requests:
            raise ValueError("a cell counts more figures than requests")
        if max(cell.requests, *cell.bins.values(), 0) >= MAX_REQUESTS:
            raise ValueError("a cell counts more requests than any server answers")
        # Sums no larger than their figures can make (1e15 J, or g, and MAX_TOKENS each): a
        # whole number of any size passed, and 10**30 nJ read 1e21 J in every book. A cell of
        # this process's own always passes: each figure was held to the same bounds when added.
        if cell.nj > cell.known * _MAX * NJ or cell.tok_nj > cell.known * _MAX * NJ \
                or cell.alloc_nj > cell.alloc_known * _MAX * NJ \
                or cell.carbon_ng > cell.carbon_known * _MAX * NG \
                or max(cell.tokens, cell.tok_tokens) > cell.requests * MAX_TOKENS:
            raise ValueError("a cell's sum is more than its figures can make")
        return cell


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < MAX_COUNT:
        raise ValueError(f"{value!r} is not a count")
    return value


def summary(cell: Cell, quantiles_of: Quantiles, statuses: Mapping[str, int],
            outcomes: Mapping[str, int], methods: Mapping[str, int], *,
            count_of: Callable[[int], int]) -> dict[str, Any]:
    """The documented per-label figures (docs/energy-schema.md, ``Summary``): ``cell``'s
    counters, quantiles from ``quantiles_of(sketch, qs)`` and how many values each rests on
    (``count_of(sketch)``), and the status class, outcome and method counts of the keys
    merged into it."""
    n, known = cell.requests, cell.known
    p50, p90, p99 = quantiles_of(J, (0.5, 0.9, 0.99))
    (jpt_p50,) = quantiles_of(JPT, (0.5,))
    s50, s99 = quantiles_of(SEC, (0.5, 0.99))
    jpt_agg = cell.tok_nj / NJ / cell.tok_tokens if cell.tok_tokens else None
    mix = {m: methods.get(m, 0) for m in METHOD_MIX}
    return {
        "requests": n,
        "joules": {
            "known": known,
            "sum": rounded(cell.nj / NJ) if known else None,
            "mean": rounded(cell.nj / NJ / known) if known else None,
            "p50": rounded(p50),
            "p90": rounded(p90),
            "p99": rounded(p99),
        },
        "tokens": cell.tokens,
        "joules_per_token": {"p50": rounded(jpt_p50), "aggregate": rounded(jpt_agg),
                             "known": count_of(JPT)},
        "tokens_per_joule": {
            "p50": rounded(1.0 / jpt_p50) if jpt_p50 else None,
            "aggregate": rounded(1.0 / jpt_agg) if jpt_agg else None,
        },
        "allocated_joules": {
            "known": cell.alloc_known,
            "sum": rounded(cell.alloc_nj / NJ) if cell.alloc_known else None,
            "mean": rounded(cell.alloc_nj / NJ / cell.alloc_known) if cell.alloc_known else None,
        },
        "carbon": {
            "known": cell.carbon_known,
            "grams": rounded(cell.carbon_ng / NG) if cell.carbon_known else None,
            "mean": rounded(cell.carbon_ng / NG / cell.carbon_known) if cell.carbon_known else None,
        },
        "seconds": {
            "sum": rounded(cell.us / US),
            "p50": rounded(s50),
            "p99": rounded(s99),
            "known": count_of(SEC),
        },
        "outcomes": {o: outcomes.get(o, 0) for o in OUTCOMES},
        "statuses": dict(sorted(statuses.items())),
        "methods": mix,
        "method_shares": {
            **{m: rounded(c / n) if n else None for m, c in mix.items()},
            "contended": rounded(cell.contended / n) if n else None,
        },
    }


def rounded(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


__all__ = ["NG", "NJ", "US", "Cell", "Point", "Quantiles", "rounded", "summary"]
