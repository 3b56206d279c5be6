"""One card, host-wide: every process's windows on it, the one tape its holder reads, its books.

A card is shared by every process of the host that draws on it, from any server: four
workers of one uvicorn, a second gateway started by the same shell, a batch job's meter. Its
energy must be charged once. So the processes meet at the card's table, a folder in the host's
place (``cards/<card>/``), and exactly one of them reads the card:

- ``lock``: whoever holds it (``flock``, released by the kernel when its holder dies, even of
  ``kill -9``) is the card's *holder*: it reads the card, decides every span for the whole host
  (:class:`~giul_asgi.spans.CardSpan`) and publishes it. The others follow. When the
  holder goes, the next process to find the lock free takes it, and the time between the two
  tapes is published as a gap (filled from the prior, never booked as measured).
- ``tape``: what the holder publishes: a ring of decided pieces (spans and gaps), and the
  card's books (measured, what no window took, and what departed processes left) under a
  sequence lock.
- ``p-<pid>-<start>-<n>``: one file per ledger on the card: its heartbeat and books (written by
  it), its windows' opens and closes (a ring it writes, the holder reads), and its part of each
  published piece (a ring the holder writes, it reads).

Everything is memory-mapped: a window's open or close is two stores in this process's file (no
system call on the request path, nothing lost to a ``kill -9``: the kernel owns the pages), and
the holder reads every ring on its reader thread. Space is reserved with ``posix_fallocate``
before a file is mapped (a store into a page that a full tmpfs cannot back would be a SIGBUS):
a full place fails at join, loudly, and the card is then this process's alone.

``time.monotonic()`` is one clock for every process of a Linux host, so times line up.

Bound: per card, ``lock`` and ``tape`` (1.0 MiB) and one file per live ledger on it (452 KiB);
a departed ledger's file is removed by the holder within a second of its going.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import math
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..spans import CardSpan, Coverage, Gap
from .keys import folder_name
from .place import make_dir, open_file
from .rows import alive, process_start

log = logging.getLogger("giul_asgi.hostshare")

PAGE = 4096
#: Pieces the tape keeps; a follower further behind than this books the rest as a gap.
TAPE_ENTRIES = 4096
ENTRY = 256
#: Opens and closes a ledger's ring keeps between two looks of the holder (tens of ms).
EVENTS = 8192
EVENT = 32
#: Parts of pieces the holder has left for a ledger and it has not taken yet.
ANSWERS = 8192
ANSWER = 24
TAPE_BYTES = PAGE + TAPE_ENTRIES * ENTRY
SEAT_BYTES = PAGE + EVENTS * EVENT + ANSWERS * ANSWER
#: How often the holder looks whether the other ledgers still run, and for new ones (s): a
#: dead one's windows stop counting as the card's members only once it is seen dead.
LIVENESS_S = 0.1
CENSUS_S = 0.5
#: A holder that has published nothing for this long while windows wait is gone or wedged.
HOLDER_STALE_S = 5.0

_TAPE_MAGIC = b"GIULTAP1"
_SEAT_MAGIC = b"GIULSEA1"
# The tape's header: magic, books' sequence lock, pieces published, then its books and the
# holder's state (see Books and _Tape).
_TAPE_HEAD = struct.Struct("<8sQQ24d")
# measured, unattributed, external, retired charged, retired unattributed, retired estimated,
# last piece's end, period, heartbeat, retired received, the holders' reads, failed reads and
# counter resets, the holder's last good reading, the highest measured, unattributed and
# external sums so far (what is shown: a counter never falls), where the holder's tape goes
# on from (a counter's value and its step's time), how many ledgers ever joined, all the card
# drew (idle included) and its idle floor no window was allocated, the departed ledgers' idle
# floor charged and forfeit (the allocated basis, as above idle's)
_T_MEASURED, _T_UNATTRIBUTED, _T_EXTERNAL, _T_R_CHARGED, _T_R_UNATTR, _T_R_ESTIMATED, \
    _T_LAST, _T_PERIOD, _T_BEAT, _T_R_RECEIVED, _T_READS, _T_ERRORS, _T_RESETS, _T_GOOD, \
    _T_MEASURED_TOP, _T_UNATTRIBUTED_TOP, _T_EXTERNAL_TOP, _T_BASE_VALUE, _T_BASE_T, _T_JOINS, \
    _T_DRAWN, _T_IDLE_UNATTR, _T_R_IDLE_CHARGED, _T_R_IDLE_FORFEIT = range(24)
#: A sum that a span measured below idle may lower (a step stamp's error, carried into the next
#: span) and the highest it has been: the books show the highest, so no counter ever falls.
_TOPS = {_T_MEASURED: _T_MEASURED_TOP, _T_UNATTRIBUTED: _T_UNATTRIBUTED_TOP, _T_EXTERNAL: _T_EXTERNAL_TOP}
# A piece: index, kind, fault, tails, quiet, unwatched, level seen lately, foreign process
# (-1 unknown), unseen lately; 15 floats (the last: the span's time with a window open);
# members; why; crc32 of all before it.
_ENTRY = struct.Struct("<QBBBBBBbB15dI96sI")
_SPAN, _GAP = 1, 2
# A ledger's header: magic, pid, start, state, then its books and its counters.
_SEAT_HEAD = struct.Struct("<8sQQQ8d4Q")
_LIVE, _CLOSED = 1, 2
# heartbeat, received, charged, forfeit, in flight, estimated, windows open, given (holder's)
_S_BEAT, _S_RECEIVED, _S_CHARGED, _S_FORFEIT, _S_IN_FLIGHT, _S_ESTIMATED, _S_OPEN, _S_GIVEN = range(8)
_SEAT_FLOATS = 8 + 3 * 8  # where the floats start in a ledger's header
_SEAT_COUNTS = _SEAT_FLOATS + 8 * 8  # events written, answers written, pieces taken, spare
# After the header, in the seat's first page: its idle floor (received, charged, forfeit, in
# flight: the allocated basis, written by it), the idle floor the holder gave it (written by
# the holder), and what its answers showed (a sequence number, then SHOWN).
_SEAT_IDLE, _SEAT_IDLE_GIVEN, _SEAT_SHOWN = 256, 288, 320
_IDLE = struct.Struct("<4d")
#: The card's counters as every ledger answers for them (HostBooks' fields): an answer shows
#: each at the highest any ledger of the host has shown (each publishes what it showed; a
#: departed one's is folded into the tape's), so that no counter falls from any worker's
#: answer after another's, nor when a ledger dies, its holder included.
SHOWN = ("measured_j", "charged_j", "unattributed_j", "foreign_j", "estimated_j", "drawn_j",
         "idle_charged_j", "idle_unattributed_j", "reads", "read_errors", "resets")
_SHOWN = struct.Struct(f"<{len(SHOWN)}d")
_TAPE_SHOWN = 1024  # in the tape's first page: the highest its departed ledgers showed
_EVENT = struct.Struct("<QBxxxxxxxdQ")
_OPEN, _CLOSE = 1, 2
_ANSWER = struct.Struct("<QdI4x")
_Q = struct.Struct("<Q")
_D = struct.Struct("<d")
_TAPE_FLOATS = 24  # where the tape's books start in its header
_RETIRED = 3
_seats = itertools.count(1)  # two ledgers of one process on one card: two seats
_EVENTS_AT = PAGE
_ANSWERS_AT = PAGE + EVENTS * EVENT


class Unusable(OSError):
    """The card's table cannot be joined (the place is full, not ours, damaged): the card is
    then this process's alone, and its figures say so."""


