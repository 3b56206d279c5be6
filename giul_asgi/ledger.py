"""One ledger per node: it owns the reader and shares the card's energy among windows.

The seed's ruler gave every window the card's whole energy, so N overlapping requests were
charged N times. Here one background task reads the node at the reader's natural period;
between two readings, the energy above idle is divided among the windows open in that
interval, by their time in it (or by a weight such as tokens per second). An interval with no
window open is ``unattributed``. Over any period::

    charged + unattributed == measured above idle        (to float rounding)

where a window whose share cannot stand as a measurement (<= 0 J, or a gap inside it)
returns its share to ``unattributed`` instead of being charged.

Opening, marking and closing a window only record a time under a lock: no I/O, no task,
no thread per request. A window that closes between readings gets a provisional share from
the latest above-idle power and its concurrency (``settled=False``); the next reading
settles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread

from .config import Node
from .energy import Energy, Figure, Provenance, grade_figure, grade_positional
from .readers import NullReader, Reader, Reading, make_reader

log = logging.getLogger("giul_asgi.ledger")

#: A counter that has not moved for this many periods is taken at its word (zero energy).
MAX_STALE_PERIODS = 5
#: Readings may fail this long (in periods, at least one second) before the gap is lost.
MAX_GAP_PERIODS = 10
_NOT_YET = "not settled: the card has not reported this window's energy yet"
#: How many recent readings each ledger keeps for inspection.
RING_SIZE = 512


class Split(Protocol):
    """How an interval's energy is divided among the windows open in it."""

    name: str

    def weight(self, window: Window) -> float | None:
        """The window's weight per second of overlap, known at close; None when unknown."""
        ...


class TimeSplit:
    """Each window's share is proportional to its time in the interval."""

    name = "time"

    def weight(self, window: Window) -> float | None:
        return 1.0


class TokenSplit:
    """Shares proportional to time x tokens per second: equal energy per token generated."""

    name = "tokens"

    def weight(self, window: Window) -> float | None:
        if window.tokens is None or window.tokens <= 0 or window.t_close is None:
            return None
        return window.tokens / max(window.t_close - window.t_open, 1e-9)


class Window:
    """One request's time on a node, and what the ledger has charged to it so far.

    A plain class whose defaults live on the class, not a dataclass: one is built per
    request, and its constructor sets only the four fields every window has. Lists are
    created only when a request uses them (marks, intervals awaiting weights).
    """

    t_close: float | None = None
    busy_close = 0.0
    tokens: int | None = None
    marks: list[tuple[str, float]] | None = None
    #: Per named stage, then the tail after the last mark; None until the first mark.
    stage_shares: list[float] | None = None
    provisional_stages: list[float] | None = None
    share = 0.0
    edge = 0.0
    power_j = 0.0
    measured_s = 0.0
    lost_s = 0.0
    provisional: float | None = 0.0
    pending: list[_Interval] | None = None
    seen_end = False
    settled = False
    alone = True
    rules: str | None = None  # the split rules used when shared: "time", "tokens"
    error: str | None = None
    abandoned = False
    event: Any = None

    def __init__(
        self, t_open: float, busy_open: float, runner: object | None, weight: float | None = 1.0
    ) -> None:
        self.t_open = t_open
        self.busy_open = busy_open
        self.runner = runner
        self.weight = weight

    @property
    def seconds(self) -> float:
        return (self.t_close if self.t_close is not None else self.t_open) - self.t_open

    @property
    def concurrency(self) -> float | None:
        if self.t_close is None:
            return None
        span = self.t_close - self.t_open
        if span <= 0:
            return 1.0
        return (self.busy_close - self.busy_open) / span


@dataclass(eq=False, slots=True)
class _Interval:
    t0: float
    t1: float
    above: float
    power: float
    members: list[tuple[Window, float]]
    waiting: int = 0
    done: bool = False


@dataclass(frozen=True, slots=True)
class LedgerTotals:
    """The books of one node since its ledger was built."""

    measured_j: float
    charged_j: float
    unattributed_j: float
    in_flight_j: float
    lost_s: float
    reads: int
    read_errors: int
    resets: int
    read_seconds_max: float
    windows_open: int

    @property
    def conservation_error_j(self) -> float:
        return self.measured_j - (self.charged_j + self.unattributed_j + self.in_flight_j)


