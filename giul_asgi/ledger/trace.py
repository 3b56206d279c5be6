"""What a ledger saw, written down so that it can be run again: a bounded, rotating trace.

A figure nobody can re-derive is a figure nobody can check. With ``Node(trace=DIR)`` the
ledger writes every input its tape and book took, in the order its lock took them: the
readings as the reader gave them (time, cumulative joules or watts, error) and the windows
(open, marks, close with tokens and the request's id, route and tier, abandon), with the
load it was told of (other workers, the upstream, the process list). ``giul-asgi replay``
(:mod:`giul_asgi.replay`) feeds them to a fresh ledger on a virtual clock: the same tape and
book, so the same figures, or the figures of another split. Nothing else goes in: no
request content, no header, no key, no tenant.

The request path only appends a tuple to an in-memory deque, under the ledger's lock it
already holds; the node's reader thread turns the tuples into lines and writes them (a
chore, and once more when the ledger stops). Building a trace touches no file (a ledger is
built where its middleware is, the event loop included), and each write opens the file
(:func:`~giul_asgi.hostshare.place.open_file`: never through a link, only a regular file of
ours) and closes it before it returns, so nothing a trace opens outlives it, stopped or
collected. The deque and the files are bounded: at most ``files`` files of ``max_bytes``
each per ledger (the oldest is dropped), and a reader thread that falls behind loses events
and says so in the trace (``{"lost": ...}``) rather than hold memory. A directory holds the
traces of live processes and those of the :data:`KEEP_DEAD` dead processes that wrote last
(each ledger removes older dead ones when it begins its trace): under worker churn at most
``(live ledgers + KEEP_DEAD) x files`` files of ``max_bytes``.

The format (JSON lines; one file holds a whole run until it rotates):

- a header object ``{"giul_trace": 1, "node": ..., "split": ..., ...}`` opens each file
  (``part`` counts the files; ``part > 0`` continues the one before);
- events are arrays, the first item naming the kind:
  ``["r", t, joules, watts, error]`` a reading; ``["o", t, w]`` window ``w`` opened;
  ``["m", t, w, stage]`` a mark; ``["c", t, w, tokens, id, route, tier]`` a close;
  ``["a", t, w]`` an abandon; ``["z", w, share_j, fill_j]`` window ``w`` settled live with
  that raw share (what replay checks itself against); ``["at", {...}]`` the reader was
  built (what it is, its idle floor, its period hint); ``["f", error]`` it failed to build;
  ``["p", foreign]`` the process list; ``["ow", t, window_seconds]`` the other workers'
  load; ``["up", t, running, spread_s, waiting]`` the upstream's; ``["s"]`` the ledger stopped;
- ``{"books": {...}}`` the live books when the ledger stopped, ``{"lost": n}`` events the
  buffer dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..hostshare.place import open_file
from ..hostshare.rows import alive, process_start

if TYPE_CHECKING:
    from ..config import Node

log = logging.getLogger("giul_asgi.ledger")

VERSION = 1
#: Files kept per node and process (the one written and the one before).
FILES = 2
#: Events held in memory between two writes at most (a stalled reader thread loses the rest).
MAX_BUFFER = 200_000
#: Seconds between two writes (a chore of the node's reader thread).
WRITE_EVERY_S = 0.5
#: Dead processes' traces kept per directory (the newest; older ones are removed when a
#: ledger begins its trace there).
KEEP_DEAD = 4

Event = tuple[Any, ...]


def trace_stem(node: str, pid: int | None = None) -> str:
    """The file name (without ``.jsonl``) of a node's trace in this process."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)
    return f"giul-trace-{safe}-{os.getpid() if pid is None else pid}"


def rotated(path: Path, part: int) -> Path:
    """The ``part``-th older file of the trace whose current file is ``path``."""
    return path.with_name(f"{path.stem}.{part}{path.suffix}")