@dataclass(frozen=True, slots=True)
class HostBooks:
    """A card's books summed over every ledger of the host that meters it."""

    #: Ledgers on the card now, this one included.
    workers: int
    measured_j: float
    charged_j: float
    unattributed_j: float
    in_flight_j: float
    windows_open: int
    #: Filled from the prior where no reading covered a window's time (outside the books).
    estimated_j: float = 0.0
    #: What a foreign or unseen load took; the card's reads by every holder, failed reads,
    #: counter resets; seconds since the last piece was published (None: none yet).
    foreign_j: float = 0.0
    reads: int = 0
    read_errors: int = 0
    resets: int = 0
    age_s: float | None = None
    #: All the card drew (idle included), and its idle floor no window was allocated.
    drawn_j: float = 0.0
    idle_unattributed_j: float = 0.0
    #: The idle floor charged to the host's settled windows, and to those not settled yet.
    idle_charged_j: float = 0.0
    idle_in_flight_j: float = 0.0


@dataclass(frozen=True, slots=True)
class SeatBooks:
    """What one ledger publishes of its books: its part of the pieces it took and what became
    of it (``received == charged + forfeit + in flight``; charged and forfeit as the highest
    they have been, so that the card's counters never fall)."""

    received_j: float
    charged_j: float
    forfeit_j: float
    in_flight_j: float
    estimated_j: float
    windows_open: int
    #: The same of the idle floor its windows were allocated (the allocated basis).
    idle_received_j: float = 0.0
    idle_charged_j: float = 0.0
    idle_forfeit_j: float = 0.0
    idle_in_flight_j: float = 0.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


class _Map:
    """One file of the table, mapped read-write, with its size reserved on the filesystem."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = open_file(path, flags)
        try:
            if create:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not a SIGBUS later
            elif os.fstat(fd).st_size < size:
                raise Unusable(f"{path.name} is {os.fstat(fd).st_size} bytes, not {size}")
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()


def _create(path: Path, size: int, header: bytes) -> bool:
    """Create ``path`` (exclusively: of two processes that race, one makes it), reserve its
    size and write its header last, so a reader that finds the header finds the whole file.
    Returns False where another process made it first."""
    try:
        made = _Map(path, size, create=True)
    except FileExistsError:
        return False
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a half-made file (no room): nobody may take it for a table
        raise
    try:
        made.mm[: len(header)] = header
    finally:
        made.close()
    return True


def _open_made(path: Path, size: int, magic: bytes, *, wait_s: float = 2.0) -> _Map:
    """Map a file another process may be making this instant: wait (briefly) for its header."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            made = _Map(path, size, create=False)
        except Unusable:
            made = None  # not its full size yet
        if made is not None:
            if bytes(made.mm[: len(magic)]) == magic:
                return made
            made.close()
        if time.monotonic() > deadline:
            raise Unusable(f"{path.name} is not one of ours (damaged, or another version)")
        time.sleep(0.005)


