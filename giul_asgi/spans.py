"""The pieces of a card's energy that pass from part to part: spans, gaps, and spans decided for the host.

The tape (:mod:`giul_asgi.ledger.tape`) turns readings into :class:`Span` s of energy above
idle and :class:`Gap` s where the energy is unknown. Several processes (the workers of one
server, or of several servers) can draw on one card, and its energy must be charged once: the
process that reads it (the one holding the card's lock, :mod:`giul_asgi.hostshare.cards`)
decides, for each span, what the host's windows share of it: which windows are members (those
that overlap the span, else the ramp-down tails of windows closed just before), how much
window-time they cover in all, what a foreign load takes first. That decision is a
:class:`CardSpan`, published at the card's table. Every process then takes its own part,
``above_j x mine / (covered + unseen)``, and shares it among its own windows by the node's
split: the parts of all processes add up to the span, whoever holds the card.

The idle floor of a span (``total_j - measured_j``: idle_w x its time) is booked the same way
for the *allocated* basis: the part of the span's time with at least one window of the host
open (``busy_s``, the union of the windows' time in it) is shared like the energy above idle,
by the same members and rule; the rest is idle with no window open (``idle_unattributed``).

A process alone on its card makes the same decision with nobody else's windows, so there is
one way to book a span. These are plain records, imported by the ledger and the card's table
alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """Energy between ``t0`` and ``t1``: ``above_j`` over the idle floor, ``total_j`` in all.

    ``stamp_s`` is how far either end may be from the true step time (0 for reads stamped
    at read time); the book turns it into uncertainty at a window's edges. ``unc_j`` is
    what the span's energy itself may be off by (a gauge's samples miss what happened
    between them; a counter is exact to its millijoule).
    """

    t0: float
    t1: float
    above_j: float
    total_j: float
    stamp_s: float = 0.0
    unc_j: float = 0.0

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


@dataclass(frozen=True, slots=True)
class Gap:
    """Between ``t0`` and ``t1`` the card's energy is unknown, for the reason given.

    ``fault`` is true when the reader failed (errors, a stale counter, a reset); false
    where a healthy reader simply had no baseline yet (the time before its first step).
    """

    t0: float
    t1: float
    why: str
    fault: bool = True


Piece = Span | Gap

#: Windows an upstream's count has, as the host's processes say (the card's holder adds them
#: up): how many surely, and the times (start, end) within the count's own of those it may.
Counted = tuple[int, list[tuple[float, float]]]


def counted(windows: Iterable[tuple[float, float]], t: float, spread_s: float, lag_s: float) -> Counted:
    """Of ``windows`` (open, close; ``inf`` while open), those an upstream's count, taken within
    ``t`` +- ``spread_s`` (the scrape's own time) and as old as ``lag_s`` (a server's count
    may lag a request's start or end), surely has, and the times of those it may have: those
    open all that time, and those that opened or closed in it (their part of it). A request
    reaches the upstream after its window opens and has left it before the window closes."""
    early, late = t - spread_s - lag_s, t + spread_s
    surely, maybe = 0, []
    for t_open, t_close in windows:
        if t_open > late or t_close < early:
            continue
        if t_open <= early and t_close > late:
            surely += 1
        else:
            maybe.append((max(t_open, early), min(t_close, late)))
    return surely, maybe


INF = math.inf


@dataclass(frozen=True, slots=True)
class Coverage:
    """Windows' time in one span ``(t0, t1]``: of the windows that overlap it, and, where
    none does, of the ramp-down tails of windows closed within a ramp before it; and the
    latest close at or before ``t0`` (a neighbour's tail may still be in the span)."""

    open_s: float = 0.0
    open_n: int = 0
    tail_s: float = 0.0
    tail_n: int = 0
    last_close: float = -INF
    #: Windows open now (not only in the span): whether the card is busy.
    open_now: int = 0
    #: The overlapping windows' time in the span, as ``(start, end)`` intervals: their union
    #: is the span's time with a window open (whose idle floor the windows are allocated).
    busy: tuple[tuple[float, float], ...] = ()

    def __add__(self, other: Coverage) -> Coverage:
        return Coverage(
            self.open_s + other.open_s, self.open_n + other.open_n,
            self.tail_s + other.tail_s, self.tail_n + other.tail_n,
            max(self.last_close, other.last_close), self.open_now + other.open_now,
            self.busy + other.busy,
        )

    def by(self, tails: bool) -> float:
        """The window-seconds that count under the span's mode."""
        return self.tail_s if tails else self.open_s


NOBODY = Coverage()


def union_s(intervals: tuple[tuple[float, float], ...]) -> float:
    """The length of the union of ``(start, end)`` intervals (a few per span)."""
    if len(intervals) == 1:
        a, b = intervals[0]
        return b - a if b > a else 0.0
    if not intervals:
        return 0.0
    total = 0.0
    end = -INF
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@dataclass(frozen=True, slots=True)
class CardSpan:
    """A span of the card's energy as decided for the whole host (see the module)."""

    t0: float
    t1: float
    #: What the windows share: the span's energy above idle, less a subtracted foreign load.
    above_j: float
    #: All the card drew in the span (idle included): the windows' mean power.
    total_j: float
    stamp_s: float
    unc_j: float
    #: The span's energy above idle as measured (before any foreign load was taken off).
    measured_j: float
    #: The members are ramp-down tails of windows closed before the span (none overlaps it).
    tails: bool
    #: Window-seconds of every member on the host (by the mode), and how many members.
    covered: float
    members: int
    #: Window-seconds of load no process on the host sees (the upstream's requests beyond
    #: every window here): it draws its part of the span like a window would.
    unseen: float
    #: Joules taken off for a foreign load before the windows share (``foreign="subtract"``).
    foreign_j: float
    #: Where no window covers the span, whether only the witnessed foreign level's own
    #: doubt remains there (the card was seen quiet and no window closed a ramp before).
    quiet: bool
    doubt_w: float
    #: The doubt, in the card's watts, of what load not the host's took: a subtracted foreign
    #: level's, and the unseen load's where its count moved between samples (0: none).
    foreign_unc_w: float
    #: Asked to subtract a foreign load that nobody could look for yet: all may be foreign.
    unwatched: bool
    #: The witnessed foreign level (W above idle; None: not witnessed long enough), and
    #: whether it was seen recently; whether the card's process list showed a foreign
    #: process; whether the upstream ran load nobody here sees, lately.
    level: float | None = None
    level_recent: bool = False
    processes_foreign: bool | None = None
    unseen_recent: bool = False
    #: The card's update period when decided (followers have no tape to learn it from).
    period: float = 0.1
    #: The span's time with at least one window of the host open (the union of their time).
    busy_s: float = 0.0
    #: The idle floor (W) it was cut above, as its holder published it (None: not said, an
    #: earlier release's tape, or a span not published).
    cut_above_w: float | None = None

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    @property
    def idle_j(self) -> float:
        """The span's idle floor (idle_w x its time; 0 where the node gives no floor)."""
        return max(0.0, self.total_j - self.measured_j)

    def idle_part(self, mine: float) -> float:
        """The idle floor ``mine`` window-seconds of members are allocated: the floor of the
        span's time with a window open, shared as the energy above idle is (a closed window's
        tail is not running: the idle under it is nobody's)."""
        seconds = self.t1 - self.t0
        if mine <= 0 or self.covered <= 0 or self.tails or seconds <= 0 or self.busy_s <= 0:
            return 0.0
        idle = self.total_j - self.measured_j
        if idle <= 0:
            return 0.0
        return idle * min(1.0, self.busy_s / seconds) * mine / (self.covered + self.unseen)

    @property
    def idle_unattributed_j(self) -> float:
        """The idle floor no window of the host is allocated: time with none open, and the
        part of load nobody here sees."""
        return self.idle_j - self.idle_part(self.covered)

    def part(self, mine: float) -> float:
        """The energy ``mine`` window-seconds of members take. A closed window's tail is a
        member only where no window is open; where load nobody here sees is, that load takes
        the span whole (it does not see the tail), or the tail would be counted twice."""
        if mine <= 0 or self.covered <= 0 or (self.tails and self.unseen > 0):
            return 0.0
        return self.above_j * mine / (self.covered + self.unseen)

    def fraction_of(self, part: float) -> float:
        """The share of the card's span that ``part`` joules of it are (1 where nobody
        else takes any: a lone process with no load it cannot see)."""
        if self.above_j:
            return min(1.0, abs(part / self.above_j))
        return 1.0 if not self.unseen else self.covered / (self.covered + self.unseen)

    @property
    def unattributed_j(self) -> float:
        """What no window on the host takes: the whole span where none is a member, else
        the foreign load taken off and the unseen load's part."""
        return self.measured_j - self.part(self.covered)

    @property
    def external_j(self) -> float:
        """What load other than the host's windows took: foreign, and unseen."""
        if self.covered <= 0:
            return 0.0
        return self.foreign_j + (self.above_j - self.part(self.covered))


__all__ = ["NOBODY", "CardSpan", "Counted", "Coverage", "Gap", "Piece", "Span", "counted", "union_s"]