class StepPhase:
    """Where a stepped counter's steps fall, learnt from the reads that saw them change.

    Each change is seen between two reads, so a step lies in (a, b]. Steps come at a steady
    period, so the brackets of many steps, folded onto one, narrow down the phase; reads
    at jittered times make them narrow fast. When the brackets stop agreeing (the card's
    period drifts from the nominal one) the estimate starts again from the newest bracket.
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self._ref: float | None = None
        self._lo = 0.0
        self._hi = 0.0

    def step_time(self, a: float, b: float) -> float:
        """The latest step in (a, b]: where a read at ``b`` saw the counter had moved since
        the read at ``a``. A bracket narrower than a period pins one step and teaches the
        phase; a wider one (reads delayed under load) is placed by the phase learnt."""
        if b <= a:
            return b
        if b - a <= self.period:
            self._learn(a, b)
        if self._ref is None:
            return (a + b) / 2.0
        mid = (self._lo + self._hi) / 2.0
        step = mid + math.floor((b - mid) / self.period) * self.period
        return step if a < step <= b else (a + b) / 2.0

    def last_step(self, t: float, after: float) -> float:
        """The latest step at or before ``t`` (and after ``after``), if the phase is known;
        else ``t``. A baseline read reflects the counter as of its last step, not its read."""
        if self._ref is None:
            return t
        mid = (self._lo + self._hi) / 2.0
        step = mid + math.floor((t - mid) / self.period) * self.period
        return step if after < step <= t else t

    def _learn(self, a: float, b: float) -> None:
        if self._ref is None:
            self._ref, self._lo, self._hi = a, a, b
            return
        k = round(((a + b) / 2.0 - (self._lo + self._hi) / 2.0) / self.period)
        shift = k * self.period
        lo, hi = max(self._lo, a - shift), min(self._hi, b - shift)
        if lo >= hi:
            self._lo, self._hi = a, b  # the brackets disagree (the period drifts): start again
        else:
            self._lo, self._hi = lo, hi


class Ledger:
    """The single owner of a node's reader; windows borrow it and never read the card."""

    def __init__(
        self,
        node: Node,
        reader: Reader | None = None,
        *,
        split: Split | None = None,
        read_timeout: float = 1.0,
        max_pending: int = 10_000,
    ) -> None:
        self.node = node
        self.reader: Reader = reader if reader is not None else make_reader(node)
        self.split: Split = split or (TokenSplit() if node.split == "tokens" else TimeSplit())
        self.clock = self.reader.clock
        self.idle_w = node.idle_w
        self.provenance = Provenance(
            method=self.reader.method, backend=self.reader.backend,
            source=self.reader.source, idle_watts=node.idle_w,
        )
        period = node.period_s or self.reader.period
        # Poll a stepped counter at twice its step rate, so a step is seen within half a step.
        self.poll_s = period / 2 if self.reader.kind == "counter" else period
        self.read_timeout = read_timeout
        self.max_gap_s = max(MAX_GAP_PERIODS * period, 1.0)
        self.max_stale_s = MAX_STALE_PERIODS * period
        self._phase = StepPhase(period)
        self.max_pending = max_pending
        # Weights other than time are known only at close; until then a window waits.
        self._open_weight: float | None = 1.0 if self.split.name == "time" else None
        self.measures = self.reader.kind != "none"
        self.readings: deque[Reading] = deque(maxlen=RING_SIZE)

        self._lock = threading.Lock()
        self._open: dict[int, Window] = {}
        self._closed: list[Window] = []
        self._pending: deque[_Interval] = deque()
        self._n = 0
        self._busy = 0.0
        self._t_evt = self.clock()
        self._base: Reading | None = None
        self._t_last: float | None = None
        self._busy_last = 0.0
        self._t_prev_read = float("-inf")
        self._above_w: float | None = None
        self._last_error: str | None = None

        self.measured_j = 0.0
        self.charged_j = 0.0
        self.unattributed_j = 0.0
        self.lost_s = 0.0
        self.reads = 0
        self.read_errors = 0
        self.resets = 0
        self.read_seconds_max = 0.0

        self._runner: object | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._thread: int | None = None
        self._alive: Callable[[], bool] = _always
        self._cancel: anyio.CancelScope | None = None

    # -- windows: O(1), no I/O ----------------------------------------------------------
    def _busy_at(self, t: float) -> float:
        return self._busy + self._n * (t - self._t_evt)

    def open(self) -> Window:
        with self._lock:
            now = self.clock()
            # busy: the integral of windows open over time, so far (``_busy_at``, inlined).
            busy = self._busy = self._busy + self._n * (now - self._t_evt)
            self._t_evt = now
            self._n += 1
            window = Window(now, busy, self._runner, self._open_weight)
            self._open[id(window)] = window
        return window

    def mark(self, window: Window, name: str) -> None:
        with self._lock:
            if window.t_close is None:
                if window.marks is None or window.stage_shares is None:
                    # Everything booked so far lies before this mark: it is the first stage.
                    window.marks = []
                    window.stage_shares = [window.share]
                window.marks.append((name, self.clock()))
                window.stage_shares.append(0.0)

    def close(self, window: Window, tokens: int | None = None) -> None:
        settled: list[Window] = []
        with self._lock:
            if window.t_close is not None or self._open.pop(id(window), None) is None:
                return
            now = self.clock()
            busy = self._busy = self._busy + self._n * (now - self._t_evt)
            self._t_evt = now
            self._n -= 1
            window.t_close = now
            window.busy_close = busy
            window.tokens = tokens
            if self._open_weight is None:
                window.weight = self.split.weight(window)
            window.provisional = self._provisional(window)
            if self.measures:
                self._closed.append(window)
                if window.pending:
                    for interval in window.pending:
                        interval.waiting -= 1
                    settled = self._resolve_ready(window.pending)
            else:
                window.error = getattr(self.reader, "reason", "no reader for this node")
                window.seen_end = True
                self._try_settle(window, settled)
        if settled:
            self._fire(settled)

    def abandon(self, window: Window) -> None:
        """Close a window whose figure nobody will read (a re-bound request)."""
        window.abandoned = True
        self.close(window)

    def _provisional(self, window: Window) -> float | None:
        assert window.t_close is not None
        if self._t_last is None:
            start = window.t_open
            busy_start = window.busy_open
        else:
            start = max(window.t_open, self._t_last)
            busy_start = window.busy_open if start == window.t_open else self._busy_last
        span = window.t_close - start
        if span <= 0:
            return 0.0
        if self._above_w is None:
            return None
        mean_n = (window.busy_close - busy_start) / span
        value = self._above_w * span / (mean_n if mean_n > 1.0 else 1.0)
        if window.marks is not None:
            window.provisional_stages = [0.0] * (len(window.marks) + 1)
            self._spread(window, start, window.t_close, value, window.provisional_stages)
        return value

    # -- readings ------------------------------------------------------------------------
    def read_now(self) -> Reading:
        """Read the card here and now (blocking) and book the interval. For sync meters."""
        reading = self.reader.read()
        self.ingest(reading)
        return reading

    def ingest(self, reading: Reading) -> None:
        """Book one reading: close the interval since the last one and share its energy."""
        settled: list[Window] = []
        with self._lock:
            self.reads += 1
            self.readings.append(reading)
            settled = self._ingest(reading)
        self._fire(settled)

    def _ingest(self, reading: Reading) -> list[Window]:
        t = reading.t
        if not reading.ok:
            self.read_errors += 1
            self._last_error = reading.error or "empty reading"
            if self._t_last is not None and t - self._t_last > self.max_gap_s:
                return self._book_lost(t, f"reader failed: {self._last_error}")
            if self._t_last is None:
                self._t_last, self._busy_last = t, self._busy_at(t)
            return []
        base = self._base
        if base is None or self._t_last is None:
            # First good reading, or the first after a lost gap: a baseline, no energy yet.
            out = self._book_lost(t, "no baseline reading yet") if self._t_last is not None else []
            self._base = reading
            self._t_prev_read = t
            if reading.joules is not None and self._t_last is not None:
                t = self._phase.last_step(t, self._t_last)
            self._t_last, self._busy_last = t, self._busy_at(t)
            return out
        t_prev, self._t_prev_read = self._t_prev_read, t
        if reading.joules is not None and base.joules is not None:
            delta = reading.joules - base.joules
            if delta < 0:
                self.resets += 1
                out = self._book_lost(t, "energy counter went down (driver reset)")
                self._base = reading
                return out
            if delta == 0 and t - self._t_last < self.max_stale_s:
                return []  # the counter has not stepped: no new information yet
            if delta > 0:
                # The counter stepped after the previous read: stamp the interval's end
                # where the learnt phase puts that step, not at read time.
                t = max(self._phase.step_time(max(t_prev, self._t_last), t), self._t_last + 1e-9)
            dt = t - self._t_last
        elif reading.watts is not None and base.watts is not None:
            dt = t - self._t_last
            delta = (reading.watts + base.watts) / 2.0 * dt
        else:
            out = self._book_lost(t, "reader changed kind mid-run")
            self._base = reading
            return out
        if dt <= 0:
            return []
        above = delta - (self.idle_w or 0.0) * dt
        self.measured_j += above
        self._above_w = above / dt
        members, ended = self._members(t)
        self._base = reading
        self._t_last, self._busy_last = t, self._busy_at(t)
        if not members:
            self.unattributed_j += above
            return self._settle_ended(ended)
        interval = _Interval(self._t_last - dt, t, above, delta / dt, members)
        if self.split.name != "time":
            interval.waiting = sum(1 for window, _ in members if window.t_close is None)
        if interval.waiting:
            # Split by weights known only at close: the interval waits for its open windows.
            for window, _ in members:
                if window.pending is None:
                    window.pending = [interval]
                else:
                    window.pending.append(interval)
            self._pending.append(interval)
            out = self._resolve_ready([])
            while len(self._pending) > self.max_pending:
                out += self._resolve(self._pending.popleft())
        else:
            out = self._resolve(interval)
        return out + self._settle_ended(ended)

    def _members(self, t: float) -> tuple[list[tuple[Window, float]], list[Window]]:
        """Windows overlapping (t_last, t], and the closed windows this reading sees past."""
        # Runs over every window in flight at every reading: the loops are written out.
        t0 = self._t_last
        assert t0 is not None
        members: list[tuple[Window, float]] = []
        ended: list[Window] = []
        for window in self._open.values():
            t_open = window.t_open
            overlap = t - (t_open if t_open > t0 else t0)
            if overlap > 0:
                members.append((window, overlap))
        if self._closed:
            still: list[Window] = []
            for window in self._closed:
                t_open, t_close = window.t_open, window.t_close
                assert t_close is not None
                overlap = (t_close if t_close < t else t) - (t_open if t_open > t0 else t0)
                if overlap > 0:
                    members.append((window, overlap))
                if t_close <= t:
                    window.seen_end = True
                    ended.append(window)
                else:
                    still.append(window)
            self._closed = still
        return members, ended

    def _settle_ended(self, ended: list[Window]) -> list[Window]:
        out: list[Window] = []
        for window in ended:
            self._try_settle(window, out)
        return out

    def _book_lost(self, t: float, why: str) -> list[Window]:
        """An interval whose energy is unknown: its windows cannot be measured."""
        assert self._t_last is not None
        self.lost_s += t - self._t_last
        members, ended = self._members(t)
        for window, overlap in members:
            window.lost_s += overlap
            window.error = why
        settled = self._settle_ended(ended)
        self._base = None
        self._t_last, self._busy_last = t, self._busy_at(t)
        return settled

    def _resolve_ready(self, intervals: list[_Interval]) -> list[Window]:
        out: list[Window] = []
        for interval in list(intervals):
            if not interval.done and interval.waiting <= 0:
                out += self._resolve(interval)
        while self._pending and self._pending[0].done:
            self._pending.popleft()
        return out

    def _resolve(self, interval: _Interval) -> list[Window]:
        if interval.done:
            return []
        interval.done = True
        members = interval.members
        rule = self.split.name
        # Every window of a time split weighs 1.0 (``_open_weight``): no list of weights.
        weights: list[float] | None = None
        if rule != "time":
            weights = [w.weight for w, _ in members if w.weight is not None and w.weight > 0]
            if len(weights) != len(members):  # a weight is unknown: split this one by time
                weights, rule = None, "time"
        total = 0.0
        if weights is None:
            for _, o in members:
                total += o
        else:
            for wt, (_, o) in zip(weights, members, strict=True):
                total += wt * o
        above, power, t0 = interval.above, interval.power, interval.t0
        edge = (interval.t1 - t0) * (1 - 1e-9)
        shared = len(members) > 1
        settled: list[Window] = []
        for i, (window, overlap) in enumerate(members):
            share = above * (
                (overlap if weights is None else weights[i] * overlap) / total
            )
            window.share += share
            window.power_j += power * overlap
            window.measured_s += overlap
            if overlap < edge:
                window.edge += abs(share)
            if shared:
                window.alone = False
                rules = window.rules
                if rules is None:
                    window.rules = rule
                elif rule not in rules:
                    window.rules = "+".join(sorted({*rules.split("+"), rule}))
            if window.stage_shares is not None:
                start = max(window.t_open, t0)
                self._spread(window, start, start + overlap, share, window.stage_shares)
            pending = window.pending
            if pending and interval in pending:  # only intervals that waited are listed
                pending.remove(interval)
            self._try_settle(window, settled)
        return settled

    @staticmethod
    def _spread(window: Window, a: float, b: float, value: float, into: list[float]) -> None:
        """Share ``value`` over [a, b] among the window's stages and its tail, by time."""
        if b <= a or window.marks is None:
            return
        prev = window.t_open
        for i, (_, t_mark) in enumerate(window.marks):
            overlap = min(b, t_mark) - max(a, prev)
            if overlap > 0:
                into[i] += value * overlap / (b - a)
            prev = t_mark
        overlap = b - max(a, prev)
        if overlap > 0:
            into[-1] += value * overlap / (b - a)

    def _try_settle(self, window: Window, into: list[Window]) -> None:
        """Settle ``window`` (adding it to ``into``) if nothing can change its share now."""
        if window.settled or window.t_close is None or not window.seen_end or window.pending:
            return
        window.settled = True
        if window.abandoned or window.lost_s > 0 or window.share <= 0 or not self.measures:
            self.unattributed_j += window.share
        else:
            self.charged_j += window.share
        into.append(window)

    def _fire(self, windows: list[Window]) -> None:
        for window in windows:
            if window.event is not None:  # someone awaits it: Meter.settled()
                window.event.set()

    def force_settle(self) -> None:
        """Settle every closed window now (shutdown): pending intervals split by time, and
        any tail after the last reading booked as lost, since no reading will cover it."""
        settled: list[Window] = []
        with self._lock:
            while self._pending:
                settled += self._resolve(self._pending.popleft())
            for window in self._closed:
                assert window.t_close is not None
                window.seen_end = True
                start = window.t_open if self._t_last is None else max(window.t_open, self._t_last)
                if window.t_close > start:
                    window.lost_s += window.t_close - start
                    window.error = "closed after the ledger's last reading (ledger stopped)"
                self._try_settle(window, settled)
            self._closed = []
        self._fire(settled)

    # -- results --------------------------------------------------------------------------
    def energy(self, window: Window, **options: Any) -> Energy:
        """The window's record now: settled, or provisional with ``settled=False``.
        ``options`` are :meth:`figure`'s keywords (tier, route, tokens, token_kind, hint)."""
        return Energy.from_figure(self.figure(window, **options))

    def figure(
        self,
        window: Window,
        tier: str | None = None,
        route: str | None = None,
        tokens: int | None = None,
        token_kind: str = "output",
        hint_per_1k: float = 0.0,
    ) -> Figure:
        """:meth:`energy` as a :class:`Figure`, for the request path (cheaper to build)."""
        with self._lock:
            share, uncertainty, settled, error = self._share(window)
            marks = window.marks
            stage_values = window.stage_shares
            if (
                marks is not None and share is not None and not settled
                and stage_values is not None and window.provisional_stages is not None
            ):
                stage_values = [
                    a + b for a, b in zip(stage_values, window.provisional_stages, strict=True)
                ]
            measured_s = window.measured_s
            mean_w = window.power_j / measured_s if measured_s > 0 else None
            split = window.rules or "exclusive"
        stages: dict[str, Figure] | None = None
        if marks is not None and stage_values is not None:
            stages = {}
            prev = window.t_open
            for (name, t_mark), value in zip(marks, stage_values, strict=False):
                stages[name] = grade_figure(
                    value if share is not None else None, provenance=self.provenance,
                    seconds=t_mark - prev, node=self.node.name, tier=tier, route=route,
                    settled=settled, split=split,
                )
                prev = t_mark
        return grade_positional(
            share, self.provenance, window.seconds, self.node.name, tier, route, tokens,
            token_kind, hint_per_1k, mean_w, window.concurrency, split,
            uncertainty if share is not None else None, settled, stages, None, error,
        )

    def share_now(self, window: Window) -> float | None:
        """The window's joules above idle as :meth:`figure` would grade them; None if unknown."""
        with self._lock:
            return self._share(window)[0]

    def _share(self, window: Window) -> tuple[float | None, float, bool, str | None]:
        """(joules above idle or None, uncertainty, settled, error) for the window now."""
        if not self.measures or window.lost_s > 0:
            return None, window.edge, window.settled, window.error
        if window.settled:
            return window.share, window.edge, True, window.error
        provisional = window.provisional
        if provisional is None or window.t_close is None or window.share + provisional <= 0:
            # The card has not reported the window's load yet: unknown for now, not "failed".
            return None, window.edge, False, window.error or _NOT_YET
        return window.share + provisional, window.edge + provisional, False, window.error

    async def wait_settled(self, window: Window, timeout: float | None = None) -> bool:
        """Wait until the next reading settles the window; False if ``timeout`` ran out."""
        if window.settled:
            return True
        if window.event is None:
            window.event = anyio.Event()
        with anyio.move_on_after(timeout):
            await window.event.wait()
        return window.settled

    def totals(self) -> LedgerTotals:
        """The books. ``in_flight_j`` is energy shared to windows not yet settled, plus
        intervals still waiting for their windows' weights."""
        with self._lock:
            unsettled: dict[int, Window] = {id(w): w for w in self._open.values()}
            for window in self._closed:
                unsettled[id(window)] = window
            waiting = 0.0
            for interval in self._pending:
                if interval.done:
                    continue
                waiting += interval.above
                for window, _ in interval.members:
                    if not window.settled:
                        unsettled[id(window)] = window
            in_flight = waiting + sum(w.share for w in unsettled.values() if not w.settled)
            return LedgerTotals(
                measured_j=self.measured_j, charged_j=self.charged_j,
                unattributed_j=self.unattributed_j, in_flight_j=in_flight, lost_s=self.lost_s,
                reads=self.reads, read_errors=self.read_errors, resets=self.resets,
                read_seconds_max=self.read_seconds_max, windows_open=len(self._open),
            )

    # -- lifecycle: one reader task per node, per event loop ------------------------------
    def ensure_started(self) -> None:
        """Start the reader task on the running event loop if it is not running there."""
        if not self.measures:
            return
        if self._running and self._thread == threading.get_ident() and self._alive():
            # Every request asks: this answers without asking for the running loop, which
            # costs a getpid() system call on CPython 3.11.
            return
        key = _loop_key()
        if key is None or (key is self._runner and self._running):
            return
        self._start(key)

    def _start(self, key: object) -> None:
        if self._runner is not None and self._runner is not key:
            # The previous loop is gone: its windows will never close. Forget them, and
            # start the books afresh from a new baseline.
            with self._lock:
                for window in [w for w in self._open.values() if w.runner is not key]:
                    window.abandoned = window.settled = True
                    del self._open[id(window)]
                    self._n -= 1
                    self.unattributed_j += window.share
                self._base = None
        self._runner = key
        self._running = True
        self._thread = threading.get_ident()
        # The loop of this thread still running the reader; a trio run cancels its system
        # tasks when it ends, which clears _running, so trio needs no check of its own.
        self._alive = key.is_running if isinstance(key, asyncio.AbstractEventLoop) else _always
        for window in self._open.values():
            window.runner = key
        self.ingest(self.reader.read())
        if isinstance(key, asyncio.AbstractEventLoop):
            self._task = key.create_task(self._run(), name=f"giul-ledger-{self.node.name}")
        else:
            import trio

            trio.lowlevel.spawn_system_task(self._run, name=f"giul-ledger-{self.node.name}")

    async def _run(self) -> None:
        limiter = anyio.CapacityLimiter(1)
        jitter = random.Random(id(self))
        try:
            with anyio.CancelScope() as scope:
                self._cancel = scope
                while True:
                    # Jittered reads let the step phase be learnt to well under a period.
                    await anyio.sleep(self.poll_s * jitter.uniform(0.6, 1.4))
                    self.ingest(await self._read(limiter))
        except Exception:  # never crash the app's loop: stop metering, say why
            log.exception("ledger for node %r stopped", self.node.name)
        finally:
            self._running = False
            self._cancel = None

    async def _read(self, limiter: anyio.CapacityLimiter) -> Reading:
        if not self.reader.blocking:
            return self.reader.read()
        started = self.clock()
        with anyio.move_on_after(self.read_timeout):
            reading = await anyio.to_thread.run_sync(
                self.reader.read, abandon_on_cancel=True, limiter=limiter
            )
            self.read_seconds_max = max(self.read_seconds_max, self.clock() - started)
            return reading
        self.read_seconds_max = max(self.read_seconds_max, self.clock() - started)
        return Reading(t=self.clock(), error=f"read timed out after {self.read_timeout} s")

    async def aclose(self) -> None:
        """Stop the reader task, book a last reading and settle every closed window."""
        if self._cancel is not None:
            self._cancel.cancel()
        if self._task is not None and not self._task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        self._running = False
        if self.measures:
            if self.reader.blocking:
                with anyio.move_on_after(self.read_timeout):
                    self.ingest(await anyio.to_thread.run_sync(self.reader.read))
            else:
                self.ingest(self.reader.read())
        self.force_settle()

    def close_reader(self) -> None:
        self.reader.close()


