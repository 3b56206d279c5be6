"""One server's statistics files: each live worker's row and tail, one row for the dead, and their bound.

``stats/<server key>.<keeper>/`` in the host's place (:attr:`ServerId.folder`) holds, and
never anything else:

- ``<pid>-<start>-<n>.json``: a live worker's *row*, its whole state at its last cut,
  replaced atomically every ``flush_s``;
- ``<pid>-<start>-<n>.tail``: what it counted since, written in place (:mod:`.tail`);
- ``dead.json``: every dead worker's counts folded into one row, with the names folded
  (each kept :data:`FORGET_S` after its files went, so a reader that listed them meanwhile
  never counts them twice);
- ``server.json``: which server this is and the process that keeps it (its master);
- ``tenants.txt``: the tenants that keep their own label in the merged statistics, the
  first ``2 x max_tenants`` admitted by any worker (:meth:`ServerFolder.admit`);
- ``.fold.lock``: whoever folds holds it (``flock``); the others go on.

A dead worker (gunicorn's ``--max-requests``, a kill) is folded by the next live worker to
look, within its ``flush_s``, and its two files removed. So the folder holds at most
``2 x live workers + 4`` files, and for a moment the workers that died since the last look:
its bytes are the live workers' tails (``2 x tail.AREA`` each) and the rows (each bounded
as :meth:`EnergyStats.bound` says, whatever the number of requests or of dead workers).

A dead *server*'s folder (its keeper and every worker gone: a restart, another server that
ran before on the host) is removed by the next statistics to start on the host, at once: the
keeper is in the folder's name, so a folder is never judged before its files are made (a
folder of the former layout, named by the key alone, only once a minute old); rows of
the former flat layout (``stats/<pid>-<start>.json``) likewise once their writer is dead.

Nothing in the folder is trusted: a row that is not JSON, has NaN or Infinity in it, or
counts in something that is not a whole number is skipped and said once, naming the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hostshare.place import held_if_free, make_dir, open_file, own_entries
from ..hostshare.rows import Row, Rows, alive, load_json, parse, replace
from ..hostshare.server import ServerId, keeper_in
from .labels import NONE, OTHER
from .tail import AREA, SUFFIX, Changed, Generation, Tail, TailReader

log = logging.getLogger("giul_asgi.stats")

DEAD = "dead.json"
SERVER = "server.json"
LOCK = ".fold.lock"
TENANTS = "tenants.txt"
DEAD_SCHEMA = "giul-asgi/stats-dead/1"
_said: set[tuple[str, str]] = set()  # (folder, file) said skipped, once a process
_said_lock = threading.Lock()
#: A folder of the former layout (no keeper in its name) this young is never removed (its
#: first files may not be there yet).
YOUNG_S = 60.0
#: How long a folded name is remembered after its files are removed (seconds).
FORGET_S = 60.0


@dataclass(slots=True)
class Other:
    """Another worker of this server, as read now."""

    name: str
    row: dict[str, Any]
    #: its tail's generations from its row's cut on
    gens: list[Generation]
    alive: bool


@dataclass(slots=True)
class Found:
    """What the folder holds besides this worker's own files."""

    others: list[Other]
    #: the dead workers' row (``None``: nobody died yet)
    dead: dict[str, Any] | None


