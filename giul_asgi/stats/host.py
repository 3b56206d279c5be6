"""HostStats: several workers' statistics, merged when one of them is read.

``uvicorn --workers 4`` or gunicorn run one process per worker, each with its own
:class:`~giul_asgi.stats.EnergyStats`. :class:`HostStats` wraps a worker's statistics
after the model of prometheus_client's multiprocess mode: each worker writes its mergeable
state (counters and DDSketch bins, per label and time slot, and its node samples) to its
own row in the host's place (:mod:`giul_asgi.hostshare`: by default a per-user directory on
shared memory, no setting), every ``flush_s`` seconds when it changed, atomically, and at
exit. A worker answering ``/energy`` or ``/metrics`` merges its own live state with every
other row it finds (sketches merge exactly). Other workers' figures are at most ``flush_s`` old.

The statistics are one server's: the rows whose parent process (pid and start time) is
ours, the uvicorn or gunicorn master that started the workers. Rows are named by pid and
start time, so a dead worker is told from a live one: the page counts live workers only,
and a dead worker's counters still count (counters never go backwards) while its server
runs. Another server's rows are left out, and an earlier run's removed after an hour, so
nothing needs clearing at restart. Where nothing can be shared
(``GIUL_ASGI_LOAD_DIR=off``, no writable place) the statistics are this worker's and say so
(``workers: 1``, ``shared: false``), and the log says why once.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..energy import Energy
from ..errors import ConfigError
from ..hostshare import ENV, Rows, alive, log_unshared, resolve, server_identity
from ..listeners import Settled
from .nodes import Sample
from .stats import EnergyStats

_instances = itertools.count()  # two HostStats in one process write two rows

#: Dead rows of an earlier run of the server are removed after this long (seconds).
STALE_S = 3600.0
#: A worker writes its state for the others at most this share of its time (a 50th).
FLUSH_SHARE = 50.0


def multiproc_dir(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """Where the workers' statistics rows go: ``stats/`` in the host's place (``directory``,
    else ``$GIUL_ASGI_LOAD_DIR``, else the per-user default); None where nothing can be
    shared (said once in the log)."""
    place = resolve(directory)
    log_unshared(place)
    return place.path / "stats" if place.path is not None else None


def clear_directory(directory: str | os.PathLike[str] | None = None) -> int:
    """Remove the statistics rows; returns how many (never needed: an earlier run's rows
    are left out by themselves)."""
    path = multiproc_dir(directory)
    removed = 0
    for file in path.glob("*.json") if path is not None and path.is_dir() else ():
        file.unlink(missing_ok=True)
        removed += 1
    return removed


def _parent() -> list[Any]:
    """This process's server (:mod:`giul_asgi.hostshare.server`): its key, and the (pid,
    start) of the process that keeps it."""
    server = server_identity()
    return [server.keeper[0], server.keeper[1], server.key]


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
        folder = multiproc_dir(directory)
        #: This worker's row among the host's (None: nothing is shared, figures are ours).
        self.rows = Rows(folder, tag=str(next(_instances))) if folder is not None else None
        self.flush_s = float(flush_s)
        self.parent = _parent()
        self._cache: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._live = 0
        self._written = -1
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self.write_errors = 0
        if self.rows is None:
            return
        self.flush()
        self._thread = threading.Thread(target=self._run, name="giul-host-stats", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def shared(self) -> bool:
        """Whether the other workers' statistics are merged into this one's answers."""
        return self.rows is not None

    # What the middleware calls, as on EnergyStats: this worker counts.
    def settled(self, batch: Sequence[Settled]) -> None:
        self.stats.settled(batch)

    def record(self, energy: Energy, *, outcome: str, status: int | None) -> None:
        self.stats.record(energy, outcome=outcome, status=status)

    def observe_nodes(self, totals: Any) -> None:
        self.stats.observe_nodes(totals)

    def observe_history(self, histories: Any) -> None:
        self.stats.observe_history(histories)

    @property
    def windows(self) -> tuple[str, ...]:
        return self.stats.windows

    @property
    def tenants(self) -> Any:
        """This worker's tenant places (bounded labels)."""
        return self.stats.tenants

    def size(self) -> dict[str, int]:
        """This worker's statistics' elements (see :meth:`EnergyStats.size`)."""
        return self.stats.size()

    def bound(self) -> dict[str, int]:
        """Their stated bound (see :meth:`EnergyStats.bound`)."""
        return self.stats.bound()

    @property
    def default_window(self) -> str:
        return self.stats.default_window

    def _changes(self) -> int:
        return self.stats.records

    def flush(self) -> None:
        """Write this worker's state now (atomically), if it changed since the last write."""
        rows = self.rows
        if rows is None:
            return
        with self._flush_lock:
            changes = self._changes()
            if changes == self._written and rows.path.exists():
                return
            row = {"parent": self.parent, "state": self.stats.state(),
                   "nodes": {name: [list(s) for s in samples]
                             for name, samples in _samples(self.stats).items()}}
            try:
                rows.write(json.dumps(row, separators=(",", ":")).encode())
                self._written = changes
            except OSError:
                self.write_errors += 1

    def _run(self) -> None:
        wait = self.flush_s
        while not self._stop.wait(wait):
            spent = time.thread_time()
            self.flush()
            # A write costs what the state holds (about 0.5 s of CPU at 1e6 records over
            # 200 keys): the next waits FLUSH_SHARE times as long, so sharing the statistics
            # costs a worker at most 1/FLUSH_SHARE of a core; the others read it that late.
            wait = max(self.flush_s, (time.thread_time() - spent) * FLUSH_SHARE)

    def close(self) -> None:
        """Stop the writer and write the final state (the worker's totals stay on disk)."""
        self._stop.set()
        self.flush()

    def _others(self) -> list[dict[str, Any]]:
        """The other workers' rows: live ones, and dead ones of this run of the server."""
        rows = self.rows
        if rows is None:
            return []
        found, seen, live = [], set(), set()
        for row in rows.others():
            seen.add(row.name)
            if row.pid == os.getpid():
                continue  # another middleware in this process: not another worker
            try:
                st = row.path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                cached = self._cache.get(row.name)
                if cached is None or cached[0] != stamp:
                    cached = (stamp, json.loads(row.path.read_bytes()))
                    self._cache[row.name] = cached
                data = cached[1]
            except (OSError, ValueError):
                continue  # a row removed meanwhile, or damaged: skip it this time
            if data.get("parent") != self.parent:
                # another server's (or an earlier run's): not ours to count
                if not _alive_parent(data.get("parent")):
                    rows.remove_dead(STALE_S, [row])
                continue
            if row.alive():
                live.add(row.pid)
            found.append(data)
        for name in [n for n in self._cache if n not in seen]:
            del self._cache[name]
        self._live = len(live)
        return found

    def workers(self) -> int:
        """Live worker processes sharing these statistics, this one included."""
        self._others()
        return 1 + self._live

    def view(self) -> EnergyStats:
        """The whole host's statistics: this worker's live state merged with the others'."""
        if self.rows is None:
            return self.stats
        merged = self.stats.empty_like()
        merged.merge_state(self.stats.state())
        samples: list[dict[str, list[Sample]]] = [_samples(self.stats)]
        for data in self._others():
            try:
                merged.merge_state(data["state"])
                samples.append({str(k): [Sample(*s) for s in v] for k, v in data.get("nodes", {}).items()})
            except (ConfigError, KeyError, TypeError, ValueError, IndexError, AttributeError):
                continue  # another configuration or a damaged row: left out
        merged_samples = _merge_samples(samples, self.stats.step_s)
        with merged._lock:
            merged._nodes.samples = merged_samples
        return merged

    def snapshot(self, window: str | None = None, **kwargs: Any) -> dict[str, Any]:
        out = self.view().snapshot(window, **kwargs)
        out["workers"] = self.workers() if self.rows is not None else 1
        out["shared"] = self.rows is not None
        return out


def _alive_parent(parent: Any) -> bool:
    try:
        return alive(int(parent[0]), parent[1])
    except (TypeError, ValueError, IndexError):
        return False


def _samples(stats: EnergyStats) -> dict[str, list[Sample]]:
    with stats._lock:
        return stats._nodes.copy()


def _merge_samples(per_worker: list[dict[str, list[Sample]]], step: float) -> dict[str, list[Sample]]:
    """Every worker's samples of the host's node books, one per step (the latest): each
    worker samples when it answers, so together they draw the series none has alone."""
    merged: dict[str, dict[int, Sample]] = {}
    for samples in per_worker:
        for name, items in samples.items():
            slots = merged.setdefault(name, {})
            for item in items:
                slot = int(item.t // step)
                if slot not in slots or slots[slot].t < item.t:
                    slots[slot] = item
    return {name: [slots[k] for k in sorted(slots)] for name, slots in merged.items()}


__all__ = ["ENV", "HostStats", "clear_directory", "multiproc_dir"]
