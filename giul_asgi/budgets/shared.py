"""One server's spending files: each worker's row, one row for the dead, and who crossed first.

``budgets/<server key>/`` in the host's place (:mod:`giul_asgi.hostshare.place`; the key:
:mod:`giul_asgi.hostshare.server`, so two servers on one host never mix their budgets, and
a restart starts from its own) holds, and never anything else:

- ``<pid>-<start>-<n>.json``: a worker's *row*, what it spent per (budget, key, period) in
  the periods not over yet (and its refusals). Its budgets' thread rewrites it in place, in
  one ``pwrite`` on a descriptor it keeps (a row replaced by a new file took ten system
  calls, each a hand-over of the GIL that cost a busy worker's loop tens of microseconds):
  a frame ``GIULB1 <crc32> <length>`` then the JSON, so a reader that catches a write half
  done sees the sum disagree and keeps what it read before;
- ``dead.json``: every dead worker's spending in those periods, folded into one row with the
  names folded (kept :data:`FORGET_S` after their files went, so a reader that listed a row
  just before it was folded never counts it twice);
- ``crossed.json``: for each (budget, key) the last period it was crossed in and how many
  times it was, written by whichever worker saw the crossing first, under ``.crossed.lock``
  (``flock``): one log line and one count per crossing, whichever worker saw it;
- ``server.json``: which server this is and the process that keeps it, so the next server's
  start removes this folder once every worker and the keeper are gone.

``dead.json`` and ``crossed.json`` are replaced whole (a new file, then a rename), and read
again when their inode changes. A dead worker's spending counts until its period ends (a
worker killed with -9 does not give its tenants their joules back); the next live worker to
look folds it within a second. So the folder holds at most ``live workers + 5`` files and,
for a moment, the workers that died since the last look. Every file is opened through
:func:`~giul_asgi.hostshare.place.open_file` (``O_NOFOLLOW``, a regular file of this user's
with one link) and nothing read is trusted: a row that is not JSON, or holds a number that
is not finite and >= 0, is skipped and said once. Nothing here runs on a request's path: the
budgets' thread calls it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hostshare.place import held, held_if_free, make_dir, open_file
from ..hostshare.rows import Rows, alive, load_json, parse, replace
from ..hostshare.server import ServerId
from ..stats.folder import remove_dead_servers
from ..tenants import OTHER

log = logging.getLogger("giul_asgi.budgets")

ROW_SCHEMA = "giul-asgi/budgets-row/1"
DEAD_SCHEMA = "giul-asgi/budgets-dead/1"
CROSSED_SCHEMA = "giul-asgi/budgets-crossed/1"
DEAD = "dead.json"
CROSSED = "crossed.json"
SERVER = "server.json"
FOLD_LOCK = ".fold.lock"
CROSSED_LOCK = ".crossed.lock"
#: How long a folded name is remembered after its row was removed (seconds).
FORGET_S = 60.0
#: The most (budget, key) pairs ``crossed.json`` keeps counts for; past it, ``<other>``.
MAX_CROSSED = 10_000
#: How often the folder is listed (new workers, rows removed, the dead row and crossings
#: replaced; seconds): in between, the rows held open are read again, one ``pread`` each.
SCAN_S = 0.25
#: The largest row read (a row of 10,000 keys is about 600 KB).
MAX_ROW = 8 << 20
#: A row's frame: magic, the CRC-32 of the JSON, its length; then the JSON.
_FRAME = re.compile(rb"GIULB1 ([0-9a-f]{8}) ([0-9]{1,9})\n")

#: (budget name, key, period index) -> joules or grams spent
Spent = dict[tuple[str, str, int], float]


@dataclass(slots=True)
class Found:
    """What the folder holds besides this worker's own row, summed."""

    spent: Spent
    refused: Spent
    #: live workers besides this one (looked up when the rows listed change, and at each fold)
    live: int
    #: whether anything changed since the last read (else all of this is what it was)
    changed: bool = True
    #: how many times each (budget, key) was crossed, server-wide
    crossed: dict[tuple[str, str], int] = field(default_factory=dict)
    #: a hard budget's usual cost of a request, as the live workers that learnt one say it
    #: (their mean): what a worker that has learnt none yet reserves
    usual: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Other:
    """Another worker's row, as held open."""

    fd: int
    inode: int
    who: tuple[int, str | None]
    raw: bytes = b""
    data: dict[str, Any] | None = None
    #: whether its writer ran when last looked up (None: not looked up yet)
    alive: bool | None = None


