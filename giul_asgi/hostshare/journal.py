"""Each process's recent records in its own append-only file, found by id from any other.

A client reads ``X-Energy-Id`` from one worker's answer and asks ``/energy/requests/{id}``
of whichever worker the server hands the connection to. So each process appends every
record it keeps (first figure, then settled) to its own file in the host's place, one line
each, and looks up the others' files when its own store misses. The files are bounded
twice: after ``max_lines`` lines a file becomes the previous generation (the one before is
dropped), and a line older than ``max_age_s`` is never answered. A dead process's files are
removed once they are that old. Only what a record carries is written (figures, labels,
the id): never a request's content or a secret.

A line is ``<id> TAB <t> TAB <json>``: a reader indexes new lines by splitting, without
parsing JSON, and reads each file only from where it stopped last time.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .rows import Rows

SUFFIX = ".jsonl"
OLD = "-old"


@dataclass
class _Index:
    """Where each id's latest line is in one other process's file, as far as read."""

    inode: int
    offset: int = 0
    lines: dict[str, tuple[float, int, int]] = field(default_factory=dict)  # id -> (t, pos, len)


class Journal:
    """This process's file of recent records in ``directory``, and lookups in the others'."""

    def __init__(
        self, directory: Path, *, max_lines: int = 10_000, max_age_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rows = Rows(directory / "records", suffix=SUFFIX)
        self.old = self.rows.path.with_name(self.rows.path.name[: -len(SUFFIX)] + OLD + SUFFIX)
        self.max_lines = max_lines
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lines = 0
        self._indexes: dict[str, _Index] = {}
        self._swept = -float("inf")

    def append(self, records: Iterable[tuple[str, bytes]]) -> None:
        """Append ``(id, record as JSON bytes)`` pairs in one write. Raises OSError (the
        caller counts it)."""
        stamp = b"\t%r\t" % self.clock()
        lines = [key.encode() + stamp + record + b"\n"
                 for key, record in records if "\t" not in key and "\n" not in key]
        if not lines:
            return
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.rows.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._fd, b"".join(lines))
            self._lines += len(lines)
            if self._lines >= self.max_lines:  # this file becomes the previous generation
                os.replace(self.rows.path, self.old)
                os.close(self._fd)
                self._fd = None
                self._lines = 0

    def find(self, key: str) -> dict[str, Any] | None:
        """The latest record under ``key`` in another process's file, younger than
        ``max_age_s``; None if none. Never raises."""
        try:
            return self._find(key)
        except (OSError, ValueError):
            return None

    def _find(self, key: str) -> dict[str, Any] | None:
        now = self.clock()
        best: tuple[float, Path, int, int] | None = None
        rows = [r for r in self.rows.others() if r.path != self.old]
        seen = set()
        for row in rows:
            seen.add(row.name)
            found = self._scan(row.path, key)
            if found is not None and now - found[0] <= self.max_age_s and \
                    (best is None or found[0] >= best[0]):
                best = (found[0], row.path, found[1], found[2])
        for gone in [n for n in self._indexes if n not in seen]:
            del self._indexes[gone]
        if now - self._swept > self.max_age_s / 10:
            self._swept = now
            self.rows.remove_dead(self.max_age_s, rows)
        if best is None:
            return None
        with open(best[1], "rb") as fh:
            fh.seek(best[2])
            line = fh.read(best[3])
        record = json.loads(line.split(b"\t", 2)[2])
        return record if isinstance(record, dict) else None

    def _scan(self, path: Path, key: str) -> tuple[float, int, int] | None:
        """Index the lines added to ``path`` since the last look; ``key``'s latest line."""
        name = path.name
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            index = self._indexes.get(name)
            if index is None or index.inode != info.st_ino or info.st_size < index.offset:
                index = self._indexes[name] = _Index(info.st_ino)
            if info.st_size > index.offset:
                fh.seek(index.offset)
                chunk = fh.read(info.st_size - index.offset)
                end = chunk.rfind(b"\n") + 1  # a line being written is read next time
                pos = index.offset
                for line in chunk[:end].splitlines(keepends=True):
                    parts = line.split(b"\t", 2)
                    if len(parts) == 3:
                        with contextlib.suppress(ValueError):
                            index.lines[parts[0].decode()] = (float(parts[1]), pos, len(line))
                    pos += len(line)
                index.offset += end
        return index.lines.get(key)

    def close(self) -> None:
        """Stop writing (the file stays for the others until it ages out)."""
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


__all__ = ["Journal"]
