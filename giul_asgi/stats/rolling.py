"""Rolling windows (1m, 15m, 1h, ... and since start) as rings of slots, per label key.

Time is cut in *steps* (``step_s``, 10 s by default), aligned on wall-clock time so that
several workers' slots line up. Each finite window keeps a ring of at most ``points`` slots,
each a whole number of steps wide (1m: 6 slots of 10 s; 15m: 30 of 30 s; 1h: 30 of 2 min).

A record goes into ONE cell: its key's cell of the current step (:attr:`Rolling.cell`).
When the step moves on, that cell is set aside whole (``pending``: no merge). Whoever reads
(:meth:`Rolling.fold`) folds the pending cells into the slots of each ring and drops the
slots that left their window (what leaves the longest ring goes into ``base``, so "since
start" is ``base`` plus the longest ring plus the current cell). Reads are rare and
records are not, so the merging is done by the reader; if nobody reads for
``pending_steps`` steps the reader thread folds (the same work, once per key and step).

A window ``w`` covers the last ``w`` seconds to within one slot: the newest slot is partial,
the oldest one is dropped whole.

Memory, per key: one current cell, at most ``pending_steps`` pending cells, ``points``
slots per ring, ``base`` and the since-start merge kept for reads:
:meth:`Geometry.slots_per_key`.
"""

from __future__ import annotations

import re

from ..errors import ConfigError
from .cell import Cell

