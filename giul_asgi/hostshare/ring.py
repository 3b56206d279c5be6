"""One ring of records in a memory-mapped file: written in place by one process, read by any.

A record must outlive its process: a worker killed with ``kill -9`` right after it answered
has handed out an id that a client will look up at another worker. So a record is written
where the kernel keeps it, before the answer goes: a store into a shared mapping of a file in
the host's place (``MAP_SHARED``: the page cache holds it once the process is gone, and the
other processes map the same pages). Nothing on that path is a system call: the bytes go in
with one copy, then the header's cursor moves. Space is reserved with ``posix_fallocate``
when the file is made, so a full place fails there, loudly, never as a ``SIGBUS`` later.

The file is a page of header and a ring of entries, each aligned to :data:`UNIT` bytes:

- the header: magic, the ring's capacity, ``written`` (bytes ever written: an entry starting
  at absolute offset ``a`` lies at ``a % capacity``), ``oldest`` (where the oldest entry that
  survives starts), the writer's ``max_age_s``; then a table of id prefixes (one per process
  whose records the ring holds, with the highest counter written, the highest counter dropped
  and the highest dropped while still young: why an id is gone, see :class:`Prefix`);
- an entry: ``magic, total, crc, t, counter, prefix row, id length, data length``, the id,
  the data. The CRC covers the entry and its absolute offset, so a reader never takes a torn
  entry, nor an entry of another lap for the one it expected;
- a wrap mark where the next entry does not fit before the end.

The writer moves ``oldest`` past the entries it is about to overwrite *before* it writes, and
``written`` *after*: a reader copies what lies between the two, checks each entry's CRC, and
drops whatever starts before ``oldest`` as read again after its copy. One writer at a time:
a process's own ring has one writer (under its lock); a ring written by several processes
(the server's fold) is written under ``flock``.

``time.monotonic()`` is one clock for every process of a Linux host, so entry times line up.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .place import open_file

UNIT = 64
HEAD_BYTES = 4096
MAGIC = b"GIULRNG1"
ENTRY_MAGIC = b"GRE1"
WRAP_MAGIC = b"GRW1"
# magic, capacity, written, oldest, max age (s)
_HEAD = struct.Struct("<8sQQQd")
_WRITTEN_AT, _OLDEST_AT = 16, 24
# prefix, highest counter written, highest dropped, highest dropped while younger than max age
_ROW = struct.Struct("<24sQQQ")
_HIGH, _DROPPED, _EVICTED = 24, 32, 40  # where each counter sits in a row
ROWS_AT = 64
ROWS = (HEAD_BYTES - ROWS_AT) // _ROW.size
# magic, total, crc, t, counter, prefix row, id length, data length
_ENTRY = struct.Struct("<4sIIdQHHI")
_CRC = struct.Struct("<I")
_CRC_FROM = 12  # the CRC covers the entry from t on
_Q = struct.Struct("<Q")
#: The longest id a ring takes (a meter's ids are about 20 bytes).
MAX_ID = 200
#: A full ring's writer makes room for this many bytes beyond the entry it writes (at most a
#: sixteenth of the ring): a dozen records' worth dropped at once.
ROOM_AHEAD = 8 * 1024


class RingError(OSError):
    """A ring that cannot be made or read (a full place, a file that is not one of ours)."""


@dataclass(frozen=True, slots=True)
class Prefix:
    """What a ring knows of one process's ids (``<prefix><counter>``): the highest counter
    written, the highest whose entry was overwritten, and the highest overwritten while
    younger than the max age (evicted for room, not expired)."""

    prefix: str
    high: int
    dropped: int
    evicted: int
    #: Its row in the ring's table (what the ring's entries name it by).
    row: int = -1


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry as read: where it starts (absolute), its time, its id and data."""

    at: int
    total: int
    t: float
    counter: int
    row: int
    key: str
    data: bytes


