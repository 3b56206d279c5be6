"""One ledger per node: it owns the node's reader and shares the card among windows.

The seed's ruler gave every window the card's whole energy, so N overlapping requests were
charged N times. A ledger is three parts, each with one job:

- :mod:`.tape`: readings -> spans of energy above idle, or gaps (counter hygiene, step
  phase, the learnt update period, resets, stale counters, power trapezoids);
- :mod:`.book`: spans -> shares among windows (overlaps, settling, totals), with its parts:
  :mod:`.window` (a request's window, the splits), :mod:`.prior` (what fills what the card
  has not reported), :mod:`.foreign` (the foreign-load watch) and :mod:`.unseen` (load this
  process cannot see: other workers, the upstream's running requests);
- :mod:`.poller`: the thread that builds and reads the card, every driver call bounded.

This module ties them together under one lock and answers the request path: opening and
closing a window records a time (no I/O, no task, no thread per request); asking for a
share reads the book.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import anyio

from ..carbon import CarbonFeed, carbon_of, static_status
from ..config import Node
from ..energy import Carbon, Provenance, Share
from ..errors import ConfigError, GiulError, ReaderUnavailable
from ..hostshare import ENV as HOSTSHARE_ENV
from ..hostshare import CardTable, Place, Setting, card_key, log_unshared, resolve
from ..readers.base import NullReader, Process, Reader, Reading
from ..readers.mig import Mig, mig_of
from .book import Book, Split, TimeSplit, TokenSplit, Window
from .history import LOOK_EVERY_S, History
from .poller import IDLE_S, Health, Poller
from .sources import explicit, reader_factory
from .tape import Tape
from .tickets import Ticket, fire
from .trace import WRITE_EVERY_S, for_node

log = logging.getLogger("giul_asgi.ledger")

_STARTING = "the node's reader is starting"
#: How often the upstream's metrics and the workers' table are looked at (seconds).
UPSTREAM_EVERY_S = 0.25
WORKERS_EVERY_S = 0.05
#: The one setting for sharing among worker processes (a directory, or ``off``).
WORKERS_ENV = HOSTSHARE_ENV


@dataclass(frozen=True, slots=True)
class LedgerTotals:
    """The books of one node since its ledger was built, and its reader's health."""

    node: str
    measured_j: float
    charged_j: float
    unattributed_j: float
    foreign_j: float
    in_flight_j: float
    idle_w: float | None
    mean_concurrency: float | None
    foreign_watts: float | None
    contended: bool | None
    reads: int
    read_errors: int
    last_error: str | None
    last_reading_age_s: float | None
    resets: int
    period_s: float | None
    lost_s: float
    windows_open: int
    read_seconds_max: float
    backend: str
    method: str
    #: Filled into figures from the prior where no reading covered their time (never
    #: measured: outside ``measured == charged + unattributed + in flight``).
    estimated_j: float = 0.0
    #: Worker processes whose books these are (1: this process's alone).
    workers: int = 1

    @property
    def conservation_error_j(self) -> float:
        return self.measured_j - (self.charged_j + self.unattributed_j + self.in_flight_j)


