"""One server's records in place: this process's ring, the others' read at lookup, the dead folded.

A client reads ``X-Energy-Id`` from one worker's answer and asks ``/energy/requests/{id}`` of
whichever worker the server hands the connection to, perhaps after the first one was killed.
So each process writes every record it keeps into its own ring (:mod:`.ring`: memory-mapped,
written in place before the answer goes), and a lookup that misses in memory reads the rings
of its server's processes. Records are one server's (:mod:`.server`): the rings sit in
``records/<server>/`` of the host's place, and another server's are never read.

Bound, per server: one ring per live store (one per process, or per middleware where a
process has several; :data:`JOURNAL_BYTES` at most each, and no more than 1/:data:`ROOM_SHARE`
of the place's file system, plus a page), the ``fold`` ring and
its lock; a dead process's ring is folded into ``fold`` (its records younger than the max
age copied, its id counters kept) and removed within :data:`CENSUS_S` of a live process
seeing it dead, so dead rings waiting are at most as many as the processes that died in that
second: files <= 2 x live stores + 2, bytes <= (2 x live stores + 1) x (JOURNAL_BYTES + 4 KiB).
A store that closes, or is collected, folds its own ring and removes it (on its thread). A
process that could not make its ring (a full place) leaves a note of why, ``<row>.unshared``
(a few hundred bytes, removed once its writer has been dead for the max age). A dead server's
folder (its keeper and every writer gone) is removed by the next store of this user to start,
of any server, and every minute by the live ones. Only what a record carries is written
(figures, labels, the id): never a request's content or a secret.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import rows
from .place import held, make_dir, remedy
from .ring import Prefix, Ring, RingError
from .rows import TMP, UNSHARED, Row, Rows, alive, me, parse, read_small
from .server import ServerId, keeper_in

log = logging.getLogger("giul_asgi.records")

SUFFIX = ".ring"
FOLD = "fold.ring"
LOCK = "fold.lock"
#: A process that could not share its records says why in ``<its row>.unshared``.
#: The most a ring holds (4 MiB: about 3,000 requests, a first and a settled figure each).
JOURNAL_BYTES = 4 << 20
#: What one record of ``max_records`` is given in its ring (a record is about 600 bytes).
BYTES_PER_RECORD = 1536
#: How often a store looks for its server's dead processes (seconds).
CENSUS_S = 1.0
#: How often it looks for dead servers' folders beyond the one at its start (seconds).
SWEEP_S = 60.0
#: An id's counter, where its process is known to this server (see :meth:`Journal.why`).
UNKNOWN = "unknown id"


#: A ring is at most this share of the place's file system: 1 MiB on Docker's 64 MB
#: /dev/shm, where 4 MiB rings, tails and seats filled it at a dozen workers (a hostile trial:
#: 19 MB for four), and every worker then charged the card whole.
ROOM_SHARE = 64


def ring_bytes(max_records: int, room: int | None = None) -> int:
    """The ring a store of ``max_records`` is given, on a place of ``room`` bytes."""
    most = JOURNAL_BYTES if room is None else max(256 * 1024, min(JOURNAL_BYTES, room // ROOM_SHARE))
    return min(most, max(64 * 1024, max_records * BYTES_PER_RECORD))


def folder_name(server: ServerId) -> str:
    """The server's records folder (:attr:`ServerId.folder`)."""
    return server.folder


@dataclass(slots=True)
class _Reader:
    """A ring of this server as this process has read it so far."""

    ring: Ring
    inode: int
    cursor: int = 0
    #: id -> (where its latest entry starts, its time), oldest first.
    index: dict[str, tuple[int, float]] = field(default_factory=dict)
    damage_said: bool = False

    def refresh(self) -> None:
        entries, self.cursor, oldest = self.ring.entries(self.cursor)
        index = self.index
        for entry in entries:
            index.pop(entry.key, None)  # re-inserted: the index stays in the order written
            index[entry.key] = (entry.at, entry.t)
        while index:
            key = next(iter(index))
            if index[key][0] >= oldest:
                break
            del index[key]


