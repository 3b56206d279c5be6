"""One book's windows in time: those open, those closed and not settled yet, and their time in a span.

The book shares each span among its *members*: the windows that overlap it, else (where none
does) the ramp-down tails of windows closed within ``ramp_s`` before it. This is where the
windows are kept and those questions answered: who overlaps (t0, t1], for how long, how much
window-time this process has on the card at an instant (:meth:`Windows.load_at`, the
integral the in-process simulated card is loaded by), and its :class:`~giul_asgi.spans.Coverage`
of a span for whoever decides it for the host. No clock, no lock: the book's caller gives the
times and holds the lock.

The closing windows are kept in the order they closed, so that a reading looks only at the
few it concerns: those whose ramp-down it has just passed (:meth:`Windows.ended`), those
that closed inside a span. A busy node has thousands closing (every request of the last two
or three counter periods): scanning all of them at every read was most of the reader
thread's work per request.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterator
from operator import attrgetter

from ..spans import Counted, Coverage, counted
from .window import Window

Members = list[tuple[Window, float]]
_T_CLOSE = attrgetter("t_close")


class Windows:
    """The windows of one book: open (by id), closing (closed, not yet seen past their
    ramp-down; in the order of their close), and the window-seconds integral of how many
    were open."""

    __slots__ = ("_busy", "_closes", "_n", "_t", "closing", "last_close", "open", "ramp_s")

    def __init__(self, ramp_s: float) -> None:
        self.ramp_s = ramp_s
        self.open: dict[int, Window] = {}
        self.closing: list[Window] = []
        self.last_close = -math.inf
        self._closes: deque[float] = deque(maxlen=64)  # recent closes, for neighbours' tails
        self._n = 0
        self._busy = 0.0
        self._t: float | None = None

    @property
    def n(self) -> int:
        """Windows open now."""
        return self._n

    def _advance(self, t: float) -> float:
        if self._t is not None and t > self._t:
            self._busy += self._n * (t - self._t)
        self._t = t if self._t is None else max(self._t, t)
        return self._busy

    def enter(self, window: Window) -> Window:
        """A window made by the request path (its open time stamped) joins the open ones."""
        window.busy_open = self._advance(window.t_open)
        self._n += 1
        self.open[id(window)] = window
        return window

    def shut(self, window: Window, t: float) -> bool:
        """The window closes at ``t`` (it waits among the closing until it settles); False if
        it was not open here."""
        if window.t_close is not None or self.open.pop(id(window), None) is None:
            return False
        window.busy_close = busy = self._advance(t)
        self._n -= 1
        window.t_close = t_close = max(t, window.t_open)
        span = t_close - window.t_open
        window.concurrency = (busy - window.busy_open) / span if span > 0 else 1.0
        self.last_close = max(self.last_close, t_close)
        self._closes.append(t_close)
        closing = self.closing
        last = closing[-1].t_close if closing else None
        if last is not None and last > t_close:  # another thread's close, booked late
            insort(closing, window, key=_T_CLOSE)
        else:
            closing.append(window)
        return True

    def _closed_after(self, t: float) -> int:
        """Where the closing windows that closed after ``t`` begin."""
        return bisect_right(self.closing, t, key=_T_CLOSE)

    def overlapping(self, t0: float, t1: float) -> Members:
        """Windows with time in (t0, t1], and how much."""
        return list(self._overlapping(t0, t1))

    def _overlapping(self, t0: float, t1: float) -> Iterator[tuple[Window, float]]:
        for window in self.open.values():
            overlap = t1 - max(window.t_open, t0)
            if overlap > 0:
                yield window, overlap
        closing = self.closing
        for i in range(self._closed_after(t0), len(closing)):  # one closed by t0 has none
            window = closing[i]
            t_close = window.t_close
            assert t_close is not None
            if window.settled:
                continue
            overlap = min(t_close, t1) - max(window.t_open, t0)
            if overlap > 0:
                yield window, overlap

    def tails(self, t0: float, t1: float) -> Members:
        """Closed windows whose ramp-down tail (``ramp_s`` after close) reaches into (t0, t1]."""
        return list(self._tails(t0, t1))

    def _tails(self, t0: float, t1: float) -> Iterator[tuple[Window, float]]:
        closing = self.closing
        # A tail that ends by t0 has nothing in the span (a nanosecond's margin for rounding).
        for i in range(self._closed_after(t0 - self.ramp_s - 1e-9), len(closing)):
            window = closing[i]
            t_close = window.t_close
            assert t_close is not None
            if t_close >= t1:
                break  # every later one closed after the span
            if window.settled:
                continue
            tail = min(t_close + self.ramp_s, t1) - max(t_close, t0)
            if tail > 0:
                yield window, tail

    def ended(self, t: float) -> list[Window]:
        """The closing windows whose ramp-down ended by ``t`` (those a reading at ``t`` has
        seen the end of): the first ones, in the order they closed."""
        closing = self.closing
        n = 0
        ramp_s = self.ramp_s
        for window in closing:
            t_close = window.t_close
            assert t_close is not None
            if t < t_close + ramp_s:
                break
            n += 1
        return closing[:n]

    def members(self, t0: float, t1: float) -> tuple[Members, bool]:
        """The span's members: the windows overlapping it, else the closed windows' tails
        (and whether they are tails)."""
        members = self.overlapping(t0, t1)
        if members:
            return members, False
        tails = self.tails(t0, t1)
        return tails, bool(tails)

    def coverage(self, t0: float, t1: float) -> Coverage:
        """These windows' time in (t0, t1] (what a decider adds up for the host), and when
        they were busy in it. Summed as found: a list of a busy span's members (thousands)
        alive at once was most of the reader's collections (benchmarks/ledger_path.py, see
        the commit)."""
        covered, n = 0.0, 0
        busy = []
        for window, overlap in self._overlapping(t0, t1):
            covered += overlap
            n += 1
            start = max(window.t_open, t0)
            busy.append((start, start + overlap))
        tails, n_tails = (0.0, 0) if n else _summed(self._tails(t0, t1))
        last = max((c for c in self._closes if c <= t0), default=-math.inf)
        return Coverage(covered, n, tails, n_tails, last, self._n, tuple(busy))

    def unsettled(self) -> list[Window]:
        """Every window not settled yet: open, or closed and waiting on the card."""
        return [*self.open.values(), *(w for w in self.closing if not w.settled)]

    def drop_settled(self) -> None:
        """Forget the settled windows. A window settles once its end was seen, and ends are
        seen in the order of the closes: only the first ones need looking at."""
        closing = self.closing
        n = 0
        for window in closing:
            if not (window.seen_end or window.settled):
                break
            n += 1
        if n:
            closing[:n] = [w for w in closing[:n] if not w.settled]

    def load_at(self, t: float) -> tuple[float, int]:
        """The window-seconds integral until ``t``, and the windows open now."""
        since = t - self._t if self._t is not None and t > self._t else 0.0
        return self._busy + self._n * since, self._n

    def ours_at(self, t: float, spread_s: float = 0.0, lag_s: float = 0.0) -> Counted:
        """These windows in an upstream's count taken at ``t`` (:func:`~giul_asgi.spans.counted`)."""
        return counted(((w.t_open, math.inf if w.t_close is None else w.t_close)
                        for w in (*self.open.values(), *self.closing)), t, spread_s, lag_s)


def _summed(members: Iterator[tuple[Window, float]]) -> tuple[float, int]:
    """The members' time and their number."""
    total, n = 0.0, 0
    for _, overlap in members:
        total += overlap
        n += 1
    return total, n


__all__ = ["Members", "Windows"]