def for_node(node: Node, split: str, measures: bool) -> Trace | None:
    """The node's trace, where it asks for one: the header says how to build its book again."""
    if node.trace is None:
        return None
    header = {
        "node": node.name, "split": split, "ramp_s": node.ramp_s, "foreign": node.foreign,
        "period_s": node.period_s, "idle_w": node.idle_w, "measures": measures,
        "pid": os.getpid(), "clock": "the ledger's (time.monotonic unless a test's)",
    }
    return Trace(node.trace, header, max_bytes=int(node.trace_mb * 1e6))


def _unused(path: Path) -> Path:
    """``path``, or ``<stem>-2.jsonl``, ``-3``... where a trace is already there."""
    n = 1
    found = path
    while os.path.lexists(found) or os.path.lexists(rotated(found, 1)):
        n += 1
        found = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return found


_PART = re.compile(r"^(?P<base>giul-trace-.+?)(?:\.(?P<part>\d+))?\.jsonl$")


def _header(path: Path) -> dict[str, Any] | None:
    """The header line of a trace file of ours, or None (not a trace, or not ours)."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        head = os.read(fd, 4096).split(b"\n", 1)[0]
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        item = json.loads(head)
    except (ValueError, RecursionError):
        return None
    return item if isinstance(item, dict) and "giul_trace" in item else None


def prune(directory: Path, keep_dead: int = KEEP_DEAD, *, mine: Path | None = None) -> int:
    """Remove the traces of dead processes from ``directory`` but the newest ``keep_dead``
    (each with its rotated parts); returns how many files went. A trace is a dead process's
    when its header's pid (and start time) runs no more; files that are not traces of this
    user's, and every live process's trace, are left alone."""
    groups: dict[str, list[tuple[Path, float]]] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                match = _PART.match(entry.name)
                if match is None or not entry.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    groups.setdefault(match["base"], []).append(
                        (Path(entry.path), entry.stat(follow_symlinks=False).st_mtime))
    except OSError:
        return 0
    dead: list[tuple[float, list[Path]]] = []
    for base, files in groups.items():
        if mine is not None and base == mine.stem:
            continue
        newest = max(files, key=lambda f: f[1])
        header = _header(newest[0])
        pid = header.get("pid") if header is not None else None
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue  # not a trace we can tell the writer of: not ours to remove
        start = header.get("start") if header is not None else None
        if alive(pid, start if isinstance(start, str) else None):
            continue
        dead.append((newest[1], [f for f, _ in files]))
    dead.sort(key=lambda d: d[0], reverse=True)
    removed = 0
    for _, paths in dead[keep_dead:]:
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


class Trace:
    """One node's trace in this process: a buffer the request path appends to, and the
    files the reader thread writes it to (opened for each write and closed at once: nothing
    the trace opens outlives the write, however the trace ends)."""

    def __init__(
        self, directory: str | os.PathLike[str], header: dict[str, Any], *,
        max_bytes: int, files: int = FILES, max_buffer: int = MAX_BUFFER, keep_dead: int = KEEP_DEAD,
    ) -> None:
        # No I/O here: a ledger is built wherever its middleware is, the event loop included.
        self.directory = Path(directory)
        self.path = self.directory / f"{trace_stem(str(header.get('node', 'node')))}.jsonl"
        self.header = dict(header)
        self.max_bytes = max_bytes
        self.files = max(1, files)
        self.keep_dead = keep_dead
        self.buffer: deque[Event] = deque(maxlen=max_buffer)
        #: The request path's whole cost: ``note(event)`` under the ledger's lock.
        self.note = self.buffer.append
        self._fd: int | None = None  # open only within one write
        self._begun = False
        self._size = 0
        self._head = 0
        self._part = 0
        self._attach: Event | None = None  # repeated at the top of each new file
        self.lost = 0
        self.broken: str | None = None
        self.closed = False

    def write(self) -> None:
        """Write what the buffer holds (the reader thread; never raises)."""
        buffer = self.buffer
        n = len(buffer)
        if n == 0 or self.broken is not None:
            if self.broken is not None:
                buffer.clear()
            return
        full = n >= (buffer.maxlen or n + 1)
        events = [buffer.popleft() for _ in range(n)]
        try:
            self._write(events, full)
        except (OSError, TypeError, ValueError) as exc:
            self._broke(exc)
        finally:
            self._close_file()

    def _broke(self, exc: BaseException) -> None:
        self.broken = f"{type(exc).__name__}: {exc}"
        log.error("the trace %s cannot be written (%s); tracing stops for this node",
                  self.path, self.broken)

    def _write(self, events: Iterable[Event], full: bool) -> None:
        self._ensure_open()
        chunk: list[str] = []
        pending = 0
        if full:
            self.lost += 1
            chunk.append(json.dumps({"lost": "some: the trace's buffer filled (the reader "
                                             "thread fell behind); replay will not agree"}) + "\n")
            pending += len(chunk[-1])
        for event in events:
            if event[0] == "c":  # the request's (id, route, tier), flattened
                about = event[4] if event[4] is not None else (None, None, None)
                line = json.dumps(["c", event[1], event[2], event[3], *about]) + "\n"
            else:
                line = json.dumps(event) + "\n"
            if self._size + pending + len(line) > self.max_bytes and self._size + pending > self._head:
                self._put("".join(chunk))
                chunk, pending = [], 0
                self._rotate()
            if event[0] == "at":
                self._attach = event  # repeated at the top of the next file
            chunk.append(line)
            pending += len(line)
        self._put("".join(chunk))

    def _put(self, text: str) -> None:
        """Append ``text`` to the current file (JSON is ASCII: a character is a byte)."""
        assert self._fd is not None
        view = memoryview(text.encode("ascii"))
        while view:
            view = view[os.write(self._fd, view):]
        self._size += len(text)

    def _ensure_open(self) -> None:
        if self._fd is not None:
            return
        if self._begun:
            try:
                self._fd = open_file(self.path, os.O_WRONLY | os.O_APPEND)
                return
            except FileNotFoundError:
                pass  # removed under us: begun again, with its header
        else:
            self._begun = True
            if isinstance(self.header.get("pid"), int):  # read here, off the loop: /proc
                self.header.setdefault("start", process_start(self.header["pid"]))
            self.path = _unused(self.path)  # another ledger of this node and process: its own
            prune(self.directory, self.keep_dead, mine=self.path)
        self._open_new()

    def _open_new(self) -> None:
        self._fd = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._size = os.fstat(self._fd).st_size
        head = {"giul_trace": VERSION, **self.header, "part": self._part,
                "written_unix": round(time.time(), 3)}
        text = json.dumps(head) + "\n"
        if self._part and self._attach is not None:
            text += json.dumps(self._attach) + "\n"
        self._put(text)
        self._head = self._size  # a file holds at least one event past its header

    def _rotate(self) -> None:
        self._close_file()
        for part in range(self.files - 1, 0, -1):
            older = rotated(self.path, part)
            newer = self.path if part == 1 else rotated(self.path, part - 1)
            if os.path.lexists(newer):
                os.replace(newer, older)
        if self.files == 1:
            self.path.unlink(missing_ok=True)
        self._part += 1
        self._open_new()

    def close(self, books: dict[str, float] | None = None) -> None:
        """Write the rest and the live books (the ledger stopped); nothing stays open."""
        if self.closed:
            return
        self.write()
        self.closed = True
        if books is not None and self.broken is None:
            try:
                self._ensure_open()
                self._put(json.dumps({"books": books}) + "\n")
            except (OSError, TypeError, ValueError) as exc:
                self._broke(exc)
            finally:
                self._close_file()

    def _close_file(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["FILES", "KEEP_DEAD", "MAX_BUFFER", "VERSION", "WRITE_EVERY_S", "Trace", "for_node", "prune",
           "rotated", "trace_stem"]
