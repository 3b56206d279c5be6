"""One node's ledger: it owns the node's reader and shares the card among windows.

The seed's ruler gave every window the card's whole energy, so N overlapping requests were
charged N times. A ledger ties its parts together under one lock and answers the request
path: opening and closing a window records a time and nothing else (no lock, no I/O, no
task, no thread per request: the time goes into an in-tray); the book takes what the tray
holds, in order, at the reader thread's next look, or when a figure is asked for (one lock:
a first figure rests on the book as it stands). Shares, settling, grading and the records
are the reader thread's: settling per reading, the settled figures' listeners between its
reads, a chunk at a time (:meth:`Ledger.deliver`). Its parts (see the package's docstring): the tape
(readings -> spans), the book (spans -> shares), the poller (the one thread that reads the
card), the chores beside it, and its seat at the card's table
(:mod:`giul_asgi.hostshare.cards`), through which every process of the host that meters
the card charges it once: one of them reads the card and decides every span, and each takes
its own part.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from ..carbon import CarbonFeed, carbon_of, static_status
from ..config import Node
from ..deferred import raise_kept
from ..energy import Carbon, Provenance, Share
from ..errors import GiulError, ReaderUnavailable
from ..hostshare import CardTable, SeatBooks, card_key, log_unshared, resolve, server_identity
from ..hostshare.place import remedy
from ..hostshare.priors import KeptPrior, prior_name
from ..readers.base import Continuing, Process, Reader, Reading
from ..readers.mig import Mig, mig_of
from ..spans import NOBODY, CardSpan, Counted, Gap, Span
from .book import Book, Split, TimeSplit, TokenSplit, Window
from .chores import UPSTREAM_EVERY_S, Upstream
from .history import LOOK_EVERY_S, History
from .phases import PREFILL, PhaseSplit, split_for
from .poller import IDLE_S, TURNS, Health, Poller
from .sources import explicit, reader_factory
from .tape import Tape
from .tickets import Ticket, fire
from .trace import WRITE_EVERY_S, for_node
from .unseen import COUNT_LAG_S, SLOWEST_SCRAPE_S
from .window import waiting_on

log = logging.getLogger("giul_asgi.ledger")

_STARTING = "the node's reader is starting"
#: What the request path puts in a ledger's tray besides a window that opened.
_CLOSE, _REPORT = "close", "report"
#: How often a ledger at a card's table publishes its books for the others (seconds).
BOOKS_EVERY_S = 0.05
#: How often a node's prior is kept for the server's next worker (s), where it learnt since.
KEEP_EVERY_S = 2.0
#: While other processes share the card, a piece is decided this long after its end at the
#: soonest (s): their windows' opens reach the table a little after they happen (a process
#: preempted between its clock and its store), and a window missed then is a foreign load.
DECIDE_AFTER_S = 0.03
#: Settled windows whose listeners the reader thread runs at a time, between reads.
HAND_OVER_CHUNK = 16


_PID = [str(os.getpid())]  # this process's, renewed in a forked child
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, str(os.getpid())))


#: Floors (W) closer than this are one: a follower's figures say the reader's only beyond it.
FLOOR_TOLERANCE_W = 1e-6


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
    #: The allocated basis: all the card drew (idle included); the idle floor charged to
    #: settled windows and to windows not settled yet; the idle floor no window was
    #: allocated (time with none open). ``drawn == allocated + unattributed +
    #: idle_unattributed + in flight + idle in flight``.
    drawn_j: float = 0.0
    idle_charged_j: float = 0.0
    idle_in_flight_j: float = 0.0
    idle_unattributed_j: float = 0.0
    #: Whose books these are where the card is this process's alone (an in-process card, or
    #: nothing could be shared): its pid, so each worker's counters are a series of their
    #: own; None for the host's card, the same books from every process.
    process: str | None = None
    #: Why the node's ``upstream`` cannot be read, while it cannot (None: it can, or none).
    upstream_error: str | None = None

    @property
    def conservation_error_j(self) -> float:
        return self.measured_j - (self.charged_j + self.unattributed_j + self.in_flight_j)

    @property
    def allocated_j(self) -> float:
        """Charged to settled windows on the allocated basis: above idle and idle floor."""
        return self.charged_j + self.idle_charged_j

    @property
    def allocation_error_j(self) -> float:
        """What the allocated books miss of all the card drew (0 to rounding)."""
        return self.drawn_j - (self.allocated_j + self.unattributed_j + self.idle_unattributed_j
                               + self.in_flight_j + self.idle_in_flight_j)


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
        raise_kept(node)  # a Node made wrong while a server imported the app
        self.node = node
        self.read_timeout = read_timeout
        #: False: nothing reads the card by itself; the caller feeds :meth:`ingest` (tests).
        self.poll = poll
        #: Settled on the reader thread, their listeners not yet run (see :meth:`_hand_over`).
        self._handing: deque[Window] = deque()
        self._lock = threading.Lock()
        #: What the request path recorded and the book has not taken yet, in order (any
        #: thread appends; whoever holds the lock takes): a window opened, ``(CLOSE, window,
        #: t, tokens, about, usage)``, ``(REPORT, window, ticket)``.
        self._tray: deque[Any] = deque()
        self._seqs = itertools.count(1)  # windows' numbers, which the card's table knows
        self._build = reader_factory(node) if reader is None else (lambda: reader)
        #: The reader was made in code (handed in, or the node's factory): shared with other
        #: processes only if it says which card it reads.
        self._custom = reader is not None or node.reader_factory is not None
        self.clock: Callable[[], float] = clock or (reader.clock if reader else time.monotonic)
        split = split or split_for(node.split)
        measures = node.reader != "none" or reader is not None or node.reader_factory is not None
        provenance = Provenance("measured", "none", "none", node.idle_w, pue=node.pue)
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
        #: A startup waits on this reader (:meth:`wait_ready`) and says its failure itself.
        self._startup_waits = False
        self._poller: Poller | None = None
        #: This ledger's seat at the card's table, host-wide (None: alone on its card, not
        #: joined yet, or nothing can be shared); joined on the reader thread.
        self.table: CardTable | None = None
        self._joined = False
        self._kept: KeptPrior | None = None  # the node's prior, kept for the server's next worker
        self._others_s = 0.0  # other processes' window-seconds on a card that lives here
        self._others_t: float | None = None
        self._kept_learnt = 0
        #: The reader thread has had its first turn at the table (joined it, and taken what
        #: the card's holder published): a follower's first figures can use the host's rate.
        self.looked = False
        self._books_t = -math.inf
        self._highs: dict[str, float] = {}
        #: Holder: pieces its tape yielded that wait to be decided (see DECIDE_AFTER_S).
        self._due: deque[Span | Gap] = deque()
        #: Why this process's figures cannot see other processes on the card (no place to
        #: share through), said in every figure; None where they are shared or turned off.
        self.unshared: str | None = None
        #: Where the process reading the card (another server's) cuts its energy above another
        #: idle floor than this node's: that floor, said in every figure (None: the same).
        self.floor_caveat: str | None = None
        #: Why the node's upstream cannot be read, while it cannot (None: it can, or none).
        self.upstream_error: str | None = None
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
        """A window opens now: its time, into the tray (and the card's table)."""
        self.ensure_started()
        window = Window(self.clock(), 0.0, next(self._seqs))
        self._tray.append(window)
        table = self.table
        if table is not None:  # in the holder's own file too: whoever takes over reads them
            table.opened(window.seq, window.t_open)
        if not self._deferring():
            self._take_tray()
        return window

    def mark(self, window: Window, name: str) -> None:
        with self._lock:
            settled = self._tray_locked()
            t = self.clock()
            marked = self.book.mark(window, name, t)
            settled += marked
            if self._note is not None:
                self._note(("m", t, id(window), name))
                self._noted(marked)
        self._fire(settled)

    @property
    def weighs_phases(self) -> bool:
        """Whether the node's split weighs prefill and decode (it wants first events and usage)."""
        return isinstance(self.book.split, PhaseSplit)

    def first_out(self, window: Window) -> None:
        """The answer's first event went out: where the node weighs phases, the window's
        prefill ends now (its ``prefill`` mark, once); elsewhere nothing."""
        if not self.weighs_phases or window.t_close is not None:
            return
        if any(name == PREFILL for name, _ in window.marks or ()):
            return
        self.mark(window, PREFILL)

    def close(
        self, window: Window, tokens: int | None = None,
        about: tuple[str | None, str | None, str | None] | None = None,
        usage: tuple[int, int] | None = None,
    ) -> None:
        """The window closes now: its time (and ``tokens``), into the tray. ``about`` is the
        request's (id, route, tier), for the node's trace only; ``usage`` its (prompt,
        completion) tokens, where known (the phase split weighs them)."""
        t = self.clock()
        self._tray.append((_CLOSE, window, t, tokens, about, usage))
        table = self.table
        if table is not None:
            table.closed(window.seq, t)
        if not self._deferring():
            self._take_tray()

    def report(self, window: Window, ticket: Ticket) -> None:
        """Deliver ``ticket`` once the (closed) window settles: into the tray, for the reader
        thread to file with the batch that settles it."""
        self._tray.append((_REPORT, window, ticket))
        if not self._deferring():
            self._take_tray()
        TURNS.give_way()  # the answer is out: a reader thread of ours may want the GIL

    def abandon(self, window: Window) -> None:
        with self._lock:
            settled = self._tray_locked()
            t = self.clock()
            settled += self.book.abandon(window, t)
            table = self.table
            if table is not None:
                table.closed(window.seq, t)
            if self._note is not None:
                self._note(("a", t, id(window)))
                self._noted(settled)
        self._fire(settled)

    def _deferring(self) -> bool:
        """Whether the tray may wait for the reader thread: one is running and measuring.
        Else (no poller, no reader, stopped) the caller books what it recorded at once."""
        return self._poller is not None and self.book.measures and not self._stopped

    def _take_tray(self) -> None:
        with self._lock:
            settled = self._tray_locked()
        self._fire(settled)

    def _tray_locked(self) -> list[Window]:
        """The book takes what the request path recorded, in order (under the lock): opens,
        closes, reports. Returns the windows that settled (to fire outside the lock)."""
        tray = self._tray
        if not tray:
            return []
        book, note = self.book, self._note
        settled: list[Window] = []
        fired: list[Window] = []
        while tray:
            item = tray.popleft()
            if type(item) is Window:
                book.enter(item)
                if note is not None:
                    note(("o", item.t_open, id(item)))
                continue
            window = item[1]
            if item[0] == _CLOSE:
                if window.t_close is not None:
                    continue  # closed twice: the first one stands
                _, _, t, tokens, about, usage = item
                settled += book.close(window, t, tokens, usage)
                if note is not None:
                    note(("c", t, id(window), tokens, about))
            else:  # a report
                if window.settled and window.callbacks is None:
                    # Handed over already (or nothing waited on it): delivered now. A window
                    # settled whose callbacks are still there waits in ``_handing`` for the
                    # reader, which delivers them and this ticket together (it threw them away
                    # here once: an ``on_settled`` never ran, a hostile review).
                    fired.append(window)
                waiting_on(window, item[2])
        if settled and note is not None:
            self._noted(settled)
        return settled + fired

    def share(self, window: Window) -> Share:
        """The window's share now (its first figure's, before it settles): one lock, in
        which the book first takes what the tray holds."""
        with self._lock:
            settled = self._tray_locked()
            share = self.book.share(window)
        self._fire(settled)
        return share

    def share_unlocked(self, window: Window) -> Share:
        """:meth:`share` for a caller that holds the lock (a batch of tickets)."""
        return self.book.share(window)

    def stage_values(self, window: Window) -> list[float] | None:
        with self._lock:
            settled = self._tray_locked()
            values = self.book.stage_values(window)
        self._fire(settled)
        return values

    def when_settled(self, window: Window, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the window settles (now, if it has)."""
        with self._lock:
            settled = self._tray_locked()
            waits = not window.settled
            if waits:
                waiting_on(window, callback)
        self._fire(settled)
        if not waits:
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
            settled = self._tray_locked()
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
                                              self.mig.caveat if self.mig is not None else None,
                                              boundary=getattr(reader, "boundary", "gpu"), pue=self.node.pue)
            if reader.kind == "none":
                self.book.measures = False  # first: the request path books at once from now
                self.book.error = getattr(reader, "reason", "no reader for this node")
                settled += self._tray_locked()
                settled += self.book.force_settle()
            else:
                self.book.error = None
        self._fire(settled)

    def failed(self, error: BaseException) -> None:
        """The reader could not be built: figures on this node are unknown or estimated."""
        reason = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
        with self._lock:
            self.failure = error
            self.book.measures = False  # first: the request path books at once from now
            self.book.error = f"reader unavailable: {reason}"
            settled = self._tray_locked()
            settled += self.book.force_settle()
            if self._note is not None:
                self._note(("f", reason))
        self._fire(settled)

    def ingest(self, reading: Reading) -> None:
        """Book one reading: the spans it closes are decided for the host (this process holds
        the card, or is alone on it) and taken, and what they settle fires."""
        table = self.table
        holding = table is not None and table.holding
        with self._lock:
            settled = self._tray_locked()  # windows opened before the reading: booked first
            tape = self.tape
            if tape is None or not self.book.measures:
                tape = None
            elif self._note is not None:
                self._note(("r", reading.t, reading.joules, reading.watts, reading.error))
            if tape is not None:
                settled += self._book_reading(tape, reading, table, holding)
        self._hand_over(settled)
        if tape is not None and table is not None and holding:
            self._decide(table)

    def _book_reading(self, tape: Tape, reading: Reading, table: CardTable | None,
                      holding: bool) -> list[Window]:
        """:meth:`ingest` under the lock: the reading's pieces, taken or left to decide."""
        settled: list[Window] = []
        if not reading.ok:  # first figures made from now until the next span say so
            self.book.note_trouble(f"the reader is failing: {reading.error or 'empty reading'}")
        pieces = tape.feed(reading)
        if table is None or not holding:
            for piece in pieces:
                settled += self.book.book(piece, reading.t)
        else:
            self._due.extend(pieces)
            table.count_reads(tape.reads, tape.errors, tape.resets, tape.last_good)
            table.note_baseline(tape.baseline())
        if settled and self._note is not None:
            self._noted(settled)
        return settled

    def _decide(self, table: CardTable, *, all_now: bool = False) -> None:
        """Holder: decide for the host, and publish, the pieces old enough (all of them
        where nobody else is at the table, or ``all_now``), with the others' windows as
        they stand (their files: read outside the lock)."""
        if not self._due:
            return
        table.look()
        with self._lock:
            settled = self._tray_locked()
            tape = self.tape
            now = self.clock()
            wait = DECIDE_AFTER_S if table.others and not all_now else 0.0
            while self._due and tape is not None and self._due[0].t1 <= now - wait:
                settled += self._publish(table, self._due.popleft(), now, tape.period)
            if settled and self._note is not None:
                self._noted(settled)
        self._hand_over(settled)

    def _publish(self, table: CardTable, piece: Span | Gap, now: float, period: float) -> list[Window]:
        """Holder: decide a piece for every process at the card's table, publish it, and
        take this process's own part (under the lock)."""
        if isinstance(piece, Gap):
            table.publish(piece, {}, period)
            return self.book.take(piece, now, 0.0)
        coverages = table.coverages(piece.t0, piece.t1)
        span = self.book.decide(piece, sum(coverages.values(), NOBODY))
        table.publish(span, coverages, period)
        return self.book.take(span, now, self.book.coverage(span.t0, span.t1).by(span.tails))

    def _hand_over(self, settled: list[Window]) -> None:
        """Windows the reader thread settled: their listeners (statistics, records, budgets,
        sinks) run between its reads, a chunk at a time (:meth:`deliver`), not all at once.
        A saturated loop's windows settled in one go cost the reader up to 0.9 s (4,837
        windows) in which it read nothing, so the next reading settled more, later still
        (benchmarks/overhead.py: 0.4 readings a period where the pace asks for ten). Fed
        by hand (tests, replay: no poller), at once."""
        if not settled:
            return
        if self._poller is None:
            self._fire(settled)
            return
        self._handing.extend(settled)

    def _fire(self, windows: list[Window]) -> None:
        """Run what waited on ``windows`` (just settled; called without the lock): tickets in
        one batch per ledger and listeners, plain callbacks one by one."""
        if windows:
            fire(windows, lock=self._lock)

    def deliver(self, budget_s: float) -> None:
        """Reader thread, between reads: hand settled figures to their listeners, chunks of
        :data:`HAND_OVER_CHUNK`, for ``budget_s`` seconds at most (every one if ``inf``)."""
        handing = self._handing
        deadline = time.perf_counter() + budget_s
        while handing:
            chunk: list[Window] = []
            with contextlib.suppress(IndexError):  # another thread drained it (stop)
                for _ in range(min(HAND_OVER_CHUNK, len(handing))):
                    chunk.append(handing.popleft())
            self._fire(chunk)
            if time.perf_counter() >= deadline:
                return

    def reads_card(self) -> bool:
        """The reader thread's question at each lap: read the card now? Yes where this
        process is alone on it, or holds it; otherwise take what its holder published,
        and take the card over if nobody holds it any more (its holder left or died)."""
        try:
            return self._turn_at_table()
        finally:
            self.looked = True

    def _turn_at_table(self) -> bool:
        if not self._joined:
            self._join()
        table = self.table
        if table is None:
            return True
        now = self.clock()
        if not table.holding:
            self._follow(table)
            if table.try_hold():
                self._resume(table)
                if table.others:
                    # "others": every process on the host metering this card, any server's
                    log.info("node %r: this process (pid %d) now reads the card for the other %s on this "
                             "host metering it", self.node.name, os.getpid(),
                             "process" if table.others == 1 else f"{table.others} processes")
                else:  # the first at the table: the others, if any, join later
                    log.info("node %r: this process (pid %d) reads the card", self.node.name, os.getpid())
        if table.holding:
            table.beat()
            self._decide(table)
        if now - self._books_t >= BOOKS_EVERY_S:
            self._books_t = now
            table.publish_books(self._seat_books())
        return table.holding

    def _resume(self, table: CardTable) -> None:
        """This process now holds the card: its tape goes on from the last holder's, so the
        time between the two is a span, not a gap (where the counter follows on)."""
        baseline = table.baseline()
        with self._lock:
            tape = self.tape
            if baseline is not None and tape is not None and tape.reads == 0:
                tape.resume(*baseline)
                if isinstance(self.reader, Continuing):  # a card this process runs a copy of
                    self.reader.resume(baseline[1], baseline[0])

    def card_state(self) -> tuple[str, str | None]:
        """How the card is read where another process reads it for this one: ``ok`` while
        its readings come, else ``failing`` and why (the reader thread's health)."""
        table = self.table
        if table is None:
            return "starting", None
        age = table.reading_age()
        bound = max(2.0, 20 * self._period())
        if age is None:
            return "starting", "the process that reads the card has not read it yet"
        if age > bound:
            return "failing", f"the process that reads the card has not read it well for {age:.1f} s"
        return "ok", None

    def _follow(self, table: CardTable) -> None:
        """Take this process's part of what the card's holder published, labelled with the
        idle floor each span was cut above where it is not this node's (:meth:`_floor_of`)."""
        pieces = table.pending()
        if not pieces:
            return
        for piece, _ in pieces:
            if isinstance(piece, CardSpan) and piece.cut_above_w is not None:
                self._floor_of(piece.cut_above_w)
        self.take(pieces)

    @property
    def _idle_w(self) -> float | None:
        """The idle floor this ledger's tape cuts spans above (the node's, or its simulated
        card's where the node gives none)."""
        return self.tape.idle_w if self.tape is not None else None

    def _floor_of(self, floor: float) -> None:
        """The card's reader cuts its spans above ``floor`` (W). A card has one floor, and its
        books one cut: where this node's ``idle_w`` is another, this process's figures are
        above the reader's floor and say so (``idle_watts``, ``error``), with the log's one
        line and the remedy. Cut again above each node's own, the card's books lost what the
        floors differ by (a conservation error on the follower's /energy); taken as cut and
        labelled with this node's floor, they were 1.5x its truth and said nothing (a hostile
        trial, 2026-12-08)."""
        idle_w = self._idle_w
        own = idle_w or 0.0
        differs = abs(floor - own) > FLOOR_TOLERANCE_W
        said = floor if differs else idle_w  # the floor the figures are to say they are above
        if self.book.provenance.idle_watts == said:
            return  # as already said (or nothing to say)
        with self._lock:
            self.book.provenance = replace(self.book.provenance, idle_watts=said)
            self.floor_caveat = (
                f"above an idle floor of {floor:g} W, the one the process reading this card (another "
                f"server's on this host) cuts its energy above; this node's idle_w is {own:g} W"
                if differs else None)
        if differs:
            log.warning("node %r: the process reading this card (another server's, on this host) cuts "
                        "its energy above an idle floor of %g W; this node's idle_w is %g W. A card has one "
                        "floor: this process's figures are above %g W and say so until every server on the "
                        "card gives the same idle_w (giul-asgi probe --idle 30 measures it)",
                        self.node.name, floor, own, floor)
        else:
            log.info("node %r: the card's reader cuts its energy above this node's idle floor again (%g W)",
                     self.node.name, own)

    def take(self, pieces: list[tuple[CardSpan | Gap, float]]) -> None:
        """Take this process's part (window-seconds) of pieces another process decided (the
        card's holder; replay, from a trace)."""
        with self._lock:
            settled = self._tray_locked()
            now = self.clock()
            for piece, mine in pieces:
                if self._note is not None:
                    self._note(("k", _piece_event(piece), mine))
                settled += self.book.take(piece, now, mine)
            if settled and self._note is not None:
                self._noted(settled)
        self._hand_over(settled)

    def _join(self) -> None:
        """Sit at the card's table (reader thread: it creates files): shared by every process
        of the host that meters the same card, by default; where nothing can be shared,
        this process's figures say so. First, start from what this server's earlier workers
        learnt of the node (:meth:`_recall`)."""
        self._joined = True
        reader = self.reader
        if self.clock is not time.monotonic or not self.book.measures:
            return  # a test's clock: nobody else's
        place = resolve(self.node.workers_dir)
        log_unshared(place)
        if place.path is not None:
            self._recall(place.path, reader)
        key = (card_key(self.node, reader, custom=self._custom, server=server_identity())
               if reader is not None else None)
        if key is None:
            return  # a card read by code that does not say which card: nobody else's
        if place.path is None:
            if not place.off:
                self.unshared = f"per process: {place.reason}; other processes on this card are not seen"
            return
        try:
            table = CardTable(place.path, key, self.node.name, ramp_s=self.node.ramp_s, clock=self.clock,
                              idle_w=self._idle_w)
        except OSError as exc:  # Unusable, or one the table did not foresee: per process, said
            self.unshared = f"per process: {exc}; other processes on this card are not seen"
            cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
            log.warning("node %r: the card cannot be shared with the host's other processes: %s. "
                        "Figures are this process's alone: %s", self.node.name, exc, remedy(cause))
            return
        with self._lock:
            # The seat first: a window the request path opens from now writes its own open;
            # those already in the tray or the book are adopted (the table skips the ones
            # the request path wrote or closed meanwhile).
            self.table = table
            settled = self._tray_locked()
            table.adopt([(window.seq, window.t_open) for window in self.book.open_windows()])
        self._fire(settled)

    def _recall(self, place: Path, reader: Reader | None) -> None:
        """Start from the prior this server's workers kept (gunicorn's recycled worker answered
        its first requests unknown while learning the node anew), and keep this one's."""
        node = self.node
        name = prior_name(node.name, node.idle_w, node.ramp_s, node.gpus, _reader_name(node, reader))
        try:
            kept = KeptPrior(place, server_identity(), name)
        except OSError as exc:
            log.debug("node %r: no place to keep its prior: %s", node.name, exc)
            return
        state = kept.load()
        with self._lock:
            prior = self.book.prior
            restored = state is not None and prior.restore(state)
            if restored and self._note is not None:
                self._note(("pr", state))  # replay starts from it too
            self._kept, self._kept_learnt = kept, prior.learnt
        if restored:
            log.info("node %r: starts from what this server's earlier workers learnt of the card "
                     "(%d windows)", node.name, self._kept_learnt)

    def _keep_prior(self) -> None:
        """Keep the node's prior for the server's next worker, where it learnt since (chore)."""
        kept = self._kept
        if kept is None:
            return
        with self._lock:
            prior = self.book.prior
            if prior.learnt == self._kept_learnt:
                return
            self._kept_learnt, state = prior.learnt, prior.state()
        kept.save(state)

    def _seat_books(self) -> SeatBooks:
        with self._lock:
            settled = self._tray_locked()
            book = self.book.totals()
            high = self._high
            seat = SeatBooks(book.received_j, high("charged", book.charged_j),
                             high("forfeit", book.forfeit_j), book.in_flight_j, book.estimated_j,
                             book.windows_open, book.idle_received_j,
                             high("idle_charged", book.idle_charged_j),
                             high("idle_forfeit", book.idle_forfeit_j), book.idle_in_flight_j)
        self._fire(settled)
        return seat

    def _high(self, name: str, value: float) -> float:
        """The highest ``value`` this book's counter ``name`` has shown (under the lock): a
        span measured below idle (a step stamp's error, carried into the next span) lowers a
        sum for a moment, and a counter that falls reads as a reset to Prometheus."""
        high = max(self._highs.get(name, value), value)
        self._highs[name] = high
        return high

    def _noted(self, settled: list[Window]) -> None:
        """Trace what the windows just settled with (under the lock), for replay's check."""
        note = self._note
        if note is not None:
            for window in settled:
                note(("z", id(window), window.share, window.fill_j))

    def next_step(self) -> tuple[float, float, float] | None:
        """When the card's counter should step next (the reader thread's pace): the tape's
        :meth:`~.tape.Tape.next_step`. Read without the lock: only the reader thread, which
        asks, feeds the tape."""
        tape = self.tape
        return tape.next_step() if tape is not None else None

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
            settled = self._tray_locked()
            self.book.note_processes(foreign)
            if self._note is not None:
                self._note(("p", foreign))
        self._fire(settled)

    def _chores(self) -> list[tuple[float, Callable[[], None]]]:
        """What the poller does beside reading the card: the load nobody here can see, the
        carbon intensity, the trace, the history of the books."""
        chores: list[tuple[float, Callable[[], None]]] = []
        if self.node.upstream is not None:
            phases = self.note_phases if self.weighs_phases else None
            chores.append((UPSTREAM_EVERY_S, Upstream(
                self.node.upstream, self.clock, self.note_upstream, self.deciding, phases,
                node=self.node.name, trouble=self._upstream_trouble, model=self.node.upstream_model)))
        if self._carbon_feed is not None:
            chores.append((self._carbon_feed.tick_s, self._carbon_tick))
        if self._trace is not None:
            chores.append((WRITE_EVERY_S, self._trace.write))
        chores.append((LOOK_EVERY_S, self.history.chore(self.host_totals)))
        chores.append((KEEP_EVERY_S, self._keep_prior))
        return chores

    def _upstream_trouble(self, why: str | None) -> None:
        """The upstream's metrics cannot be read, and why (None: they can): said in figures
        and in the node's books while it lasts."""
        self.upstream_error = why

    def deciding(self) -> bool:
        """Whether this process decides the card's spans (alone on it, or holding it)."""
        table = self.table
        return table is None or table.holding

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
        """The card's books (:meth:`totals`: what ``/energy`` and ``/metrics`` show)."""
        return self.totals()

    def own_load(self) -> tuple[float, int]:
        """This process's window-seconds integral on the node so far, and windows open."""
        with self._lock:
            settled = self._tray_locked()
            load = self.book.load_at(self.clock())
        self._fire(settled)
        return load

    def card_load(self) -> tuple[float, int]:
        """What loads a card that lives in the holder's process (the simulated one): every
        process's windows at the card's table where this one holds it (the others' time
        taken from their seats since the last call), else this process's own. So the
        workers of ``uvicorn --workers 4`` load one simulated card, as they would a GPU, and
        every worker's books are that card's (four cards before: each worker's books its
        own, jumping between answers)."""
        window_s, open_now = self.own_load()
        table = self.table
        if table is None or not table.holding:
            self._others_t = None
            return window_s + self._others_s, open_now
        now = self.clock()
        if self._others_t is not None and now > self._others_t:
            table.look()
            coverages = table.coverages(self._others_t, now).values()
            self._others_s += sum(c.open_s for c in coverages)
            open_now += sum(c.open_now for c in coverages)
        self._others_t = now
        return window_s + self._others_s, open_now

    def note_upstream(self, t: float, running: float, spread_s: float = 0.0, waiting: float = 0.0) -> None:
        """The upstream (the inference server) ran ``running`` requests at ``t`` (its count
        taken within ``t`` +- ``spread_s``: the scrape's own time), and held ``waiting`` more
        queued."""
        if not (spread_s > 0 and math.isfinite(spread_s)):  # a trace's or a caller's nonsense: none
            spread_s = 0.0
        if 2 * spread_s > SLOWEST_SCRAPE_S:  # when it counted is too vague (a hostile review)
            return
        if not (waiting > 0 and math.isfinite(waiting)):
            waiting = 0.0
        table = self.table
        others: Counted = (0, [])
        if table is not None and table.holding:
            table.look()  # the other workers' opens and closes since the last read (a hostile review)
            others = table.others_open_at(t, spread_s, COUNT_LAG_S)
        with self._lock:
            settled = self._tray_locked()
            self.book.note_upstream(t, running, others, spread_s, waiting)
            if self._note is not None:
                self._note(("up", t, running, spread_s, waiting))
        self._fire(settled)

    def note_phases(self, prompt_tokens: float | None, generation_tokens: float | None,
                    prefill_s: float | None, decode_s: float | None) -> None:
        """The upstream's token counters and its requests' summed prefill and decode
        seconds (cumulative): the phase split's seconds per token."""
        split = self.book.split
        if isinstance(split, PhaseSplit):
            with self._lock:
                split.note_engine(prompt_tokens, generation_tokens, prefill_s, decode_s)

    def _period(self) -> float:
        table = self.table
        if table is not None and not table.holding and table.period is not None:
            return table.period  # the card's, as its holder learnt it
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
                target=_target(node), load=self.card_load, shared=self._shared_pace,
                startup_says=lambda: self._startup_waits and explicit(node),
            )
            self._poller.start()

    def _windows_open(self) -> bool:
        """Whether windows are open on the node, or closed and not settled yet (the poller's
        busy pace: a closed window waits on the next steps to settle): this process's, and
        where it reads the card for others, theirs."""
        if self._tray or self._handing or self.own_load()[1] > 0 or self.book.unsettled:
            return True
        table = self.table
        return table is not None and table.holding and table.others_busy(self.clock(), self._period())

    def _shared_pace(self) -> bool:
        """Whether an idle reader should still read at the counter's period: it reads the
        card for other processes, whose new windows it learns of only by looking."""
        table = self.table
        return table is not None and table.holding and table.others > 0

    @property
    def health(self) -> Health | None:
        """How the node's reader is doing (None before the poller started)."""
        poller = self._poller
        return poller.health if poller is not None else None

    async def wait_ready(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the reader to be built and its first turn at the
        card's table (a worker that joins warm ones learns their rate before its first
        request: gunicorn's recycled worker on a loaded host answered it unknown). Raises the
        build's error when the operator asked for this reader by name; a slow driver is
        logged, not waited for."""
        if not self.book.measures and self.failure is None:
            return  # reader="none": nothing to wait for
        self._startup_waits = True  # a reader asked for by name that fails: its line is ours
        self.ensure_started()
        with anyio.move_on_after(timeout):
            while self._starting():
                await anyio.sleep(0.005)
        self._startup_waits = False  # a failure from now on is the reader's to say
        if self.failure is not None and explicit(self.node):
            if isinstance(self.failure, GiulError):  # its one line names the node
                raise self.failure.about(f"node {self.node.name!r}") from None
            raise ReaderUnavailable(
                f"node {self.node.name!r}: {type(self.failure).__name__}: {self.failure}"
            )
        if self.reader is None and self.failure is None:
            log.warning(
                "node %r: the reader is still starting after %.2g s (a slow or wedged driver?);"
                " serving, with figures unknown until it answers", self.node.name, timeout,
            )

    def _starting(self) -> bool:
        """Whether the reader thread is still on its way to its first reading's turn."""
        if self.failure is not None or self._poller is None:
            return False
        return self.reader is None or (self.book.measures and not self.looked and not self._stopped)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the poller (one last reading first, bounded) and settle every window."""
        self._stopped = True
        poller = self._poller
        if poller is not None and not poller.stop(timeout):
            log.warning("node %r: the reader did not stop in time; left behind", self.node.name)
        if self._carbon_feed is not None:
            self._carbon_feed.close()
        table = self.table
        if table is not None and table.holding:
            self._decide(table, all_now=True)  # what the last readings yielded, published
        with self._lock:
            settled = self._tray_locked()
            settled += self.book.force_settle()
            if self._note is not None:
                self._note(("s",))
                self._noted(settled)
        self._keep_prior()  # what this worker learnt, for the next one
        table = self.table
        if self._trace is not None:
            totals = self._own_totals()  # what replay books again from this process's trace
            self._trace.close({"measured_j": totals.measured_j, "charged_j": totals.charged_j,
                               "unattributed_j": totals.unattributed_j,
                               "in_flight_j": totals.in_flight_j,
                               # at a card's table the holder measures; a seat receives
                               "received_j": self.book.totals().received_j})
        if table is not None:  # the holder folds this process's books into the card's
            table.publish_books(self._seat_books())
            with self._lock:
                self.table = None
            table.close()
        self.deliver(math.inf)
        self._fire(settled)

    async def aclose(self, timeout: float | None = None) -> None:
        """:meth:`stop` without blocking the event loop."""
        await anyio.to_thread.run_sync(self.stop, timeout, abandon_on_cancel=True)

    # -- the books ------------------------------------------------------------------------
    def totals(self) -> LedgerTotals:
        """The card's books: where this process shares the card with others, the whole
        host's (every process's charges summed, the same from every process); else its own
        (``workers`` is then 1)."""
        mine = self._own_totals()
        table = self.table
        if table is None:
            return replace(mine, process=_PID[0])
        try:
            books = table.host(self._seat_books())
        except ValueError:  # the table closed under this call (the ledger is stopping)
            return mine
        return replace(
            mine, drawn_j=books.drawn_j, idle_unattributed_j=books.idle_unattributed_j,
            idle_charged_j=books.idle_charged_j, idle_in_flight_j=books.idle_in_flight_j,
            measured_j=books.measured_j, charged_j=books.charged_j,
            unattributed_j=books.unattributed_j, in_flight_j=books.in_flight_j, foreign_j=books.foreign_j,
            windows_open=books.windows_open, workers=books.workers, estimated_j=books.estimated_j,
            reads=books.reads, read_errors=books.read_errors, resets=books.resets,
            last_reading_age_s=books.age_s, period_s=table.period or mine.period_s,
        )

    def _own_totals(self) -> LedgerTotals:
        with self._lock:
            settled = self._tray_locked()
            book = self.book.totals()
            tape = self.tape
            poller = self._poller
            high = self._high
            totals = LedgerTotals(
                node=self.node.name, measured_j=high("measured", book.measured_j),
                charged_j=high("charged", book.charged_j),
                unattributed_j=high("unattributed", book.unattributed_j),
                foreign_j=high("foreign", book.foreign_j),
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
                drawn_j=high("drawn", book.drawn_j), idle_charged_j=high("idle_charged", book.idle_charged_j),
                idle_in_flight_j=book.idle_in_flight_j,
                idle_unattributed_j=high("idle_unattributed", book.idle_unattributed_j),
                upstream_error=self.upstream_error,
            )
        self._fire(settled)
        return totals


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


def _piece_event(piece: CardSpan | Gap) -> list[Any]:
    """A piece taken from the card's holder, for the trace (replay takes it again)."""
    if isinstance(piece, Gap):
        return ["g", piece.t0, piece.t1, piece.why, piece.fault]
    return ["s", *(getattr(piece, f) for f in CardSpan.__slots__)]


__all__ = ["Ledger", "LedgerTotals", "Split", "TimeSplit", "TokenSplit", "Window"]
