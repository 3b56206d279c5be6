"""What a worker counted since its last row, written in place as it counts: kill -9 loses none of it.

A worker's row (its whole mergeable state, :mod:`.host`) is rewritten every ``flush_s``: too
costly a record, and a worker killed between two rows took with it every request it had
answered since. So every request is also written here when it happens, into a file mapped
in memory (a copy into shared pages: no system call, nothing that waits), as
prometheus_client's multiprocess mode writes its values: the *answer* (the middleware has
answered; the request's labels) and later the *settled* figure. A reader adds to a worker's
row the settled figures written after it and, for a dead worker, the answers that never
settled (requests of unknown energy). Any worker then counts every answered request of
every other, a killed one's included.

The file is two *areas* of :data:`AREA` bytes, each a header (:data:`MAGIC`, generation,
bytes used) and entries (a little-endian u32 length, then a JSON list). The writer appends
to the area of the current generation and moves ``used`` past an entry only once the entry
is whole. A row *cut* (:meth:`Tail.cut`, under the statistics' lock, when the row's state is
taken) moves to the other area with the next generation; the row says which generation
begins after it, and a reader applies the areas of that generation and later. An area is
reused only two cuts later, once the row of the cut between is written, so a reader that
finds an area's generation changed under it reads the newer row and starts again.

The file is allocated whole when it is made (``posix_fallocate``): a full place fails there,
loudly, never later as a SIGBUS on a page of the map.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hostshare.place import open_file
from ..hostshare.rows import load_json
from .cell import Cell
from .labels import Key, is_key

#: The bytes of one area (two per worker): about 2,500 requests between two rows.
AREA = 512 * 1024
#: An area is at most this share of the place's file system (see journal.ROOM_SHARE).
ROOM_SHARE = 256

MAGIC = b"GIULTAIL"
_HEAD = struct.Struct("<8sQQ")  # magic, generation, bytes used after the header
_LEN = struct.Struct("<I")
SUFFIX = ".tail"


def tail_area(area: int, room: int | None) -> int:
    """The area a tail of at most ``area`` bytes is given on a place of ``room`` bytes."""
    return area if room is None else min(area, max(64 * 1024, room // ROOM_SHARE))


class Tail:
    """This worker's tail file at ``path`` (made here, allocated whole: raises OSError)."""

    def __init__(self, path: Path, *, area: int = AREA) -> None:
        self.path = path
        self.area = area
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            _allocate(fd, 2 * area)
            self._map = mmap.mmap(fd, 2 * area, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(fd)
        self.gen = 1
        self._used = 0
        self._head(0, 1, 0)
        self._head(1, 0, 0)
        #: entries that did not fit (the next row has them; a kill before it loses them)
        self.overflow = 0

    def _head(self, index: int, gen: int, used: int) -> None:
        _HEAD.pack_into(self._map, index * self.area, MAGIC, gen, used)

    def append(self, entry: list[Any]) -> bool:
        """Write one entry in the current area; False when it is full (see :attr:`overflow`)."""
        return self.append_json(json.dumps(entry, separators=(",", ":")).encode())

    def append_json(self, data: bytes) -> bool:
        """Write one entry already made (a JSON list) in the current area."""
        index = self.gen % 2
        start = index * self.area + _HEAD.size + self._used
        end = start + _LEN.size + len(data)
        if end > (index + 1) * self.area:
            self.overflow += 1
            return False
        m = self._map
        m[start + _LEN.size:end] = data
        _LEN.pack_into(m, start, len(data))
        self._used = end - index * self.area - _HEAD.size
        struct.pack_into("<Q", m, index * self.area + 16, self._used)  # the entry is whole
        return True

    def fill(self) -> float:
        """The share of the current area used (a row is due early past a half)."""
        return self._used / (self.area - _HEAD.size)

    def cut(self) -> int:
        """Begin the next generation in the other area; returns it (the row's ``gen``)."""
        self.gen += 1
        self._used = 0
        self._head(self.gen % 2, self.gen, 0)
        return self.gen

    def close(self, *, remove: bool = True) -> None:
        with contextlib.suppress(ValueError, BufferError):
            self._map.close()
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _allocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes on disk now (ENOSPC here, not a SIGBUS later)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:  # no posix_fallocate (macOS): write the bytes out
        os.ftruncate(fd, 0)
        chunk = b"\0" * 65536
        left = size
        while left:
            left -= os.write(fd, chunk[:min(left, len(chunk))])


class Changed(Exception):
    """An area was reused while it was read: read the worker's row again."""


@dataclass
class Generation:
    """What one generation of a worker's tail holds, as far as read."""

    offset: int = 0
    #: the settled figures, as cells: (key, step) -> cell
    cells: dict[tuple[Key, int], Cell] = field(default_factory=dict)
    #: the ids of the settled figures
    settled: set[str] = field(default_factory=set)
    #: the answers: id -> ``[t, route, node, tier, outcome, status, tenant]``
    answered: dict[str, list[Any]] = field(default_factory=dict)
    #: entries that made no sense (skipped)
    bad: int = 0
    #: why the worker's row cannot be written (a ``w`` entry: the place is full), if it said
    stuck: str | None = None

    def snapshot(self) -> Generation:
        """A copy that later reads leave as it is (another thread may merge it)."""
        return Generation(self.offset, {k: c.copy() for k, c in self.cells.items()},
                          set(self.settled), dict(self.answered), self.bad, self.stuck)


class TailReader:
    """Another worker's tail, read incrementally: the generations from ``since`` on
    (``step_s``: the statistics' step, to place answers in time)."""

    def __init__(self, path: Path, step_s: float) -> None:
        self.path = path
        self.step_s = step_s
        self.gens: dict[int, Generation] = {}

    def read(self, since: int) -> list[Generation]:
        """The generations ``>= since``, oldest first, brought up to what is written now.
        Raises :class:`Changed` when an area needed was reused meanwhile, OSError when the
        file cannot be read."""
        for gen in [g for g in self.gens if g < since]:
            del self.gens[gen]
        fd = open_file(self.path, os.O_RDONLY)
        try:
            area = os.fstat(fd).st_size // 2
            if area > _HEAD.size:
                for index in (0, 1):
                    self._area(fd, index, area, since)
        finally:
            os.close(fd)
        return [self.gens[g] for g in sorted(self.gens) if g >= since]

    def _area(self, fd: int, index: int, area: int, since: int) -> None:
        magic, gen, used = _HEAD.unpack(os.pread(fd, _HEAD.size, index * area))
        if magic != MAGIC or gen < since or gen == 0:
            return
        used = min(used, area - _HEAD.size)
        seen = self.gens.setdefault(gen, Generation())
        if seen.offset >= used:
            return
        data = os.pread(fd, used - seen.offset, index * area + _HEAD.size + seen.offset)
        if _HEAD.unpack(os.pread(fd, _HEAD.size, index * area))[1] != gen:
            del self.gens[gen]
            raise Changed(self.path.name)
        pos = 0
        while pos + _LEN.size <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + _LEN.size + n > len(data):
                break
            self._take(seen, data[pos + _LEN.size:pos + _LEN.size + n])
            pos += _LEN.size + n
        seen.offset += pos

    def _take(self, gen: Generation, raw: bytes) -> None:
        try:
            entry = load_json(raw)
            if not isinstance(entry, list):
                raise ValueError("not a list")
            kind = entry[0]
            # a figure: 16 fields, 15 from a worker that predates the allocated basis
            if kind == "s" and len(entry) in (15, 16):
                key = tuple(entry[3:10])
                step = entry[2]
                if not is_key(key) or type(step) is not int:
                    raise ValueError("a figure without a key or step")
                cell = Cell()
                cell.add(entry[10], entry[11], entry[12], entry[13], entry[14],
                         entry[15] if len(entry) == 16 else None)
                mine = gen.cells.get((key, step))  # type: ignore[arg-type]
                if mine is None:
                    gen.cells[(key, step)] = cell  # type: ignore[index]
                else:
                    mine.merge(cell)
                if isinstance(entry[1], str):
                    gen.settled.add(entry[1])
            elif kind == "a" and len(entry) == 9:
                t = entry[2]
                if not isinstance(entry[1], str) or not isinstance(t, float | int) \
                        or not math.isfinite(t):
                    raise ValueError("an answer without an id or time")
                gen.answered[entry[1]] = entry[2:]
            elif kind == "w" and len(entry) == 2 and isinstance(entry[1], str):
                gen.stuck = entry[1][:300]
            else:
                raise ValueError("an entry of another kind")
        except (ValueError, TypeError, IndexError, KeyError, OverflowError):
            gen.bad += 1



__all__ = ["AREA", "MAGIC", "ROOM_SHARE", "SUFFIX", "Changed", "Generation", "Tail", "TailReader",
           "tail_area"]
