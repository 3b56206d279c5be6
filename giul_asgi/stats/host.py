"""HostStats: one server's workers' statistics, merged when one of them is read; nothing answered lost.

``uvicorn --workers 4`` or gunicorn run one process per worker, each with its own
:class:`~giul_asgi.stats.EnergyStats`. :class:`HostStats` shares them after the model of
prometheus_client's multiprocess mode, in the server's folder of the host's place
(:mod:`.folder`; the place: :mod:`giul_asgi.hostshare`, by default a per-user directory
on shared memory, no setting):

- every request is written in place as it happens (:mod:`.tail`: a memory-mapped file, no
  system call): the answer when the middleware has answered (:meth:`HostStats.answered`),
  the figure when it settles;
- every ``flush_s`` (sooner when the tail fills) the worker's whole mergeable state is cut
  and written as its row, atomically: the row says where its tail goes on;
- whoever answers ``/energy`` or ``/metrics`` merges (:mod:`.merge`) its own live state,
  every other worker's row and the figures in its tail after it, and the dead row; a dead worker's
  answers that never settled count as requests of unknown energy. So a request that got its
  answer is counted by any worker, even if its own was killed with -9 right after, and every
  worker's answer is the same, up to what happened while it was read: counters never go
  back from one answer to the next, whichever worker gives them.
- a dead worker is folded into the dead row and its files removed (:meth:`ServerFolder.fold`):
  churn (gunicorn's ``--max-requests``) keeps the folder at its bound.

The statistics are one *server's* (:mod:`giul_asgi.hostshare.server`): the workers that
inherited one listening socket, or a process of its own; another server's, and an earlier
run's, are never counted, and a dead server's folder is removed at the next start. A process
of its own is its whole server: its statistics stay in its memory, nothing is written in the
place (``shared: true``, ``workers: 1``). Where
nothing can be shared (``GIUL_ASGI_LOAD_DIR=off``, no usable place, a place full or
read-only: then said once as a WARNING with the reason) the statistics are this worker's
and say so: ``workers: 1``, ``shared: false`` and ``shared_reason``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..energy import Energy
from ..errors import ConfigError
from ..hostshare import ENV, ServerId, log_unshared, resolve, server_identity
from ..hostshare.place import remedy, room
from ..hostshare.rows import say_unshared, unshared_in
from ..listeners import Settled
from ..switch import SWITCH
from .folder import Other, ServerFolder, dump, remove_dead_servers
from .labels import Key
from .merge import merge_samples, merge_server, process_of, samples_of
from .stats import EnergyStats
from .tail import AREA, tail_area

log = logging.getLogger("giul_asgi.stats")

_instances = itertools.count()  # two HostStats in one process write two rows
#: How long a reader waits for a fresh HostStats to join its server's place (seconds).
JOIN_WAIT_S = 5.0

#: A worker writes its state for the others at most this share of its time (a 50th).
FLUSH_SHARE = 50.0
#: Answers kept waiting for their figure, at most (the oldest are forgotten past it).
MAX_PENDING = 100_000


def multiproc_dir(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """Where the servers' statistics folders go: ``stats/`` in the host's place
    (``directory``, else ``$GIUL_ASGI_LOAD_DIR``, else the per-user default); None where
    nothing can be shared (said once in the log)."""
    place = resolve(directory)
    log_unshared(place)
    return place.path / "stats" if place.path is not None else None


def clear_directory(directory: str | os.PathLike[str] | None = None) -> int:
    """Remove every statistics file of this user's in the place; returns how many (never
    needed: another server's files are left out, a dead one's removed at the next start)."""
    path = multiproc_dir(directory)
    removed = 0
    if path is None or not path.is_dir():
        return 0
    for file in [*path.glob("*.json"), *path.glob("*/*")]:
        if file.is_file() or file.is_symlink():
            file.unlink(missing_ok=True)
            removed += 1
    return removed


class HostStats:
    """A worker's statistics, shared with the other workers of its server through files.

    Use it where an :class:`EnergyStats` goes: ``record`` counts in this worker; ``view()``
    and ``snapshot()`` answer for the whole server.
    """

    def __init__(
        self, stats: EnergyStats | None = None, directory: str | os.PathLike[str] | None = None,
        *, flush_s: float = 1.0, area: int = AREA, server: ServerId | None = None,
    ) -> None:
        if not (isinstance(flush_s, int | float) and flush_s > 0):
            raise ConfigError(f"flush_s={flush_s!r} must be positive", remedy="use 1.0")
        self.stats = stats if stats is not None else EnergyStats()
        self.flush_s = float(flush_s)
        #: Which server's statistics these are (found, or given: a test's workers); None until
        #: the writer thread has found it.
        self.server: ServerId | None = server
        #: Why nothing is shared (None while shared).
        self.shared_reason: str | None = None
        #: A server of one process (:attr:`ServerId.alone`): its statistics are the whole
        #: server's in memory, and nothing is written in the place.
        self.alone = False
        self.folder: ServerFolder | None = None
        #: Answered, not settled yet: id -> its member of the row's ``pending`` object, as
        #: JSON (``"id":[t,route,node,tier,outcome,status,tenant]``). Bytes: a row joins them
        #: rather than encoding a dict of tuples (a worker at 7,000 requests a second kept
        #: 14,000 waiting, and its rows took 20-68 ms each to encode), and they are no work
        #: for the cyclic collector.
        self._pending: dict[str, bytes] = {}
        self._cut_pending = b""  # the members at the last cut, for the row being written
        self._encoded: dict[tuple[Any, ...], bytes] = {}  # labels -> their JSON, made once
        self._tail_lock = threading.Lock()
        self._written = -1
        self._stop = threading.Event()
        self._due = threading.Event()  # the tail is filling: a row now
        self._flush_lock = threading.Lock()
        self._live = 0
        self._overflow_said = False
        self._hurrying = False  # the tail asked for a row, and the GIL's hand-overs hurry
        self.write_errors = 0
        self._unwritten: bytes | None = None  # a row cut but not written (a full place)
        self._stuck: list[str] = []  # why other workers' rows wait, as their tails say
        self._directory, self._area, self._given = directory, area, server
        self._place: Path | None = None  # the place joined (or tried)
        self._tag = str(next(_instances))
        self._forked = False
        self._fork_lock = threading.Lock()
        _hosts.add(self)
        self._begin()

    def _begin(self) -> None:
        """Join the server's statistics on the writer's own thread (now, and again in a
        forked child). Starlette builds the middleware, and so these, on the event loop: the
        place is found and the first row written there, never on the loop."""
        self._ready = threading.Event()  # the place is joined (or found unusable)
        self._early: list[tuple[str, float, tuple[Any, ...]]] = []  # answered while joining
        self._thread = threading.Thread(target=self._start, args=(self._directory, self._area),
                                        name="giul-host-stats", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """A child of a process that had these (gunicorn --preload builds the app in its
        master): the parent's row, tail and writer are the parent's, and its server may not
        be this one's; this process joins its own server's statistics anew. Without this,
        every worker counted on its own under the master's server and /energy jumped between
        their counts (a hostile trial: 36, 15, 22, 36 on six scrapes)."""
        with self._fork_lock:
            if not self._forked:
                return
            self._forked = False
            self.server, self.folder, self.shared_reason = self._given, None, None
            self.alone = False
            self._unwritten = None
            self.stats.journal = None
            self._pending, self._written, self._live = {}, -1, 0
            self._hurrying = False
            self._stop, self._due = threading.Event(), threading.Event()
            self._begin()

    def _start(self, directory: str | os.PathLike[str] | None, area: int) -> None:
        try:
            self._join(directory, area)
        finally:
            self._ready.set()
        if self.folder is not None:
            atexit.register(self.close)
            self._run()

    def _join(self, directory: str | os.PathLike[str] | None, area: int) -> None:
        if self.server is None:
            self.server = server_identity()
        place = resolve(directory)
        log_unshared(place)
        if place.path is None:
            self.shared_reason = place.reason
            return
        self._place = place.path
        if self.server.alone:
            # Rows and a tail in the place would be read by nobody: the answers a killed
            # process gave die with its server (a restart is another). With the records' ring
            # they made a JSON request 141.5 us added against 89.2 (overhead-2026-12-06h). Dead
            # servers' folders still go at its start, as at any server's.
            with self._tail_lock:
                self.alone, self._early = True, []
            with contextlib.suppress(OSError, ValueError):
                remove_dead_servers(place.path / "stats", self.server.folder)
            return
        try:
            root = place.path / "stats"
            folder = ServerFolder(root, self.server, tag=self._tag, place=place.path,
                                  step_s=self.stats.step_s, area=tail_area(area, room(place.path)))
            remove_dead_servers(root, self.server.folder)
        except OSError as exc:
            self._unshare(f"cannot write the statistics in {place.path}: {exc.strerror or exc}", exc)
            return
        except ValueError as exc:  # a file in the place that is not one of ours to read
            self._unshare(f"cannot read the statistics in {place.path}: {exc}", exc)
            return
        with self._tail_lock:  # answers made while joining go in place now, in order
            self.folder, early, self._early = folder, self._early, []
        for id, t, six in early:
            self._write_answer(id, t, six)
        self.stats.journal = self._journal
        self._flush()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the server's statistics are joined (or found unusable); lifespan
        startup waits on it off the loop, so the first request is counted for the server."""
        if self._forked:
            self._after_fork()
        return self._ready.wait(timeout)

    @property
    def shared(self) -> bool:
        """Whether the other workers' statistics are merged into this one's answers (or this
        process is its whole server: :attr:`alone`)."""
        self._ready.wait(JOIN_WAIT_S)
        return self.folder is not None or self.alone

    @property
    def rows(self) -> Any:
        """This worker's row among its server's (None: nothing is shared)."""
        return self.folder.rows if self.folder is not None else None

    def _unshare(self, reason: str, exc: BaseException | None = None) -> None:
        """From now on, this worker's figures are its own: said once, loudly, here and in the
        server's folder, so that the workers that share say whose requests they miss (a
        hostile trial: on a place full from the start they said shared, reason null, while
        one worker's 76 requests were nowhere in their counts)."""
        self.shared_reason = reason
        folder, self.folder = self.folder, None
        self.stats.journal = None
        if folder is not None:
            folder.close()
        if self._place is not None and self.server is not None:
            say_unshared(self._place / "stats" / self.server.folder, self._place, self._tag, reason)
        log.warning("statistics are this worker's alone from now on: %s -> %s. Until then /energy "
                    "says shared: false and counts this worker's requests only", reason, remedy(exc))

    # What the middleware calls, as on EnergyStats: this worker counts.
    def settled(self, batch: Sequence[Settled]) -> None:
        if self._forked:
            self._after_fork()
        self.stats.settled(batch)

    def record(self, energy: Energy, *, outcome: str, status: int | None) -> None:
        if self._forked:
            self._after_fork()
        self.stats.record(energy, outcome=outcome, status=status)

    def answered(self, id: str | None, route: str | None, node: str | None, tier: str | None,
                 outcome: str, status: int | None, tenant: str | None) -> None:
        """The middleware answered a request (its figure settles later): written in place,
        so that it is counted even if this worker dies before it settles. Never raises."""
        if not isinstance(id, str):
            return
        if self._forked:
            self._after_fork()
        try:
            t = time.time()
            six = (route, node, tier, outcome, status, tenant)
            if self.folder is None:
                if not self._ready.is_set():  # still joining: written in place once joined
                    with self._tail_lock:
                        if self.folder is None and not self.alone and len(self._early) < MAX_PENDING:
                            self._early.append((id, t, six))
                            return
                if self.folder is None:
                    return
            self._write_answer(id, t, six)
        except Exception:
            log.debug("an answer could not be written in place", exc_info=True)

    def _write_answer(self, id: str, t: float, six: tuple[Any, ...]) -> None:
        folder = self.folder
        if folder is None:
            return
        part = self._encoded.get(six)
        if part is None:
            part = self._encode(six)
        id_json, t_json = _id_json(id), repr(t).encode()
        data = b'["a",%b,%b,%b]' % (id_json, t_json, part)
        member = b'%b:[%b,%b]' % (id_json, t_json, part)
        with self._tail_lock:
            pending = self._pending
            pending[id] = member
            if len(pending) > MAX_PENDING:
                del pending[next(iter(pending))]
            kept = folder.tail.append_json(data)
            full = self._half_full(folder.tail)
        if full:
            self._due.set()
        if not kept:
            self._overflowed()

    def _journal(self, counted: list[tuple[Key, Settled]], step: int) -> None:
        """Under the statistics' lock: the figures just counted, written in place."""
        folder = self.folder
        if folder is None:
            return
        tail = folder.tail
        encoded = self._encoded
        entries = []
        for key, s in counted:
            e = s.energy
            part = encoded.get(key)
            if part is None:
                part = self._encode(key)
            entries.append((e.id, b'["s",%b,%d,%b,%b,%b,%b,%b,%b,%b]' % (
                _id_json(e.id), step, part, _number(e.joules), _number(e.tokens), _number(e.seconds),
                _number(e.contended), _number(e.carbon_grams), _number(e.allocated_joules))))
        kept = True
        with self._tail_lock:
            pending = self._pending
            for id, data in entries:
                if id is not None:
                    pending.pop(id, None)
                kept = tail.append_json(data) and kept
            full = self._half_full(tail)
        if full:
            self._due.set()
        if not kept:
            self._overflowed()

    def _half_full(self, tail: Any) -> bool:
        """Under the tail's lock: whether the tail has just passed half full, so that a row is
        due; if so the GIL's hand-overs hurry until the row writer has written it (released
        under the same lock: :meth:`_flush`). Beside a loop running Python flat out the
        writer woke 0-220 ms after being asked (its wake-up is a few hand-overs, each a race
        it mostly lost), and at 7,000 requests a second the tail filled meanwhile in some
        runs. Not while no row can be written (a full place: the tail is not cut, and it
        would hurry for as long) nor once the writer is stopped."""
        if self._hurrying or self._unwritten is not None or self._stop.is_set() or tail.fill() <= 0.5:
            return False
        self._hurrying = True
        SWITCH.hurry()
        return True

    def _overflowed(self) -> None:
        if self._overflow_said:
            return
        self._overflow_said = True
        log.warning("this worker's tail is full (the row writer cannot keep up): requests answered "
                    "until its next row would be lost if it were killed now; they still count")

    def _encode(self, labels: tuple[Any, ...]) -> bytes:
        """Labels as the inside of a JSON list, kept (a bounded number) for the next entry."""
        encoded = self._encoded
        if len(encoded) >= 4096:
            encoded.clear()
        part = encoded[labels] = json.dumps([_label(x) for x in labels], separators=(",", ":"),
                                            allow_nan=False)[1:-1].encode()
        return part

    def _cut(self) -> dict[str, Any]:
        """Under the statistics' lock, as the row's state is taken: the tail's next
        generation; the answers still waiting for their figure go beside it (the row's
        ``pending``, spliced in as they are by :meth:`_flush`)."""
        folder = self.folder
        with self._tail_lock:
            gen = folder.tail.cut() if folder is not None else 0
            self._cut_pending = b",".join(self._pending.values())
            return {"gen": gen}

    def observe_nodes(self, totals: Iterable[Any]) -> None:
        self.stats.observe_nodes(totals)

    def observe_history(self, histories: Mapping[str, Sequence[Sequence[Any]]]) -> None:
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

    def flush(self) -> None:
        """Cut and write this worker's row now (atomically), if anything changed since the
        last one; then fold the workers that died."""
        self._ready.wait(JOIN_WAIT_S)
        self._flush()

    def _flush(self) -> None:
        # A row waiting for room is tried again unhurried: one failed call a wait, for as long
        # as the place stays full (each retry hurried the GIL's hand-overs: a test beside a
        # CPU burner saw it, 1 run in 6). Decided under the lock: decided before it, a flush
        # that waited for another one which found the place full hurried all the same (CI).
        try:
            with self._flush_lock:
                hurry = SWITCH.hurried() if self._unwritten is None else contextlib.nullcontext()
                with hurry:
                    self._flush_now()
        finally:
            with self._tail_lock:  # paired with _half_full's hurry under the same lock
                if self._hurrying:
                    self._hurrying = False
                    SWITCH.started()

    def _flush_now(self) -> None:
        """The row cut and written (the writer thread's, or a flush asked for)."""
        folder = self.folder
        if folder is None:
            return
        if self._unwritten is not None and not self._write(folder, self._unwritten):
            return  # still no room: the tail goes on, uncut, after the row on disk
        changes = self.stats.records
        if changes != self._written or self._due.is_set() or not folder.rows.path.exists():
            self._due.clear()
            row = {"server": folder.server.key, "state": self.stats.state(cut=self._cut),
                   "nodes": {name: [list(s) for s in samples]
                             for name, samples in samples_of(self.stats).items()}}
            try:
                data = b'%b,"pending":{%b}}' % (dump(row)[:-1], self._cut_pending)
            except ValueError as exc:
                self.write_errors += 1
                self._unshare(f"cannot write this worker's row in {folder.folder}: {exc}", exc)
                return
            finally:
                self._cut_pending = b""  # in the row now (up to 100,000 members: megabytes)
            if not self._write(folder, data):
                return
            self._written = changes
        try:
            folder.fold(self._fold)
        except (OSError, ValueError) as exc:
            log.debug("folding the dead workers failed: %s", exc)

    def _write(self, folder: ServerFolder, data: bytes) -> bool:
        """Write a row just cut; where the place is full (something else filled /dev/shm) keep
        it, to be written first at the next flush. Meanwhile the tail is not cut again, so
        every worker, this one too (:meth:`view`), counts this one's requests from its last
        row on disk and the tail after it (until the tail is full): counts stall, never fall,
        and every worker's /energy says why in ``shared_reason`` (the tail carries it)."""
        try:
            folder.rows.write(data)
        except OSError as exc:
            self.write_errors += 1
            if self._unwritten is None:
                self.shared_reason = (f"this worker's row cannot be written in {folder.folder} "
                                      f"({exc.strerror or exc}): its requests are counted up to its "
                                      "last row, and its tail until that fills")
                log.warning("%s -> %s", self.shared_reason, remedy(exc))
                with self._tail_lock:  # said in place too: the others' answers say it
                    folder.tail.append_json(json.dumps(["w", self.shared_reason]).encode())
            self._unwritten = data
            return False
        if self._unwritten is not None:
            log.warning("this worker's row is written in %s again: the other workers count all "
                        "of its requests", folder.folder)
            self._unwritten, self.shared_reason = None, None
            self._due.set()  # a row of everything, at once
        return True

    def _run(self) -> None:
        wait = self.flush_s
        while not self._stop.is_set():
            self._due.wait(wait)
            if self._stop.is_set():
                return
            spent = time.thread_time()
            try:
                self._flush()
            except Exception:  # the writer goes on: a tail past half with no writer stays so
                log.exception("writing this worker's statistics row failed")
            if self._unwritten is not None:
                # No room for the row: tried again every wait, not at every answer (the
                # writer spun on the due flag, 2.5 s of CPU in 3, while the place was full).
                self._due.clear()
            # A write costs what the state holds (about 0.5 s of CPU at 1e6 records over
            # 200 keys): the next waits FLUSH_SHARE times as long, so sharing the statistics
            # costs a worker at most 1/FLUSH_SHARE of a core; the tail keeps every request
            # meanwhile (a full one asks for a row at once).
            wait = max(self.flush_s, (time.thread_time() - spent) * FLUSH_SHARE)

    def close(self) -> None:
        """Stop the writer and write the final row (the worker's counts stay on disk, to be
        folded once it is gone)."""
        if self._stop.is_set():
            return  # closed already (by its owner, then at exit)
        self._stop.set()
        self._due.set()
        atexit.unregister(self.close)
        self.flush()

    # -- reading --------------------------------------------------------------------------
    def workers(self) -> int:
        """Live worker processes sharing these statistics, this one included."""
        self._ready.wait(JOIN_WAIT_S)
        folder = self.folder
        if folder is None:
            return 1
        return 1 + len({process_of(o) for o in folder.find().others if o.alive})

    def _fold(self, dead: dict[str, Any] | None, others: list[Other]) -> dict[str, Any]:
        """The new dead row: the last one and ``others`` (dead workers) merged."""
        merged, samples, _ = merge_server(self.stats, self.folder, dead, others, None)
        nodes = merge_samples(samples, merged.step_s)
        return {"state": merged.state(),
                "nodes": {name: [list(s) for s in items] for name, items in nodes.items()}}

    def view(self) -> EnergyStats:
        """The whole server's statistics: this worker's live state merged with the others'.
        While its row waits for room (:meth:`_write`), this worker counts itself as the
        others do, from its row on disk and its tail: every worker answers alike, and no
        counter goes down between two answers from different workers (a hostile trial saw
        ``giul_requests_total`` fall by 3,849 where the others' count of it stalled)."""
        self.wait_ready(JOIN_WAIT_S)
        folder = self.folder
        if folder is None:
            return self.stats
        found = folder.find()
        others: list[Other] = found.others
        own: dict[str, Any] | None = self.stats.state()
        if self._unwritten is not None:
            mine = folder.mine()
            if mine is not None:
                others, own = [*others, mine], None
        self._stuck = [f"worker {process_of(o)}: {g.stuck}" for o in found.others if o.alive
                       for g in o.gens[-1:] if g.stuck]
        self._stuck += [f"worker {pid}: its statistics are its own ({why or 'see its log'}); its requests "
                        "are not counted here" for pid, why in unshared_in(folder.folder)]
        merged, samples, self._live = merge_server(self.stats, folder, found.dead, others, own)
        if own is None:
            self._live = max(0, self._live - 1)  # this worker was counted among the others
        else:
            samples.append(samples_of(self.stats))
        merged_samples = merge_samples(samples, self.stats.step_s)
        with merged._lock:
            merged._nodes.samples = merged_samples
        return merged

    def snapshot(self, window: str | None = None, **kwargs: Any) -> dict[str, Any]:
        out = self.view().snapshot(window, **kwargs)
        out["workers"] = 1 + self._live if self.folder is not None else 1
        out["shared"] = self.folder is not None or self.alone
        out["shared_reason"] = "; ".join([self.shared_reason, *self._stuck] if self.shared_reason
                                         else self._stuck) or None
        out["server"] = self.server.key if self.server is not None else None
        return out


