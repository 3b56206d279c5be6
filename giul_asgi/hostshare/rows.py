"""One file per process in a folder: how the processes of a host publish and read each other.

A row is named by its writer's pid and start time (``/proc/<pid>/stat`` field 22), so a
reused pid is never mistaken for a dead writer, and a writer is alive only while a process
with that pid *and* that start time runs. A row is replaced atomically (a temporary file,
then ``os.replace``): a reader sees the old row or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .place import make_dir


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

    def __init__(self, folder: Path, *, suffix: str = ".json", tag: str = "") -> None:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_dir(folder)
        self.folder = folder
        self.suffix = suffix
        self.name = me(tag) + suffix
        self.path = folder / self.name

    def write(self, data: bytes) -> None:
        """Replace this process's row with ``data``, atomically."""
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def others(self) -> list[Row]:
        """Every other row in the folder, live or dead (``Row.alive()`` says which)."""
        rows = []
        for name in os.listdir(self.folder):
            if name == self.name:
                continue
            who = parse(name, self.suffix)
            if who is not None:
                rows.append(Row(name, self.folder / name, who[0], who[1]))
        return rows

    def remove_dead(self, older_than_s: float, rows: list[Row] | None = None) -> int:
        """Remove dead writers' rows untouched for ``older_than_s``; returns how many."""
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


__all__ = ["Row", "Rows", "alive", "me", "parse", "process_start"]