@dataclass(slots=True)
class _Remote:
    """Another ledger's seat as the holder follows it: its windows, read from its ring."""

    name: str
    seat: _Map
    pid: int
    start: int
    events_read: int = 0
    windows: dict[int, list[float]] = field(default_factory=dict)  # id -> [t_open, t_close]
    last_close: float = -math.inf
    pruned_close: float = -math.inf

    def read_events(self) -> None:
        mm = self.seat.mm
        written = _Q.unpack_from(mm, _SEAT_COUNTS)[0]
        if written - self.events_read > EVENTS:
            log.warning("card table: %s wrote %d opens and closes between two looks; some were lost",
                        self.name, written - self.events_read)
            self.events_read = written - EVENTS
        while self.events_read < written:
            at = _EVENTS_AT + (self.events_read % EVENTS) * EVENT
            index, kind, t, window = _EVENT.unpack_from(mm, at)
            if index != self.events_read or not math.isfinite(t):
                break  # being written: read next time
            if kind == _OPEN:
                self.windows[window] = [t, math.inf]
            elif kind == _CLOSE:
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


_swept: set[Path] = set()  # the places whose forgotten cards this process has removed


class CardTable:
    """This ledger's seat at one card's table: its own file, the tape, and the lock.

    Built on the reader thread (it creates files); the request path only calls
    :meth:`opened` and :meth:`closed` (two stores each). Raises :class:`Unusable` (an OSError)
    when the table cannot be joined.
    """

    def __init__(self, directory: Path, key: str, node: str, *, ramp_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key = key
        self.node = node
        self.ramp_s = ramp_s
        self.clock = clock
        cards = make_dir(directory / "cards", root=directory)
        self.folder = make_dir(cards / folder_name(key), root=directory)
        if directory not in _swept:  # once a process: the cards nobody reads any more go
            _swept.add(directory)
            sweep_cards(directory, keep=self.folder)
        pid = os.getpid()
        start = process_start(pid)
        self.name = f"p-{pid}-{start or 0}-{next(_seats)}"
        self._maps: list[_Map] = []
        self._lock_fd: int | None = None
        self.holding = False
        self._remotes: dict[str, _Remote] = {}
        try:
            tape_path = self.folder / "tape"
            _create(tape_path, TAPE_BYTES, _TAPE_MAGIC)
            self.tape = _open_made(tape_path, TAPE_BYTES, _TAPE_MAGIC)
            self._maps.append(self.tape)
            header = _SEAT_HEAD.pack(_SEAT_MAGIC, pid, int(start or 0), _LIVE, *([0.0] * 8), 0, 0, 0, 0)
            _create(self.folder / self.name, SEAT_BYTES, header)
            self.seat = self._map(self.folder / self.name, SEAT_BYTES)
            self._lock_fd = open_file(self.folder / "lock", os.O_RDWR | os.O_CREAT)
            # Say so: the holder looks for new ledgers at once (a burst's windows, opened just
            # after a worker joined, read as a foreign load when it looked twice a second).
            self._add(_T_JOINS, 1.0)
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
        self._looked = self._census_t = -math.inf
        self._joins = -1.0
        self._last_t1: float | None = None
        self._counted = (0, 0, 0)  # this holder's tape's reads, errors, resets already counted
        #: One answer for the card's books at a time in this process: what it shows is
        #: written in its seat before the answer goes out, never after a later answer's.
        self._answering = threading.Lock()

    def _map(self, path: Path, size: int) -> _Map:
        made = _Map(path, size, create=False)
        self._maps.append(made)
        return made

    # -- the request path: two stores ---------------------------------------------------------
    def opened(self, window: int, t: float) -> None:
        with self._events_lock:
            self._posted.add(window)
            self._event(_OPEN, window, t)

    def closed(self, window: int, t: float) -> None:
        with self._events_lock:
            if window in self._posted:
                self._posted.discard(window)
                self._event(_CLOSE, window, t)
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
                    self._event(_OPEN, window, t)

    def _event(self, kind: int, window: int, t: float) -> None:
        index = self._events
        mm = self.seat.mm
        _EVENT.pack_into(mm, _EVENTS_AT + (index % EVENTS) * EVENT, index, kind, t, window)
        self._events = index + 1
        _Q.pack_into(mm, _SEAT_COUNTS, index + 1)

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
        self._taken = max(self._taken, self._published())
        last = self._tape_float(_T_LAST)
        self._last_t1 = last if last > 0 else None
        self.look(force=True)
        return True

    def look(self, *, force: bool = False) -> None:
        """Holder: read every other ledger's new opens and closes; ten times a second see
        whether they still run, and twice a second who joined (a departed ledger's books go
        to the tape's)."""
        now = self.clock()
        joins = self._tape_float(_T_JOINS)
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
                remote = self._join_remote(name)
                if remote is None:
                    continue
            self._check(remote)
        for name in [n for n in self._remotes if n not in names]:
            self._remotes.pop(name).seat.close()

    def _check(self, remote: _Remote) -> None:
        """Retire a ledger that has left or died."""
        state = _Q.unpack_from(remote.seat.mm, 24)[0]
        if state == _RETIRED:  # counted in the tape's books already: only its file is left
            with contextlib.suppress(OSError):
                os.unlink(remote.seat.path)
            self._remotes.pop(remote.name).seat.close()
            return
        if state != _LIVE or not alive(remote.pid, str(remote.start) if remote.start else None):
            remote.read_events()
            self._retire(remote)

    def _join_remote(self, name: str) -> _Remote | None:
        try:
            seat = _Map(self.folder / name, SEAT_BYTES, create=False)
        except (OSError, ValueError) as exc:
            log.debug("card table: skipping %s: %s", name, exc)
            return None
        magic, pid, start = struct.unpack_from("<8sQQ", seat.mm, 0)
        if magic != _SEAT_MAGIC or not pid:
            seat.close()
            return None
        remote = _Remote(name, seat, pid, start)
        # Opens and closes already in its ring: a window open since before this holder.
        remote.events_read = max(0, _Q.unpack_from(seat.mm, _SEAT_COUNTS)[0] - EVENTS)
        self._remotes[name] = remote
        return remote

    def _retire(self, remote: _Remote) -> None:
        """A ledger has gone: its books move into the tape's (what it had been given and not
        charged is lost with it: unattributed), and its file is removed."""
        books = [_finite(v) for v in struct.unpack_from("<8d", remote.seat.mm, _SEAT_FLOATS)]
        charged, forfeit, estimated = books[_S_CHARGED], books[_S_FORFEIT], books[_S_ESTIMATED]
        # What it took: what the holder gave it (a follower), or what it took as holder.
        took = max(books[_S_GIVEN], books[_S_RECEIVED])
        row = self._seat_books(remote.seat.mm)
        idle_charged, idle_forfeit = (row.idle_charged, row.idle_forfeit) if row else (0.0, 0.0)
        idle_took = max(row.idle_given, row.idle_received) if row else 0.0
        shown = row.shown if row else None
        with self._books():
            self._add(_T_R_CHARGED, charged)
            # Its forfeit, and what it had in flight or in transit: never less than the forfeit
            # already shown (the seat shows its highest), so no counter falls.
            self._add(_T_R_UNATTR, max(forfeit, took - charged))
            self._add(_T_R_ESTIMATED, estimated)
            self._add(_T_R_RECEIVED, took)
            self._add(_T_R_IDLE_CHARGED, idle_charged)
            self._add(_T_R_IDLE_FORFEIT, max(idle_forfeit, idle_took - idle_charged))
            if shown is not None:  # what it showed, every process sees still
                tops = _SHOWN.unpack_from(self.tape.mm, _TAPE_SHOWN)
                _SHOWN.pack_into(self.tape.mm, _TAPE_SHOWN, *map(max, map(_finite, tops), shown))
            _Q.pack_into(remote.seat.mm, 24, _RETIRED)  # counted in the tape's books now
        with contextlib.suppress(OSError):
            os.unlink(remote.seat.path)
        remote.seat.close()
        self._remotes.pop(remote.name, None)

    def coverages(self, t0: float, t1: float) -> dict[str, Coverage]:
        """Holder: every other ledger's windows' time in (t0, t1]."""
        return {name: r.coverage(t0, t1, self.ramp_s) for name, r in self._remotes.items()}

    def others_busy(self, now: float, period: float) -> bool:
        """Holder: another ledger has windows the card has yet to report."""
        return any(r.busy(now, self.ramp_s, period) for r in self._remotes.values())

    def others_open_at(self, t: float) -> int:
        """Holder: the other ledgers' windows open at ``t`` (or closed a ramp-down before)."""
        lag = t - self.ramp_s
        return sum(1 for r in self._remotes.values() for t_open, t_close in r.windows.values()
                   if t_open <= t and t_close > lag)

    @property
    def others(self) -> int:
        """Holder: other ledgers at the table."""
        return len(self._remotes)

    def publish(self, piece: CardSpan | Gap, coverages: Mapping[str, Coverage], period: float) -> None:
        """Holder: publish one decided piece, and each other ledger's part of it."""
        last = self._last_t1
        if last is not None and piece.t0 > last + 1e-9:
            # The card changed hands (or this holder's tape began later): nobody read it then.
            self._publish(Gap(last, piece.t0, "the card's reader changed hands; nobody read it meanwhile"),
                          {}, period)
        self._publish(piece, coverages, period)

    def _publish(self, piece: CardSpan | Gap, coverages: Mapping[str, Coverage], period: float) -> None:
        index = _Q.unpack_from(self.tape.mm, 16)[0]
        if isinstance(piece, CardSpan):
            for name, coverage in coverages.items():
                mine = coverage.by(piece.tails)
                remote = self._remotes.get(name)
                if mine > 0 and remote is not None:
                    self._answer(remote, index, mine, piece.part(mine), piece.idle_part(mine))
            payload = (index, _SPAN, 0, piece.tails, piece.quiet, piece.unwatched, piece.level_recent,
                       -1 if piece.processes_foreign is None else int(piece.processes_foreign),
                       piece.unseen_recent, piece.t0, piece.t1, piece.above_j, piece.total_j,
                       piece.stamp_s, piece.unc_j, piece.measured_j, piece.covered, piece.unseen,
                       piece.foreign_j, piece.doubt_w, piece.foreign_unc_w,
                       math.nan if piece.level is None else piece.level, piece.period, piece.busy_s,
                       piece.members, b"")
            with self._books():
                self._add(_T_MEASURED, piece.measured_j)
                self._add(_T_UNATTRIBUTED, piece.unattributed_j)
                self._add(_T_EXTERNAL, piece.external_j)
                self._add(_T_DRAWN, piece.total_j)
                self._add(_T_IDLE_UNATTR, piece.idle_unattributed_j)
        else:
            payload = (index, _GAP, piece.fault, 0, 0, 0, 0, -1, 0, piece.t0, piece.t1,
                       *([0.0] * 11), period, 0.0, 0, piece.why.encode()[:96])
        packed = _ENTRY.pack(*payload, 0)
        crc = zlib.crc32(packed[: _ENTRY.size - 4])
        at = PAGE + (index % TAPE_ENTRIES) * ENTRY
        self.tape.mm[at:at + _ENTRY.size] = packed[:-4] + struct.pack("<I", crc)
        self._set(_T_LAST, piece.t1)
        self._set(_T_PERIOD, period)
        self._set(_T_BEAT, self.clock())
        _Q.pack_into(self.tape.mm, 16, index + 1)
        self._last_t1 = piece.t1
        self._taken = index + 1
        for remote in self._remotes.values():
            remote.prune(piece.t1 - self.ramp_s - 1.0)

    def _answer(self, remote: _Remote, index: int, mine: float, given: float, idle: float) -> None:
        mm = remote.seat.mm
        written = _Q.unpack_from(mm, _SEAT_COUNTS + 8)[0]
        crc = zlib.crc32(struct.pack("<Qd", index, mine))
        _ANSWER.pack_into(mm, _ANSWERS_AT + (written % ANSWERS) * ANSWER, index, mine, crc)
        at = _SEAT_FLOATS + 8 * _S_GIVEN
        _D.pack_into(mm, at, _finite(_D.unpack_from(mm, at)[0]) + given)
        _D.pack_into(mm, _SEAT_IDLE_GIVEN, _finite(_D.unpack_from(mm, _SEAT_IDLE_GIVEN)[0]) + idle)
        _Q.pack_into(mm, _SEAT_COUNTS + 8, written + 1)

    def note_baseline(self, baseline: tuple[float, float] | None) -> None:
        """Holder: where its tape goes on from, for whoever takes the card over next."""
        if baseline is not None:
            self._set(_T_BASE_VALUE, baseline[0])
            self._set(_T_BASE_T, baseline[1])

    def baseline(self) -> tuple[float, float] | None:
        """Where the last holder's tape went on from (None: never said)."""
        t = self._tape_float(_T_BASE_T)
        return (self._tape_float(_T_BASE_VALUE), t) if t > 0 else None

    def count_reads(self, reads: int, errors: int, resets: int, good_t: float | None) -> None:
        """Holder: its tape's reads, failed reads and resets so far (the card's counters add
        every holder's, so they never fall when the card changes hands), and when it last
        read the card well."""
        if good_t is not None:
            self._set(_T_GOOD, good_t)
        before = self._counted
        if (reads, errors, resets) == before:
            return
        with self._books():
            self._add(_T_READS, max(0, reads - before[0]))
            self._add(_T_ERRORS, max(0, errors - before[1]))
            self._add(_T_RESETS, max(0, resets - before[2]))
        self._counted = (reads, errors, resets)

    def beat(self) -> None:
        """Holder: say it is alive (followers whose windows wait look at this)."""
        self._set(_T_BEAT, self.clock())

    # -- following ----------------------------------------------------------------------------------
    def pending(self) -> list[tuple[CardSpan | Gap, float]]:
        """Follower: the pieces the holder published since the last call, each with this
        ledger's part of it (window-seconds; 0 where it had none)."""
        mm = self.tape.mm
        published = _Q.unpack_from(mm, 16)[0]
        out: list[tuple[CardSpan | Gap, float]] = []
        if published - self._taken > TAPE_ENTRIES:
            skipped = published - TAPE_ENTRIES
            first = self._entry(skipped)
            if first is not None and self._last_t1 is not None:
                out.append((Gap(self._last_t1, first.t0, "this process fell behind the card's tape"), 0.0))
            self._taken = skipped
        while self._taken < published:
            piece = self._entry(self._taken)
            if piece is None:
                break  # being written: taken next time
            out.append((piece, self._answer_for(self._taken)))
            self._last_t1 = piece.t1
            self._taken += 1
        _Q.pack_into(self.seat.mm, _SEAT_COUNTS + 16, self._taken)
        return out

    def _entry(self, index: int) -> CardSpan | Gap | None:
        at = PAGE + (index % TAPE_ENTRIES) * ENTRY
        raw = bytes(self.tape.mm[at:at + _ENTRY.size])
        if zlib.crc32(raw[:-4]) != struct.unpack_from("<I", raw, _ENTRY.size - 4)[0]:
            return None
        (seq, kind, fault, tails, quiet, unwatched, level_recent, foreign, unseen_recent, t0, t1, above,
         total, stamp, unc, measured, covered, unseen, foreign_j, doubt, foreign_unc, level, period, busy,
         members, why, _) = _ENTRY.unpack(raw)
        if seq != index or not (math.isfinite(t0) and math.isfinite(t1)):
            return None
        if kind == _GAP:
            return Gap(t0, t1, why.rstrip(b"\0").decode(errors="replace") or "no reading", bool(fault))
        values = [_finite(v) for v in (above, total, stamp, unc, measured, covered, unseen, foreign_j,
                                        doubt, foreign_unc)]
        return CardSpan(
            t0, t1, values[0], values[1], values[2], values[3], values[4], tails=bool(tails),
            covered=max(0.0, values[5]), members=members, unseen=max(0.0, values[6]),
            foreign_j=values[7], quiet=bool(quiet), doubt_w=values[8], foreign_unc_w=values[9],
            unwatched=bool(unwatched), level=level if math.isfinite(level) else None,
            level_recent=bool(level_recent), processes_foreign=None if foreign < 0 else bool(foreign),
            unseen_recent=bool(unseen_recent), period=period if math.isfinite(period) and period > 0 else 0.1,
            busy_s=max(0.0, _finite(busy)),
        )

    def _answer_for(self, index: int) -> float:
        mm = self.seat.mm
        written = _Q.unpack_from(mm, _SEAT_COUNTS + 8)[0]
        if written - self._answers_read > ANSWERS:
            self._answers_read = written - ANSWERS
        while self._answers_read < written:
            at = _ANSWERS_AT + (self._answers_read % ANSWERS) * ANSWER
            seq, mine, crc = _ANSWER.unpack_from(mm, at)
            if crc != zlib.crc32(struct.pack("<Qd", seq, mine)) or seq > index:
                return 0.0
            self._answers_read += 1
            if seq == index:
                return mine if math.isfinite(mine) and mine > 0 else 0.0
        return 0.0

    def holder_age(self) -> float | None:
        """Seconds since the holder last said it was alive (None: nobody ever held it)."""
        beat = self._tape_float(_T_BEAT)
        return max(0.0, self.clock() - beat) if beat > 0 else None

    def reading_age(self) -> float | None:
        """Seconds since the card's holder last read it well (None: never)."""
        good = self._tape_float(_T_GOOD)
        return max(0.0, self.clock() - good) if good > 0 else None

    @property
    def period(self) -> float | None:
        period = self._tape_float(_T_PERIOD)
        return period if period > 0 else None

    # -- books ----------------------------------------------------------------------------------
    def publish_books(self, books: SeatBooks) -> None:
        """This ledger's books, for anyone who answers for the card's."""
        _D.pack_into(self.seat.mm, _SEAT_FLOATS + 8 * _S_BEAT, self.clock())
        struct.pack_into("<6d", self.seat.mm, _SEAT_FLOATS + 8 * _S_RECEIVED, books.received_j,
                         books.charged_j, books.forfeit_j, books.in_flight_j, books.estimated_j,
                         float(books.windows_open))
        _IDLE.pack_into(self.seat.mm, _SEAT_IDLE, books.idle_received_j, books.idle_charged_j,
                        books.idle_forfeit_j, books.idle_in_flight_j)

    def host(self, mine: SeatBooks) -> HostBooks:
        """The card's books on the whole host: the tape's, the departed ledgers', every live
        ledger's (``mine``: this one's, now, published first). The same from every ledger,
        and no counter falls from any ledger's answer after any other's: each is shown at
        the highest any of them showed (this one's written in its seat before the answer
        goes out; a departed ledger's is kept in the tape's)."""
        with self._answering:
            self.publish_books(mine)
            seats = self._seats()
            for _ in range(8):
                seq = _Q.unpack_from(self.tape.mm, 8)[0]
                if seq % 2:
                    time.sleep(0)
                    continue
                tape, tops, rows = self._read_books(seats)
                if _Q.unpack_from(self.tape.mm, 8)[0] == seq:
                    break
            else:
                tape, tops, rows = self._read_books(seats)
            own = self._seat_books(self.seat.mm)
            live = [r for r in rows if r is not None]
            everyone = [*live, own] if own is not None else live
            # The other ledgers' in transit: what the holder gave them that they have not taken.
            in_flight = sum(r.in_flight for r in everyone) + sum(r.in_transit for r in live)
            idle_in_flight = sum(r.idle_in_flight for r in everyone) + sum(r.idle_in_transit for r in live)
            now = (  # in SHOWN's order
                tape[_T_MEASURED_TOP], tape[_T_R_CHARGED] + sum(r.charged for r in everyone),
                tape[_T_UNATTRIBUTED_TOP] + tape[_T_R_UNATTR] + sum(r.forfeit for r in everyone),
                tape[_T_EXTERNAL_TOP], tape[_T_R_ESTIMATED] + sum(r.estimated for r in everyone),
                tape[_T_DRAWN], tape[_T_R_IDLE_CHARGED] + sum(r.idle_charged for r in everyone),
                tape[_T_IDLE_UNATTR] + tape[_T_R_IDLE_FORFEIT] + sum(r.idle_forfeit for r in everyone),
                tape[_T_READS], tape[_T_ERRORS], tape[_T_RESETS])
            shown = [max(value, top, *(r.shown[k] for r in everyone if r.shown is not None))
                     for k, (value, top) in enumerate(zip(now, tops, strict=True))]
            _write_shown(self.seat.mm, shown)
        (measured, charged, unattributed, foreign, estimated, drawn, idle_charged, idle_unattributed,
         reads, errors, resets) = shown
        return HostBooks(
            workers=len(everyone), measured_j=measured, charged_j=charged, unattributed_j=unattributed,
            in_flight_j=in_flight, windows_open=int(sum(r.windows_open for r in everyone)),
            estimated_j=estimated, foreign_j=foreign, reads=int(reads), read_errors=int(errors),
            resets=int(resets), age_s=max(0.0, self.clock() - tape[_T_GOOD]) if tape[_T_GOOD] > 0 else None,
            drawn_j=drawn, idle_unattributed_j=idle_unattributed, idle_charged_j=idle_charged,
            idle_in_flight_j=idle_in_flight,
        )

    def _read_books(self, seats: list[mmap.mmap]) -> tuple[list[float], list[float], list[_Row | None]]:
        tape = [_finite(v) for v in struct.unpack_from("<24d", self.tape.mm, _TAPE_FLOATS)]
        tops = [_finite(v) for v in _SHOWN.unpack_from(self.tape.mm, _TAPE_SHOWN)]
        return tape, tops, [self._seat_books(mm) for mm in seats]

    def _published(self) -> int:
        return int(_Q.unpack_from(self.tape.mm, 16)[0])

    def _seats(self) -> list[mmap.mmap]:
        """Every other ledger's header, mapped read-only for this look (any thread: the
        holder's own maps belong to its reader thread, which may close them meanwhile)."""
        found = []
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith("p-") and n != self.name]
        except OSError:
            return []
        for name in names:
            try:
                fd = open_file(self.folder / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                found.append(mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ))
            except (OSError, ValueError):
                continue
            finally:
                os.close(fd)
        return found

    @staticmethod
    def _seat_books(mm: mmap.mmap) -> _Row | None:
        magic, pid, _start, state = struct.unpack_from("<8sQQQ", mm, 0)
        del pid
        if magic != _SEAT_MAGIC or state not in (_LIVE, _CLOSED):
            return None
        v = [_finite(x) for x in struct.unpack_from("<8d", mm, _SEAT_FLOATS)]
        received, charged, forfeit, in_flight = (_finite(x) for x in _IDLE.unpack_from(mm, _SEAT_IDLE))
        return _Row(v[_S_RECEIVED], v[_S_CHARGED], v[_S_FORFEIT], v[_S_IN_FLIGHT], v[_S_ESTIMATED],
                    v[_S_OPEN], v[_S_GIVEN], received, charged, forfeit, in_flight,
                    _finite(_D.unpack_from(mm, _SEAT_IDLE_GIVEN)[0]), _read_shown(mm))

    def _books(self) -> _SeqLock:
        return _SeqLock(self.tape.mm)

    def _add(self, index: int, value: float) -> None:
        total = self._tape_float(index) + _finite(value)
        self._set(index, total)
        top = _TOPS.get(index)
        if top is not None and total > self._tape_float(top):
            self._set(top, total)

    def _set(self, index: int, value: float) -> None:
        _D.pack_into(self.tape.mm, _TAPE_FLOATS + 8 * index, value)

    def _tape_float(self, index: int) -> float:
        return _finite(_D.unpack_from(self.tape.mm, _TAPE_FLOATS + 8 * index)[0])

    # -- leaving ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the table: this ledger's books stay until the holder folds them into the
        tape's; the lock goes to whoever asks next."""
        seat = getattr(self, "seat", None)
        if seat is not None and not seat.mm.closed:
            _Q.pack_into(seat.mm, 24, _CLOSED)
        for remote in list(self._remotes.values()):
            remote.seat.close()
        self._remotes = {}
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
        self.holding = False
        for made in self._maps:
            made.close()
        self._maps = []


