"""The load on the card that no process on the host can see, and how much of a span it drew.

Other processes on the card are not unseen: their windows are in the card's table
(:mod:`giul_asgi.hostshare.cards`), and the span is decided with them. What nobody here
sees is the upstream's own load: the inference server behind the gateway, read through its
own ``/metrics``, says how many requests it is running (:meth:`Unseen.note_upstream`). That
count includes the host's; the book says how many windows of the host were surely in it (open
all through the scrape and the count's lag before it), and how many at most may have been
(they began or ended in that time, or may be among the requests it holds queued): the excess
is load we cannot see, somewhere between the count less both and the count less the sure ones.
Within that, the excess held before stands: a window of ours that just ended may still be in a
count that lags (SGLang logs its own every 40 decode steps by default), and one that just began
may not be in it yet, so neither moves it; but another replica's request that began as ours
ended is not hidden by ours either (it was, when a window closed within a ramp-down counted as
in the count: ours was charged 2.0x).

A span's unseen window-seconds share it with ours: ours get covered / (covered + unseen).

Between two samples the count is held, and what it did meanwhile nobody saw: a request of
another replica's may have ended just after one sample, or a sample may have fallen in a gap
between two of its requests. The doubt of the held count is how far it moved, or may be off
within what a sample allows (once load beyond ours has been seen), at the samples on either
side of the time (a count that moves between samples moves between them too; one that
held still at both is taken as still): 1 where another replica's load comes and goes, 0 where
it is steady or none.
"""

from __future__ import annotations

import math
from collections import deque

#: How long an unseen load, once sampled, keeps figures ``contended`` (seconds).
UNSEEN_KEEP_S = 120.0
#: Samples past the last one are extrapolated this far at most (seconds).
EXTRAPOLATE_S = 1.0
#: How far a server's count may lag its requests' starts and ends (seconds): a window that
#: began or ended within this of a scrape may or may not be in its count.
COUNT_LAG_S = 0.1
#: A scrape slower than this says too little of when its count was taken (the windows it may
#: have counted are settled and forgotten by the time it is read): it is not noted (seconds).
SLOWEST_SCRAPE_S = 0.5


class Unseen:
    """Cumulative window-seconds of load this process cannot see, as samples in time."""

    def __init__(self) -> None:
        # The upstream's running requests beyond ours, integrated between its samples.
        self._upstream: deque[tuple[float, float]] = deque(maxlen=4096)
        self._excess = 0.0  # the upstream's requests beyond ours at its last sample
        # The held count's doubt (requests), integrated the same way, and how far the count
        # moved at the last sample (the doubt past it).
        self._doubt: deque[tuple[float, float]] = deque(maxlen=4096)
        self._moved = 0.0
        self.seen_t: float | None = None  # when the upstream last ran more than ours

    def note_upstream(self, t: float, running: float, ours: int, maybe: int = 0) -> None:
        """The upstream ran ``running`` requests at ``t`` while ``ours`` of our windows were
        on the card and ``maybe`` more may have been in its count: the excess is load we
        cannot see, until the next sample (the one held, as far as this sample allows)."""
        if not math.isfinite(running):
            running = 0.0
        low, high = max(0.0, running - ours - maybe), max(0.0, running - ours)
        excess = min(max(self._excess, low), high)
        samples, doubts = self._upstream, self._doubt
        # How far it moved, or may be off within what the count allows where load beyond ours
        # has been seen lately (where none has been, nor is it now, ours is all it may have).
        moved = abs(excess - self._excess) if samples else 0.0
        if excess > 0 or self.recent(t):
            moved = max(moved, excess - low, high - excess)
        if samples:
            t0, integral = samples[-1]
            if t > t0:
                samples.append((t, integral + self._excess * (t - t0)))
                doubts.append((t, doubts[-1][1] + max(self._moved, moved) * (t - t0)))
        else:
            samples.append((t, 0.0))
            doubts.append((t, 0.0))
        self._excess, self._moved = excess, moved
        if excess > 0:
            self.seen_t = t

    def window_seconds(self, t0: float, t1: float) -> float:
        """Window-seconds in (t0, t1] of load this process does not see (0 when unknown)."""
        upstream = _delta(self._upstream, t0, t1, self._excess)
        return max(0.0, upstream) if upstream is not None else 0.0

    def doubt_seconds(self, t0: float, t1: float) -> float:
        """How far the unseen window-seconds in (t0, t1] may be off: the held count's doubt
        (the larger of its moves at the samples either side), integrated (0 when unknown)."""
        doubt = _delta(self._doubt, t0, t1, self._moved)
        return max(0.0, doubt) if doubt is not None else 0.0

    def recent(self, now: float | None) -> bool:
        """Whether the upstream has run load we cannot see lately."""
        return self.seen_t is not None and (now is None or now - self.seen_t <= UNSEEN_KEEP_S)


def _delta(samples: deque[tuple[float, float]], t0: float, t1: float, rate: float | None) -> float | None:
    """The growth of a cumulative series between ``t0`` and ``t1``, interpolated between
    samples (and, past the last, extrapolated at ``rate`` when one is given); None when the
    series does not cover the span."""
    if not samples or samples[0][0] > t0:
        return None
    last_t = samples[-1][0]
    if t1 > last_t and (rate is None or t1 - last_t > EXTRAPOLATE_S):
        return None
    return _at(samples, t1, rate) - _at(samples, t0, rate)


def _at(samples: deque[tuple[float, float]], t: float, rate: float | None) -> float:
    last_t, last_v = samples[-1]
    if t >= last_t:
        return last_v + (rate or 0.0) * (t - last_t)
    lo, hi = 0, len(samples) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, va), (tb, vb) = samples[lo], samples[hi]
    return va + (vb - va) * ((t - ta) / (tb - ta) if tb > ta else 0.0)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of these (start, end) spans that overlap at any one instant: how many windows
    that may be in a count taken at one instant can be in it at most (short requests back to
    back touch a scrape's time three at a time, but are in its count one at a time)."""
    if len(spans) < 2:
        return len(spans)
    edges = sorted([(start, 0) for start, _ in spans] + [(end, 1) for _, end in spans])
    most = now = 0
    for _, ends in edges:  # at one time a start before an end: spans that touch overlap
        now += -1 if ends else 1
        most = max(most, now)
    return most


__all__ = ["COUNT_LAG_S", "SLOWEST_SCRAPE_S", "UNSEEN_KEEP_S", "Unseen", "most_at_once"]
