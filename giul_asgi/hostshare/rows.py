"""One file per process in a folder: how the processes of a host publish and read each other.

A row is named by its writer's pid and start time (``/proc/<pid>/stat`` field 22), so a
reused pid is never mistaken for a dead writer, and a writer is alive only while a process
with that pid *and* that start time runs. A row is replaced atomically (a temporary file,
then ``os.replace``): a reader sees the old row or the new one, never half of one.

Nothing in the folder is taken on trust (:mod:`.place`): the folder is made by
:func:`~.place.make_dir`, the temporary file is created by :func:`~.place.open_file`
(``O_EXCL | O_NOFOLLOW``; the replace renames the name itself and never follows a link at
the row's path), and :meth:`Rows.others` lists only regular files of this user's. The
temporary file is named by its writer (``.tmp-<pid>-<start>-<random>``), so one left by a
writer that was killed between the two steps is removed once that writer is dead, and any
older than :data:`STALE_TMP_S` (the old unnamed ones included).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .place import make_dir, open_file, own_entries

log = logging.getLogger("giul_asgi.hostshare")

#: The prefix of a row's temporary file.
TMP = ".tmp-"
#: A temporary file this old is a dead writer's whoever wrote it (a live one holds it for
#: the time of one write).
STALE_TMP_S = 60.0


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time (clock ticks since boot), from
    ``/proc/<pid>/stat``; None where there is no such process (or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None (no such process, no /proc)."""
    found = _stat(pid)
    return found[1] if found is not None else None


def alive(pid: int, start: str | None) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs. A zombie (killed,
    not yet reaped by its parent) does not: ``kill(pid, 0)`` still finds it, and a worker
    killed with -9 under a parent slow to reap it would go on holding its windows open."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and is another user's
    except OSError:
        return False
    found = _stat(pid)
    if found is None:
        return True  # no /proc to look in: the signal said it exists
    state, started = found
    return state not in ("Z", "X") and (start is None or started == start)


def me(tag: str = "") -> str:
    """This process's row name: ``<pid>-<start>`` (and ``-<tag>``)."""
    pid = os.getpid()
    name = f"{pid}-{process_start(pid) or 'x'}"
    return f"{name}-{tag}" if tag else name


def replace(path: Path, data: bytes) -> None:
    """Replace the file at ``path`` with ``data``, atomically: a temporary file of this
    process's in the same folder (``O_EXCL | O_NOFOLLOW``), then ``os.replace``. Raises
    OSError (ENOSPC: the place is full), leaving no temporary file behind."""
    tmp = path.parent / f"{TMP}{me()}-{secrets.token_hex(4)}"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True, slots=True)
class Row:
    """Another writer's row as found in the folder."""

    name: str
    path: Path
    pid: int
    start: str | None

    def alive(self) -> bool:
        return alive(self.pid, self.start)


def parse(name: str, suffix: str) -> tuple[int, str | None] | None:
    """``(pid, start)`` from a row's file name, or None if it is not a row."""
    if not name.endswith(suffix) or name.startswith("."):
        return None
    parts = name[: -len(suffix)].split("-")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    return int(parts[0]), (None if parts[1] == "x" else parts[1])


