"""Spans in, shares out: how one node's energy is divided among the windows that used it.

Each :class:`~giul_asgi.ledger.tape.Span` of energy above idle is divided among the windows
open in it, in proportion to their time in it (or by a :class:`Split`'s weight, such as
tokens per second). A span with no window open is ``unattributed``. Over any period::

    charged + unattributed == measured above idle        (to float rounding)

One model makes both figures a window gets. Its **settled** share is the sum of its parts
of the spans it overlapped. Its **first** share, at close, is the same sum over the spans
the card has reported so far, plus the part not reported yet: the window's time in it
times the node's *prior*, the joules per second that recently settled windows were
charged (tails included), with a bias and a spread learnt from how far earlier first
figures fell from their settled ones. Its uncertainty covers both parts.

What the book also sees: a card drawing above idle with no window open, once a ramp-down
(``ramp_s``) after the last window has passed, is a **foreign load**. Its watts are
witnessed, figures on the node say ``contended``, and with ``foreign="subtract"`` that
level is taken off the spans windows share (booked as ``foreign_j``, unattributed).

No clock, no lock, no I/O: the ledger serialises calls and gives the times.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..energy import Provenance, Share
from .tape import Gap, Piece, Span

#: Windows settled so far teach the prior with this weight each (an EWMA).
PRIOR_WEIGHT = 0.1
#: Residuals of first figures kept for the bias and spread of the interpolated part.
RESIDUALS = 256
#: The share of first figures whose interpolated part the uncertainty covers: the
#: conformal rank ceil((n + 1) x COVER) of n past residuals, once there are enough of them;
#: before that, the part is uncertain by its whole scale.
COVER = 0.92
COLD_SPREAD = 1.0
#: And never less than this share of the interpolated part itself.
FLOOR = 0.05
#: Witnessed foreign power below this (W, or this share of idle) is noise, not a load.
FOREIGN_MIN_W = 5.0
FOREIGN_MIN_SHARE = 0.05
#: Witnessed time before a foreign level is believed (in periods, at least a tenth of a
#: second), and how long it is kept.
FOREIGN_BELIEVE_PERIODS = 1
FOREIGN_BELIEVE_S = 0.1
FOREIGN_KEEP_S = 120.0
#: The subtracted level is uncertain by this many mean absolute deviations of the witness.
FOREIGN_SPREAD = 2.5
#: The foreign level follows the witness with this time constant (seconds).
FOREIGN_TAU_S = 5.0
#: Intervals waiting for an open window's weight: at most this many, for at most this long.
MAX_WAITING = 2_000
MAX_WAIT_S = 10.0


class Split(Protocol):
    """How a span's energy is divided among the windows in it."""

    #: The name the record's ``split`` field shows for a shared span.
    name: str
    #: True when every window's weight is known at open: spans never wait.
    known_at_open: bool

    def weight(self, window: Window) -> float | None:
        """The window's weight per second of overlap; None when not known (yet)."""
        ...


class TimeSplit:
    """Each window's share is proportional to its time in the span."""

    name = "time"
    known_at_open = True

    def weight(self, window: Window) -> float | None:
        return 1.0


class TokenSplit:
    """Shares proportional to time x tokens per second: equal energy per token, as in a
    continuous batch. A window's weight is known only when it closes with its count."""

    name = "tokens"
    known_at_open = False

    def weight(self, window: Window) -> float | None:
        if window.tokens is None or window.tokens <= 0 or window.t_close is None:
            return None
        return window.tokens / max(window.t_close - window.t_open, 1e-9)