class _Row(NamedTuple):
    """A seat's books as :meth:`CardTable._seat_books` reads them: above idle, then the
    idle floor (the allocated basis); ``given`` is the holder's word; what its answers
    showed (None: unreadable)."""

    received: float
    charged: float
    forfeit: float
    in_flight: float
    estimated: float
    windows_open: float
    given: float
    idle_received: float
    idle_charged: float
    idle_forfeit: float
    idle_in_flight: float
    idle_given: float
    shown: tuple[float, ...] | None

    @property
    def in_transit(self) -> float:
        """What the holder gave it that it has not taken yet (above idle)."""
        return max(0.0, self.given - self.received)

    @property
    def idle_in_transit(self) -> float:
        return max(0.0, self.idle_given - self.idle_received)



def _read_shown(mm: mmap.mmap) -> tuple[float, ...] | None:
    """What a seat's answers showed, from the last of its two slots written whole (a
    ledger killed while writing one leaves the other); None where it kept changing."""
    for _ in range(8):
        seq = _Q.unpack_from(mm, _SEAT_SHOWN)[0]
        values = _SHOWN.unpack_from(mm, _SEAT_SHOWN + 8 + (seq % 2) * _SHOWN.size)
        if _Q.unpack_from(mm, _SEAT_SHOWN)[0] - seq <= 1:  # the other slot, at most, was rewritten
            return tuple(_finite(v) for v in values)
        time.sleep(0)
    return None


