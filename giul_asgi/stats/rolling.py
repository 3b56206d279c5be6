"""Rolling windows (1m, 15m, 1h, ... and since start) as rings of slots, per label key.

Time is cut in *steps* (``step_s``, 10 s by default), aligned on wall-clock time so that
several workers' slots line up. Each finite window keeps a ring of at most ``points`` slots,
each a whole number of steps wide (1m: 6 slots of 10 s; 15m: 30 of 30 s; 1h: 30 of 2 min).

A record goes into ONE cell: its key's cell of the current step (:attr:`Rolling.cell`).
When the step moves on, that cell is folded into the slot of each ring it belongs to: once
per key and step, never per record. A slot that leaves the longest ring goes into ``base``,
so "since start" is ``base`` plus the longest ring plus the current cell. A window is merged
when someone reads: its ring's closed slots (kept merged, and updated by adding the slots
that closed and subtracting the ones that left: cells subtract exactly), plus its open slot,
plus the current cell.

A window ``w`` covers the last ``w`` seconds to within one slot: the newest slot is partial,
the oldest one is dropped whole.

Memory, per key: one current cell, ``sum(points of each ring)`` slots and ``base``:
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

    def slots_per_key(self) -> int:
        """The most cells one key holds: the current one, every ring's slots, base."""
        return 1 + sum(n for _, n in self.rings) + 1

    def describe(self) -> list[object]:
        """What another worker's state must match to be merged."""
        return [self.step_s, [list(g) for g in self.rings], list(self.names)]


class Ring:
    """One window's slots for one key (slot index -> cell, oldest first), and the merge of
    its closed slots as of the last read (``closed`` covers the slots below ``upto``)."""

    __slots__ = ("closed", "n", "slots", "upto", "width")

    def __init__(self, width: int, n: int) -> None:
        self.width = width  # steps a slot
        self.n = n  # slots in the window
        self.slots: dict[int, Cell] = {}
        self.closed: Cell | None = None
        self.upto = 0

    def add(self, slot: int, cell: Cell) -> None:
        mine = self.slots.get(slot)
        if mine is None:
            self.slots[slot] = cell.copy()
        else:
            mine.merge(cell)

    def prune(self, newest: int, spill: Cell | None) -> None:
        """Drop the slots before the window that ends at slot ``newest`` (into ``spill``)."""
        oldest = newest - self.n + 1
        slots = self.slots
        while slots:
            first = next(iter(slots))
            if first >= oldest:
                break
            cell = slots.pop(first)
            if self.closed is not None and first < self.upto:
                self.closed.subtract(cell)
            if spill is not None:
                spill.merge(cell)

    def window(self, newest: int) -> Cell:
        """A new cell: the merge of the slots in the window that ends at slot ``newest``."""
        closed = self.closed
        if closed is None:
            closed = self.closed = Cell()
            self.upto = min(self.slots, default=newest)
        if self.upto < newest:
            for slot, cell in self.slots.items():
                if self.upto <= slot < newest:
                    closed.merge(cell)
            self.upto = newest
        out = closed.copy()
        current = self.slots.get(newest)
        if current is not None:
            out.merge(current)
        return out

    def forget(self) -> None:
        """Drop the merged closed slots (the slots changed under them)."""
        self.closed, self.upto = None, 0


class Rolling:
    """One key's cells over time: the current step's cell (where records go), a ring per
    finite window, and ``base`` (what left the longest ring)."""

    __slots__ = ("base", "cell", "longest", "rings", "step")

    def __init__(self, geometry: Geometry, step: int) -> None:
        self.step = step  # the step ``cell`` counts
        self.cell = Cell()
        self.rings = [Ring(w, n) for w, n in geometry.rings]
        self.longest = self.rings[geometry.longest] if geometry.longest is not None else None
        self.base = Cell()

    def at(self, step: int) -> Cell:
        """The cell of ``step`` (not before :attr:`step`): the older one folds into the rings."""
        if step != self.step:
            self.roll(step)
        return self.cell

    def roll(self, step: int) -> None:
        """Fold the current cell into its slots, drop what left the windows at ``step``."""
        cell = self.cell
        if cell.requests:
            for ring in self.rings:
                ring.add(self.step // ring.width, cell)
            if self.longest is None:
                self.base.merge(cell)
            self.cell = Cell()
        self.step = step
        for ring in self.rings:
            ring.prune(step // ring.width, self.base if ring is self.longest else None)

    def window(self, index: int) -> Cell:
        """Ring ``index``'s window at the current step (call :meth:`roll` first)."""
        ring = self.rings[index]
        out = ring.window(self.step // ring.width)
        out.merge(self.cell)
        return out

    def window_slot(self, index: int) -> Cell:
        """A new cell: ring ``index``'s open slot and the current cell (call :meth:`roll` first)."""
        ring = self.rings[index]
        out = Cell()
        current = ring.slots.get(self.step // ring.width)
        if current is not None:
            out.merge(current)
        out.merge(self.cell)
        return out

    def since_start(self) -> Cell:
        """Everything this key counted (call :meth:`roll` first)."""
        longest = self.longest
        out = longest.window(self.step // longest.width) if longest is not None else Cell()
        out.merge(self.base)
        out.merge(self.cell)
        return out

    def cells(self) -> int:
        """Cells held now (for the memory bound)."""
        return 2 + sum(len(r.slots) for r in self.rings)


__all__ = ["Geometry", "Ring", "Rolling", "parse_window"]
