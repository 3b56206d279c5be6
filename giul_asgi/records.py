"""Recent records by id, so a client can fetch its request's figure afterwards, from any worker.

Every metered response carries ``X-Energy-Id``; ``GET /energy/requests/{id}`` answers from
here. The store is bounded twice: at most ``max_records`` records, each kept at most
``max_age_s`` seconds after its first figure. A later record of the same id (the settled
figure) replaces the first one, without renewing its age.

Several worker processes answer one server's requests, the one that answers a lookup is
rarely the one that served the request, and that one may have been killed since. So by
default every record is also written, in place and before the answer goes, into this store's
ring in its server's folder (:mod:`giul_asgi.hostshare.journal`: a copy into shared memory,
no system call, nothing lost to ``kill -9``), and a lookup that misses here reads the rings of
the server's other processes. A record that is truly gone says why (:meth:`RecordStore.lookup`).
A process that is a server of its own (:attr:`~giul_asgi.hostshare.server.ServerId.alone`: a
single-process uvicorn) holds every record of its server in its memory: no ring is made.

Nothing here touches a file on the thread that builds the store or on the request's path:
the place is found and the ring made by the store's own thread (it then folds the rings of
the server's dead processes); records kept before the ring is ready are written when it is.
Where nothing can be shared (``share=False``, ``GIUL_ASGI_LOAD_DIR=off``, no usable place, a
full one) records are this process's alone, a warning says why once, and :attr:`shared` and
:attr:`reason` say so.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import types
import typing
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from .energy import Energy
from .errors import ConfigError
from .hostshare import ENV, OFF, Setting, log_unshared, resolve
from .hostshare.journal import CENSUS_S, UNKNOWN, Journal, ring_bytes, say_unshared, sweep
from .hostshare.place import remedy, room
from .hostshare.rows import load_json
from .hostshare.server import ServerId, server_identity
from .listeners import Settled
from .meter import id_prefix, split_id
from .wire.body import energy_json

log = logging.getLogger("giul_asgi.records")

#: How long a lookup (or :attr:`RecordStore.shared`) waits for the store's ring to be made.
OPEN_WAIT_S = 10.0
_instances = itertools.count(1)  # two stores in one process: two rings
_stores: weakref.WeakSet[RecordStore] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup found: the record, or why there is none."""

    energy: Energy | None
    #: Why there is no record (``None`` when found): "expired after max_age_s", "evicted:
    #: ...", "its process's journal was not shared: ...", "unknown id: ...".
    reason: str | None = None