class Window:
    """One request's time on a node, and what the book has charged to it so far.

    A plain slotted class: one is built per request, and the constructor sets only what
    every window has.
    """

    __slots__ = (
        "abandoned",
        "alone",
        "busy_close",
        "busy_open",
        "callbacks",
        "edge_sq",
        "error",
        "first",
        "linear_unc",
        "lost_s",
        "marks",
        "measured_s",
        "power_j",
        "rules",
        "seen_end",
        "settled",
        "share",
        "stage_shares",
        "t_close",
        "t_open",
        "tokens",
        "waiting",
        "waits_on",
        "weight",
    )

    def __init__(self, t_open: float, busy_open: float) -> None:
        self.t_open = t_open
        self.busy_open = busy_open
        self.t_close: float | None = None
        self.busy_close = 0.0
        self.tokens: int | None = None
        self.weight: float | None = None
        self.marks: list[tuple[str, float]] | None = None
        self.stage_shares: list[float] | None = None
        self.share = 0.0
        self.edge_sq = 0.0  # squared ambiguity of partly covered spans
        self.linear_unc = 0.0  # stamp and foreign-level uncertainty, added linearly
        self.power_j = 0.0
        self.measured_s = 0.0
        self.lost_s = 0.0
        self.waiting = 0  # spans waiting on weights that include this window
        self.waits_on: list[_Waiting] | None = None  # those spans, while the window is open
        self.seen_end = False
        self.settled = False
        self.abandoned = False
        self.alone = True
        self.rules: str | None = None
        self.error: str | None = None
        self.first: _First | None = None
        self.callbacks: list[Callable[[], None]] | None = None

    @property
    def seconds(self) -> float:
        return (self.t_close if self.t_close is not None else self.t_open) - self.t_open

    @property
    def concurrency(self) -> float | None:
        if self.t_close is None:
            return None
        span = self.t_close - self.t_open
        return (self.busy_close - self.busy_open) / span if span > 0 else 1.0


@dataclass(slots=True)
class _First:
    """What the window's first figure assumed: kept to learn from when it settles."""

    reported: float  # the share already reported at close
    guess: float  # the interpolated part, prior x time (before the learnt bias)
    scale: float  # the residual's unit: the guess, with at least a quarter period in it
    unc: float = 0.0  # the measured part's uncertainty at close


@dataclass(eq=False, slots=True)
class _Waiting:
    """A span whose split waits for weights that open windows will know at close."""

    span: Span
    above: float
    members: list[tuple[Window, float]]
    open_members: int
    done: bool = False


@dataclass(frozen=True, slots=True)
class BookTotals:
    measured_j: float
    charged_j: float
    unattributed_j: float
    foreign_j: float
    in_flight_j: float
    lost_s: float
    windows_open: int
    foreign_watts: float | None
    contended: bool | None
    mean_concurrency: float | None