def _always() -> bool:
    return True


def _loop_key() -> object | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    try:
        import trio

        return trio.lowlevel.current_root_task()
    except (ImportError, RuntimeError):
        return None


class Ledgers:
    """Ledgers by node name: the one place a node's reader is owned.

    A process keeps one (``default_ledgers()``) so that the middleware and any
    ``Meter.for_node`` in a handler share a node's ledger instead of each reading the card
    and each charging the whole of its energy.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def get(self, node: Node) -> Ledger:
        ledger = self._by_name.get(node.name)
        if ledger is not None and (ledger.node is node or _same(ledger.node, node)):
            return ledger
        with self._lock:
            ledger = self._by_name.get(node.name)
            if ledger is None:
                ledger = Ledger(node)
                self._by_name[node.name] = ledger
            elif not _same(ledger.node, node):
                from .errors import ConfigError

                raise ConfigError(
                    f"two different nodes are both named {node.name!r}",
                    remedy="give each node its own name, or reuse the same Node object",
                )
            return ledger

    def __iter__(self) -> Any:
        return iter(list(self._by_name.values()))

    async def aclose(self) -> None:
        for ledger in list(self._by_name.values()):
            await ledger.aclose()

    def close(self) -> None:
        for ledger in list(self._by_name.values()):
            ledger.close_reader()
        self._by_name.clear()


def _same(a: Node, b: Node) -> bool:
    return a == b and a.reader_factory is b.reader_factory


_default = Ledgers()


def default_ledgers() -> Ledgers:
    """The process's ledgers: one per node name, shared by every meter and middleware."""
    return _default


__all__ = [
    "Ledger",
    "LedgerTotals",
    "Ledgers",
    "NullReader",
    "Split",
    "TimeSplit",
    "TokenSplit",
    "Window",
    "default_ledgers",
]