class RecordStore:
    """A bounded, thread-safe map of request id -> latest :class:`~giul_asgi.energy.Energy`,
    shared with the other processes of its server unless ``share`` says otherwise."""

    def __init__(
        self, max_records: int = 10_000, max_age_s: float = 600.0, *,
        clock: Callable[[], float] = time.monotonic, share: Setting = None,
        server: ServerId | None = None,
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
        self._fork_lock = threading.Lock()
        #: id -> its latest record: its JSON where it was made (the ring's copy, read back as
        #: another process's would be), else the Energy itself (when each was first kept:
        #: :attr:`_order`). Bytes are no work for the cyclic collector: 10,000 records kept as
        #: Energy objects were a quarter of what each of its full passes walked.
        self._items: dict[str, Energy | bytes] = {}
        #: The ids in the order they were first kept, and when (two deques in step): what
        #: expires or is evicted next. A deque beside a dict: an OrderedDict's popitem and
        #: first item cost about twice as much, 1.07 -> 0.60 us an insert by timeit; no
        #: (time, id) tuple a record, one object less for the collector.
        self._order: deque[str] = deque()
        self._times: deque[float] = deque()
        # The highest id counters of this process's own that memory dropped (full, old).
        self._evicted = self._expired = 0
        self._share = share
        #: Whose records these are (by default this process's server, found on the store's
        #: thread: :func:`~giul_asgi.hostshare.server.server_identity`).
        self._server = server
        self._tag = str(next(_instances))
        self.write_errors = 0
        _stores.add(self)
        self._begin()

    def _begin(self) -> None:
        """Start making this store's ring on its own thread (now, and again in a forked child)."""
        self._write_lock = threading.Lock()
        self._journal: Journal | None = None
        self._reason: str | None = None
        #: A server of one process (:attr:`ServerId.alone`): every record of the server is
        #: in this memory, and no ring is made.
        self._alone = False
        self._pending: deque[tuple[Any, bytes | None]] = deque(maxlen=self.max_records)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._forked = False
        setting = self._share if self._share is not None else os.environ.get(ENV) or None
        if setting is False or (isinstance(setting, str) and setting.strip().lower() == OFF):
            place = resolve(False)  # no file looked at
            log_unshared(place)
            self._reason = place.reason
            self._ready.set()
            return
        thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop), daemon=True,
                                  name="giul-records")
        thread.start()

    # -- the store's thread ----------------------------------------------------------------------
    def _open(self) -> Journal | None:
        """Find the place and make the ring (the store's thread); write what waited."""
        journal = None
        try:
            place = resolve(self._share)
            log_unshared(place)
            if place.path is None:
                self._reason = place.reason
                return None
            server = self._server if self._server is not None else server_identity()
            sweep(place.path)  # dead servers' folders, at each start
            if server.alone:
                # No other process will look a record up: a ring would be written for nobody
                # (with the statistics' tail, 141.5 us a JSON request against 89.2: 06h).
                self._alone = True
                return None
            try:
                journal = Journal(place.path, server, max_age_s=self.max_age_s,
                                  capacity=ring_bytes(self.max_records, room(place.path)), tag=self._tag,
                                  clock=self._clock)
            except OSError as exc:
                self._reason = (f"cannot make this process's journal in {place.path / 'records'}: "
                                f"{exc.strerror or exc}")
                say_unshared(place.path, server, self._tag, self._reason)
                log.warning("records are this process's alone: %s -> %s", self._reason, remedy(exc))
                return None
        except Exception as exc:  # never the app's problem: records stay this process's
            self._reason = f"cannot share records: {type(exc).__name__}: {exc}"
            log.warning("records are this process's alone: %s", self._reason)
            return None
        finally:
            with self._write_lock:
                self._journal = journal
                pending, self._pending = list(self._pending), deque(maxlen=self.max_records)
                if journal is not None:
                    for energy, data in pending:
                        self._write(journal, energy, data)
                self._ready.set()
        return journal

    # -- keeping ------------------------------------------------------------------------------
    def put(self, energy: Any, data: bytes | None = None) -> None:
        """Keep ``energy`` under ``energy.id`` (ignored without an id): the request's first
        figure, before its answer goes. ``data`` is its JSON (``energy_json``) where the caller
        made it already. A copy into memory on the calling thread; never raises."""
        if data is None:
            data = _json(energy)
        if self._keep(energy, data):
            self._file(energy, data)

    def settled(self, batch: Sequence[Settled]) -> None:
        """Settled figures (a :class:`~giul_asgi.listeners.Listener`): kept and written for
        the other workers at once (the reader thread)."""
        for item in batch:
            energy = item.energy
            data = _json(energy)
            if self._keep(energy, data):
                self._file(energy, data)

    def _file(self, energy: Any, data: bytes | None) -> None:
        if self._forked:
            self._after_fork()
        with self._write_lock:
            journal = self._journal
            if journal is None:
                if not self._ready.is_set():
                    self._pending.append((energy, data))  # written when the ring is made
                return
            self._write(journal, energy, data)

    def _write(self, journal: Journal, energy: Any, data: bytes | None) -> None:
        try:
            key = energy.id
            journal.append(key, data if data is not None else energy_json(energy), *_parts(key))
        except Exception as exc:
            self.write_errors += 1
            if self.write_errors == 1:
                log.warning("a record cannot be shared with the other workers (%s: %s); it "
                            "stays in this process", type(exc).__name__, exc)

    def _keep(self, energy: Any, data: bytes | None) -> bool:
        try:
            key = energy.id
            if not isinstance(key, str) or not key:
                return False
            # As its JSON has it (nine significant digits), as another worker reads it; the
            # Energy itself only where its JSON could not be made.
            record = data if data is not None else energy
            now = self._clock()
            with self._lock:
                items = self._items
                if key in items:  # its settled figure: kept since its first, in that order
                    items[key] = record
                    return True
                items[key] = record
                order = self._order
                order.append(key)
                self._times.append(now)
                self._expire(now)
                while len(items) > self.max_records:
                    gone = order.popleft()
                    self._times.popleft()
                    items.pop(gone, None)
                    self._evicted = max(self._evicted, _counter(gone))
            return True
        except Exception:
            return False

    def close(self) -> None:
        """Stop writing and folding (the ring stays for the others: they read it, and fold it
        once this process is gone). No file is touched here: it runs on the event loop."""
        self._stop.set()
        with self._write_lock:
            journal = self._journal
        if journal is not None:
            journal.close()

    def wait_ready(self, timeout: float = OPEN_WAIT_S) -> bool:
        """Wait (at most ``timeout``) until the ring is made or known impossible (a thread's
        call, never the loop's); whether it is settled which."""
        if self._forked:
            self._after_fork()
        return self._ready.wait(timeout)

    def _after_fork(self) -> None:
        # A child of a process that had a store (gunicorn --preload): the parent's ring is
        # the parent's; this process makes its own (its locks were made new at the fork).
        with self._fork_lock:
            if not self._forked:
                return
            self._tag = str(next(_instances))
            self._begin()

    @property
    def shared(self) -> bool:
        """Whether every worker process of this server can find these records by id (this
        one alone where it is its whole server); waits for the ring to be made: ask off the
        event loop."""
        self.wait_ready()
        return self._journal is not None or self._alone

    @property
    def reason(self) -> str | None:
        """Why records are this process's alone (``None`` while shared, or where this
        process is its whole server): for ``/energy``."""
        self.wait_ready()
        if self._journal is not None or self._alone:
            return None
        return self._reason or "the records' journal is still being made"

    @property
    def journal(self) -> Journal | None:
        return self._journal

    # -- finding --------------------------------------------------------------------------------
    def get(self, key: str) -> Energy | None:
        """The latest record under ``key``, from this process or another of its server;
        ``None`` if never seen, expired or evicted (:meth:`lookup` says which)."""
        return self.lookup(key).energy

    def lookup(self, key: str) -> Lookup:
        """The latest record under ``key``, or why there is none. Reads files: a thread's call
        (``/energy/requests/{id}`` runs it in a worker thread). Never raises."""
        try:
            return self._lookup(key)
        except Exception as exc:  # the endpoint answers 404 with this, never a 500
            log.exception("giul-asgi could not look up a record")
            return Lookup(None, f"the lookup failed here: {type(exc).__name__}: {exc}")

    def _lookup(self, key: str) -> Lookup:
        if not isinstance(key, str) or not key:
            return Lookup(None, f"{UNKNOWN}: empty")
        item = self._kept(key)
        if item is None:
            self.wait_ready()
            if self._alone:
                item = self._kept_by_another(key)
        if isinstance(item, bytes):
            energy, nonsense = parse_record(item)
            if energy is None:
                return Lookup(None, f"its record makes no sense ({nonsense})")
            return Lookup(energy)
        if item is not None:
            return Lookup(item)
        parts = split_id(key)
        journal = self._journal
        if journal is not None:
            found = journal.find(key)
            if found is not None:
                if self._clock() - found.t > self.max_age_s:
                    return Lookup(None, f"expired after max_age_s ({self.max_age_s:g} s)")
                energy, nonsense = parse_record(found.data)
                if energy is not None and not energy.settled and found.writer_gone:
                    # Its worker died (kill -9) before the card reported the window: this
                    # first figure is all there is, and says so.
                    gone = "never settled: the worker process that served it ended first"
                    return Lookup(replace(energy, error=f"{gone}; {energy.error}" if energy.error else gone))
                if energy is not None:
                    return Lookup(energy)
                _say_once(f"a record in {found.path} makes no sense ({nonsense}): skipped")
                return Lookup(None, f"its record makes no sense ({nonsense}): skipped")
        if parts is None:
            return Lookup(None, f"{UNKNOWN}: not an id this middleware makes")
        prefix, counter = parts
        if prefix == id_prefix():  # one of ours: memory knows what it let go
            if counter <= self._evicted:
                return Lookup(None, f"evicted: the store holds max_records ({self.max_records})")
            if counter <= self._expired:
                return Lookup(None, f"expired after max_age_s ({self.max_age_s:g} s)")
            return Lookup(None, f"{UNKNOWN}: this process has kept no record under it (is its "
                                "request still running?)")
        if self._alone:
            return Lookup(None, f"{UNKNOWN}: another server's (this process is a server of its own)")
        if journal is None:
            return Lookup(None, "its process's journal was not shared: records here are this "
                                f"process's alone ({self.reason})")
        return Lookup(None, journal.why(prefix, counter))

    def _kept(self, key: str) -> bytes | Energy | None:
        """The record this process's memory keeps under ``key`` (its JSON, or the figure where
        none could be made); None where it keeps none, young enough."""
        with self._lock:
            self._expire(self._clock())
            item: bytes | Energy | None = self._items.get(key)
            return item

    def _kept_by_another(self, key: str) -> bytes | Energy | None:
        """The record another store of this process keeps under ``key`` (two middlewares):
        where the process is its whole server, they are the server's other stores."""
        for other in list(_stores):
            if other is not self and other._alone:
                item = other._kept(key)
                if item is not None:
                    return item
        return None

    def __len__(self) -> int:
        """Records kept in this process."""
        with self._lock:
            self._expire(self._clock())
            return len(self._items)

    def _expire(self, now: float) -> None:
        items, order, times, limit = self._items, self._order, self._times, now - self.max_age_s
        while times and times[0] < limit:
            times.popleft()
            key = order.popleft()
            items.pop(key, None)
            self._expired = max(self._expired, _counter(key))