def dump(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()



def entries(raw: Any) -> Iterator[tuple[tuple[str, str, int], float]]:
    """The ``[name, key, period, value]`` entries of a row (raises ValueError on a bad one)."""
    if not isinstance(raw, list):
        raise ValueError("entries are not a list")
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and type(entry[2]) is int
                and isinstance(entry[3], int | float) and not isinstance(entry[3], bool)
                and math.isfinite(entry[3]) and entry[3] >= 0):
            raise ValueError(f"an entry that makes no sense: {entry!r:.80}")
        yield (entry[0], entry[1], entry[2]), float(entry[3])


def _usual(raw: Any) -> Iterator[tuple[str, float]]:
    """The ``[name, joules]`` usual costs of a row (raises ValueError on a bad one)."""
    if not isinstance(raw, list):
        raise ValueError("usual costs are not a list")
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int | float) and not isinstance(entry[1], bool)
                and math.isfinite(entry[1]) and entry[1] > 0):
            raise ValueError(f"a usual cost that makes no sense: {entry!r:.80}")
        yield entry[0], float(entry[1])


def as_entries(spent: Spent) -> list[list[Any]]:
    return [[name, key, period, value] for (name, key, period), value in spent.items()]


def framed(data: bytes) -> bytes:
    """A row as written: its frame, then its JSON."""
    return b"GIULB1 %08x %d\n" % (zlib.crc32(data), len(data)) + data


def unframed(raw: bytes) -> bytes | None:
    """A row's JSON, or None while a write is half done (the sum disagrees); raises
    ValueError for what is no row at all."""
    match = _FRAME.match(raw)
    if match is None:
        if raw.startswith(b"GIULB1 ") or not raw:
            return None  # the frame itself half written
        raise ValueError("not a budgets row")
    start, length = match.end(), int(match.group(2))
    data = raw[start:start + length]
    if len(data) < length or zlib.crc32(data) != int(match.group(1), 16):
        return None
    return data


def _add(into: Spent, more: Spent, since: dict[str, int]) -> None:
    """Add ``more``'s entries of periods not over yet (``since``: each budget's current
    period; a budget not in it, another configuration's, is left out)."""
    for slot, value in more.items():
        current = since.get(slot[0])
        if current is not None and slot[2] >= current:
            into[slot] = into.get(slot, 0.0) + value


def _row(raw: Any, schema: str) -> dict[str, Any]:
    """A row's content as dicts (raises ValueError for one that makes no sense)."""
    if not isinstance(raw, dict) or raw.get("schema") != schema:
        raise ValueError("not a budgets row of this version")
    data: dict[str, Any] = {"spent": dict(entries(raw.get("spent", []))),
                            "refused": dict(entries(raw.get("refused", []))),
                            "usual": dict(_usual(raw.get("usual", [])))}
    if schema == DEAD_SCHEMA:
        folded = raw.get("folded")
        if not isinstance(folded, dict):
            raise ValueError("no folded names")
        data["folded"] = folded
    return data