class Rows:
    """This process's row in ``folder`` and the others' (``tag`` tells apart several rows of one
    process, such as two nodes on one card)."""

    def __init__(self, folder: Path, *, suffix: str = ".json", tag: str = "",
                 root: Path | None = None) -> None:
        make_dir(folder, root=root)  # with root: every folder from the place down is checked
        self.folder = folder
        self.suffix = suffix
        self.name = me(tag) + suffix
        self.path = folder / self.name
        self._uid = os.getuid()
        self._foreign_said = False
        self.remove_stale_tmp()

    def write(self, data: bytes) -> None:
        """Replace this process's row with ``data``, atomically."""
        replace(self.path, data)

    def others(self) -> list[Row]:
        """Every other row in the folder, live or dead (``Row.alive()`` says which): regular
        files of this user's only (a link, or a file someone else put here, is never a row)."""
        rows = []
        try:
            entries = os.scandir(self.folder)
        except FileNotFoundError:  # the place was deleted under us: no other rows to read
            return []  # (a hostile trial: /energy and /metrics answered 500 for it)
        with entries:
            for entry in entries:
                name = entry.name
                if name == self.name:
                    continue
                who = parse(name, self.suffix)
                if who is None or not self._ours(entry):
                    continue
                rows.append(Row(name, self.folder / name, who[0], who[1]))
        return rows

    def _ours(self, entry: os.DirEntry[str]) -> bool:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        if stat.S_ISREG(info.st_mode) and info.st_uid == self._uid:
            return True
        if not self._foreign_said:
            self._foreign_said = True
            log.warning("%s in %s is %s: never read (someone else writes in the host's place?)",
                        entry.name, self.folder,
                        "not a regular file" if not stat.S_ISREG(info.st_mode)
                        else f"another user's (uid {info.st_uid})")
        return False

    def remove_stale_tmp(self) -> int:
        """Remove temporary files whose writer is dead, or older than :data:`STALE_TMP_S`."""
        now = time.time()
        removed = 0
        try:
            with os.scandir(self.folder) as entries:
                names = [(e.name, e) for e in entries if e.name.startswith(TMP)]
        except OSError:
            return 0
        for name, entry in names:
            try:
                old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S
                parts = name[len(TMP):].split("-")
                writer = parse(f"{parts[0]}-{parts[1]}.x", ".x") if len(parts) >= 3 else None
                if old or (writer is not None and not alive(*writer)):
                    os.unlink(self.folder / name)
                    removed += 1
            except OSError:
                continue
        return removed

    def remove_dead(self, older_than_s: float, rows: list[Row] | None = None) -> int:
        """Remove dead writers' rows untouched for ``older_than_s`` (and their temporary
        files, :meth:`remove_stale_tmp`); returns how many rows."""
        self.remove_stale_tmp()
        now = time.time()
        removed = 0
        for row in rows if rows is not None else self.others():
            try:
                if now - row.path.stat().st_mtime < older_than_s or row.alive():
                    continue
                row.path.unlink()
                removed += 1
            except OSError:
                continue
        return removed

    @staticmethod
    def remove(row: Row) -> None:
        """Remove another writer's row (a dead one's)."""
        with contextlib.suppress(OSError):
            row.path.unlink()

    def close(self) -> None:
        """Leave the folder (readers keep what they saw of this row)."""
        with contextlib.suppress(OSError):
            self.path.unlink()


#: A process's word that its figures are its own (``<row>.unshared``: why, in a few words).
UNSHARED = ".unshared"


def say_unshared(folder: Path, root: Path, tag: str, reason: str) -> None:
    """Leave ``<row>.unshared`` in ``folder`` saying why this process's figures are its own,
    for the other processes of its server to say (:func:`unshared_in`). Best effort: a full
    place may take the name and not the words."""
    with contextlib.suppress(OSError):
        make_dir(folder, root=root)
        fd = open_file(folder / f"{me(tag)}{UNSHARED}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, reason.encode()[:400])
        finally:
            os.close(fd)


def unshared_in(folder: Path) -> list[tuple[int, str | None]]:
    """The live processes that said their figures are their own in ``folder``: (pid, why);
    a dead one's word is removed."""
    out = []
    for marker, _ in own_entries(folder):  # another user's word is nobody's here
        who = parse(marker.name, UNSHARED)
        if who is None:
            continue
        if not alive(*who):
            with contextlib.suppress(OSError):
                os.unlink(marker.path)
            continue
        out.append((who[0], read_small(Path(marker.path))))
    return out


def read_small(path: Path) -> str | None:
    """A few hundred bytes of words another process left (None: none, or not readable)."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 400).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text or None


#: The most digits an integer another process wrote may have: past 64 bits it is nobody's
#: count, and a float of it overflows (10**400 made math.isfinite raise, a hostile trial).
MOST_DIGITS = 20


def load_json(raw: bytes | str) -> Any:
    """JSON another process wrote to the place, taken as nothing more than plain values: NaN
    and Infinity, an integer past 64 bits and nesting past the parser's depth are each a
    ValueError, what every reader of the place already treats as an odd file (a hostile
    trial planted ``[`` x 100,000: the RecursionError went past them, /energy answered 500
    while the file stayed and a statistics thread died)."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_int=_int)
    except RecursionError:
        raise ValueError("nested deeper than a row is") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MOST_DIGITS:
        raise ValueError("an integer past 64 bits")
    return int(digits)


__all__ = ["MOST_DIGITS", "STALE_TMP_S", "TMP", "UNSHARED", "Row", "Rows", "alive", "load_json", "me",
           "parse", "process_start", "read_small", "replace", "say_unshared", "unshared_in"]