def _run(ref: weakref.ref[RecordStore], stop: threading.Event) -> None:
    """The store's thread: make its ring, then keep its server's folder bounded; when the
    store is closed or collected, fold its ring into the server's and remove it."""
    store = ref()
    if store is None:
        return
    journal = store._open()
    del store
    if journal is None:
        return
    while not stop.wait(CENSUS_S) and ref() is not None:
        journal.census()
    journal.retire()


def _json(energy: Energy) -> bytes | None:
    """A figure's JSON, kept and written (None where it cannot be made: its writing says
    why, and the figure is kept as it is)."""
    try:
        return energy_json(energy)
    except Exception:
        return None


def _parts(key: str) -> tuple[str, int]:
    """An id's prefix and counter for the ring (``("?", 0)`` for an id not made by a meter)."""
    prefix = id_prefix()
    if key.startswith(prefix):  # one of this process's: the common case, quickly
        try:
            return prefix, int(key[len(prefix):], 16)
        except ValueError:
            pass
    return split_id(key) or ("?", 0)


def _counter(key: str) -> int:
    """The counter of one of this process's ids (0 for any other): ``split_id``'s answer for
    our own prefix without its general parse (an evicted record's, on the request path)."""
    prefix = id_prefix()
    if key.startswith(prefix):
        tail = key[len(prefix):]
        if tail and len(tail) <= 16 and "-" not in tail:
            try:
                return int(tail, 16)
            except ValueError:
                return 0
    return 0