class ServerSpending:
    """This worker's row in its server's budgets folder, and everyone else's. Raises OSError
    where the folder or the row cannot be made (a full or read-only place)."""

    def __init__(self, place: Path, server: ServerId, *, tag: str) -> None:
        self.server = server
        self.root = place / "budgets"
        self.folder = make_dir(self.root / server.folder, root=place)
        self.rows = Rows(self.folder, tag=tag, root=place)
        if not (self.folder / SERVER).exists():
            replace(self.folder / SERVER, dump({"key": server.key, "how": server.how,
                                                "keeper": list(server.keeper)}))
        remove_dead_servers(self.root, server.folder)  # earlier runs' folders, once all are gone
        self._fd = open_file(self.rows.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        self._others: dict[str, _Other] = {}
        self._whole: dict[str, tuple[int, dict[str, Any] | None]] = {}  # dead.json, crossed.json
        self._found: Found | None = None
        self._scanned = -math.inf
        self._said: set[str] = set()

    # -- this worker ------------------------------------------------------------------------
    def write(self, spent: Spent, refused: Spent, usual: dict[str, float] | None = None) -> None:
        """Rewrite this worker's row in place (raises OSError: the place is full or gone);
        ``usual``: the hard budgets' usual costs this worker learnt."""
        blob = framed(dump({"schema": ROW_SCHEMA, "pid": os.getpid(),
                            "spent": as_entries(spent), "refused": as_entries(refused),
                            "usual": [[name, value] for name, value in (usual or {}).items()
                                      if value > 0]}))
        if os.pwrite(self._fd, blob, 0) != len(blob):
            raise OSError(28, "the row was cut short (is the place full?)")

    def close(self) -> None:
        """Let go of the files (this worker's row stays: its spending counts until folded)."""
        for fd in [self._fd, *(o.fd for o in self._others.values())]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._others.clear()

    # -- the others ---------------------------------------------------------------------------
    def read(self, since: dict[str, int], *, again: bool = False, alive_too: bool = False) -> Found:
        """The other workers' spending in the periods from ``since`` on (budget name -> its
        current period), live and dead, the dead row's and the crossings, from one listing
        of the folder (every :data:`SCAN_S`) and one ``pread`` of each row. A worker folded
        meanwhile is in the dead row (read after its row), never twice, never not at all.
        ``again``: sum anew (a new period); ``alive_too``: look up which writers still run."""
        changed = again or self._found is None
        now = time.monotonic()
        if changed or alive_too or now - self._scanned >= SCAN_S:
            self._scanned = now
            changed |= self._scan()
        else:  # the rows held open (one removed meanwhile still reads as it was: counted once)
            for name, other in list(self._others.items()):
                changed |= self._pread(name, other.inode, other.who)
        if not changed and not alive_too and self._found is not None:
            self._found.changed = False
            return self._found
        spent: Spent = {}
        refused: Spent = {}
        dead_row = self._whole.get(DEAD, (0, None))[1]
        folded = dead_row.get("folded", {}) if dead_row is not None else {}
        live = 0
        usual: dict[str, list[float]] = {}
        for name, other in sorted(self._others.items()):
            if other.data is None or name in folded:
                continue
            _add(spent, other.data["spent"], since)
            _add(refused, other.data["refused"], since)
            if alive_too or other.alive is None:
                other.alive = alive(*other.who)
            live += other.alive
            if other.alive:
                for budget, value in other.data["usual"].items():
                    usual.setdefault(budget, []).append(value)
        if dead_row is not None:
            _add(spent, dead_row["spent"], since)
            _add(refused, dead_row["refused"], since)
        crossed_row = self._whole.get(CROSSED, (0, None))[1]
        crossed = crossed_row["counts"] if crossed_row is not None else {}
        self._found = Found(spent, refused, live, changed, dict(crossed),
                            {name: sum(values) / len(values) for name, values in usual.items()})
        return self._found

    def _scan(self) -> bool:
        """List the folder: rows come and go, the dead row and crossings are replaced; read
        each row. Whether anything changed."""
        me, mine = os.getpid(), self.rows.name
        listed: dict[str, tuple[int, tuple[int, str | None] | None]] = {}
        with os.scandir(self.folder) as listing:
            for entry in listing:
                name = entry.name
                who = parse(name, ".json") if name not in (DEAD, CROSSED, SERVER) else None
                if name == mine or (who is None and name not in (DEAD, CROSSED)) \
                        or (who is not None and who[0] == me):
                    continue  # ours, another middleware of this process's, or no row
                listed[name] = (entry.inode(), who)
        changed = False
        for name in [n for n in self._others if n not in listed]:
            with contextlib.suppress(OSError):
                os.close(self._others.pop(name).fd)
            changed = True
        for name, (inode, who) in listed.items():
            if who is not None:
                changed |= self._pread(name, inode, who)
        for name in (DEAD, CROSSED):
            changed |= self._whole_file(name, listed.get(name, (None, None))[0])
        return changed

    def _pread(self, name: str, inode: int, who: tuple[int, str | None]) -> bool:
        """Read another worker's row again; whether what it says changed."""
        other = self._others.get(name)
        if other is not None and other.inode != inode:  # removed and made anew
            with contextlib.suppress(OSError):
                os.close(other.fd)
            other = None
        if other is None:
            try:
                fd = open_file(self.folder / name, os.O_RDONLY)
            except FileNotFoundError:
                return False  # folded and removed meanwhile: the dead row has it
            except OSError as exc:
                self._odd(name, f"{type(exc).__name__}: {exc}")
                return False
            other = self._others[name] = _Other(fd, inode, who)
        try:
            size = max(4096, 2 * len(other.raw))
            raw = os.pread(other.fd, size, 0)
            while len(raw) == size and size < MAX_ROW:
                size *= 4
                raw = os.pread(other.fd, size, 0)
        except OSError as exc:
            self._odd(name, f"{type(exc).__name__}: {exc}")
            return False
        if raw == other.raw:
            return False
        try:
            data = unframed(raw)
            if data is None:
                return False  # a write half done: what was read before stands, until the next
            parsed = _row(load_json(data), ROW_SCHEMA)
        except (ValueError, TypeError) as exc:
            self._odd(name, str(exc))
            parsed = None
        other.raw, other.data = raw, parsed
        return True

    def _whole_file(self, name: str, inode: int | None) -> bool:
        """Read a file replaced whole (dead.json, crossed.json) when its inode changed;
        whether it changed."""
        kept = self._whole.get(name)
        if inode is None:
            return self._whole.pop(name, None) is not None
        if kept is not None and kept[0] == inode:
            return False
        data = self._read_whole(name)
        if data is None and kept is not None and kept[0] == -1:
            return False
        self._whole[name] = (inode if data is not None else -1, data)
        return True

    def _read_whole(self, name: str) -> dict[str, Any] | None:
        try:
            fd = open_file(self.folder / name, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._odd(name, f"{type(exc).__name__}: {exc}")
            return None
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except OSError as exc:
            self._odd(name, f"{type(exc).__name__}: {exc}")
            return None
        finally:
            os.close(fd)
        try:
            raw = load_json(b"".join(chunks))
            if name == DEAD:
                return _row(raw, DEAD_SCHEMA)
            if not isinstance(raw, dict) or raw.get("schema") != CROSSED_SCHEMA:
                raise ValueError("not a crossings file of this version")
            return {"last": {(str(n), str(k)): int(p) for n, k, p in raw["last"]},
                    "counts": {(str(n), str(k)): int(c) for n, k, c in raw["counts"]}}
        except (ValueError, TypeError, KeyError) as exc:
            self._odd(name, str(exc))
            return None

    def _odd(self, name: str, why: str) -> None:
        if name in self._said or len(self._said) > 1000:
            return
        self._said.add(name)
        log.warning("budgets file %s in %s skipped: %s (its spending is left out; remove it if "
                    "it stays)", name, self.folder, why)

    # -- folding the dead -----------------------------------------------------------------------
    def fold(self, since: dict[str, int]) -> int:
        """Fold the dead workers' rows into the dead row and remove them; returns how many.
        Skipped while another worker folds."""
        dead = [r for r in self.rows.others() if r.pid != os.getpid() and not r.alive()]
        if not dead and not self._dead_row_due(since):
            return 0
        with held_if_free(self.folder / FOLD_LOCK) as free:
            if not free:
                return 0  # another worker folds now (or the lock cannot be opened)
            dead = [r for r in self.rows.others() if r.pid != os.getpid() and not r.alive()]
            old = self._read_whole(DEAD)
            spent: Spent = {}
            refused: Spent = {}
            folded: dict[str, Any] = {}
            if old is not None:
                _add(spent, old["spent"], since)
                _add(refused, old["refused"], since)
                folded = dict(old["folded"])
            now = time.time()
            for name, gone in list(folded.items()):
                if os.path.lexists(self.folder / name):
                    with contextlib.suppress(OSError):
                        os.unlink(self.folder / name)  # folded before, its row left: it goes now
                elif gone is None:
                    folded[name] = now
                elif not isinstance(gone, int | float) or now - gone > FORGET_S:
                    del folded[name]
            taken = []
            for row in dead:
                if row.name in folded:
                    continue
                data = self._dead_worker(row.path)
                if data is not None:
                    _add(spent, data["spent"], since)
                    _add(refused, data["refused"], since)
                folded[row.name] = None
                taken.append(row)
            if old is None and not taken:
                return 0
            replace(self.folder / DEAD, dump({"schema": DEAD_SCHEMA, "folded": folded,
                                              "spent": as_entries(spent),
                                              "refused": as_entries(refused)}))
            for row in taken:
                Rows.remove(row)
            return len(taken)

    def _dead_worker(self, path: Path) -> dict[str, Any] | None:
        """A dead worker's last whole row (it writes no more: a half-done write stays so)."""
        try:
            fd = open_file(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.pread(fd, MAX_ROW, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            data = unframed(raw)
            if data is None:
                kept = self._others.get(path.name)
                return kept.data if kept is not None else None  # what was read before it died
            return _row(load_json(data), ROW_SCHEMA)
        except (ValueError, TypeError) as exc:
            self._odd(path.name, str(exc))
            return None

    def _dead_row_due(self, since: dict[str, int]) -> bool:
        """Whether the dead row needs rewriting with no one newly dead: names to age or
        forget, or spending of periods that are over."""
        row = self._whole.get(DEAD, (0, None))[1]
        if row is None:
            return False
        now = time.time()
        if any(gone is None or not isinstance(gone, int | float) or now - gone > FORGET_S
               for gone in row["folded"].values()):
            return True
        return any(slot[2] < since.get(slot[0], slot[2] + 1)
                   for table in (row["spent"], row["refused"]) for slot in table)

    # -- crossings ----------------------------------------------------------------------------
    def claim(self, name: str, key: str, period: int) -> dict[tuple[str, str], int] | None:
        """The crossings counted, server-wide, with this one, if this worker is the first to
        see (budget ``name``, ``key``) crossed in ``period``; None if another was (raises
        OSError where it cannot be counted)."""
        with held(self.folder / CROSSED_LOCK):
            found = self._read_whole(CROSSED)
            last, counts = (found["last"], found["counts"]) if found is not None else ({}, {})
            if last.get((name, key), -1) >= period:
                return None
            if (name, key) not in counts and len(counts) >= MAX_CROSSED:
                key = OTHER
            last[(name, key)] = period
            counts[(name, key)] = counts.get((name, key), 0) + 1
            replace(self.folder / CROSSED, dump({
                "schema": CROSSED_SCHEMA,
                "last": [[n, k, p] for (n, k), p in last.items()],
                "counts": [[n, k, c] for (n, k), c in counts.items()],
            }))
            return dict(counts)


__all__ = ["CROSSED", "DEAD", "FORGET_S", "Found", "ServerSpending", "Spent", "framed", "unframed"]
