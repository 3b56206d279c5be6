"""One server's spending files: each worker's row, one row for the dead, and who crossed first.

``budgets/<server key>/`` in the host's place (:mod:`giul_asgi.hostshare.place`; the key:
:mod:`giul_asgi.hostshare.server`, so two servers on one host never mix their budgets, and
a restart starts from its own) holds, and never anything else:

- ``<pid>-<start>-<n>.json``: a worker's *row*, what it spent per (budget, key, period) in
  the periods not over yet (and its refusals), replaced atomically by its budgets' thread;
- ``dead.json``: every dead worker's spending in those periods, folded into one row with the
  names folded (kept :data:`FORGET_S` after their files went, so a reader that listed a row
  just before it was folded never counts it twice);
- ``crossed.json``: for each (budget, key) the last period it was crossed in and how many
  times it was, written by whichever worker saw the crossing first, under ``.crossed.lock``
  (``flock``): one log line and one count per crossing, whichever worker saw it;
- ``server.json``: which server this is and the process that keeps it, so the next server's
  start removes this folder once every worker and the keeper are gone.

A dead worker's spending counts until its period ends (a worker killed with -9 does not give
its tenants their joules back); the next live worker to look folds it within a second. So
the folder holds at most ``live workers + 4`` files and, for a moment, the workers that died
since the last look. Every file is opened through :func:`~giul_asgi.hostshare.place.open_file`
(``O_NOFOLLOW``, a regular file of this user's with one link) and nothing read is trusted: a
row that is not JSON, or holds a number that is not finite and >= 0, is skipped and said once.
Nothing here runs on a request's path: the budgets' thread calls it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hostshare.place import make_dir, open_file
from ..hostshare.rows import Rows, replace
from ..hostshare.server import ServerId
from ..stats.folder import remove_dead_servers

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
OTHER = "<other>"

#: (budget name, key, period index) -> joules or grams spent
Spent = dict[tuple[str, str, int], float]


@dataclass(slots=True)
class Found:
    """What the folder holds besides this worker's own row, summed."""

    spent: Spent
    refused: Spent
    #: live workers besides this one
    live: int
    #: dead workers (folded or not) whose rows count
    dead: int


