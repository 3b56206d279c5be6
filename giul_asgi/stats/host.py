"""HostStats: several workers' statistics, merged when one of them is read.

``uvicorn --workers 4`` or gunicorn run one process per worker, each with its own
:class:`~giul_asgi.stats.EnergyStats`. :class:`HostStats` wraps a worker's statistics
after the model of prometheus_client's multiprocess mode: each worker writes its mergeable
state (counters and DDSketch bins, per label and time slot) to its own file in a shared
directory, every ``flush_s`` seconds when it changed, atomically (a temporary file then
``os.replace``), and at exit. A worker answering ``/energy`` or ``/metrics`` merges its
own live state with every other file it finds (sketches merge exactly). Other workers'
figures are at most ``flush_s`` old.

The directory is ``directory=`` or the ``GIUL_ASGI_MULTIPROC_DIR`` environment variable.
Files are named by pid and start time, so a reused pid never overwrites a dead worker's
file. Dead workers' files are kept, as prometheus_client keeps its own: their counters
since start still count (counters must never go backwards), and their time windows age
out by themselves because slots are aligned on wall-clock time. Clear the directory when
the server (re)starts, as for ``PROMETHEUS_MULTIPROC_DIR``; :func:`clear_directory` does.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..energy import Energy
from ..errors import ConfigError
from ..listeners import Settled
from .stats import EnergyStats

ENV = "GIUL_ASGI_MULTIPROC_DIR"
_PREFIX = "giul-stats-"


def multiproc_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The shared directory: the argument, else ``$GIUL_ASGI_MULTIPROC_DIR``."""
    value = directory if directory is not None else os.environ.get(ENV)
    if not value:
        raise ConfigError(
            "no directory for the workers' statistics",
            remedy=f"pass directory= or set {ENV} to a directory every worker can write",
        )
    path = Path(value)
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory", remedy=f"create it, or point {ENV} elsewhere")
    return path


def clear_directory(directory: str | os.PathLike[str] | None = None) -> int:
    """Remove the statistics files (before the workers start); returns how many."""
    path = multiproc_dir(directory)
    removed = 0
    for file in path.glob(_PREFIX + "*.json"):
        file.unlink(missing_ok=True)
        removed += 1
    return removed


class HostStats:
    """A worker's statistics, shared with the other workers of the host through files.

    Use it where an :class:`EnergyStats` goes: ``record`` counts in this worker; ``view()``
    and ``snapshot()`` answer for the whole host.
    """

    def __init__(
        self, stats: EnergyStats | None = None, directory: str | os.PathLike[str] | None = None,
        *, flush_s: float = 1.0,
    ) -> None:
        if not (isinstance(flush_s, int | float) and flush_s > 0):
            raise ConfigError(f"flush_s={flush_s!r} must be positive", remedy="use 1.0")
        self.stats = stats if stats is not None else EnergyStats()
        self.directory = multiproc_dir(directory)
        self.flush_s = float(flush_s)
        self.pid = os.getpid()
        self.path = self.directory / f"{_PREFIX}{self.pid}-{time.time_ns()}.json"
        self._cache: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._written = -1
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self.write_errors = 0
        self.flush()
        self._thread = threading.Thread(target=self._run, name="giul-host-stats", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # What the middleware calls, as on EnergyStats: this worker counts.
    def settled(self, batch: Sequence[Settled]) -> None:
        self.stats.settled(batch)

    def record(self, energy: Energy, *, outcome: str, status: int | None) -> None:
        self.stats.record(energy, outcome=outcome, status=status)

    def observe_nodes(self, totals: Any) -> None:
        self.stats.observe_nodes(totals)

    @property
    def windows(self) -> tuple[str, ...]:
        return self.stats.windows

    @property
    def default_window(self) -> str:
        return self.stats.default_window

    def _changes(self) -> int:
        return self.stats.records

    def flush(self) -> None:
        """Write this worker's state now (atomically), if it changed since the last write."""
        with self._flush_lock:
            changes = self._changes()
            if changes == self._written and self.path.exists():
                return
            tmp = self.path.with_suffix(".tmp")
            try:
                tmp.write_text(json.dumps(self.stats.state(), separators=(",", ":")), "utf-8")
                os.replace(tmp, self.path)
                self._written = changes
            except OSError:
                self.write_errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def close(self) -> None:
        """Stop the writer and write the final state (the worker's totals stay on disk)."""
        self._stop.set()
        self.flush()

    def _others(self) -> list[dict[str, Any]]:
        states = []
        seen = set()
        for file in sorted(self.directory.glob(_PREFIX + "*.json")):
            if file == self.path:
                continue
            seen.add(file)
            try:
                st = file.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                cached = self._cache.get(file)
                if cached is None or cached[0] != stamp:
                    cached = (stamp, json.loads(file.read_text("utf-8")))
                    self._cache[file] = cached
                states.append(cached[1])
            except (OSError, ValueError):
                continue  # a file removed or half-written by hand: skip it this time
        for file in [f for f in self._cache if f not in seen]:
            del self._cache[file]
        return states

    def workers(self) -> int:
        """Worker files in the directory, this one included (dead workers' too)."""
        return 1 + len(self._others())

    def view(self) -> EnergyStats:
        """The whole host's statistics: this worker's live state merged with the others'."""
        merged = self.stats.empty_like()
        merged.merge_state(self.stats.state())
        for state in self._others():
            try:
                merged.merge_state(state)
            except (ConfigError, KeyError, TypeError, ValueError, IndexError):
                continue  # another configuration or a damaged file: left out
        merged.copy_nodes_from(self.stats)
        return merged

    def snapshot(self, window: str | None = None, **kwargs: Any) -> dict[str, Any]:
        out = self.view().snapshot(window, **kwargs)
        out["workers"] = self.workers()
        return out


__all__ = ["ENV", "HostStats", "clear_directory", "multiproc_dir"]