def _write_shown(mm: mmap.mmap, values: Iterable[float]) -> None:
    """Write what this seat's answer shows into its other slot, then make that slot the last."""
    seq = _Q.unpack_from(mm, _SEAT_SHOWN)[0]
    _SHOWN.pack_into(mm, _SEAT_SHOWN + 8 + ((seq + 1) % 2) * _SHOWN.size, *values)
    _Q.pack_into(mm, _SEAT_SHOWN, seq + 1)


class _SeqLock:
    """The tape's books are changed between an odd and an even sequence number: a reader
    that saw the same even number before and after read them whole."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm

    def __enter__(self) -> None:
        _Q.pack_into(self.mm, 8, _Q.unpack_from(self.mm, 8)[0] | 1)

    def __exit__(self, *exc: object) -> None:
        _Q.pack_into(self.mm, 8, (_Q.unpack_from(self.mm, 8)[0] | 1) + 1)


#: A card's folder untouched this long, with nobody holding or sitting at it, is removed.
FORGET_CARD_S = 60.0


def _seat_alive(name: str) -> bool:
    """Whether the seat file ``p-<pid>-<start>-<n>`` belongs to a process that still runs."""
    parts = name.split("-")
    if len(parts) != 4 or not parts[1].isdigit():
        return True  # not a seat of ours: leave the folder alone
    return alive(int(parts[1]), parts[2] if parts[2] != "0" else None)


def sweep_cards(directory: Path, keep: Path | None = None) -> int:
    """Remove the folders of cards nobody reads any more: no process holds the lock, every
    seat's process is gone, nothing changed for :data:`FORGET_CARD_S` (a demo's card named
    for its port, a fake GPU's: each 1.5 MB that a hostile tester saw pile up to 650 MB).
    Runs when a ledger joins a table, on its reader thread; returns how many went."""
    removed = 0
    try:
        entries = list(os.scandir(directory / "cards"))
    except OSError:
        return 0
    uid = os.getuid()
    for entry in entries:
        folder = Path(entry.path)
        try:
            info = entry.stat(follow_symlinks=False)
            if (folder == keep or info.st_uid != uid or not entry.is_dir(follow_symlinks=False)
                    or time.time() - info.st_mtime < FORGET_CARD_S):
                continue
            names = os.listdir(folder)
            if any(n.startswith("p-") and _seat_alive(n) for n in names):
                continue
            fd = open_file(folder / "lock", os.O_RDWR | os.O_CREAT)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # somebody holds the card: it is read
            if time.time() - os.stat(folder, follow_symlinks=False).st_mtime < FORGET_CARD_S:
                continue  # a ledger sat down meanwhile
            for name in os.listdir(folder):
                if name != "lock":
                    with contextlib.suppress(OSError):
                        os.unlink(folder / name)
            with contextlib.suppress(OSError):
                os.unlink(folder / "lock")
                os.rmdir(folder)
                removed += 1
        finally:
            os.close(fd)
    return removed


def ledgers_on(directory: Path, key: str) -> Iterable[str]:
    """The ledgers' files at a card's table (for tests and the bound)."""
    folder = directory / "cards" / folder_name(key)
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("p-"))
    except OSError:
        return []


__all__ = ["FORGET_CARD_S", "HOLDER_STALE_S", "CardTable", "HostBooks", "SeatBooks", "Unusable",
           "ledgers_on", "sweep_cards"]