def dump(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


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


def as_entries(spent: Spent) -> list[list[Any]]:
    return [[name, key, period, value] for (name, key, period), value in spent.items()]


def _add(into: Spent, more: Spent, since: dict[str, int]) -> None:
    """Add ``more``'s entries of periods not over yet (``since``: each budget's current
    period; a budget not in it, another configuration's, is left out)."""
    for slot, value in more.items():
        current = since.get(slot[0])
        if current is not None and slot[2] >= current:
            into[slot] = into.get(slot, 0.0) + value


class ServerSpending:
    """This worker's row in its server's budgets folder, and everyone else's. Raises OSError
    where the folder or the row cannot be made (a full or read-only place)."""

    def __init__(self, place: Path, server: ServerId, *, tag: str) -> None:
        self.server = server
        self.root = place / "budgets"
        self.folder = make_dir(self.root / server.key, root=place)
        self.rows = Rows(self.folder, tag=tag, root=place)
        if not (self.folder / SERVER).exists():
            replace(self.folder / SERVER, dump({"key": server.key, "how": server.how,
                                                "keeper": list(server.keeper)}))
        remove_dead_servers(self.root, server.key)  # earlier runs' folders, once all are gone
        self._cache: dict[str, tuple[tuple[int, int, int], Any]] = {}
        self._stamp: int | None = None
        self._said: set[str] = set()

    # -- this worker ------------------------------------------------------------------------
    def write(self, spent: Spent, refused: Spent) -> None:
        """Replace this worker's row (raises OSError: the place is full or gone)."""
        self.rows.write(dump({"schema": ROW_SCHEMA, "pid": os.getpid(),
                              "spent": as_entries(spent), "refused": as_entries(refused)}))

    # -- the others ---------------------------------------------------------------------------
    def changed(self) -> bool:
        """Whether a file in the folder was replaced, made or removed since the last
        :meth:`read` (a row is replaced by a rename, which changes the folder's time)."""
        try:
            stamp = os.stat(self.folder).st_mtime_ns
        except OSError:
            return True
        return stamp != self._stamp

    def read(self, since: dict[str, int]) -> Found:
        """The other workers' spending in the periods from ``since`` on (budget name ->
        its current period), live and dead, and the dead row's (read last: a worker folded
        meanwhile is counted there, never twice, never not at all)."""
        with contextlib.suppress(OSError):
            self._stamp = os.stat(self.folder).st_mtime_ns
        spent: Spent = {}
        refused: Spent = {}
        live = dead = 0
        me = os.getpid()
        names: dict[str, bool] = {}
        rows = []
        for row in self.rows.others():
            if row.pid == me:
                continue  # another middleware of this process: not another worker
            data = self._parsed(row.path)
            if data is not None:
                rows.append((row.name, data, row.alive()))
                names[row.name] = True
        for name in [n for n in self._cache if n not in names and n != DEAD]:
            del self._cache[name]
        dead_row = self._parsed(self.folder / DEAD, schema=DEAD_SCHEMA)
        folded = dead_row.get("folded", {}) if dead_row is not None else {}
        for name, data, alive in rows:
            if name in folded:
                continue
            _add(spent, data["spent"], since)
            _add(refused, data["refused"], since)
            live += alive
            dead += not alive
        if dead_row is not None:
            _add(spent, dead_row["spent"], since)
            _add(refused, dead_row["refused"], since)
            dead += len(folded)
        return Found(spent, refused, live, dead)

    def _parsed(self, path: Path, schema: str = ROW_SCHEMA) -> dict[str, Any] | None:
        """A row's content as dicts, parsed only when it changed; None when it is gone or
        makes no sense (said once)."""
        try:
            fd = open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._odd(path.name, f"{type(exc).__name__}: {exc}")
            return None
        try:
            st = os.fstat(fd)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            kept = self._cache.get(path.name)
            if kept is not None and kept[0] == stamp:
                return dict(kept[1])
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        except OSError as exc:
            self._odd(path.name, f"{type(exc).__name__}: {exc}")
            return None
        finally:
            os.close(fd)
        try:
            raw = json.loads(b"".join(chunks), parse_constant=_no_constant)
            if not isinstance(raw, dict) or raw.get("schema") != schema:
                raise ValueError("not a budgets row of this version")
            data: dict[str, Any] = {"spent": dict(entries(raw.get("spent", []))),
                                    "refused": dict(entries(raw.get("refused", [])))}
            if schema == DEAD_SCHEMA:
                folded = raw.get("folded")
                if not isinstance(folded, dict):
                    raise ValueError("no folded names")
                data["folded"] = folded
        except (ValueError, TypeError) as exc:
            self._odd(path.name, str(exc))
            return None
        self._cache[path.name] = (stamp, data)
        return dict(data)

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
        if not dead and not (self.folder / DEAD).exists():
            return 0
        try:
            lock = open_file(self.folder / FOLD_LOCK, os.O_RDWR | os.O_CREAT)
        except OSError:
            return 0
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0  # another worker folds now
            dead = [r for r in self.rows.others() if r.pid != os.getpid() and not r.alive()]
            old = self._parsed(self.folder / DEAD, schema=DEAD_SCHEMA)
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
                data = self._parsed(row.path)
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
        finally:
            os.close(lock)

    # -- crossings ----------------------------------------------------------------------------
    def claim(self, name: str, key: str, period: int) -> bool:
        """Whether this worker is the first to see (budget ``name``, ``key``) crossed in
        ``period``; if so the crossing is counted (raises OSError where it cannot be)."""
        lock = open_file(self.folder / CROSSED_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            last, counts = self._crossings()
            if last.get((name, key), -1) >= period:
                return False
            if (name, key) not in counts and len(counts) >= MAX_CROSSED:
                key = OTHER
            last[(name, key)] = period
            counts[(name, key)] = counts.get((name, key), 0) + 1
            replace(self.folder / CROSSED, dump({
                "schema": CROSSED_SCHEMA,
                "last": [[n, k, p] for (n, k), p in last.items()],
                "counts": [[n, k, c] for (n, k), c in counts.items()],
            }))
            return True
        finally:
            os.close(lock)

    def crossings(self) -> dict[tuple[str, str], int]:
        """How many times each (budget, key) was crossed, server-wide, since the server started."""
        return self._crossings()[1]

    def _crossings(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        try:
            fd = open_file(self.folder / CROSSED, os.O_RDONLY)
        except FileNotFoundError:
            return {}, {}
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        try:
            raw = json.loads(b"".join(chunks), parse_constant=_no_constant)
            last = {(str(n), str(k)): int(p) for n, k, p in raw["last"]}
            counts = {(str(n), str(k)): int(c) for n, k, c in raw["counts"]}
        except (ValueError, TypeError, KeyError) as exc:
            self._odd(CROSSED, str(exc))
            return {}, {}
        return last, counts


__all__ = ["CROSSED", "DEAD", "FORGET_S", "Found", "ServerSpending", "Spent"]