def dump(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


class ServerFolder:
    """This worker's files in its server's folder, and the others'. Raises OSError where
    the folder or the files cannot be made (a full or read-only place)."""

    def __init__(self, root: Path, server: ServerId, *, tag: str, place: Path,
                 step_s: float, area: int = AREA) -> None:
        self.server = server
        self.root = root
        self.folder = make_dir(root / server.folder, root=place)
        self.rows = Rows(self.folder, tag=tag, root=place)
        self.step_s = step_s
        self.tail = Tail(self.folder / (self.rows.name[: -len(".json")] + SUFFIX), area=area)
        try:
            if not (self.folder / SERVER).exists():
                replace(self.folder / SERVER, dump({"key": server.key, "how": server.how,
                                                    "keeper": list(server.keeper)}))
        except BaseException:
            self.tail.close()
            raise
        self._rows: dict[str, tuple[tuple[int, int, int], Any]] = {}
        self._tails: dict[str, TailReader] = {}
        self._dead: tuple[tuple[int, int, int], Any] | None = None
        self._lock = threading.Lock()  # the caches: /energy, /metrics and the writer look at once

    # -- saying once what is skipped -----------------------------------------------------------
    def odd(self, name: str, why: str) -> None:
        """Log once per file that it is skipped, and why."""
        said = (str(self.folder), name)
        with _said_lock:
            if said in _said:
                return
            if len(_said) > 1000:
                _said.clear()
            _said.add(said)
        log.warning("statistics file %s in %s skipped: %s (its counts are left out; remove it "
                    "if it stays)", name, self.folder, why)

    # -- reading ------------------------------------------------------------------------------
    def _parsed(self, path: Path, cache: dict[str, tuple[tuple[int, int, int], Any]]) -> Any:
        """The file's JSON, parsed only when it changed; raises OSError or ValueError."""
        fd = open_file(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            kept = cache.get(path.name)
            if kept is not None and kept[0] == stamp:
                return kept[1]
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = load_json(b"".join(chunks))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        cache[path.name] = (stamp, data)
        return data

    def find(self) -> Found:
        """The other workers' rows and tails, and the dead row (read last: a worker it
        folded meanwhile is counted there, never twice, never not at all). Copies: any
        thread may read them while another looks again."""
        with self._lock:
            return self._find()

    def _find(self) -> Found:
        others: list[Other] = []
        seen: set[str] = set()
        me = os.getpid()
        for row in self.rows.others():
            seen.add(row.name)
            if row.pid == me:
                continue  # another middleware in this process: not another worker
            other = self._other(row)
            if other is not None:
                others.append(other)
        for cache in (self._rows, self._tails):
            for name in [n for n in cache if n not in seen]:
                del cache[name]
        dead = self._dead_row()
        if dead is not None:
            folded = dead.get("folded", {})
            others = [o for o in others if o.name not in folded]
        return Found(others, dead)

    def mine(self) -> Other | None:
        """This worker's row and tail as the others read them (its row on disk, the tail
        after it)."""
        with self._lock:
            return self._other(Row(self.rows.name, self.rows.path, os.getpid(), None))

    def _other(self, row: Row) -> Other | None:
        for _ in range(3):
            try:
                data = self._parsed(row.path, self._rows)
            except FileNotFoundError:
                return None  # folded and removed meanwhile: the dead row has it
            except (OSError, ValueError) as exc:
                self.odd(row.name, f"{type(exc).__name__}: {exc}")
                return None
            cut = data.get("state", {}).get("cut") if isinstance(data.get("state"), dict) else None
            gen = cut.get("gen") if isinstance(cut, dict) else None
            gens: list[Generation] = []
            if type(gen) is int and gen > 0:
                tail = self._tails.get(row.name)
                if tail is None:
                    tail = self._tails[row.name] = TailReader(
                        row.path.with_name(row.name[: -len(".json")] + SUFFIX), self.step_s)
                try:
                    gens = tail.read(gen)
                except Changed:
                    continue  # its row moved on meanwhile: read it again
                except FileNotFoundError:
                    gens = []  # no tail (yet, or any more): the row alone
                except OSError as exc:
                    self.odd(row.name[: -len(".json")] + SUFFIX, f"{type(exc).__name__}: {exc}")
            for g in gens:
                if g.bad:
                    self.odd(row.name[: -len(".json")] + SUFFIX, f"{g.bad} entries that make no sense")
            return Other(row.name, data, [g.snapshot() for g in gens], row.alive())
        return None

    def _dead_row(self) -> dict[str, Any] | None:
        path = self.folder / DEAD
        try:
            fd = open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.odd(DEAD, f"{type(exc).__name__}: {exc}")
            return None
        os.close(fd)
        cache: dict[str, tuple[tuple[int, int, int], Any]] = {}
        if self._dead is not None:
            cache[DEAD] = self._dead
        try:
            data = self._parsed(path, cache)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.odd(DEAD, f"{type(exc).__name__}: {exc}")
            return None
        self._dead = cache[DEAD]
        if data.get("schema") != DEAD_SCHEMA or not isinstance(data.get("folded"), dict):
            self.odd(DEAD, "not a dead row of this version")
            return None
        return dict(data)

    # -- the tenants that keep a label ---------------------------------------------------------
    def admit(self, names: set[str], most: int) -> set[str]:
        """Of ``names``, the tenants that keep their own label in this server's merged
        statistics: the first ``most`` ever admitted by any worker (``tenants.txt``, lines
        appended, never removed), so every worker's answer labels them alike, now and later,
        and a tenant's counters never move to ``<other>`` and back."""
        path = self.folder / TENANTS
        register = self._register(path)
        admitted = set(register[:most])
        listed = set(register)
        new = sorted(n for n in names if n not in listed and "\n" not in n and n not in (NONE, OTHER))
        if new and len(register) < most:
            try:
                fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                try:
                    os.write(fd, "".join(f"{n}\n" for n in new[: most - len(register)]).encode())
                finally:
                    os.close(fd)
            except OSError:
                return admitted & names  # full, or not ours: the new ones count under <other>
            admitted = set(self._register(path)[:most])  # the order appends landed in decides
        return admitted & names

    def _register(self, path: Path) -> list[str]:
        try:
            fd = open_file(path, os.O_RDONLY)
        except OSError:
            return []
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        text = b"".join(chunks).decode("utf-8", "replace")
        return [line for line in text.split("\n")[:-1] if line]  # a line being written is not one yet

    # -- folding the dead ---------------------------------------------------------------------
    def fold(self, merge: Callable[[dict[str, Any] | None, list[Other]], dict[str, Any]]) -> int:
        """Fold the dead workers into the dead row (``merge(dead row, dead workers)`` makes
        the new one) and remove their files; returns how many. Skipped while another worker
        folds."""
        me = os.getpid()
        with self._lock:  # a look by name first: the live workers' rows are not read here
            gone = [r for r in self.rows.others() if r.pid != me and not r.alive()]
            last = self._dead_row()
        folded = last.get("folded", {}) if last is not None else {}
        if not [r for r in gone if r.name not in folded] and not [n for n in folded if self._gone(n)]:
            return 0
        with held_if_free(self.folder / LOCK) as mine:
            if not mine:
                return 0  # another worker folds now
            found = self.find()  # under the lock: what the last folder left
            dead = [o for o in found.others if not o.alive]
            now = time.time()
            folded = dict(found.dead.get("folded", {})) if found.dead is not None else {}
            for name, gone in list(folded.items()):
                if self._gone(name):
                    if gone is None:
                        folded[name] = now
                    elif not isinstance(gone, float | int) or now - gone > FORGET_S:
                        del folded[name]
                else:
                    self._remove(name)  # folded before, its files left: they go now
            if dead:
                row = merge(found.dead, dead)
                for other in dead:
                    folded[other.name] = None
            elif found.dead is not None:
                row = dict(found.dead)
            else:
                return 0
            row["schema"] = DEAD_SCHEMA
            row["folded"] = folded
            replace(self.folder / DEAD, dump(row))
            for other in dead:
                self._remove(other.name)
            return len(dead)

    def _gone(self, name: str) -> bool:
        return not os.path.lexists(self.folder / name)

    def _remove(self, name: str) -> None:
        for path in (self.folder / name, self.folder / (name[: -len(".json")] + SUFFIX)):
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- leaving ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop writing in place (the files stay: a dead worker's counts are folded)."""
        self.tail.close(remove=False)


def remove_dead_servers(root: Path, ours: str) -> int:
    """Remove the folders of servers that no longer run (every worker dead, and the keeper),
    and dead writers' rows of the former flat layout; returns how many folders and rows."""
    removed = 0
    for entry, info in own_entries(root):
        if stat.S_ISREG(info.st_mode):
            who = parse(entry.name, ".json")
            if who is not None and not alive(*who):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed += 1
            continue
        if entry.name == ours or not stat.S_ISDIR(info.st_mode):
            continue
        keeper = keeper_in(entry.name)
        if keeper is not None and alive(*keeper):
            continue
        if keeper is None and time.time() - info.st_mtime < YOUNG_S:
            continue  # the former layout's, starting now: its files are being made
        if _server_dead(Path(entry.path)):
            removed += _remove_folder(Path(entry.path))
    return removed


def _server_dead(folder: Path) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        who = parse(name, ".json") or parse(name, SUFFIX)
        if who is not None and alive(*who):
            return False
    try:
        keeper = load_json((folder / SERVER).read_bytes()).get("keeper")
        if alive(int(keeper[0]), None if keeper[1] is None else str(keeper[1])):
            return False
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        pass  # no keeper said: its workers are all there is
    return True


def _remove_folder(folder: Path) -> int:
    uid = os.getuid()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if (entry.is_file(follow_symlinks=False) or entry.is_symlink()) \
                            and entry.stat(follow_symlinks=False).st_uid == uid:
                        os.unlink(entry.path)
        os.rmdir(folder)
    except OSError:
        return 0
    return 1


__all__ = ["DEAD", "DEAD_SCHEMA", "FORGET_S", "LOCK", "SERVER", "TENANTS", "Found", "Other", "ServerFolder",
           "dump", "remove_dead_servers"]
