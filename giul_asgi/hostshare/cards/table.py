"""This ledger's seat at one card's table: it joins, writes its windows, holds or follows.

Every ledger of the host that meters the card sits at its table (:mod:`giul_asgi.hostshare.cards`):
it writes its windows' opens and closes in its own seat (two stores, on the request path), and
either holds the card's ``lock`` (it reads the card, decides each span for the whole host and
publishes it on the tape, with each other ledger's part) or follows (it takes the pieces the
holder published, with its own part). The table itself only ties the parts together: the
files (:mod:`.files`), the tape (:mod:`.tape`), the other seats as the holder follows them
(:mod:`.others`), the books any ledger answers for (:mod:`.books`).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import math
import os
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ...spans import CardSpan, Counted, Coverage, Gap
from ..keys import folder_name
from ..place import make_dir, open_file
from ..rows import process_start
from .books import CardBooks, HostBooks, SeatBooks
from .files import FileMap, Unusable, make_file, open_made
from .layout import (
    ANSWER,
    ANSWER_ROW,
    ANSWERS,
    ANSWERS_AT,
    CLOSE,
    CLOSED,
    EVENT,
    EVENT_ROW,
    EVENTS,
    EVENTS_AT,
    LIVE,
    OPEN,
    SEAT_BYTES,
    SEAT_COUNTS,
    SEAT_HEAD,
    SEAT_MAGIC,
    T_BASE_T,
    T_BASE_VALUE,
    T_BEAT,
    T_DRAWN,
    T_ERRORS,
    T_EXTERNAL,
    T_GOOD,
    T_IDLE_UNATTR,
    T_JOINS,
    T_LAST,
    T_MEASURED,
    T_PERIOD,
    T_READS,
    T_RESETS,
    T_UNATTRIBUTED,
    TAPE_BYTES,
    TAPE_ENTRIES,
    TAPE_MAGIC,
    U64,
)
from .others import Others
from .sweep import sweep_cards
from .tape import Tape

_seats = itertools.count(1)  # two ledgers of one process on one card: two seats
_swept: set[Path] = set()  # the places whose forgotten cards this process has removed
_tables: weakref.WeakSet[CardTable] = weakref.WeakSet()  # this process's seats, for a fork


def _after_fork_in_child() -> None:
    """A process forked from one at a card's table (an app's helper, multiprocessing's fork)
    is not at the table, but its copy of the lock's descriptor held the card after its parent
    died: nobody read the card again (a hostile trial, 113 of 1,182 requests ever counted).
    The copy is closed here, never unlocked: that would free the parent's hold too."""
    for table in list(_tables):
        fd, table._lock_fd = table._lock_fd, None
        table.holding = False
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


os.register_at_fork(after_in_child=_after_fork_in_child)