def entry_size(key: bytes, data: bytes) -> int:
    """The bytes an entry takes in the ring (header, id, data, padding)."""
    return -(-(_ENTRY.size + len(key) + len(data)) // UNIT) * UNIT


def _store(mm: mmap.mmap, at: int, value: int) -> None:
    """A cursor written as one 8-byte copy. struct's pack_into stores a Q byte by byte, and its
    unpack_from loads one so: a reader in another process took a cursor half moved (a ring of
    4 KiB copied as 8 KiB: ``struct.error`` out of :meth:`Ring.entries`, a hostile review)."""
    mm[at: at + 8] = _Q.pack(value)


def _load(mm: mmap.mmap, at: int) -> int:
    """A cursor read as one 8-byte copy (see :func:`_store`)."""
    return int(_Q.unpack(mm[at: at + 8])[0])


def _crc(at: int, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(_Q.pack(at)))


class Ring:
    """A ring file mapped read-write (its writer) or read-only (anyone else)."""

    def __init__(self, path: Path, mm: mmap.mmap, *, writable: bool) -> None:
        self.path = path
        self.mm = mm
        self.writable = writable
        magic, capacity, _, _, max_age = _HEAD.unpack_from(mm, 0)
        if magic != MAGIC or capacity % UNIT or len(mm) < HEAD_BYTES + capacity or capacity < UNIT:
            raise RingError(f"{path.name} is not a ring of ours (damaged, or another version)")
        self.capacity = capacity
        self.max_age_s = max_age
        # The writer's cursor and each row's highest counter, kept between two writes (one
        # writer at a time: read from the header when the ring is opened for writing).
        self._written = self.written
        self._oldest = self.oldest
        self._counts: dict[tuple[int, int], int] = {}  # (row, field) -> its value
        self._high: dict[int, int] = {}  # row -> its highest counter written (the quick check)
        self._ahead = min(ROOM_AHEAD, capacity // 16) // UNIT * UNIT
        #: Units read that held no whole entry where one should start (damage, or a stranger's
        #: bytes): skipped, and said once by whoever reads.
        self.damaged = 0

    # -- making and opening -----------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, final: Path | None, capacity: int, max_age_s: float) -> Ring:
        """Make a ring at ``path`` (exclusively), reserve its space, write its header, and
        (with ``final``) rename it there once whole. Raises OSError (ENOSPC: the place is full)."""
        capacity = max(UNIT, capacity // UNIT * UNIT)
        size = HEAD_BYTES + capacity
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            try:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not a SIGBUS at a store later
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            mm[: _HEAD.size] = _HEAD.pack(MAGIC, capacity, 0, 0, float(max_age_s))
            if final is not None:
                os.replace(path, final)
                path = final
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return cls(path, mm, writable=True)

    @classmethod
    def open(cls, path: Path, *, writable: bool = False) -> Ring:
        """Map another process's ring (read-only unless ``writable``: the fold). Raises OSError."""
        fd = open_file(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < HEAD_BYTES + UNIT:
                raise RingError(f"{path.name} is {size} bytes: not a ring of ours")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(fd)
        try:
            return cls(path, mm, writable=writable)
        except BaseException:
            mm.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()

    # -- the header ---------------------------------------------------------------------------
    @property
    def written(self) -> int:
        return _load(self.mm, _WRITTEN_AT)

    @property
    def oldest(self) -> int:
        return _load(self.mm, _OLDEST_AT)

    def prefixes(self) -> list[Prefix]:
        """The id prefixes this ring holds records of (see :class:`Prefix`)."""
        out = []
        for i in range(ROWS):
            at = ROWS_AT + i * _ROW.size  # the row copied whole: its counters as _raise wrote them
            raw, high, dropped, evicted = _ROW.unpack(self.mm[at: at + _ROW.size])
            name = raw.rstrip(b"\0")
            if name:
                out.append(Prefix(name.decode("ascii", "replace"), high, dropped, evicted, i))
        return out

    def row(self, prefix: str) -> int:
        """The table row of ``prefix``: found, else a free one, else the one whose counters
        are lowest (reused). The writer's only."""
        raw = prefix.encode("ascii", "replace")[:24]
        free = lowest = -1
        low = None
        for i in range(ROWS):
            name, high, _, _ = _ROW.unpack_from(self.mm, ROWS_AT + i * _ROW.size)
            name = name.rstrip(b"\0")
            if name == raw:
                return i
            if not name and free < 0:
                free = i
            if low is None or high < low:
                low, lowest = high, i
        at = free if free >= 0 else lowest
        _ROW.pack_into(self.mm, ROWS_AT + at * _ROW.size, raw, 0, 0, 0)
        for field in (_HIGH, _DROPPED, _EVICTED):
            self._counts.pop((at, field), None)
        self._high.pop(at, None)
        return at

    def _bump(self, row: int, *, high: int = 0, dropped: int = 0, evicted: int = 0) -> None:
        self._raise(row, _HIGH, high)
        self._raise(row, _DROPPED, dropped)
        self._raise(row, _EVICTED, evicted)

    def merge_prefix(self, prefix: Prefix) -> int:
        """Take another ring's counters for ``prefix`` (the fold); its row here."""
        row = self.row(prefix.prefix)
        self._bump(row, high=prefix.high, dropped=prefix.dropped, evicted=prefix.evicted)
        return row

    # -- writing -------------------------------------------------------------------------------
    def append(self, key: bytes, data: bytes, t: float, counter: int, row: int, now: float) -> None:
        """Write one entry (the writer's, one at a time: the cursor is kept here between two
        writes). ``now`` tells an entry overwritten while young (evicted) from an old one
        (expired). Raises ValueError for an entry that can never fit. The request path's:
        about one microsecond of copying and CRC, and the interpreter's share."""
        size = (_ENTRY.size + UNIT - 1 + len(key) + len(data)) // UNIT * UNIT
        cap = self.capacity
        if size > cap or len(key) > MAX_ID:
            raise ValueError(f"a record of {size} bytes does not fit a ring of {cap}")
        mm = self.mm
        written = self._written
        pos = written % cap
        if cap - pos < size:  # no room before the end: a wrap mark, and on from the start
            self._make_room(written + cap - pos, now)
            mm[HEAD_BYTES + pos: HEAD_BYTES + pos + 4] = WRAP_MAGIC
            written += cap - pos
            pos = 0
            _store(mm, _WRITTEN_AT, written)
        if written + size - cap > self._oldest:
            # Room for this entry and ROOM_AHEAD beyond it, in one pass over the oldest
            # entries' headers rather than a pass a write.
            self._make_room(min(written + size + self._ahead, written + cap), now)
        at = HEAD_BYTES + pos
        body = _ENTRY.pack(ENTRY_MAGIC, size, 0, t, counter, row, len(key), len(data)) + key + data
        crc = zlib.crc32(memoryview(body)[_CRC_FROM:], zlib.crc32(_Q.pack(written)))
        mm[at: at + len(body)] = body
        _CRC.pack_into(mm, at + 8, crc)
        self._written = written + size
        _store(mm, _WRITTEN_AT, written + size)  # after the bytes: readers take it whole
        if counter > self._high.get(row, -1):
            self._raise(row, _HIGH, counter)
            self._high[row] = counter

    def _make_room(self, upto: int, now: float) -> None:
        """Move ``oldest`` past every entry that a write up to ``upto`` (absolute) overwrites,
        noting what each was (dropped, evicted while young). The request path's when the
        ring is full: one entry's header read, a store or two."""
        mm, cap = self.mm, self.capacity
        oldest = self._oldest
        limit = upto - cap
        dropped: dict[int, int] = {}  # row -> the highest counter dropped
        evicted: dict[int, int] = {}  # row -> the highest dropped while young
        while oldest < limit:
            pos = oldest % cap
            if cap - pos < _ENTRY.size:
                oldest += cap - pos
                continue
            magic, total, _, t, counter, row, _, _ = _ENTRY.unpack_from(mm, HEAD_BYTES + pos)
            if magic != ENTRY_MAGIC or total < UNIT or total % UNIT or total > cap - pos:
                oldest += cap - pos  # a wrap mark (or nothing readable): on to the next lap
                continue
            if row < ROWS:
                if counter > dropped.get(row, -1):
                    dropped[row] = counter
                if now - t < self.max_age_s and counter > evicted.get(row, -1):
                    evicted[row] = counter
            oldest += total
        for row, counter in dropped.items():
            self._raise(row, _DROPPED, counter)
        for row, counter in evicted.items():
            self._raise(row, _EVICTED, counter)
        self._oldest = oldest
        _store(mm, _OLDEST_AT, oldest)  # before the bytes are overwritten

    def _raise(self, row: int, field: int, counter: int) -> None:
        """Raise one counter of a row's (``field``: its offset in the row) to ``counter``."""
        known = self._counts.get((row, field))
        at = ROWS_AT + row * _ROW.size + field
        if known is None:
            known = _load(self.mm, at)
        if counter > known:
            _store(self.mm, at, counter)  # one 8-byte copy: another process reads it whole
            known = counter
        self._counts[(row, field)] = known

    def _header(self, at: int) -> tuple[int, float, int, int] | None:
        pos = at % self.capacity
        if self.capacity - pos < _ENTRY.size:
            return None
        magic, total, _, t, counter, row, _, _ = _ENTRY.unpack_from(self.mm, HEAD_BYTES + pos)
        if magic != ENTRY_MAGIC or total < UNIT or total % UNIT or total > self.capacity - pos:
            return None
        return total, t, counter, row

    # -- reading -------------------------------------------------------------------------------
    def entries(self, since: int = 0) -> tuple[list[Entry], int, int]:
        """The whole entries written from ``since`` (absolute; an earlier point than the
        oldest starts there) up to ``written``: ``(entries, where to go on from, oldest)``. A
        torn or foreign entry ends the read (what follows is read next time); every entry
        returned starts at or after ``oldest`` as it stood after the copy."""
        mm, cap = self.mm, self.capacity
        written = self.written
        start = max(since, self.oldest)
        if start >= written:
            return [], max(since, written), self.oldest
        first = start % cap
        length = written - start
        if first + length <= cap:
            copy = bytes(mm[HEAD_BYTES + first: HEAD_BYTES + first + length])
        else:
            copy = bytes(mm[HEAD_BYTES + first: HEAD_BYTES + cap]) + \
                bytes(mm[HEAD_BYTES: HEAD_BYTES + first + length - cap])
        oldest = self.oldest  # read again: what the writer overwrote meanwhile starts before it
        out: list[Entry] = []
        at = start
        for entry in self._walk(copy, start, written, oldest):
            if isinstance(entry, int):
                at = entry
                continue
            at = entry.at + entry.total
            if entry.at >= oldest:
                out.append(entry)
        return out, at, oldest

    def _walk(self, copy: bytes, start: int, end: int, oldest: int) -> Iterator[Entry | int]:
        """Entries in ``copy`` (the ring's bytes from absolute ``start``); an int where only
        the cursor moves (a wrap mark)."""
        cap = self.capacity
        at = start
        view = memoryview(copy)
        while at < end:
            off = at - start
            pos = at % cap
            magic = bytes(view[off: off + 4])
            if magic == WRAP_MAGIC:
                at += cap - pos
                yield at
                continue
            if end - at < _ENTRY.size:
                return
            _, total, crc, t, counter, row, idlen, datalen = _ENTRY.unpack_from(view, off)
            used = _ENTRY.size + idlen + datalen
            if magic != ENTRY_MAGIC or total % UNIT or total < used or total > cap - pos \
                    or at + total > end or _crc(at, view[off + _CRC_FROM: off + used]) != crc:
                # Below ``written`` nothing is being written (the cursor moves after the
                # bytes): damaged. Look for the next whole entry, unit by unit.
                if at >= oldest:  # before it: overwritten while copied, not damaged
                    self.damaged += 1
                at += UNIT
                yield at
                continue
            key_at = off + _ENTRY.size
            key = bytes(view[key_at: key_at + idlen]).decode("utf-8", "replace")
            yield Entry(at, total, t, counter, row, key,
                        bytes(view[key_at + idlen: key_at + idlen + datalen]))
            at += total

    def read(self, at: int) -> Entry | None:
        """The entry starting at ``at`` (absolute), if it is still there, whole."""
        if at < self.oldest or at >= self.written:
            return None
        pos = at % self.capacity
        head = self._header(at)
        if head is None:
            return None
        total = head[0]
        copy = bytes(self.mm[HEAD_BYTES + pos: HEAD_BYTES + pos + total])
        if at < self.oldest:
            return None
        for entry in self._walk(copy, at, at + total, at):
            return entry if isinstance(entry, Entry) else None
        return None


__all__ = ["HEAD_BYTES", "MAX_ID", "UNIT", "Entry", "Prefix", "Ring", "RingError", "entry_size"]
