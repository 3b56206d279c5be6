"""Recent records by id, so a client can fetch its request's settled figure afterwards.

Every metered response carries ``X-Energy-Id``; ``GET /energy/requests/{id}`` answers from
here. The store is bounded twice: at most ``max_records`` records, each kept at most
``max_age_s`` seconds after its first figure. A later record of the same id (the settled
figure) replaces the first one in place, without renewing its age.

Several worker processes answer one server's requests, and the one that answers a lookup
is rarely the one that served the request. So by default every record is also appended to
this process's journal in the host's place (:mod:`giul_asgi.hostshare`), and a lookup that
misses here reads the other processes' journals. Nothing of that runs on the request's
path: :meth:`RecordStore.put` queues the record, and a writer thread (or the reader thread
that delivers a settled batch) appends what is queued in one write. Where nothing can be
shared (``share=False``, ``GIUL_ASGI_LOAD_DIR=off``, no writable place), records are this
process's alone and :attr:`RecordStore.shared` says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from .energy import Energy
from .errors import ConfigError
from .hostshare import Place, Setting, log_unshared, resolve
from .hostshare.journal import Journal
from .listeners import Settled
from .wire.body import energy_json

log = logging.getLogger("giul_asgi.records")

#: How long queued records wait to be written together (seconds).
BATCH_S = 0.02


class RecordStore:
    """A bounded, thread-safe map of request id -> latest :class:`~giul_asgi.energy.Energy`,
    shared with the host's other worker processes unless ``share`` says otherwise."""

    def __init__(
        self, max_records: int = 10_000, max_age_s: float = 600.0, *,
        clock: Callable[[], float] = time.monotonic, share: Setting = None,
    ) -> None:
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise ConfigError(f"max_records={max_records!r} must be a positive integer",
                              remedy="use 10_000")
        if isinstance(max_age_s, bool) or not isinstance(max_age_s, int | float) or not max_age_s > 0:
            raise ConfigError(f"max_age_s={max_age_s!r} must be a positive number of seconds",
                              remedy="use 600")
        self.max_records = max_records
        self.max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        #: Where the records are shared, or why they are not.
        self.place: Place = resolve(share)
        log_unshared(self.place)
        self.journal: Journal | None = None
        if self.place.path is not None:
            self.journal = Journal(self.place.path, max_lines=max_records, max_age_s=self.max_age_s,
                                   clock=clock)
        self.write_errors = 0
        self._queue: deque[Any] = deque()  # appended on any thread, drained by one
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()

    @property
    def shared(self) -> bool:
        """Whether another worker process can find these records by id."""
        return self.journal is not None

    # -- keeping ------------------------------------------------------------------------
    def put(self, energy: Any) -> None:
        """Keep ``energy`` under ``energy.id`` (ignored without an id): the request's first
        figure. O(1) on the request path; never raises."""
        if self._keep(energy) and self.journal is not None:
            self._queue.append(energy)
            if not self._wake.is_set():
                self._start_writer()
                self._wake.set()

    def settled(self, batch: Sequence[Settled]) -> None:
        """Settled figures (a :class:`~giul_asgi.listeners.Listener`): kept, and written for
        the other workers at once, with whatever first figures wait (reader thread)."""
        for item in batch:
            if self._keep(item.energy) and self.journal is not None:
                self._queue.append(item.energy)
        self.flush()

    def _keep(self, energy: Any) -> bool:
        try:
            key = energy.id
            if not isinstance(key, str) or not key:
                return False
            now = self._clock()
            with self._lock:
                items = self._items
                old = items.get(key)
                if old is not None:
                    items[key] = (old[0], energy)
                    return True
                items[key] = (now, energy)
                self._expire(now)
                while len(items) > self.max_records:
                    items.popitem(last=False)
            return True
        except Exception:
            return False

    def flush(self) -> None:
        """Write what is queued for the other workers now, in one write. Never raises."""
        journal = self.journal
        if journal is None or not self._queue:
            return
        with self._writer_lock:
            queue = []
            while self._queue:
                queue.append(self._queue.popleft())
            try:
                journal.append(_lines(queue))
            except Exception as exc:
                self.write_errors += 1
                if self.write_errors == 1:
                    log.warning("records cannot be shared with the other workers: %s", exc)

    def _start_writer(self) -> None:
        if self._writer is None:
            with self._writer_lock:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                                    name="giul-records")
                    self._writer.start()

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(BATCH_S)  # let the figures of a burst go in one write
            self._wake.clear()
            self.flush()

    def close(self) -> None:
        """Write what is queued and stop writing (the journal stays for its max age)."""
        self.flush()
        if self.journal is not None:
            self.journal.close()

    # -- finding ------------------------------------------------------------------------
    def get(self, key: str) -> Any | None:
        """The latest record under ``key``, from this process or another worker's journal;
        ``None`` if never seen, expired or evicted."""
        with self._lock:
            self._expire(self._clock())
            item = self._items.get(key)
        if item is not None:
            return item[1]
        if self.journal is None or not isinstance(key, str) or not key:
            return None
        found = self.journal.find(key)
        return energy_from_dict(found) if found is not None else None

    def __len__(self) -> int:
        """Records kept in this process."""
        with self._lock:
            self._expire(self._clock())
            return len(self._items)

    def _expire(self, now: float) -> None:
        items, limit = self._items, now - self.max_age_s
        while items:
            first = next(iter(items.values()))
            if first[0] >= limit:
                break
            items.popitem(last=False)


_FIELDS = frozenset(f.name for f in fields(Energy))


def _lines(queue: Iterable[Any]) -> list[tuple[str, bytes]]:
    # The JSON block's own writer (held equal to as_dict): a record's dict and json.dumps
    # were most of a settled figure's cost on the reader thread (7.5 -> 2.4 us a record).
    out = []
    for energy in queue:
        try:
            out.append((energy.id, energy_json(energy)))
        except Exception:
            continue
    return out


def energy_from_dict(data: Mapping[str, Any]) -> Energy | None:
    """An :class:`Energy` from its ``as_dict()`` (another worker's record); None if it is not one."""
    try:
        values = {k: v for k, v in data.items() if k in _FIELDS}
        stages = values.pop("stages", None) or {}
        energy = Energy(**values)
        energy.stages = {str(name): stage for name, raw in stages.items()
                         if (stage := energy_from_dict(raw)) is not None}
        return energy
    except Exception:
        return None


__all__ = ["RecordStore", "energy_from_dict"]