class Ledger:
    """The single owner of a node's reader; windows borrow it and never read the card.

    ``reader`` is a reader already built (tests, benchmarks) or None to build the node's
    own on the poller thread when the ledger starts.
    """

    def __init__(
        self,
        node: Node,
        reader: Reader | None = None,
        *,
        split: Split | None = None,
        clock: Callable[[], float] | None = None,
        read_timeout: float = 1.0,
        poll: bool = True,
    ) -> None:
        self.node = node
        self.read_timeout = read_timeout
        #: False: nothing reads the card by itself; the caller feeds :meth:`ingest` (tests).
        self.poll = poll
        self._lock = threading.Lock()
        self._build = reader_factory(node) if reader is None else (lambda: reader)
        self.clock: Callable[[], float] = clock or (reader.clock if reader else time.monotonic)
        split = split or (TokenSplit() if node.split == "tokens" else TimeSplit())
        measures = node.reader != "none" or reader is not None or node.reader_factory is not None
        provenance = Provenance("measured", "none", "none", node.idle_w)
        self.book = Book(
            provenance, split=split, ramp_s=node.ramp_s,
            subtract_foreign=node.foreign == "subtract", period=self._period, measures=measures,
        )
        self.book.error = _STARTING if measures else "node configured with reader='none'"
        self.tape: Tape | None = None
        self.reader: Reader | None = None
        #: The node reads a MIG board (None: not, or not known yet): said in every record.
        self.mig: Mig | None = None
        self.failure: BaseException | None = None
        self._poller: Poller | None = None
        self._workers: _Workers | None = None
        #: Why this process's figures cannot see other workers on the card (no place to
        #: share through), said in every figure; None where they are shared or turned off.
        self.unshared: str | None = None
        self._stopped = False
        #: The node's carbon intensity now (None: none configured): what every figure is
        #: graded with, one attribute read; a polled one is replaced by the reader thread.
        self.carbon: Carbon | None
        self._carbon_feed: CarbonFeed | None
        self.carbon, self._carbon_feed = carbon_of(node)
        #: What the ledger saw, for replay (None: the node keeps no trace); ``_note``
        #: appends one event to its buffer, under the lock (see :mod:`.trace`).
        self._trace = for_node(node, split.name, measures)
        self._note = self._trace.note if self._trace is not None else None
        #: The host's books, one sample a step, taken by the reader thread (/energy's power).
        self.history = History()
        if reader is not None:
            self.attach(reader)

    # -- the request path: O(1), no I/O ---------------------------------------------------
    @property
    def provenance(self) -> Provenance:
        return self.book.provenance

    @property
    def measures(self) -> bool:
        return self.book.measures

    def open(self) -> Window:
        self.ensure_started()
        with self._lock:
            t = self.clock()
            window = self.book.open(t)
            if self._note is not None:
                self._note(("o", t, id(window)))
            return window

    def mark(self, window: Window, name: str) -> None:
        with self._lock:
            t = self.clock()
            self.book.mark(window, name, t)
            if self._note is not None:
                self._note(("m", t, id(window), name))

    def close(
        self, window: Window, tokens: int | None = None,
        about: tuple[str | None, str | None, str | None] | None = None,
    ) -> Share:
        """Close the window and return its share at close (one lock for both). ``about``
        is the request's (id, route, tier), for the node's trace only."""
        with self._lock:
            t = self.clock()
            settled = self.book.close(window, t, tokens)
            if self._note is not None:
                self._note(("c", t, id(window), tokens, about))
                self._noted(settled)
            share = self.book.share(window)
        if settled:
            _fire(settled)
        return share

    def abandon(self, window: Window) -> None:
        with self._lock:
            t = self.clock()
            settled = self.book.abandon(window, t)
            if self._note is not None:
                self._note(("a", t, id(window)))
                self._noted(settled)
        _fire(settled)

    def share(self, window: Window) -> Share:
        with self._lock:
            return self.book.share(window)

    def share_unlocked(self, window: Window) -> Share:
        """:meth:`share` for a caller that holds the lock (a batch of tickets)."""
        return self.book.share(window)

    def stage_values(self, window: Window) -> list[float] | None:
        with self._lock:
            return self.book.stage_values(window)

    def when_settled(self, window: Window, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the window settles (now, if it has)."""
        with self._lock:
            if not window.settled:
                if window.callbacks is None:
                    window.callbacks = [callback]
                else:
                    window.callbacks.append(callback)
                return
        callback()

    async def wait_settled(self, window: Window, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout``) until a reading settles the window."""
        if window.settled:
            return True
        wait, wake = _waker()
        self.when_settled(window, wake)
        with anyio.move_on_after(timeout):
            await wait()
        return window.settled

    # -- readings, from the poller's thread (or a test) -----------------------------------
    def attach(self, reader: Reader) -> None:
        """The reader is built: what it is says how every figure is labelled."""
        with self._lock:
            if self.reader is reader:
                return
            self.reader = reader
            # A simulated card's own floor stands in only where the operator gave none.
            idle_w = self.node.idle_w
            if idle_w is None:
                idle_w = getattr(reader, "simulated_idle_w", None)
            self.tape = Tape(reader.kind, idle_w, period_hint=self.node.period_s or reader.period)
            self.mig = mig_of(reader)
            if self._note is not None:
                self._note(("at", {"kind": reader.kind, "method": reader.method,
                                   "backend": reader.backend, "source": reader.source,
                                   "idle_w": idle_w, "period_hint": self.tape.period_hint,
                                   "mig": self.mig.as_dict() if self.mig is not None else None}))
            self.book.provenance = Provenance(reader.method, reader.backend, reader.source, idle_w,
                                              self.mig.caveat if self.mig is not None else None)
            if reader.kind == "none":
                self.book.measures = False
                self.book.error = getattr(reader, "reason", "no reader for this node")
                settled = self.book.force_settle()
            else:
                self.book.error = None
                settled = []
        _fire(settled)

    def failed(self, error: BaseException) -> None:
        """The reader could not be built: figures on this node are unknown or estimated."""
        reason = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        with self._lock:
            self.failure = error
            self.book.measures = False
            self.book.error = f"reader unavailable: {reason}"
            settled = self.book.force_settle()
            if self._note is not None:
                self._note(("f", reason))
        _fire(settled)

    def ingest(self, reading: Reading) -> None:
        """Book one reading: the spans it closes are shared, and what they settle fires."""
        settled: list[Window] = []
        with self._lock:
            tape = self.tape
            if tape is None or not self.book.measures:
                return
            if self._note is not None:
                self._note(("r", reading.t, reading.joules, reading.watts, reading.error))
            if not reading.ok:  # first figures made from now until the next span say so
                self.book.note_trouble(f"the reader is failing: {reading.error or 'empty reading'}")
            for piece in tape.feed(reading):
                settled += self.book.book(piece, reading.t)
            if settled and self._note is not None:
                self._noted(settled)
        _fire(settled)

    def _noted(self, settled: list[Window]) -> None:
        """Trace what the windows just settled with (under the lock), for replay's check."""
        note = self._note
        if note is not None:
            for window in settled:
                note(("z", id(window), window.share, window.fill_j))

    def read_now(self) -> Reading:
        """Read the card here and now (blocking) and book it: for sync meters only."""
        if self.reader is None:
            self._attach_now()
        reader = self.reader
        if reader is None:
            return Reading(t=self.clock(), error=self.book.error or "no reader")
        reading = reader.read()
        self.ingest(reading)
        return reading

    def _attach_now(self) -> None:
        try:
            self.attach(self._build())
        except Exception as exc:
            self.failed(exc)

    def note_processes(self, processes: list[Process] | None) -> None:
        serving = self.node.serving
        foreign: bool | None = None
        if processes is not None and serving is not None:
            foreign = any(
                not (p.pid == serving if isinstance(serving, int) else p.name == serving)
                for p in processes
            )
        with self._lock:
            self.book.note_processes(foreign)
            if self._note is not None:
                self._note(("p", foreign))

    def _chores(self) -> list[tuple[float, Callable[[], None]]]:
        """What the poller does beside reading the card: the load this process cannot see."""
        chores: list[tuple[float, Callable[[], None]]] = []
        if self.node.upstream is not None:
            chores.append((UPSTREAM_EVERY_S, _Upstream(self, self.node.upstream)))
        # Other worker processes on this card: shared by default, through the host's place.
        self._workers = _Workers(self, self.node.workers_dir)
        chores.append((WORKERS_EVERY_S, self._workers))
        if self._carbon_feed is not None:
            chores.append((self._carbon_feed.tick_s, self._carbon_tick))
        if self._trace is not None:
            chores.append((WRITE_EVERY_S, self._trace.write))
        chores.append((LOOK_EVERY_S, self.history.chore(self.host_totals)))
        return chores

    def _carbon_tick(self) -> None:
        """The carbon intensity, re-aged (and a due poll started, off this thread)."""
        if self._carbon_feed is not None:
            self.carbon = self._carbon_feed.tick()

    @property
    def carbon_health(self) -> dict[str, Any] | None:
        """Where the node's carbon intensity comes from and how it is going (``/energy``)."""
        feed = self._carbon_feed
        if feed is None:
            return static_status(self.carbon) if self.carbon is not None else None
        status = feed.status()
        poller = self._poller
        if feed.polls == 0 and (poller is None or poller.health.state == "unavailable"):
            status["reason"] = ("not polled: the node's reader thread polls it, and none runs (it "
                                "starts with the first request; a node without a reader has none)")
        return status

    def host_totals(self) -> LedgerTotals:
        """:meth:`totals` for the whole host: every worker process's charges on this card
        summed (what ``/energy`` and ``/metrics`` show); this process's alone where the
        workers cannot share (``workers`` is then 1)."""
        mine = self.totals()
        workers = self._workers
        return workers.host(mine) if workers is not None else mine

    def own_load(self) -> tuple[float, int]:
        """This process's window-seconds integral on the node so far, and windows open."""
        with self._lock:
            return self.book.load_at(self.clock())

    def note_upstream(self, t: float, running: float) -> None:
        """The upstream (the inference server) ran ``running`` requests at ``t``."""
        with self._lock:
            self.book.note_upstream(t, running)
            if self._note is not None:
                self._note(("up", t, running))

    def _period(self) -> float:
        tape = self.tape
        return tape.period if tape is not None else (self.node.period_s or 0.1)

    # -- lifecycle ----------------------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the poller thread once (no driver call happens here: it runs there), and
        wake it: every window opens through here, and an idle poller dozes."""
        poller = self._poller
        if poller is not None:
            poller.wake()
            return
        if self._stopped or not self.book.measures or not self.poll:
            return
        with self._lock:
            if self._poller is not None or self._stopped:
                return
            if self.reader is not None and self.reader.kind == "none":
                return
            node = self.node
            self._poller = Poller(
                node.name, self._build if self.reader is None else (lambda: self.reader),  # type: ignore[arg-type,return-value]
                self, read_timeout=self.read_timeout, clock=self.clock, chores=self._chores(),
                busy=self._windows_open, idle_s=None if _watches_idle(node) else IDLE_S,
                reader_name=_reader_name(node, self.reader),
                target=_target(node), load=self.own_load,
            )
            self._poller.start()

    def _windows_open(self) -> bool:
        """Whether this process has windows open on the node, or closed and not settled yet
        (the poller's busy pace: a closed window waits on the next steps to settle)."""
        return self.own_load()[1] > 0 or self.book.unsettled

    @property
    def health(self) -> Health | None:
        """How the node's reader is doing (None before the poller started)."""
        poller = self._poller
        return poller.health if poller is not None else None

    async def wait_ready(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the reader to be built. Raises the build's error
        when the operator asked for this reader by name; a slow driver is logged, not
        waited for."""
        if not self.book.measures and self.failure is None:
            return  # reader="none": nothing to wait for
        self.ensure_started()
        with anyio.move_on_after(timeout):
            while self.reader is None and self.failure is None and self._poller is not None:
                await anyio.sleep(0.005)
        if self.failure is not None and explicit(self.node):
            if isinstance(self.failure, GiulError):
                raise self.failure
            raise ReaderUnavailable(
                f"node {self.node.name!r}: {type(self.failure).__name__}: {self.failure}"
            )
        if self.reader is None and self.failure is None:
            log.warning(
                "node %r: the reader is still starting after %.2g s (a slow or wedged driver?);"
                " serving, with figures unknown until it answers", self.node.name, timeout,
            )

    def stop(self, timeout: float | None = None) -> None:
        """Stop the poller (one last reading first, bounded) and settle every window."""
        self._stopped = True
        poller = self._poller
        if poller is not None and not poller.stop(timeout):
            log.warning("node %r: the reader did not stop in time; left behind", self.node.name)
        if self._workers is not None:
            self._workers.close()  # the other workers keep this one's figures, frozen
        if self._carbon_feed is not None:
            self._carbon_feed.close()
        with self._lock:
            settled = self.book.force_settle()
            if self._note is not None:
                self._note(("s",))
                self._noted(settled)
        if self._trace is not None:
            totals = self.totals()
            self._trace.close({"measured_j": totals.measured_j, "charged_j": totals.charged_j,
                               "unattributed_j": totals.unattributed_j,
                               "in_flight_j": totals.in_flight_j})
        _fire(settled)

    async def aclose(self, timeout: float | None = None) -> None:
        """:meth:`stop` without blocking the event loop."""
        await anyio.to_thread.run_sync(self.stop, timeout, abandon_on_cancel=True)

    # -- the books ------------------------------------------------------------------------
    def totals(self) -> LedgerTotals:
        with self._lock:
            book = self.book.totals()
            tape = self.tape
            poller = self._poller
            return LedgerTotals(
                node=self.node.name, measured_j=book.measured_j, charged_j=book.charged_j,
                unattributed_j=book.unattributed_j, foreign_j=book.foreign_j,
                in_flight_j=book.in_flight_j, idle_w=self.node.idle_w,
                mean_concurrency=book.mean_concurrency, foreign_watts=book.foreign_watts,
                contended=book.contended, reads=tape.reads if tape else 0,
                read_errors=tape.errors if tape else 0,
                last_error=(tape.last_error if tape else None) or self.book.error,
                last_reading_age_s=tape.age(self.clock()) if tape else None,
                resets=tape.resets if tape else 0,
                period_s=tape.steps.period if tape else None, lost_s=book.lost_s,
                windows_open=book.windows_open, estimated_j=book.estimated_j,
                read_seconds_max=poller.read_seconds_max if poller else 0.0,
                backend=self.book.provenance.backend, method=self.book.provenance.method,
            )


def _watches_idle(node: Node) -> bool:
    """Whether an idle node still reads at its counter's period: it watches for a foreign
    load it subtracts, or for the upstream's load. (Other workers' load is read from the
    host's table on the chore's own lap; sharing is the default, so it cannot set the pace.)"""
    return node.foreign == "subtract" or node.upstream is not None


def _reader_name(node: Node, built: Reader | None) -> str:
    """The reader's name for people: the node's, or what a reader handed in says it is."""
    if built is not None:
        return built.backend
    return "custom" if node.reader_factory is not None else node.reader


def _target(node: Node) -> str:
    """What the node's reader reads, for people: the URL, else the GPUs."""
    if node.url is not None:
        return node.url
    if node.reader == "simulated":
        return "an in-process simulated card loaded by this node's windows"
    return f"GPUs {list(node.gpus)}" if node.gpus else "every GPU"


def _fire(windows: list[Window]) -> None:
    # Tickets in one batch per ledger and listeners; plain callbacks one by one.
    fire(windows)


def _waker() -> tuple[Callable[[], Awaitable[object]], Callable[[], None]]:
    """An event to await on this loop, and a setter any thread may call."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio

        trio_event = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake_trio() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(trio_event.set)

        return trio_event.wait, wake_trio
    event = asyncio.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(event.set)

    return event.wait, wake


class _Upstream:
    """Reads the inference server's running requests beside the card (poller thread)."""

    def __init__(self, ledger: Ledger, url: str) -> None:
        self.ledger, self.url = ledger, url
        self.load: Any = None

    def __call__(self) -> None:
        if self.load is None:
            from ..readers.upstream import UpstreamLoad

            self.load = UpstreamLoad(self.url, clock=self.ledger.clock)
        reading = self.load.read()
        if reading.ok and reading.running is not None:
            self.ledger.note_upstream(reading.t, reading.running)


class _Workers:
    """Publishes this process's windows on the card and reads the other workers' (poller
    thread), through the card's table in the host's place (shared by default)."""

    def __init__(self, ledger: Ledger, setting: Setting) -> None:
        self.ledger, self.setting = ledger, setting
        self.place: Place | None = None
        self.table: CardTable | None = None

    def __call__(self) -> None:
        ledger = self.ledger
        if self.place is None:
            self.place = place = resolve(self.setting)
            log_unshared(place)
            if not place.shared and not place.off:
                ledger.unshared = f"per process: {place.reason}; other workers on this card are not seen"
            key = card_key(ledger.node, ledger.reader)
            if place.path is not None and key is not None:
                self.table = CardTable(place.path, key, ledger.node.name, clock=ledger.clock)
        table = self.table
        if table is None:
            return
        t = ledger.clock()
        integral, open_now = ledger.own_load()
        table.publish(integral, open_now, t, _books(ledger.totals()))
        others = table.others(t)
        if others is not None:
            pass  # replaced by the card table (being rebuilt)

    def host(self, mine: LedgerTotals) -> LedgerTotals:
        table = self.table
        if table is None:
            return mine
        books = table.host(_books(mine))
        return replace(
            mine, measured_j=books.measured_j, charged_j=books.charged_j,
            unattributed_j=books.unattributed_j, in_flight_j=books.in_flight_j,
            windows_open=books.windows_open, workers=books.workers, estimated_j=books.estimated_j,
        )

    def close(self) -> None:
        if self.table is not None:
            self.table.close()


def _books(totals: LedgerTotals) -> dict[str, float]:
    """What a process publishes of its books for the host's (see :class:`HostBooks`)."""
    return {"measured_j": totals.measured_j, "charged_j": totals.charged_j,
            "in_flight_j": totals.in_flight_j, "windows_open": float(totals.windows_open),
            "estimated_j": totals.estimated_j}


NULL_NODE = Node("<none>", reader="none")


class Ledgers:
    """Ledgers by node name: the one place a node's reader is owned.

    A process keeps one (``default_ledgers()``) so that the middleware and any
    ``Meter.for_node`` in a handler share a node's ledger instead of each reading the card
    and each charging the whole of its energy. ``get(None)`` is the null ledger: windows
    on it measure nothing and say so.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def get(self, node: Node | None) -> Ledger:
        node = node if node is not None else NULL_NODE
        ledger = self._by_name.get(node.name)
        if ledger is not None and (ledger.node is node or _same(ledger.node, node)):
            return ledger
        with self._lock:
            ledger = self._by_name.get(node.name)
            if ledger is None:
                ledger = Ledger(node)
                self._by_name[node.name] = ledger
            elif not _same(ledger.node, node):
                raise ConfigError(
                    f"two different nodes are both named {node.name!r}",
                    remedy="give each node its own name, or reuse the same Node object",
                )
            return ledger

    def __iter__(self) -> Iterator[Ledger]:
        return iter([ledger for ledger in self._by_name.values() if ledger.node is not NULL_NODE])

    async def start(self, nodes: list[Node] | tuple[Node, ...], timeout: float = 0.25) -> None:
        """Start every node's reader and wait (at most ``timeout`` in all) for them to be
        built; raise the first error of a reader asked for by name."""
        ledgers = [self.get(node) for node in nodes]
        errors: list[BaseException] = []

        async def ready(ledger: Ledger) -> None:
            try:
                await ledger.wait_ready(timeout)
            except GiulError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            for ledger in ledgers:
                group.start_soon(ready, ledger)
        if errors:
            raise errors[0]

    async def aclose(self, timeout: float | None = None) -> None:
        for ledger in list(self._by_name.values()):
            await ledger.aclose(timeout)

    def close(self, timeout: float | None = None) -> None:
        for ledger in list(self._by_name.values()):
            ledger.stop(timeout)
        self._by_name.clear()


def _same(a: Node, b: Node) -> bool:
    return a == b and a.reader_factory is b.reader_factory


_default = Ledgers()


def default_ledgers() -> Ledgers:
    """The process's ledgers: one per node name, shared by every meter and middleware."""
    return _default


__all__ = [
    "NULL_NODE",
    "Ledger",
    "LedgerTotals",
    "Ledgers",
    "NullReader",
    "Split",
    "Ticket",
    "TimeSplit",
    "TokenSplit",
    "Window",
    "default_ledgers",
]