@dataclass(frozen=True, slots=True)
class Found:
    """A record found in a ring: its data, its time, and the file it came from."""

    data: bytes
    t: float
    path: Path

    @property
    def writer_gone(self) -> bool:
        """Whether the process that wrote it has ended (its ring folded, or its pid gone): a
        record it had not settled then never will be."""
        named = parse(self.path.name, SUFFIX)
        return named is None or not alive(*named)


class Journal:
    """This store's ring in its server's folder, and lookups in the server's other rings.

    Made off the event loop (it creates files); :meth:`append` is the request path's (a copy
    into shared memory, under a lock); :meth:`find`, :meth:`why` and :meth:`census` read
    files (threads only). Raises OSError when the ring cannot be made (a full place).
    """

    def __init__(
        self, place: Path, server: ServerId, *, max_age_s: float, capacity: int, tag: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.place = place
        self.server = server
        self.max_age_s = max_age_s
        self.clock = clock
        records = make_dir(place / "records", root=place)
        self.folder = make_dir(records / folder_name(server), root=place)
        self.rows = Rows(self.folder, suffix=SUFFIX, tag=tag, root=place)  # stale .tmp-* go
        self.capacity = capacity
        tmp = self.folder / f"{TMP}{me()}-{secrets.token_hex(4)}"
        self.ring = Ring.create(tmp, self.rows.path, capacity, max_age_s)
        self._rows: dict[str, int] = {}
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._readers: dict[str, _Reader] = {}
        self._swept = -float("inf")
        self.folded = 0
        self.closed = False

    # -- writing (the request path, the reader thread) ------------------------------------------
    def append(self, key: str, data: bytes, prefix: str, counter: int) -> None:
        """Write one record into this store's ring. Raises ValueError (too big to keep)."""
        raw = key.encode()
        with self._write_lock:
            if self.closed:
                return
            row = self._rows.get(prefix)
            if row is None:
                row = self._rows[prefix] = self.ring.row(prefix)
            now = self.clock()
            self.ring.append(raw, data, now, counter, row, now)

    def close(self) -> None:
        """Stop writing (no file is touched: see :meth:`retire`)."""
        with self._write_lock:
            self.closed = True

    def retire(self) -> None:
        """This store is done (closed, or collected): its records go into the fold, where
        the others find them, and its ring is removed (the store's thread). Never raises."""
        self.close()
        try:
            row = Row(self.rows.name, self.rows.path, *(parse(self.rows.name, SUFFIX) or (os.getpid(), None)))
            self._fold(row)
        except OSError as exc:
            _say_once(f"records of {self.folder} cannot be folded at close: {exc}")
        finally:
            self.ring.close()
            with self._read_lock:
                for reader in self._readers.values():
                    reader.ring.close()
                self._readers = {}

    # -- finding (threads) -------------------------------------------------------------------------
    def find(self, key: str) -> Found | None:
        """The latest entry under ``key`` in another ring of this server (this store's own
        records are its memory's to answer, within its bounds), younger or not (the caller
        judges its age and content); None if none holds it."""
        with self._read_lock:
            best: tuple[float, int, _Reader] | None = None
            for reader in self._refresh():
                hit = reader.index.get(key)
                if hit is not None and (best is None or hit[1] > best[0]):
                    best = (hit[1], hit[0], reader)
            if best is None:
                return None
            entry = best[2].ring.read(best[1])
            if entry is None:  # overwritten since it was indexed
                return None
            return Found(entry.data, entry.t, best[2].ring.path)

    def _refresh(self) -> list[_Reader]:
        """Every ring of this server (this store's own, live and dead processes', the fold),
        read up to now. A ring listed and gone before it was opened was folded meanwhile
        (its process closed its store): the folder is listed again, for the fold holds it now."""
        for _ in range(3):
            readers, vanished = self._scan()
            if not vanished:
                break
        return readers

    def _scan(self) -> tuple[list[_Reader], bool]:
        seen: dict[str, _Reader] = {}
        vanished = False
        try:
            names = [e.name for e in os.scandir(self.folder)
                     if e.name.endswith(SUFFIX) and not e.name.startswith(".")
                     and e.is_file(follow_symlinks=False)]
        except OSError:
            names = []
        for name in names:
            if name == self.rows.name:
                continue  # this store's own: its memory answers
            reader = self._readers.get(name)
            try:
                inode = os.stat(self.folder / name, follow_symlinks=False).st_ino
                if reader is None or reader.inode != inode:
                    if reader is not None:
                        reader.ring.close()
                    reader = _Reader(Ring.open(self.folder / name), inode)
                reader.refresh()
            except FileNotFoundError:  # folded and removed since it was listed
                vanished = True
                continue
            except (OSError, ValueError) as exc:  # not a ring of ours
                _say_once(f"{self.folder / name} cannot be read as a ring ({exc}): skipped")
                continue
            if reader.ring.damaged and not reader.damage_said:
                reader.damage_said = True
                log.warning("the records ring %s holds damaged entries (skipped)", reader.ring.path)
            seen[name] = reader
        for name, gone in self._readers.items():
            if name not in seen:
                gone.ring.close()
        self._readers = seen
        return list(seen.values()), vanished

    def why(self, prefix: str, counter: int) -> str:
        """Why no ring of this server holds the id ``<prefix><counter>`` (see the 404)."""
        pid = prefix.split("-", 1)[0]
        with self._read_lock:
            known = [p for reader in self._readers.values() for p in reader.ring.prefixes()
                     if p.prefix == prefix]
        if known:
            return _gone(known, counter, self.max_age_s, self.capacity)
        try:
            pid_n = int(pid, 16)
        except ValueError:
            pid_n = -1
        for marker in self._markers():
            who = parse(marker.name, UNSHARED)
            if who is not None and who[0] == pid_n:
                reason = read_small(marker) or "it could not make its journal (see its log)"
                return f"its process's journal was not shared: {reason}"
        return (f"{UNKNOWN}: no journal of this server holds records of process {pid_n} "
                "(an id of another server, or of a process whose journal was lost)")

    def _markers(self) -> list[Path]:
        try:
            return [Path(e.path) for e in os.scandir(self.folder) if e.name.endswith(UNSHARED)]
        except OSError:
            return []

    # -- keeping the folder bounded (the store's thread) -----------------------------------------
    def census(self) -> int:
        """Fold the rings of this server's dead processes and remove them (and stale
        temporary files, and old markers); now and then, dead servers' folders. Returns how
        many rings were folded. Never raises."""
        folded = 0
        try:
            self.rows.remove_stale_tmp()
            for row in self.rows.others():
                if row.name == FOLD or row.alive():
                    continue
                if self._fold(row):
                    folded += 1
            self._drop_markers()
            if self.clock() - self._swept > SWEEP_S:
                self._swept = self.clock()
                sweep(self.place, mine=self.folder.name)
        except OSError as exc:
            _say_once(f"records of {self.folder} cannot be kept bounded: {exc}; {remedy(exc)}")
        self.folded += folded
        return folded

    def _fold(self, row: Row) -> bool:
        """Copy a dead ring's young records into the fold ring, then remove it (under the
        fold's lock: of two processes that see it dead, one folds it)."""
        with held(self.folder / LOCK):
            try:
                dead = Ring.open(row.path)
            except FileNotFoundError:
                return False  # another process folded it first
            except (RingError, ValueError):
                Rows.remove(row)  # not a ring (half made, damaged): nothing to keep
                return False
            try:
                fold = self._fold_ring()
                try:
                    rows = {p.row: fold.merge_prefix(p) for p in dead.prefixes()}
                    entries, _, _ = dead.entries(0)
                    now = self.clock()
                    for entry in entries:
                        if now - entry.t < self.max_age_s and entry.row in rows:
                            fold.append(entry.key.encode(), entry.data, t=entry.t,
                                        counter=entry.counter, row=rows[entry.row], now=now)
                finally:
                    fold.close()
            finally:
                dead.close()
            Rows.remove(row)
            return True

    def _fold_ring(self) -> Ring:
        path = self.folder / FOLD
        try:
            return Ring.open(path, writable=True)
        except FileNotFoundError:
            tmp = self.folder / f"{TMP}{me()}-{secrets.token_hex(4)}"
            return Ring.create(tmp, path, self.capacity, self.max_age_s)

    def _drop_markers(self) -> None:
        now = time.time()
        for marker in self._markers():
            who = parse(marker.name, UNSHARED)
            with contextlib.suppress(OSError):
                if who is not None and not alive(*who) and now - marker.stat().st_mtime > self.max_age_s:
                    marker.unlink()


def _gone(known: list[Prefix], counter: int, max_age_s: float, capacity: int) -> str:
    high = max(p.high for p in known)
    if counter <= max(p.evicted for p in known):
        # The ring is sized to the place (a 64th of its room): on Docker's 64 MB /dev/shm about
        # 700 records a worker, seconds of a busy server's (a hostile trial: found 14-28 s on).
        return (f"evicted: its process's journal ({capacity / (1 << 20):.2g} MiB, about "
                f"{capacity // BYTES_PER_RECORD} records) keeps its newest only, and this "
                f"one was overwritten before max_age_s ({max_age_s:g} s); a larger place keeps more "
                "(Docker: --shm-size)")
    if counter <= max(p.dropped for p in known):
        return f"expired after max_age_s ({max_age_s:g} s)"
    if counter > high:
        return f"{UNKNOWN}: its process has filed no record under it yet (is its request still running?)"
    return f"{UNKNOWN}: its process filed no record under it"




def say_unshared(place: Path, server: ServerId, tag: str, reason: str) -> None:
    """Leave ``<row>.unshared`` in the server's records folder saying why this process's
    records are its own (the other workers' 404 says so)."""
    rows.say_unshared(place / "records" / folder_name(server), place, tag, reason)


def sweep(place: Path, *, mine: str | None = None) -> int:
    """Remove the folders of dead servers (keeper gone, no writer alive) and the journals of
    earlier versions (``records/*.jsonl``) whose writer is dead; returns how many files went."""
    records = place / "records"
    removed = 0
    try:
        entries = list(os.scandir(records))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if entry.name.endswith(".jsonl") and entry.is_file(follow_symlinks=False):
            who = parse(name, ".jsonl")
            if who is not None and not alive(*who):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed += 1
            continue
        if name == mine or not entry.is_dir(follow_symlinks=False):
            continue
        keeper = keeper_in(name)
        if keeper is None or alive(*keeper):
            continue
        removed += _remove_dead_folder(Path(entry.path))
    return removed


def _remove_dead_folder(folder: Path) -> int:
    try:
        files = [e for e in os.scandir(folder)]
    except OSError:
        return 0
    for entry in files:
        for suffix in (SUFFIX, UNSHARED):
            who = parse(entry.name, suffix)
            if who is not None and alive(*who):
                return 0  # a worker outlived its master: the server is not gone yet
    removed = 0
    for entry in files:
        if entry.is_file(follow_symlinks=False) or entry.is_symlink():
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed += 1
    with contextlib.suppress(OSError):
        os.rmdir(folder)
    return removed


_said: set[str] = set()
_said_lock = threading.Lock()


def _say_once(text: str) -> None:
    with _said_lock:
        if text in _said:
            return
        _said.add(text)
    log.warning("%s", text)


__all__ = [
    "CENSUS_S",
    "FOLD",
    "JOURNAL_BYTES",
    "ROOM_SHARE",
    "UNKNOWN",
    "Found",
    "Journal",
    "folder_name",
    "ring_bytes",
    "say_unshared",
    "sweep",
]