class Book:
    """The shares of one node's windows. The ledger calls it under its lock."""

    def __init__(
        self,
        provenance: Provenance,
        *,
        split: Split | None = None,
        ramp_s: float = 0.1,
        subtract_foreign: bool = False,
        period: Callable[[], float] = lambda: 0.1,
        measures: bool = True,
    ) -> None:
        self.provenance = provenance
        self.split: Split = split or TimeSplit()
        self.ramp_s = ramp_s
        self.subtract_foreign = subtract_foreign
        self.period = period
        self.measures = measures
        self.error: str | None = None if measures else "no reader for this node"
        self.stopped = False  # after shutdown no reading will come: windows settle at close
        self._open: dict[int, Window] = {}
        self._closing: list[Window] = []  # closed, not yet seen past their tail
        self._waiting: deque[_Waiting] = deque()
        self._n = 0
        self._busy = 0.0
        self._t_evt: float | None = None
        self._t_end: float | None = None  # where the last booked piece ended
        self._last_close = -math.inf
        self._closes: deque[float] = deque(maxlen=64)  # recent closes, for neighbours' tails
        self._prior: float | None = None  # J per window-second of settled windows
        self._tails = False  # the last members found were ramp-down tails only
        self._span_rate: float | None = None  # J per window-second of recent shared spans
        self._run_rate: float | None = None  # the same, in spans windows covered whole
        self._settled_windows = 0
        self._residuals: deque[float] = deque(maxlen=RESIDUALS)
        self._growth: deque[float] = deque(maxlen=RESIDUALS)  # settled doubt added after close
        # The witnessed level is a ratio of time-decayed sums: a span's stamp error moves
        # energy to its neighbour, and over consecutive spans those errors cancel.
        self._foreign_w: float | None = None
        self._foreign_j = 0.0
        self._foreign_s = 0.0
        self._foreign_dev = 0.0  # mean absolute deviation of single spans from the level
        self._foreign_seen_s = 0.0
        self._foreign_t: float | None = None  # when the foreign level was last witnessed
        self._processes_foreign: bool | None = None
        # What this process cannot see, as cumulative window-seconds at times: the other
        # workers' windows on this node (``others``), or the upstream's whole running load
        # (``total``, ours included).
        self._others: deque[tuple[float, float]] = deque(maxlen=4096)
        self._total: deque[tuple[float, float]] = deque(maxlen=4096)
        self.external_j = 0.0
        self._running = 0.0
        self.measured_j = 0.0
        self.charged_j = 0.0
        self.unattributed_j = 0.0
        self.foreign_j = 0.0
        self.lost_s = 0.0
        self._busy_booked = 0.0
        self._time_booked = 0.0

    # -- windows ------------------------------------------------------------------------
    def _advance(self, t: float) -> float:
        if self._t_evt is not None and t > self._t_evt:
            self._busy += self._n * (t - self._t_evt)
        self._t_evt = t if self._t_evt is None else max(self._t_evt, t)
        return self._busy

    def open(self, t: float) -> Window:
        window = Window(t, self._advance(t))
        self._n += 1
        if self.split.known_at_open:
            window.weight = 1.0
        self._open[id(window)] = window
        return window

    def mark(self, window: Window, name: str, t: float) -> None:
        if window.t_close is not None:
            return
        if window.marks is None or window.stage_shares is None:
            window.marks, window.stage_shares = [], [window.share]
        window.marks.append((name, t))
        window.stage_shares.append(0.0)

    def close(self, window: Window, t: float, tokens: int | None = None) -> list[Window]:
        """Close the window; returns the windows this settles (spans that waited on it)."""
        if window.t_close is not None or self._open.pop(id(window), None) is None:
            return []
        window.busy_close = self._advance(t)
        self._n -= 1
        window.t_close = max(t, window.t_open)
        window.tokens = tokens
        self._last_close = max(self._last_close, window.t_close)
        self._closes.append(window.t_close)
        if not self.split.known_at_open:
            window.weight = self.split.weight(window)
        if not self.measures:
            window.error = self.error
            window.seen_end = True
        window.first = self._first_guess(window)
        self._closing.append(window)
        settled: list[Window] = []
        if window.waits_on:
            self._release(settled, window)
        if self.stopped:
            self._settle_uncovered(window, settled)
        self._try_settle(window, settled)
        if window.settled:
            self._closing.remove(window)
        return settled

    def abandon(self, window: Window, t: float) -> list[Window]:
        """Close a window whose figure nobody will read (a re-bound request)."""
        window.abandoned = True
        return self.close(window, t)

    # -- pieces from the tape -------------------------------------------------------------
    def book(self, piece: Piece, now: float) -> list[Window]:
        """Share one span (or lose one gap) among its windows; returns the windows settled."""
        settled: list[Window] = []
        end = self._t_end
        if end is None:
            self._before_start(piece.t0)
        elif piece.t0 > end + 1e-9:
            self._gap(Gap(end, piece.t0, "no reading covered this time"), settled)
        if isinstance(piece, Gap):
            self._gap(piece, settled)
        else:
            self._span(piece, settled)
        self._t_end = piece.t1
        self._see_ends(piece.t1, settled)
        self._expire_waiting(now, settled)
        return settled

    def _members(self, t0: float, t1: float) -> list[tuple[Window, float]]:
        """Windows overlapping (t0, t1], with their overlap; a closed window's ramp-down
        tail counts where no window is open (``self._tails`` says when it did)."""
        members: list[tuple[Window, float]] = []
        for window in self._open.values():
            overlap = t1 - max(window.t_open, t0)
            if overlap > 0:
                members.append((window, overlap))
        tails: list[tuple[Window, float]] = []
        for window in self._closing:
            t_close = window.t_close
            assert t_close is not None
            if window.settled:
                continue
            overlap = min(t_close, t1) - max(window.t_open, t0)
            if overlap > 0:
                members.append((window, overlap))
            elif not members:
                tail = min(t_close + self.ramp_s, t1) - max(t_close, t0)
                if tail > 0:
                    tails.append((window, tail))
        self._tails = not members and bool(tails)
        return members or tails

    def _closed_near(self, t: float) -> bool:
        """Whether a window closed within a ramp-down before ``t`` (its tail may follow)."""
        return any(t - self.ramp_s < c <= t for c in self._closes)

    def _before_start(self, t: float) -> None:
        """Windows opened before the tape's first piece: that time cannot be measured."""
        for window in [*self._open.values(), *self._closing]:
            if window.settled:
                continue
            end = t if window.t_close is None else min(window.t_close, t)
            if end > window.t_open:
                window.lost_s += end - window.t_open
                window.error = "opened before the node's reader gave its first reading"

    def _gap(self, gap: Gap, settled: list[Window]) -> None:
        self.lost_s += gap.t1 - gap.t0
        for window, overlap in self._members(gap.t0, gap.t1):
            window.lost_s += overlap
            window.error = gap.why

    def _span(self, span: Span, settled: list[Window]) -> None:
        above = span.above_j
        self.measured_j += above
        seconds = span.seconds
        members = self._members(span.t0, span.t1)
        if not members:
            if span.t0 >= self._last_close + self.ramp_s:
                self._witness(span)
            self.unattributed_j += above
            return
        covered = sum(overlap for _, overlap in members)
        unseen = self._unseen(span, covered)
        if unseen:
            # Load this process does not see (other workers, other replicas, direct
            # clients) draws its part of the span: ours is covered / (covered + unseen).
            taken = above * unseen / (covered + unseen)
            self.external_j += taken
            self.foreign_j += taken
            self.unattributed_j += taken
            above -= taken
        level = self._foreign_level()
        if level is not None and self.subtract_foreign and not unseen:
            taken = min(max(above, 0.0), level * seconds)
            self.foreign_j += taken
            self.unattributed_j += taken
            above -= taken
        self._busy_booked += covered
        self._time_booked += seconds
        if not self._tails:
            self._learn_rates(above / covered, 1.0 - math.exp(-covered / FOREIGN_TAU_S), seconds, members)
        open_members = 0
        if not self.split.known_at_open:
            open_members = sum(1 for w, _ in members if w.weight is None and w.t_close is None)
        if not open_members:
            self._share(span, above, members, settled, by_time=False)
            return
        # A split by weights known only at close: the span waits for its open windows.
        waiting = _Waiting(span, above, members, open_members)
        for window, _ in members:
            window.waiting += 1
            if window.weight is None and window.t_close is None:
                if window.waits_on is None:
                    window.waits_on = [waiting]
                else:
                    window.waits_on.append(waiting)
        self._waiting.append(waiting)
        if len(self._waiting) > MAX_WAITING:
            self._resolve(self._waiting.popleft(), settled, by_time=True)

    def load_at(self, t: float) -> tuple[float, int]:
        """This book's window-seconds integral until ``t``, and its windows open now."""
        since = t - self._t_evt if self._t_evt is not None and t > self._t_evt else 0.0
        return self._busy + self._n * since, self._n

    def note_others(self, t: float, window_seconds: float) -> None:
        """The other workers' cumulative window-seconds on this node, as of ``t``."""
        self._others.append((t, window_seconds))

    def note_total(self, t: float, running: float) -> None:
        """The upstream's running requests at ``t`` (its whole load, ours included)."""
        total = self._total
        if total:
            t0, integral = total[-1]
            if t > t0:
                total.append((t, integral + self._running * (t - t0)))
        else:
            total.append((t, 0.0))
        self._running = running

    def _unseen(self, span: Span, covered: float) -> float:
        """Window-seconds in the span from load this process does not see, or 0."""
        total = _delta(self._total, span.t0, span.t1, self._running)
        if total is not None:
            return max(0.0, total - covered)
        samples = self._others
        slope = None
        if len(samples) >= 2:
            (ta, va), (tb, vb) = samples[-2], samples[-1]
            slope = (vb - va) / (tb - ta) if tb > ta else 0.0
        others = _delta(samples, span.t0, span.t1, slope)
        return max(0.0, others) if others is not None else 0.0

    def _learn_rates(
        self, rate: float, weight: float, seconds: float, members: list[tuple[Window, float]]
    ) -> None:
        """The node's recent joules per window-second, and the same where windows ran the
        whole span (no edge, no tail in it): the priors of first figures."""
        span_rate = self._span_rate
        self._span_rate = rate if span_rate is None else span_rate + weight * (rate - span_rate)
        if all(overlap >= seconds * (1 - 1e-9) for _, overlap in members):
            run = self._run_rate
            self._run_rate = rate if run is None else run + weight * (rate - run)

    def _share(
        self, span: Span, above: float, members: list[tuple[Window, float]],
        settled: list[Window], *, by_time: bool,
    ) -> None:
        weights: list[float] | None = None
        rule = self.split.name
        if not self.split.known_at_open and not by_time:
            known = [w.weight for w, _ in members]
            if all(k is not None and k > 0 for k in known):
                weights = known  # type: ignore[assignment]
            else:
                rule = "time"  # a weight is unknown (no tokens): this span by time
        elif by_time:
            rule = "time"
        total = 0.0
        for i, (_, overlap) in enumerate(members):
            total += overlap if weights is None else weights[i] * overlap
        seconds = span.seconds
        covered = sum(o for _, o in members)
        # Energy in the part of the span no window covered may or may not be theirs: half
        # of it is each window's edge ambiguity, where a neighbour's ramp-down could be in
        # it or nobody has looked at the card between windows. Where the card has been
        # seen quiet and no window closed within a ramp-down before, only the witnessed
        # level's own doubt remains there.
        uncovered = max(0.0, 1.0 - covered / seconds) if seconds > 0 else 0.0
        quiet_level = self._foreign_level() if not self._closed_near(span.t0) else None
        uncovered_j = 0.0
        if quiet_level is not None:
            uncovered_j = FOREIGN_SPREAD * self._foreign_dev * uncovered * seconds
            uncovered = 0.0
        per_stamp = 2 * span.stamp_s * (abs(above) / seconds + (self.provenance.idle_watts or 0.0)) \
            if seconds > 0 else 0.0
        foreign_unc = 0.0
        level = self._foreign_level()
        if self.subtract_foreign and level is not None:
            foreign_unc = FOREIGN_SPREAD * self._foreign_dev * seconds
        shared = len(members) > 1
        for i, (window, overlap) in enumerate(members):
            part = (overlap if weights is None else weights[i] * overlap) / total
            share = above * part
            window.share += share
            window.power_j += span.total_j * (overlap / seconds) if seconds > 0 else 0.0
            window.measured_s += overlap
            edge = overlap < seconds * (1 - 1e-9)
            if edge:
                if quiet_level is not None:
                    window.linear_unc += uncovered_j * part
                window.edge_sq += (0.5 * abs(share) * uncovered) ** 2
                window.linear_unc += per_stamp * part
                if shared:
                    # Where windows come and go in a shared span, a closing window's tail
                    # goes to the others, and theirs to it: about ramp_s / 5 at its rate.
                    window.edge_sq += (abs(share) / overlap * self.ramp_s / 5) ** 2
            window.linear_unc += span.unc_j * part
            window.linear_unc += foreign_unc * part
            if shared:
                window.alone = False
                rules = window.rules
                if rules is None:
                    window.rules = rule
                elif rule not in rules.split("+"):
                    window.rules = "+".join(sorted({*rules.split("+"), rule}))
            if window.stage_shares is not None:
                start = max(window.t_open, span.t0)
                _spread(window, start, start + overlap, share, window.stage_shares)

    def _resolve(self, waiting: _Waiting, settled: list[Window], *, by_time: bool) -> None:
        if waiting.done:
            return
        waiting.done = True
        for window, _ in waiting.members:
            window.waiting -= 1
        self._share(waiting.span, waiting.above, waiting.members, settled, by_time=by_time)
        for window, _ in waiting.members:
            self._try_settle(window, settled)

    def _release(self, settled: list[Window], closed: Window) -> None:
        """A window closed with its weight: spans that waited only for it can be shared."""
        for waiting in closed.waits_on or ():
            waiting.open_members -= 1
            if waiting.open_members <= 0:
                self._resolve(waiting, settled, by_time=False)
        closed.waits_on = None
        self._drop_done()

    def _drop_done(self) -> None:
        while self._waiting and self._waiting[0].done:
            self._waiting.popleft()

    def _expire_waiting(self, now: float, settled: list[Window]) -> None:
        """The token split never holds the book hostage: a span that waited too long is
        shared by time (and says so in its windows' ``split``)."""
        self._drop_done()
        while self._waiting and now - self._waiting[0].span.t1 > MAX_WAIT_S:
            self._resolve(self._waiting.popleft(), settled, by_time=True)
            self._drop_done()

    def _see_ends(self, t: float, settled: list[Window]) -> None:
        """Windows whose close (and ramp-down after it) the tape has now passed settle."""
        for window in self._closing:
            assert window.t_close is not None
            if t >= window.t_close + self.ramp_s:
                window.seen_end = True
                self._try_settle(window, settled)
        self._closing = [w for w in self._closing if not w.settled]

    def _try_settle(self, window: Window, settled: list[Window]) -> None:
        if window.settled or window.t_close is None or not window.seen_end or window.waiting:
            return
        window.settled = True
        if window.abandoned or window.lost_s > 0 or window.share <= 0 or not self.measures:
            self.unattributed_j += window.share
        else:
            self.charged_j += window.share
            self._learn(window)
        settled.append(window)

    # -- the prior and the first figure ---------------------------------------------------
    def _learn(self, window: Window) -> None:
        seconds = window.seconds
        if seconds > 0:
            rate = window.share / seconds
            self._settled_windows += 1
            weight = max(PRIOR_WEIGHT, 1.0 / self._settled_windows)
            self._prior = rate if self._prior is None else self._prior + weight * (rate - self._prior)
        first = window.first
        if first is not None and first.scale > 0:
            actual = window.share - first.reported
            self._residuals.append((actual - first.guess) / first.scale)
            grown = math.sqrt(window.edge_sq) + window.linear_unc - first.unc
            self._growth.append(max(0.0, grown) / first.scale)

    def _first_guess(self, window: Window) -> _First | None:
        """What the first figure assumes about the part of the window not shared yet: its
        time not yet shared (not reported, or waiting for weights) at the node's prior
        rate, plus, if it closes alone, its ramp-down tail (about ``ramp_s / 5`` seconds at
        that rate: ``ramp_s`` is when the tail has all but gone)."""
        assert window.t_close is not None
        if not self.measures:
            return _First(window.share, 0.0, 0.0)
        unshared = max(0.0, window.seconds - window.measured_s - window.lost_s)
        # Where the node has run whole spans, their rate is the draw of a running window and
        # the tail is added apart; else settled windows' rate, tails already inside it.
        tail = 0.0
        prior = self._run_rate
        if prior is not None and self._n == 0:
            tail = self.ramp_s / 5
        if prior is None:
            prior = self._prior if self._prior is not None else self._span_rate
        if prior is None and window.measured_s > 0:
            prior = window.share / window.measured_s  # nothing settled yet: its own rate
        if prior is None or prior <= 0:
            return None
        # The residual's unit is the guess itself, with at least a quarter period of time
        # in it: a window closing just after a step still waits on how the next one falls.
        return _First(
            window.share, prior * (unshared + tail), prior * max(unshared + tail, self.period() / 4),
            math.sqrt(window.edge_sq) + window.linear_unc,
        )

    def _growth_at(self) -> float:
        """How much the measured part's uncertainty grew from close to settling, per unit
        of scale, for COVER of past windows (0 before there are enough)."""
        growth = self._growth
        rank = math.ceil((len(growth) + 1) * COVER)
        return sorted(growth)[rank - 1] if rank <= len(growth) else 0.0

    def _bias_spread(self) -> tuple[float, float]:
        """The learnt bias of first figures' interpolated parts (their median residual) and
        the spread about it that covers COVER of them (split conformal)."""
        residuals = self._residuals
        n = len(residuals)
        rank = math.ceil((n + 1) * COVER)
        if rank > n:
            return 0.0, COLD_SPREAD
        ordered = sorted(residuals)
        bias = ordered[n // 2]
        return bias, sorted(abs(r - bias) for r in ordered)[rank - 1]

    # -- foreign load ---------------------------------------------------------------------
    def _witness(self, span: Span) -> None:
        idle = self.provenance.idle_watts
        seconds = span.seconds
        if idle is None or seconds <= 0:
            return
        watts = span.above_j / seconds
        decay = math.exp(-seconds / FOREIGN_TAU_S)
        level = self._foreign_w
        if level is not None:
            self._foreign_dev += (1 - decay) * (abs(watts - level) - self._foreign_dev)
        self._foreign_j = self._foreign_j * decay + span.above_j
        self._foreign_s = self._foreign_s * decay + seconds
        self._foreign_w = self._foreign_j / self._foreign_s
        self._foreign_seen_s += seconds
        self._foreign_t = span.t1

    def _foreign_level(self) -> float | None:
        """The foreign load's watts above idle, when one has been witnessed and is real."""
        level = self._foreign_w
        if level is None or self._foreign_seen_s < max(
            FOREIGN_BELIEVE_S, FOREIGN_BELIEVE_PERIODS * self.period()
        ):
            return None
        idle = self.provenance.idle_watts or 0.0
        return level if level >= max(FOREIGN_MIN_W, FOREIGN_MIN_SHARE * idle) else 0.0

    def contended(self) -> tuple[bool | None, float | None]:
        """(contended, foreign watts): ``None`` when nobody could look."""
        level = self._foreign_level()
        recent = self._foreign_t is not None and (
            self._t_end is None or self._t_end - self._foreign_t <= FOREIGN_KEEP_S
        )
        by_power: bool | None = None if level is None or not recent else level > 0
        by_process = self._processes_foreign
        if self.external_j > 0 and self._total:
            by_process = True  # the upstream serves load this process never saw
        if by_power is None and by_process is None:
            return None, None
        contended = bool(by_power) or bool(by_process)
        return contended, (level if level else None) if by_power is not None else None

    def note_processes(self, foreign: bool | None) -> None:
        """What the card's process list says: a process other than the node's server."""
        self._processes_foreign = foreign

    # -- answers --------------------------------------------------------------------------
    def share(self, window: Window) -> Share:
        """The window's share now: settled, or first (with the unreported part filled)."""
        contended, foreign_w = self.contended()
        mean_w = window.power_j / window.measured_s if window.measured_s > 0 else None
        split = window.rules or "exclusive"
        base = dict(
            provenance=self.provenance, seconds=window.seconds, mean_watts=mean_w,
            concurrency=window.concurrency, split=split, contended=contended,
            foreign_watts=foreign_w,
        )
        if not self.measures or window.lost_s > 0:
            return Share(None, 0.0, 0.0, window.settled, error=window.error or self.error, **base)  # type: ignore[arg-type]
        first = window.first
        measured_unc = math.sqrt(window.edge_sq) + window.linear_unc
        if window.settled:
            return Share(window.share, measured_unc, 0.0, True, error=window.error, **base)  # type: ignore[arg-type]
        if first is None:
            return Share(
                None, 0.0, 0.0, False,
                error=window.error or "not settled: the card has not reported this window yet",
                **base,  # type: ignore[arg-type]
            )
        bias, spread = self._bias_spread()
        # The spans still to come will add their own doubt to the settled figure (a shared
        # last span, an edge): as much as it grew for COVER of the windows settled before.
        measured_unc = max(measured_unc, first.unc + self._growth_at() * first.scale)
        guess = max(0.0, first.guess + bias * first.scale)
        # What has been reported since close belongs to the same part: the figure is the
        # reported share plus what of the guess is not reported yet.
        reported_since = window.share - first.reported
        filled = max(0.0, guess - reported_since) if reported_since > 0 else guess
        return Share(
            window.share + filled, measured_unc + spread * first.scale + FLOOR * guess, filled, False,
            error=window.error, **base,  # type: ignore[arg-type]
        )

    def stage_values(self, window: Window) -> list[float] | None:
        """The window's share per stage (then the tail after the last mark)."""
        if window.stage_shares is None:
            return None
        values = list(window.stage_shares)
        if not window.settled:
            share = self.share(window)
            extra = (share.joules or 0.0) - window.share
            if extra > 0 and window.marks is not None and window.t_close is not None:
                start = max(window.t_open, self._t_end if self._t_end is not None else window.t_open)
                _spread(window, start, window.t_close, extra, values)
        return values

    def force_settle(self) -> list[Window]:
        """Settle every closed window now (shutdown): waiting spans by time, and whatever
        the tape never covered booked as lost, since no reading will cover it."""
        settled: list[Window] = []
        while self._waiting:
            self._resolve(self._waiting.popleft(), settled, by_time=True)
        self.stopped = True
        for window in list(self._closing):
            self._settle_uncovered(window, settled)
        self._closing = []
        return settled

    def _settle_uncovered(self, window: Window, settled: list[Window]) -> None:
        """No reading will cover the rest of this window: that part is lost."""
        assert window.t_close is not None
        end = self._t_end if self._t_end is not None else window.t_open
        uncovered = window.t_close - max(window.t_open, end)
        if uncovered > 0 and self.measures:
            window.lost_s += uncovered
            window.error = "closed after the ledger's last reading (ledger stopped)"
        window.seen_end = True
        self._try_settle(window, settled)

    def totals(self) -> BookTotals:
        unsettled: dict[int, Window] = dict(self._open)
        for window in self._closing:
            unsettled[id(window)] = window
        waiting = 0.0
        for item in self._waiting:
            if item.done:
                continue
            waiting += item.above
            for window, _ in item.members:
                unsettled[id(window)] = window
        in_flight = waiting + sum(w.share for w in unsettled.values() if not w.settled)
        contended, foreign_w = self.contended()
        return BookTotals(
            measured_j=self.measured_j, charged_j=self.charged_j,
            unattributed_j=self.unattributed_j, foreign_j=self.foreign_j,
            in_flight_j=in_flight, lost_s=self.lost_s, windows_open=len(self._open),
            foreign_watts=foreign_w, contended=contended,
            mean_concurrency=self._busy_booked / self._time_booked if self._time_booked else None,
        )


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


def _delta(samples: deque[tuple[float, float]], t0: float, t1: float, rate: float | None) -> float | None:
    """The growth of a cumulative series between ``t0`` and ``t1``, interpolated between
    samples (and, past the last, extrapolated at ``rate`` when one is given); None when the
    series does not cover the span."""
    if not samples or samples[0][0] > t0:
        return None
    last_t = samples[-1][0]
    if t1 > last_t and (rate is None or t1 - last_t > 1.0):
        return None
    return _at(samples, t1, rate) - _at(samples, t0, rate)


def _at(samples: deque[tuple[float, float]], t: float, rate: float | None) -> float:
    last_t, last_v = samples[-1]
    if t >= last_t:
        return last_v + (rate or 0.0) * (t - last_t)
    lo, hi = 0, len(samples) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, va), (tb, vb) = samples[lo], samples[hi]
    return va + (vb - va) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