def _after_fork_in_child() -> None:
    for store in list(_stores):
        # A lock another thread held at the fork stays held in the child: new ones.
        store._lock = threading.Lock()
        store._fork_lock = threading.Lock()
        store._write_lock = threading.Lock()
        store._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- another process's record, read back -----------------------------------------------------------

_FIELDS = frozenset(f.name for f in fields(Energy))



def parse_record(data: bytes) -> tuple[Energy | None, str | None]:
    """An :class:`Energy` from a ring's JSON, or why it makes no sense (not JSON, NaN or
    Infinity, a string where a number goes, a field of the wrong kind)."""
    try:
        raw = load_json(data)
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(raw, dict):
        return None, "not an object"
    why = _nonsense(raw)
    if why is not None:
        return None, why
    energy = energy_from_dict(raw)
    return (energy, None) if energy is not None else (None, "not a record")


def _nonsense(raw: Mapping[str, Any], depth: int = 0) -> str | None:
    for name, value in raw.items():
        check = _CHECKS.get(name)
        if check is None:
            continue
        if name == "stages":
            if not isinstance(value, dict) or depth > 2:
                return "stages: not an object"
            for stage, inner in value.items():
                if not isinstance(inner, dict):
                    return f"stage {stage!r}: not an object"
                why = _nonsense(inner, depth + 1)
                if why is not None:
                    return f"stage {stage!r}: {why}"
        elif not check(value):
            return f"{name}: {value!r:.40} is not {_KINDS[name]}"
    return None


def _checker(hint: Any) -> tuple[Callable[[Any], bool], str]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_checker(arg) for arg in typing.get_args(hint)]
        return (lambda v: any(check(v) for check, _ in parts)), " or ".join(k for _, k in parts)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return (lambda v: v in allowed), "one of " + "/".join(map(str, allowed))
    if hint is type(None):
        return (lambda v: v is None), "null"
    if hint is bool:
        return (lambda v: isinstance(v, bool)), "true/false"
    if hint is int:
        return (lambda v: isinstance(v, int) and not isinstance(v, bool)), "an integer"
    if hint is float:
        return (lambda v: isinstance(v, int | float) and not isinstance(v, bool)
                and math.isfinite(v)), "a finite number"
    if hint is str:
        return (lambda v: isinstance(v, str)), "a string"
    return (lambda v: True), "anything"


_HINTS = typing.get_type_hints(Energy)
_CHECKS: dict[str, Callable[[Any], bool]] = {}
_KINDS: dict[str, str] = {}
for _name in _FIELDS:
    _CHECKS[_name], _KINDS[_name] = _checker(_HINTS[_name])


#: Fields that hold a float (or None): JSON writes a whole one as ``5``, read back as 5.0.
_FLOATS = frozenset(name for name in _FIELDS
                    if float in (kinds := {_HINTS[name], *typing.get_args(_HINTS[name])})
                    and int not in kinds)


def energy_from_dict(data: Mapping[str, Any]) -> Energy | None:
    """An :class:`Energy` from its ``as_dict()`` (a record read back); None if it is not one."""
    try:
        values: dict[str, Any] = {k: float(v) if type(v) is int and k in _FLOATS else v
                                  for k, v in data.items() if k in _FIELDS}
        stages = values.pop("stages", None) or {}
        energy = Energy(**values)
        energy.stages = {str(name): stage for name, raw in stages.items()
                         if (stage := energy_from_dict(raw)) is not None}
        return energy
    except Exception:
        return None


_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        log.warning("%s", text)


__all__ = ["Lookup", "RecordStore", "energy_from_dict", "parse_record"]