_hosts: weakref.WeakSet[HostStats] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for host in list(_hosts):
        # A lock another thread held at the fork stays held in the child: new ones.
        host._tail_lock, host._flush_lock = threading.Lock(), threading.Lock()
        host._fork_lock = threading.Lock()
        host.stats.renew_locks()
        host._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,80}")


def _id_json(id: str | None) -> bytes:
    """A request id as a JSON string (ids are plain: written as they are), or null."""
    if id is None:
        return b"null"
    if _SAFE_ID.fullmatch(id):
        return b'"%b"' % id.encode()
    return json.dumps(id).encode()


def _label(value: Any) -> Any:
    """A label as a row and the tail carry it: a string, a whole number, a finite number, a
    truth value or null (a NaN status, spliced in as it was, made every reader refuse the
    whole row: a hostile review)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def _number(value: Any) -> bytes:
    """A figure as JSON may carry it: NaN, infinities and anything not a number as null."""
    if value is None:
        return b"null"
    if value is True or value is False:
        return b"true" if value else b"false"
    if type(value) is int:
        return b"%d" % value
    if type(value) is float:
        return repr(value).encode() if math.isfinite(value) else b"null"
    return b"null"


__all__ = ["ENV", "HostStats", "clear_directory", "multiproc_dir"]