class CardTable:
    """This ledger's seat at one card's table: its own file, the tape, and the lock.

    Built on the reader thread (it creates files); the request path only calls
    :meth:`opened` and :meth:`closed` (two stores each). Raises :class:`Unusable` (an OSError)
    when the table cannot be joined.
    """

    def __init__(self, directory: Path, key: str, node: str, *, ramp_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, idle_w: float | None = None) -> None:
        self.key = key
        self.node = node
        self.ramp_s = ramp_s
        #: The idle floor this ledger cuts spans above: written with each span it publishes.
        self.idle_w = idle_w
        self.clock = clock
        try:  # a link or another user's folder here is refused as a full place is: said
            cards = make_dir(directory / "cards", root=directory)
            self.folder = make_dir(cards / folder_name(key), root=directory)
        except OSError as exc:
            raise Unusable(f"cannot use the cards' folder in {directory}: {exc.strerror or exc}") from exc
        if directory not in _swept:  # once a process: the cards nobody reads any more go
            _swept.add(directory)
            sweep_cards(directory, keep=self.folder)
        pid = os.getpid()
        start = process_start(pid)
        self.name = f"p-{pid}-{start or 0}-{next(_seats)}"
        self._maps: list[FileMap] = []
        self._lock_fd: int | None = None
        self.holding = False
        _tables.add(self)
        try:
            tape_path = self.folder / "tape"
            make_file(tape_path, TAPE_BYTES, TAPE_MAGIC)
            made = open_made(tape_path, TAPE_BYTES, TAPE_MAGIC)
            self._maps.append(made)
            self.tape = Tape(made.mm)
            self._others = Others(self.folder, self.name, ramp_s, self.tape.fold)
            header = SEAT_HEAD.pack(SEAT_MAGIC, pid, int(start or 0), LIVE, *([0.0] * 8), 0, 0, 0, 0)
            make_file(self.folder / self.name, SEAT_BYTES, header)
            self.seat = self._map(self.folder / self.name, SEAT_BYTES)
            self._lock_fd = open_file(self.folder / "lock", os.O_RDWR | os.O_CREAT)
            # Say so: the holder looks for new ledgers at once (a burst's windows, opened just
            # after a worker joined, read as a foreign load when it looked twice a second).
            self.tape.add(T_JOINS, 1.0)
        except Unusable:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise Unusable(f"cannot join the card's table in {self.folder}: {exc.strerror or exc}") from exc
        self._events = 0
        #: The request path writes opens and closes from any thread, the reader adopts the
        #: windows opened before the seat existed: one small lock keeps the events in order.
        self._events_lock = threading.Lock()
        self._posted: set[int] = set()  # windows whose open is written and close is not
        self._gone: set[int] | None = set()  # closed unwritten, until the adoption is done
        self._taken = 0  # pieces of the tape this ledger has taken (or skipped)
        self._answers_read = 0
        self._last_t1: float | None = None
        self._counted = (0, 0, 0)  # this holder's tape's reads, errors, resets already counted
        self._books = CardBooks(self.tape.mm, self.seat.mm, self.folder, self.name, clock)

    def _map(self, path: Path, size: int) -> FileMap:
        made = FileMap(path, size, create=False)
        self._maps.append(made)
        return made

    # -- the request path: two stores ---------------------------------------------------------
    def opened(self, window: int, t: float) -> None:
        with self._events_lock:
            self._posted.add(window)
            self._event(OPEN, window, t)

    def closed(self, window: int, t: float) -> None:
        with self._events_lock:
            if window in self._posted:
                self._posted.discard(window)
                self._event(CLOSE, window, t)
            elif self._gone is not None:
                self._gone.add(window)  # opened before the seat: never to be adopted

    def adopt(self, windows: Iterable[tuple[int, float]]) -> None:
        """Write the opens of windows that were open before this seat existed (the reader,
        once, when it joins), but not those the request path wrote or closed meanwhile."""
        with self._events_lock:
            gone, self._gone = self._gone or set(), None
            for window, t in windows:
                if window not in self._posted and window not in gone:
                    self._posted.add(window)
                    self._event(OPEN, window, t)

    def _event(self, kind: int, window: int, t: float) -> None:
        index = self._events
        mm = self.seat.mm
        EVENT_ROW.pack_into(mm, EVENTS_AT + (index % EVENTS) * EVENT, index, kind, t, window)
        self._events = index + 1
        U64.pack_into(mm, SEAT_COUNTS, index + 1)

    # -- holding the card -----------------------------------------------------------------------
    def try_hold(self) -> bool:
        """Hold the card if nobody does (the previous holder may have just died); True while
        this ledger holds it."""
        if self.holding:
            return True
        fd = self._lock_fd
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.holding = True
        self._counted = (0, 0, 0)
        self._taken = max(self._taken, self.tape.published())
        last = self.tape.get(T_LAST)
        self._last_t1 = last if last > 0 else None
        self.look(force=True)
        return True

    def look(self, *, force: bool = False) -> None:
        """Holder: read every other ledger's new opens and closes; ten times a second see
        whether they still run, and twice a second who joined (a departed ledger's books go
        to the tape's)."""
        self._others.look(self.clock(), self.tape.get(T_JOINS), force=force)

    def coverages(self, t0: float, t1: float) -> dict[str, Coverage]:
        """Holder: every other ledger's windows' time in (t0, t1]."""
        return self._others.coverages(t0, t1)

    def others_busy(self, now: float, period: float) -> bool:
        """Holder: another ledger has windows the card has yet to report."""
        return self._others.busy(now, period)

    def others_open_at(self, t: float, spread_s: float = 0.0, lag_s: float = 0.0) -> Counted:
        """Holder: the other ledgers' windows an upstream's count surely has, and may have."""
        return self._others.open_at(t, spread_s, lag_s)

    @property
    def others(self) -> int:
        """Holder: other ledgers at the table."""
        return len(self._others)

    def publish(self, piece: CardSpan | Gap, coverages: Mapping[str, Coverage], period: float) -> None:
        """Holder: publish one decided piece, and each other ledger's part of it."""
        last = self._last_t1
        if last is not None and piece.t0 > last + 1e-9:
            # The card changed hands (or this holder's tape began later): nobody read it then.
            self._publish(Gap(last, piece.t0, "the card's reader changed hands; nobody read it meanwhile"),
                          {}, period)
        self._publish(piece, coverages, period)

    def _publish(self, piece: CardSpan | Gap, coverages: Mapping[str, Coverage], period: float) -> None:
        index = self.tape.published()
        if isinstance(piece, CardSpan):
            for name, coverage in coverages.items():
                mine = coverage.by(piece.tails)
                remote = self._others.get(name)
                if mine > 0 and remote is not None:
                    remote.answer(index, mine, piece.part(mine), piece.idle_part(mine))
            with self.tape.books():
                self.tape.add(T_MEASURED, piece.measured_j)
                self.tape.add(T_UNATTRIBUTED, piece.unattributed_j)
                self.tape.add(T_EXTERNAL, piece.external_j)
                self.tape.add(T_DRAWN, piece.total_j)
                self.tape.add(T_IDLE_UNATTR, piece.idle_unattributed_j)
        self.tape.write(index, piece, period, self.idle_w or 0.0)
        self.tape.put(T_LAST, piece.t1)
        self.tape.put(T_PERIOD, period)
        self.tape.put(T_BEAT, self.clock())
        U64.pack_into(self.tape.mm, 16, index + 1)
        self._last_t1 = piece.t1
        self._taken = index + 1
        self._others.prune(piece.t1 - self.ramp_s - 1.0)

    def note_baseline(self, baseline: tuple[float, float] | None) -> None:
        """Holder: where its tape goes on from, for whoever takes the card over next."""
        if baseline is not None:
            self.tape.put(T_BASE_VALUE, baseline[0])
            self.tape.put(T_BASE_T, baseline[1])

    def baseline(self) -> tuple[float, float] | None:
        """Where the last holder's tape went on from (None: never said)."""
        t = self.tape.get(T_BASE_T)
        return (self.tape.get(T_BASE_VALUE), t) if t > 0 else None

    def count_reads(self, reads: int, errors: int, resets: int, good_t: float | None) -> None:
        """Holder: its tape's reads, failed reads and resets so far (the card's counters add
        every holder's, so they never fall when the card changes hands), and when it last
        read the card well."""
        if good_t is not None:
            self.tape.put(T_GOOD, good_t)
        before = self._counted
        if (reads, errors, resets) == before:
            return
        with self.tape.books():
            self.tape.add(T_READS, max(0, reads - before[0]))
            self.tape.add(T_ERRORS, max(0, errors - before[1]))
            self.tape.add(T_RESETS, max(0, resets - before[2]))
        self._counted = (reads, errors, resets)

    def beat(self) -> None:
        """Holder: say it is alive (followers whose windows wait look at this)."""
        self.tape.put(T_BEAT, self.clock())

    # -- following ----------------------------------------------------------------------------------
    def pending(self) -> list[tuple[CardSpan | Gap, float]]:
        """Follower: the pieces the holder published since the last call, each with this
        ledger's part of it (window-seconds; 0 where it had none)."""
        mm = self.tape.mm
        published = U64.unpack_from(mm, 16)[0]
        out: list[tuple[CardSpan | Gap, float]] = []
        if published - self._taken > TAPE_ENTRIES:
            skipped = published - TAPE_ENTRIES
            first = self.tape.piece(skipped)
            if first is not None and self._last_t1 is not None:
                out.append((Gap(self._last_t1, first.t0, "this process fell behind the card's tape"), 0.0))
            self._taken = skipped
        while self._taken < published:
            piece = self.tape.piece(self._taken)
            if piece is None:
                break  # being written: taken next time
            out.append((piece, self._answer_for(self._taken)))
            self._last_t1 = piece.t1
            self._taken += 1
        U64.pack_into(self.seat.mm, SEAT_COUNTS + 16, self._taken)
        return out

    def _answer_for(self, index: int) -> float:
        mm = self.seat.mm
        written = U64.unpack_from(mm, SEAT_COUNTS + 8)[0]
        if written - self._answers_read > ANSWERS:
            self._answers_read = written - ANSWERS
        while self._answers_read < written:
            at = ANSWERS_AT + (self._answers_read % ANSWERS) * ANSWER
            seq, mine, crc = ANSWER_ROW.unpack_from(mm, at)
            if crc != zlib.crc32(struct.pack("<Qd", seq, mine)) or seq > index:
                return 0.0
            self._answers_read += 1
            if seq == index:
                return mine if math.isfinite(mine) and mine > 0 else 0.0
        return 0.0

    def holder_age(self) -> float | None:
        """Seconds since the holder last said it was alive (None: nobody ever held it)."""
        beat = self.tape.get(T_BEAT)
        return max(0.0, self.clock() - beat) if beat > 0 else None

    def reading_age(self) -> float | None:
        """Seconds since the card's holder last read it well (None: never)."""
        good = self.tape.get(T_GOOD)
        return max(0.0, self.clock() - good) if good > 0 else None

    @property
    def period(self) -> float | None:
        period = self.tape.get(T_PERIOD)
        return period if period > 0 else None

    # -- books ----------------------------------------------------------------------------------
    def publish_books(self, books: SeatBooks) -> None:
        """This ledger's books, for anyone who answers for the card's."""
        self._books.publish(books)

    def host(self, mine: SeatBooks) -> HostBooks:
        """The card's books on the whole host (:meth:`.books.CardBooks.host`: the same from
        every ledger, no counter falling from one answer to the next)."""
        return self._books.host(mine)

    # -- leaving ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the table: this ledger's books stay until the holder folds them into the
        tape's; the lock goes to whoever asks next."""
        seat = getattr(self, "seat", None)
        if seat is not None and not seat.mm.closed:
            U64.pack_into(seat.mm, 24, CLOSED)
        others = getattr(self, "_others", None)
        if others is not None:
            others.close()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
        self.holding = False
        for made in self._maps:
            made.close()
        self._maps = []


__all__ = ["CardTable"]
