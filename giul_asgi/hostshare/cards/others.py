"""The other ledgers' seats, as the card's holder follows them: their windows, their going.

Only the holder reads the other ledgers' seats: every window's open and close, from the ring
each writes in its own file, so that a span's members and each one's part are decided for the
whole host. It looks ten times a second whether they still run and twice a second who joined
(at once when the tape's count of joins moves), and a ledger that has left or died is retired:
its books are folded into the tape's (a callable the table passes: :meth:`.tape.Tape.fold`)
and its file removed. The holder also leaves each its part of every published piece here.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...spans import Counted, Coverage, counted
from ..rows import alive
from .files import FileMap
from .layout import (
    ANSWER,
    ANSWER_ROW,
    ANSWERS,
    ANSWERS_AT,
    CLOSE,
    EVENT,
    EVENT_ROW,
    EVENTS,
    EVENTS_AT,
    F64,
    LIVE,
    OPEN,
    RETIRED,
    S_GIVEN,
    SEAT_BYTES,
    SEAT_COUNTS,
    SEAT_FLOATS,
    SEAT_IDLE_GIVEN,
    SEAT_MAGIC,
    U64,
    finite,
)

log = logging.getLogger("giul_asgi.hostshare")

#: How often the holder looks whether the other ledgers still run, and for new ones (s): a
#: dead one's windows stop counting as the card's members only once it is seen dead.
LIVENESS_S = 0.1
CENSUS_S = 0.5


@dataclass(slots=True)
class Remote:
    """Another ledger's seat as the holder follows it: its windows, read from its ring."""

    name: str
    seat: FileMap
    pid: int
    start: int
    events_read: int = 0
    windows: dict[int, list[float]] = field(default_factory=dict)  # id -> [t_open, t_close]
    last_close: float = -math.inf
    pruned_close: float = -math.inf

    def read_events(self) -> None:
        mm = self.seat.mm
        written = U64.unpack_from(mm, SEAT_COUNTS)[0]
        if written - self.events_read > EVENTS:
            log.warning("card table: %s wrote %d opens and closes between two looks; some were lost",
                        self.name, written - self.events_read)
            self.events_read = written - EVENTS
        while self.events_read < written:
            at = EVENTS_AT + (self.events_read % EVENTS) * EVENT
            index, kind, t, window = EVENT_ROW.unpack_from(mm, at)
            if index != self.events_read or not math.isfinite(t):
                break  # being written: read next time
            if kind == OPEN:
                self.windows[window] = [t, math.inf]
            elif kind == CLOSE:
                times = self.windows.get(window)
                if times is not None:
                    times[1] = max(t, times[0])
                self.last_close = max(self.last_close, t)
            self.events_read += 1

    def coverage(self, t0: float, t1: float, ramp_s: float) -> Coverage:
        open_s = tail_s = 0.0
        open_n = tail_n = open_now = 0
        busy: list[tuple[float, float]] = []
        last = self.pruned_close if self.pruned_close <= t0 else -math.inf
        for t_open, t_close in self.windows.values():
            if t_close == math.inf:
                open_now += 1
            overlap = min(t_close, t1) - max(t_open, t0)
            if overlap > 0:
                open_s += overlap
                open_n += 1
                busy.append((max(t_open, t0), max(t_open, t0) + overlap))
                continue
            if t_close < t1:
                tail = min(t_close + ramp_s, t1) - max(t_close, t0)
                if tail > 0:
                    tail_s += tail
                    tail_n += 1
            if t_close <= t0:
                last = max(last, t_close)
        return Coverage(open_s, open_n, tail_s, tail_n, last, open_now, tuple(busy))

    def prune(self, before: float) -> None:
        """Forget windows whose close and ramp-down lie wholly before ``before``."""
        gone = [w for w, (_, t_close) in self.windows.items() if t_close < before]
        for window in gone:
            self.pruned_close = max(self.pruned_close, self.windows.pop(window)[1])

    def busy(self, now: float, ramp_s: float, period: float) -> bool:
        """Windows open, or closed recently enough that the card has yet to report them."""
        return any(t_close > now - ramp_s - 2 * period for _, t_close in self.windows.values())

    def answer(self, index: int, mine: float, given: float, idle: float) -> None:
        """Leave it its part of piece ``index``: ``mine`` window-seconds, worth ``given`` above
        idle and ``idle`` of the idle floor."""
        mm = self.seat.mm
        written = U64.unpack_from(mm, SEAT_COUNTS + 8)[0]
        crc = zlib.crc32(struct.pack("<Qd", index, mine))
        ANSWER_ROW.pack_into(mm, ANSWERS_AT + (written % ANSWERS) * ANSWER, index, mine, crc)
        at = SEAT_FLOATS + 8 * S_GIVEN
        F64.pack_into(mm, at, finite(F64.unpack_from(mm, at)[0]) + given)
        F64.pack_into(mm, SEAT_IDLE_GIVEN, finite(F64.unpack_from(mm, SEAT_IDLE_GIVEN)[0]) + idle)
        U64.pack_into(mm, SEAT_COUNTS + 8, written + 1)


