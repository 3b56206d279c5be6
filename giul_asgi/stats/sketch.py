"""The quantile sketch: a fixed-size log-bucket histogram with 1% relative accuracy.

Each cell of the statistics keeps three of these (joules, joules per token, seconds) as one
dict of occupied bins, ``bin -> count``. A value ``v`` falls in the bin whose upper edge is
the smallest ``10 ** (k / BINS_PER_DECADE)`` at or above it, so a bin is read back within
:data:`ACCURACY` of any value in it, as DDSketch's logarithmic mapping does. The range is
fixed (:data:`LOWEST` to :data:`HIGHEST`, clamped beyond), so a sketch never holds more
than :data:`BINS` bins: that is the "bins" of the statistics' memory bound.

Why not the ``ddsketch`` library: its public ``DDSketch.add`` costs 0.35 us a value against
0.13 us here (three values a record: 1.1 us of a 2 us budget), a sketch of 10 values holds
3.1 KB against 0.6 KB, and its merge is 2.8 times slower (benchmarks/stats.py prints the
A/B; benchmarks/results/stats-2026-12-01b.md). The rule for a quantile is DDSketch's.

With 117 bins a decade (a multiple of 3), the Prometheus buckets (three a decade,
:data:`JOULE_BUCKETS`) are exact unions of bins, so their counts are exact too.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate
from operator import add

#: 117 bins a decade: ratio ``10 ** (1 / 117)`` = 1.0199 between edges, 0.98% accuracy.
BINS_PER_DECADE = 117
_GAMMA = 10 ** (1 / BINS_PER_DECADE)
#: Relative accuracy of every quantile: a p50 of 100 J means 99 to 101 J.
ACCURACY = 0.01
LOWEST_EXP, HIGHEST_EXP = -6, 9
#: Values are kept apart from ``LOWEST`` to ``HIGHEST``; below or above count in the edge bins.
LOWEST, HIGHEST = 10.0 ** LOWEST_EXP, 10.0 ** HIGHEST_EXP
#: Bins of one sketch: bin 0 holds everything up to ``LOWEST``, the last one everything
#: above the one before it (its upper edge is ``HIGHEST``).
BINS = (HIGHEST_EXP - LOWEST_EXP) * BINS_PER_DECADE + 1
_FIRST = LOWEST_EXP * BINS_PER_DECADE  # the upper edge exponent of bin 0
#: Where each sketch's bins start in a cell's one dict.
J, JPT, SEC = 0, BINS, 2 * BINS
#: Every bin's key as one shared int object: an int above 256 is an object of its own, so
#: cells that key their dicts with these save 28 bytes an entry (about a third of a cell).
KEYS: tuple[int, ...] = tuple(range(3 * BINS))
_log10 = math.log10
_ceil = math.ceil

#: Joules-per-request histogram bounds for Prometheus and OpenTelemetry: three a decade,
#: 0.01 J to 100 kJ, each an exact bin edge (so bucket counts come exactly from the bins).
JOULE_BUCKETS: tuple[float, ...] = tuple(10 ** (e / 3) for e in range(-6, 16))
_BUCKET_STEP = BINS_PER_DECADE // 3


def bin_of(value: float) -> int:
    """The bin of a positive value, clamped to ``0 .. BINS - 1`` (add :data:`J`,
    :data:`JPT` or :data:`SEC` for a cell's dict)."""
    k = _ceil(_log10(value) * BINS_PER_DECADE) - _FIRST
    return 0 if k < 0 else (BINS - 1 if k >= BINS else k)


def bin_value(k: int) -> float:
    """The value a bin is read back as: within :data:`ACCURACY` of anything in it."""
    upper = 10 ** ((k + _FIRST) / BINS_PER_DECADE)
    return 2 * upper / (1 + _GAMMA)


def quantiles(bins: Mapping[int, int], sketch: int, qs: Sequence[float]) -> list[float | None]:
    """Quantiles of one sketch (``J``, ``JPT`` or ``SEC``) of a cell's bins, by DDSketch's
    rule: the value of the bin where the running count first exceeds ``q * (count - 1)``.
    Sorting, summing and searching are C-level (the slots of a series are read by the
    thousand)."""
    keys = sorted(bins)
    keys = keys[bisect_left(keys, sketch):bisect_left(keys, sketch + BINS)]
    if not keys:
        return [None] * len(qs)
    running = list(accumulate(map(bins.__getitem__, keys)))
    count = running[-1]
    return [bin_value(keys[bisect_right(running, q * (count - 1))] - sketch) for q in qs]


def count(bins: Mapping[int, int], sketch: int) -> int:
    """How many values one sketch of a cell's bins holds (what its quantiles rest on)."""
    return sum(c for k, c in bins.items() if sketch <= k < sketch + BINS)


class Counts:
    """The three sketches as one dense list, for merging many cells when someone reads:
    adding a cell's bins is a list index each (half a dict's cost, measured in
    benchmarks/stats.py's A/B), and a quantile is a C-level running sum and bisection."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * (3 * BINS)

    def add(self, bins: Mapping[int, int], sign: int = 1) -> None:
        counts = self.counts
        if sign == 1:
            for k, c in bins.items():
                counts[k] += c
        else:
            for k, c in bins.items():
                counts[k] -= c

    def merge(self, other: Counts) -> None:
        self.counts = list(map(add, self.counts, other.counts))

    def copy(self) -> Counts:
        out = Counts.__new__(Counts)
        out.counts = list(self.counts)
        return out

    def count(self, sketch: int) -> int:
        """As :func:`count`, over the dense counts."""
        return sum(self.counts[sketch:sketch + BINS])

    def quantiles(self, sketch: int, qs: Sequence[float]) -> list[float | None]:
        """As :func:`quantiles`, over the dense counts."""
        running = list(accumulate(self.counts[sketch:sketch + BINS]))
        count = running[-1]
        if not count:
            return [None] * len(qs)
        return [bin_value(bisect_right(running, q * (count - 1))) for q in qs]


def joule_buckets(bins: Mapping[int, int]) -> list[int]:
    """Counts per :data:`JOULE_BUCKETS` bucket (not cumulative; the last is +Inf) of the
    joules sketch: each bin lies wholly inside one bucket."""
    counts = [0] * (len(JOULE_BUCKETS) + 1)
    top = len(JOULE_BUCKETS)
    first = -6 * _BUCKET_STEP
    for k, c in bins.items():
        if k >= BINS:
            continue
        upper = k + _FIRST  # the bin's upper edge, in 1/117 decades
        i = -((first - upper) // _BUCKET_STEP)  # ceil((upper - first) / step)
        counts[0 if i < 0 else (top if i > top else i)] += c
    return counts


__all__ = [
    "ACCURACY",
    "BINS",
    "BINS_PER_DECADE",
    "HIGHEST",
    "JOULE_BUCKETS",
    "JPT",
    "KEYS",
    "LOWEST",
    "LOWEST_EXP",
    "SEC",
    "Counts",
    "J",
    "bin_of",
    "bin_value",
    "count",
    "joule_buckets",
    "quantiles",
]