_WINDOW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_window(text: str) -> float | None:
    """Seconds in a window name (``"90s"``, ``"15m"``, ``"1h"``); ``None`` for ``"all"``."""
    if text == "all":
        return None
    match = _WINDOW_RE.match(text) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(
            f"window {text!r} is not a duration",
            remedy='write it as a number and a unit (s, m, h, d), such as "15m", or "all"',
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


class Geometry:
    """The windows as rings: ``(width in steps, slots)`` per finite window."""

    __slots__ = ("longest", "names", "points", "ring_of", "rings", "step_s")

    def __init__(self, windows: tuple[str, ...], step_s: float, points: int) -> None:
        if not windows:
            raise ConfigError("the statistics need at least one window", remedy='pass ("1m", "all")')
        if not (isinstance(step_s, int | float) and not isinstance(step_s, bool) and step_s > 0):
            raise ConfigError(f"step_s={step_s!r} must be a positive number of seconds",
                              remedy="use 10")
        if not (isinstance(points, int) and points >= 1):
            raise ConfigError(f"points={points!r} must be a positive integer", remedy="use 30")
        self.names = windows
        self.step_s = float(step_s)
        self.points = points
        rings: list[tuple[int, int]] = []
        #: window name -> index of its ring (``None``: since start)
        self.ring_of: dict[str, int | None] = {}
        for name in windows:
            seconds = parse_window(name)
            if seconds is None:
                self.ring_of[name] = None
                continue
            steps = max(1, round(seconds / self.step_s))
            width = max(d for d in range(1, steps + 1)
                        if steps % d == 0 and d * points <= max(steps, points))
            self.ring_of[name] = len(rings)
            rings.append((width, steps // width))
        self.rings: tuple[tuple[int, int], ...] = tuple(rings)
        #: the ring that spans longest (what leaves it goes into base)
        self.longest: int | None = (max(range(len(rings)), key=lambda i: rings[i][0] * rings[i][1])
                                    if rings else None)

    def seconds(self, window: str) -> float | None:
        """The window's length, s (``None`` for since start); unknown names raise."""
        if window not in self.ring_of:
            raise ConfigError(f"unknown window {window!r}",
                              remedy=f"use one of {', '.join(self.names)}")
        index = self.ring_of[window]
        if index is None:
            return None
        width, n = self.rings[index]
        return width * n * self.step_s

    @property
    def default(self) -> str:
        finite = [w for w in self.names if self.ring_of[w] is not None]
        return "15m" if "15m" in finite else (finite[0] if finite else self.names[0])

    @property
    def pending_steps(self) -> int:
        """Past steps' cells a key keeps unfolded for a reader: two of the widest slot."""
        return 2 * max((w for w, _ in self.rings), default=1)

    def slots_per_key(self) -> int:
        """The most cells one key holds: current, pending, every ring's slots, base, start."""
        return 1 + self.pending_steps + sum(n for _, n in self.rings) + 2

    def describe(self) -> list[object]:
        """What another worker's state must match to be merged."""
        return [self.step_s, [list(g) for g in self.rings], list(self.names)]


class Ring:
    """One window's slots for one key: slot index -> cell, oldest first."""

    __slots__ = ("n", "slots", "width")

    def __init__(self, width: int, n: int) -> None:
        self.width = width  # steps a slot
        self.n = n  # slots in the window
        self.slots: dict[int, Cell] = {}

    def add(self, slot: int, cell: Cell, *, owned: bool = False) -> None:
        """Merge ``cell`` into ``slot`` (another worker's, say), keeping the slots in order;
        ``owned``: nothing else holds the cell, a new slot may take it as it is."""
        mine = self.slots.get(slot)
        if mine is not None:
            mine.merge(cell)
            return
        last = next(reversed(self.slots), slot)
        self.slots[slot] = cell if owned else cell.copy()
        if slot < last:
            self.slots = dict(sorted(self.slots.items()))

    def prune(self, newest: int) -> list[tuple[int, Cell]]:
        """Drop the slots before the window that ends at slot ``newest``; returns them."""
        oldest = newest - self.n + 1
        slots = self.slots
        gone = []
        while slots:
            first = next(iter(slots))
            if first >= oldest:
                break
            gone.append((first, slots.pop(first)))
        return gone


class Rolling:
    """One key's cells over time: the current step's cell (where records go), the past
    steps' cells not folded yet, a ring per finite window, ``base`` (what left the longest
    ring), and ``start``: ``base`` plus the longest ring's slots before ``start_upto``, kept
    for the since-start counters."""

    __slots__ = ("base", "cell", "dirty", "key", "limit", "longest", "pending", "rings", "start",
                 "start_upto", "step")

    def __init__(self, geometry: Geometry, step: int, key: tuple[str, ...] = ()) -> None:
        self.key = key  # the label key whose cells these are
        self.step = step  # the step ``cell`` counts
        self.cell = Cell()
        self.pending: dict[int, Cell] = {}  # step -> its cell, oldest first
        self.limit = geometry.pending_steps
        self.rings = [Ring(w, n) for w, n in geometry.rings]
        self.longest = self.rings[geometry.longest] if geometry.longest is not None else None
        self.base = Cell()
        self.start: Cell | None = None
        self.start_upto = 0
        #: slots left their window without a reader seeing them go (the readers' merges are stale)
        self.dirty = False

    def at(self, step: int) -> Cell:
        """The cell of ``step`` (not before :attr:`step`)."""
        if step != self.step:
            self.move(step)
        return self.cell

    def move(self, step: int) -> None:
        """Set the current cell aside (whole) and start ``step``'s."""
        if self.cell.requests:
            self.pending[self.step] = self.cell
            self.cell = Cell()
        self.step = step
        if len(self.pending) > self.limit:  # nobody read for a while: fold here
            self.fold()
            self.dirty = True

    def fold(self) -> list[list[tuple[int, Cell]]]:
        """Fold the pending cells into the rings' slots and drop the slots that left their
        windows at the current step; returns those, per ring. What leaves the longest ring
        goes into ``base`` (and into ``start`` if it was not counted there yet)."""
        rings = self.rings
        for step, cell in self.pending.items():  # in step order, so each ring's slots stay in order
            adopted = False  # one ring takes the cell itself (nobody writes it again): one copy less
            for ring in rings:
                slot = step // ring.width
                mine = ring.slots.get(slot)
                if mine is not None:
                    mine.merge(cell)
                elif adopted:
                    ring.slots[slot] = cell.copy()
                else:
                    ring.slots[slot], adopted = cell, True
            if self.longest is None:
                self.base.merge(cell)
        self.pending.clear()
        gone = []
        for ring in self.rings:
            left = ring.prune(self.step // ring.width)
            if left and ring is self.longest:
                for slot, cell in left:
                    self.base.merge(cell)
                    if self.start is not None and slot >= self.start_upto:
                        self.start.merge(cell)
            gone.append(left)
        return gone

    def open_cell(self, index: int | None) -> Cell:
        """A new cell: the open slot of ring ``index`` (the longest for ``None``, since start)
        and the current cell (call :meth:`fold` first)."""
        ring = self.longest if index is None else self.rings[index]
        out = self.cell.copy()
        if ring is not None:
            current = ring.slots.get(self.step // ring.width)
            if current is not None:
                out.merge(current)
        return out

    def closed_since_start(self) -> Cell:
        """``start``, brought up to the open slot: ``base`` and the longest ring's closed
        slots (kept; call :meth:`fold` first)."""
        longest = self.longest
        if longest is None:
            return self.base
        newest = self.step // longest.width
        start = self.start
        if start is None:
            start = self.start = self.base.copy()
            self.start_upto = min(longest.slots, default=newest)
        if self.start_upto < newest:
            for slot, cell in longest.slots.items():
                if self.start_upto <= slot < newest:
                    start.merge(cell)
            self.start_upto = newest
        return start

    def since_start(self) -> Cell:
        """A new cell: everything this key counted (call :meth:`fold` first)."""
        out = self.closed_since_start().copy()
        out.merge(self.open_cell(None))
        return out

    def forget(self) -> None:
        """Drop the since-start merge (the slots changed under it)."""
        self.start, self.start_upto = None, 0

    def cells(self) -> list[Cell]:
        """Every cell held now (for the memory bound)."""
        out = [self.cell, self.base, *self.pending.values()]
        out += [c for ring in self.rings for c in ring.slots.values()]
        if self.start is not None:
            out.append(self.start)
        return out


__all__ = ["Geometry", "Ring", "Rolling", "parse_window"]