class Others:
    """The other ledgers at one card's table (``folder``; this one's seat is ``name``), as its
    holder follows them; ``fold`` moves a departed one's books (its seat's map) into the tape's."""

    def __init__(self, folder: Path, name: str, ramp_s: float, fold: Callable[[mmap.mmap], None]) -> None:
        self.folder = folder
        self.name = name
        self.ramp_s = ramp_s
        self._fold = fold
        self._remotes: dict[str, Remote] = {}
        self._looked = self._census_t = -math.inf
        self._joins = -1.0

    def look(self, now: float, joins: float, *, force: bool = False) -> None:
        """Read every other ledger's new opens and closes; ten times a second see whether they
        still run, and twice a second (or when ``joins``, the tape's count, moved) who joined."""
        if force or joins != self._joins or now - self._census_t >= CENSUS_S:
            self._census_t = self._looked = now
            self._joins = joins
            self._census()
        elif now - self._looked >= LIVENESS_S:
            self._looked = now
            for remote in list(self._remotes.values()):
                self._check(remote)
        for remote in self._remotes.values():
            remote.read_events()

    def _census(self) -> None:
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith("p-") and n != self.name]
        except OSError:
            return
        for name in names:
            remote = self._remotes.get(name)
            if remote is None:
                remote = self._join(name)
                if remote is None:
                    continue
            self._check(remote)
        for name in [n for n in self._remotes if n not in names]:
            self._remotes.pop(name).seat.close()

    def _check(self, remote: Remote) -> None:
        """Retire a ledger that has left or died."""
        state = U64.unpack_from(remote.seat.mm, 24)[0]
        if state == RETIRED:  # counted in the tape's books already: only its file is left
            with contextlib.suppress(OSError):
                os.unlink(remote.seat.path)
            self._remotes.pop(remote.name).seat.close()
            return
        if state != LIVE or not alive(remote.pid, str(remote.start) if remote.start else None):
            remote.read_events()
            self._retire(remote)

    def _join(self, name: str) -> Remote | None:
        try:
            seat = FileMap(self.folder / name, SEAT_BYTES, create=False)
        except (OSError, ValueError) as exc:
            log.debug("card table: skipping %s: %s", name, exc)
            return None
        magic, pid, start = struct.unpack_from("<8sQQ", seat.mm, 0)
        if magic != SEAT_MAGIC or not pid:
            seat.close()
            return None
        remote = Remote(name, seat, pid, start)
        # Opens and closes already in its ring: a window open since before this holder.
        remote.events_read = max(0, U64.unpack_from(seat.mm, SEAT_COUNTS)[0] - EVENTS)
        self._remotes[name] = remote
        return remote

    def _retire(self, remote: Remote) -> None:
        """A ledger has gone: its books move into the tape's (what it had been given and not
        charged is lost with it: unattributed), and its file is removed."""
        self._fold(remote.seat.mm)
        with contextlib.suppress(OSError):
            os.unlink(remote.seat.path)
        remote.seat.close()
        self._remotes.pop(remote.name, None)

    def get(self, name: str) -> Remote | None:
        return self._remotes.get(name)

    def __len__(self) -> int:
        return len(self._remotes)

    def coverages(self, t0: float, t1: float) -> dict[str, Coverage]:
        """Holder: every other ledger's windows' time in (t0, t1]."""
        return {name: r.coverage(t0, t1, self.ramp_s) for name, r in self._remotes.items()}

    def busy(self, now: float, period: float) -> bool:
        """Holder: another ledger has windows the card has yet to report."""
        return any(r.busy(now, self.ramp_s, period) for r in self._remotes.values())

    def open_at(self, t: float, spread_s: float = 0.0, lag_s: float = 0.0) -> Counted:
        """Holder: the other ledgers' windows in an upstream's count taken at ``t``
        (:func:`~giul_asgi.spans.counted`)."""
        times = ((t_open, t_close) for r in self._remotes.values() for t_open, t_close in r.windows.values())
        return counted(times, t, spread_s, lag_s)

    def prune(self, before: float) -> None:
        """Forget every other ledger's windows wholly before ``before``."""
        for remote in self._remotes.values():
            remote.prune(before)

    def close(self) -> None:
        """Unmap every other ledger's seat (their files stay theirs)."""
        for remote in list(self._remotes.values()):
            remote.seat.close()
        self._remotes = {}


__all__ = ["CENSUS_S", "LIVENESS_S", "Others", "Remote"]
