"""What fills the part of a window the card has not reported: the node's prior.

A counter reports energy a period late, and not at all before its first step or while its
reader fails. Both figures a window gets come from one model: what the card reported, plus
the rest at the node's *prior*, the joules per window-second it recently charged:

- the **run rate**: joules per window-second of running, in spans windows covered whole,
  else in spans no window closed in (no ramp-down tail inside), else from settled windows
  (each charged its run and, if it closed alone, its tail: ``share / (seconds + tail)``).
  Each is a ratio of decayed sums, joules over window-seconds, so a window of a millisecond
  teaches a thousandth of what a second does (a rate from one short window's share over its
  own few ms, tail inside, was the 1000x first figures of issue 21). Last, where this
  process's own windows have taught nothing yet, the **host's rate**: the same ratio over
  the card's spans that only other processes' windows were in, as the card's holder decided
  them (a worker started beside warm ones, gunicorn's recycled worker, guesses from the
  others' spans rather than saying unknown). A guess is the rate
  times the part not reported, plus a ramp-down tail (``ramp_s / 5`` at that rate, no longer
  than the window itself: a request too short to ramp the card up leaves little to ramp
  down) for a window that closes alone. Before any of these, the node knows nothing: the first figure
  says so (unknown), rather than a near-zero from an idle card's power or a ramp-up's
  first sliver;
- a **bias** and a **spread** learnt from how far earlier first figures' guesses fell from
  what their windows settled at, in units of the guess (split conformal: the spread is the
  rank that covers ``COVER`` of them; before there are enough, the whole guess), apart for
  windows with nothing reported at close and with some, and for those that close as a burst
  drains (:data:`DRAINING`), once each class has enough;
- how much the measured part's own doubt grew between close and settling.

The same rate and spread fill time that no reading will ever cover (before the tape's first
step, a gap where the reader failed): that part is an estimate, never booked as measured.

What a prior has learnt is a plain state (:meth:`Prior.state`) that a new worker of the same
server starts from (:meth:`Prior.restore`, :mod:`giul_asgi.hostshare.priors`): gunicorn's
``--max-requests`` makes every worker new, and each answered its first requests unknown (a
stranger's trial: a fifth to a half of them) while learning the node from nothing.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from .window import First, Window

#: Residuals of first figures kept for the bias and spread of the interpolated part.
RESIDUALS = 256
#: The share of first figures whose interpolated part the uncertainty covers: the
#: conformal rank ceil((n + 1) x COVER) of n past residuals, once there are enough of them;
#: before that, the part is uncertain by its whole scale.
COVER = 0.92
COLD_SPREAD = 0.9
#: And never less than this share of the interpolated part itself.
FLOOR = 0.05
#: A window shorter than this (s), with nothing reported yet, is not guessed: its first
#: figure would be a near-zero with a doubt a thousand times its size (a request answered
#: without a card's work, or whose work only the card's next steps can show).
MIN_GUESS_S = 0.001
#: A window the card did not read from its start waits until this many windows settled
#: wholly measured, a counter period of their time in all (one window's rate ended the wait:
#: 0.41-0.45x, outside for 8 of 8, where the first warm request drew less than the rest;
#: five 5 ms requests that did no card work, 0.08-0.13x), or the host's other processes'
#: windows were read for a period.
SETTLED_MIN = 3
#: Settled windows fit the line of share against seconds (see _Line) once there are this
#: many, each counting this much less at every later one; the lengths must spread by this
#: share of their mean for a slope and an offset (else one rate through the origin).
LINE_MIN = 3
LINE_KEEP = 0.97
LINE_SPREAD = 0.25
#: Rates forget with this time constant, in window-seconds taught.
RATE_TAU_S = 5.0
#: What :meth:`Prior.state` says it is.
STATE_SCHEMA = "giul-asgi/prior/1"


@dataclass(frozen=True, slots=True)
class Fill:
    """An interpolated part: its joules, its uncertainty, and what it was taken from."""

    joules: float
    uncertainty: float
    rate: float
    basis: str


class _Rate:
    """Joules per window-second as a ratio of sums that decay with the window-seconds added
    (time constant ``RATE_TAU_S``): recent time counts most, and each part by its time."""

    __slots__ = ("joules", "seconds")

    def __init__(self) -> None:
        self.joules = 0.0
        self.seconds = 0.0

    def add(self, joules: float, seconds: float) -> None:
        if not (seconds > 0 and math.isfinite(joules)):
            return
        keep = math.exp(-seconds / RATE_TAU_S)
        self.joules = self.joules * keep + joules
        self.seconds = self.seconds * keep + seconds

    @property
    def value(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None

    def state(self) -> list[float]:
        return [self.joules, self.seconds]

    def restore(self, state: list[float]) -> None:
        self.joules, self.seconds = state


class _Line:
    """What settled windows were charged against how long they ran: ``share ~ rate x seconds
    + offset``, by least squares over decaying weights (each window counts ``LINE_KEEP`` times
    less at every later one). The offset is what a window gets beyond its running time: its
    ramp-down tail (or, on a busy card, the part of the others' tails that falls in its time,
    which is as much on average), less its ramp-up: what makes short windows cost more a
    second than long ones."""

    __slots__ = ("_fit", "_stale", "n", "sw", "sx", "sxx", "sxy", "sy")

    def __init__(self) -> None:
        self.n = 0
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0
        # The fit, made once after each window added (every close asks for it; windows
        # settle in batches, a reading's at a time): see the commit for the A/B.
        self._fit: tuple[float, float | None] | None = None
        self._stale = True

    def add(self, seconds: float, joules: float) -> None:
        if not (seconds > 0 and math.isfinite(joules)):
            return
        k = LINE_KEEP
        self.n += 1
        self.sw = self.sw * k + 1.0
        self.sx = self.sx * k + seconds
        self.sy = self.sy * k + joules
        self.sxx = self.sxx * k + seconds * seconds
        self.sxy = self.sxy * k + seconds * joules
        self._stale = True

    def state(self) -> list[float]:
        return [float(self.n), self.sw, self.sx, self.sy, self.sxx, self.sxy]

    def restore(self, state: list[float]) -> None:
        self.n = int(state[0])
        self.sw, self.sx, self.sy, self.sxx, self.sxy = state[1:]
        self._stale = True

    @property
    def mean_s(self) -> float:
        """The windows' mean length (their weighted seconds)."""
        return self.sx / self.sw if self.sw > 0 else 0.0

    def fit(self) -> tuple[float, float | None] | None:
        """(joules per second of running, joules beyond it), once enough windows settled;
        the second None where the windows' lengths are alike: one rate through the origin,
        which holds what a window gets beyond its running time too."""
        if self._stale:
            self._fit, self._stale = self._fitted(), False
        return self._fit

    def _fitted(self) -> tuple[float, float | None] | None:
        if self.n < LINE_MIN or self.sx <= 0 or self.sw <= 0:  # (a kept state may say anything)
            return None
        mx, my = self.sx / self.sw, self.sy / self.sw
        vxx = self.sxx / self.sw - mx * mx
        if vxx > (LINE_SPREAD * mx) ** 2:  # lengths spread enough to tell rate from offset
            rate = (self.sxy / self.sw - mx * my) / vxx
            if rate > 0:
                return rate, my - rate * mx
        return (self.sy / self.sx, None) if self.sy > 0 else None  # one length: a rate says it


class Prior:
    """The node's joules per window-second, and how far guesses made from it fall."""

    def __init__(self, ramp_s: float, period: Callable[[], float]) -> None:
        self.ramp_s = ramp_s
        self.period = period
        self._prior = _Rate()  # settled windows, less their tails
        self._together = _Rate()  # the windows in flight beside them, on average (theirs too)
        #: Those that did work a card shows (more than half their own doubt): how many,
        #: their rate without tails, and the most any of a half period or more drew a second.
        self._worked_n, self._worked, self._most = 0, _Rate(), 0.0
        self._span_rate = _Rate()  # the spans windows shared with no close inside
        self._run_rate = _Rate()  # the same, in spans windows covered whole
        self._card_w: float | None = None  # above-idle watts of spans no window was in
        self._host_rate = _Rate()  # spans only other processes' windows were in
        self._line = _Line()  # settled windows' share against their seconds
        #: Closed windows' mean weight per second (the split's: 1 by time, tokens a second
        #: by tokens), to scale a guess by how a window's weight stands to theirs.
        self._weights = _Rate()
        self._settled = 0
        #: Bumped whenever a settled window teaches the prior: a window waiting for that
        #: looks again only then (5,000 waiting windows retried at every reading took 65%
        #: of a core for ten seconds: a hostile trial).
        self.learnt_at = 0
        self._residuals: deque[float] = deque(maxlen=RESIDUALS)
        self._growth: deque[float] = deque(maxlen=RESIDUALS)  # settled doubt added after close
        # The same, kept apart for windows with nothing reported at close (short ones, all
        # guess) and with some (Mondrian conformal: each class's spread covers its own; pooled,
        # short windows amid long ones got twice the width they needed: 122% of the figure
        # against 77% apart, each covering 100%, in a mix of 50 ms and 0.4 s at 16 in flight).
        self._by: tuple[tuple[deque[float], deque[float]], ...] = tuple(
            (deque(maxlen=RESIDUALS), deque(maxlen=RESIDUALS)) for _ in range(GROUPS))
        self._granks: list[tuple[float, float, float] | None] = [None] * GROUPS
        # The ranks of both, computed once after they change rather than at every figure
        # (two sorts of 256 per figure were most of a window's open and close: A/B 3.9 ->
        # 1.6 us in benchmarks/overhead.py's breakdown).
        self._ranks: tuple[float, float, float] | None = None

    # -- learning -------------------------------------------------------------------------
    def learn_span(
        self, rate: float, covered: float, seconds: float, members: list[tuple[Window, float]],
        t1: float,
    ) -> None:
        """A shared span's joules per window-second, where no window closed in it (a
        ramp-down tail in a span its window barely covered made rates of thousands of W a
        window); where windows ran it whole (no edge either), also the run rate."""
        if any(w.t_close is not None and w.t_close < t1 for w, _ in members):
            return
        self._span_rate.add(rate * covered, covered)
        if all(overlap >= seconds * (1 - 1e-9) for _, overlap in members):
            self._run_rate.add(rate * covered, covered)

    def learn_host(self, joules: float, covered: float) -> None:
        """A span of the card that only other processes' windows were in: what they took of
        it (``joules``) over their window-seconds in it (``covered``)."""
        before = self._host_rate.seconds
        self._host_rate.add(joules, covered)
        if before < self.period() <= self._host_rate.seconds:
            self.learnt_at += 1  # a window waiting for a rate may take theirs now

    def learn_card(self, watts: float) -> None:
        """A span no window was in: the card's above-idle power then. Never a first figure's
        basis (an idle card's near-zero was one), nor a cold window's (:meth:`unread_fill`);
        the last resort of a fill at settling with nothing else learnt (a reader's failure, a
        window shorter than any work a card shows before the card's first step), so that it
        settles (labelled estimated, and why) rather than wait ten seconds for a rate."""
        card = self._card_w
        watts = max(0.0, watts)
        self._card_w = watts if card is None else card + 0.5 * (watts - card)

    def learn_settled(self, window: Window, measured_unc: float, in_flight: float = 1.0) -> None:
        """A window settled wholly measured: its rate, and how far its first guess fell
        (``in_flight``: the windows on the card beside it, on average, the host's)."""
        seconds = window.seconds
        if seconds > 0:
            self._settled += 1
            self.learnt_at += 1
            # As a window of the mean weight would have been charged: what a guess is scaled
            # from (1 by time; by tokens, a line through heterogeneous windows' shares had
            # their rates in its slope: 209 J/s against a mean of about 120).
            share = window.share / self._relative_weight(window.weight)
            tail = self._tail(window, window.alone)
            self._prior.add(share, seconds + tail)
            self._together.add(max(1.0, in_flight) * seconds, seconds)
            if window.share > measured_unc / 2:  # it did work a card shows (a 429 does not)
                self._worked_n += 1
                self._worked.add(share, seconds)
                if seconds >= self.period() / 2:
                    self._most = max(self._most, share / (seconds + tail))
            self._line.add(seconds, share)
        first = window.first
        if first is not None and first.scale > 0:
            actual = window.share - first.reported
            r, g = (actual - first.guess) / first.scale, max(0.0, measured_unc - first.unc) / first.scale
            self._residuals.append(r)
            self._growth.append(g)
            group = _group(first)
            self._by[group][0].append(r)
            self._by[group][1].append(g)
            self._ranks = None
            self._granks = [None] * GROUPS  # a class too small to rank leans on the pooled

    # -- kept for the next worker ------------------------------------------------------------
    @property
    def learnt(self) -> int:
        """How many windows taught this prior (it changed when this did)."""
        return self._settled + len(self._residuals)

    def state(self) -> dict[str, Any]:
        """What this prior has learnt, as plain values (JSON)."""
        # What only unread_fill reads sits beside "rates", not in it: a worker of an older
        # release restores the rest (one that found six rates there threw the state away).
        return {"schema": STATE_SCHEMA, "settled": self._settled, "card_w": self._card_w,
                "most_w": self._most, "together": self._together.state(),
                "worked": self._worked.state(),
                "rates": {name: rate.state() for name, rate in self._rates().items()},
                "line": self._line.state(), "residuals": list(self._residuals),
                "growth": list(self._growth), "groups": [[list(r), list(g)] for r, g in self._by]}

    def restore(self, state: Any) -> bool:
        """Start from ``state`` (another worker's :meth:`state`) where this prior has learnt
        nothing yet; False, changing nothing, for a state that makes no sense."""
        if self.learnt or not _sane(state):
            return False
        for name, rate in self._rates().items():
            rate.restore(state["rates"][name])
        # A state kept before "together" and "worked": its settled windows stand for both.
        self._together.restore(state.get("together", [0.0, 0.0]))
        self._worked.restore(state.get("worked", state["rates"]["settled"]))
        if self._worked.seconds >= self.period() and int(state["settled"]) >= SETTLED_MIN:
            self._worked_n = SETTLED_MIN
        self._line.restore(state["line"])
        self._settled = int(state["settled"])
        self._card_w = state["card_w"]
        self._most = float(state.get("most_w", 0.0))  # a state kept before it: none
        self._residuals.extend(state["residuals"])
        self._growth.extend(state["growth"])
        for (res, gro), (kept_res, kept_gro) in zip(self._by, state["groups"], strict=True):
            res.extend(kept_res)
            gro.extend(kept_gro)
        self._ranks = None
        self._granks = [None] * GROUPS
        self.learnt_at += 1
        return True

    def _rates(self) -> dict[str, _Rate]:
        return {"settled": self._prior, "span": self._span_rate, "run": self._run_rate,
                "host": self._host_rate}

    # -- guessing -------------------------------------------------------------------------
    def rate(self, window: Window, alone: bool | float, *, settling: bool = False,
             ) -> tuple[float | None, float, str]:
        """(joules per second, tail seconds to add, what the rate is) for this window
        (``alone``: the share of its ramp-down tail it keeps, 1 where no other window is on
        the card to take a part; ``settling``: a fill at settling, which may fall back on the
        card's power)."""
        tail = self._tail(window, alone)
        learnt, basis = self._learnt_rate()
        if learnt is not None:
            return learnt, tail, basis
        if window.measured_s >= self.period() and window.share > 0:
            # A window measured for a period or more has ramped up and its job has begun: its
            # own rate stands (a sliver of one, a ramp-up's first ms, or a first span that
            # held mostly the time before the upstream started the job, would not).
            return window.share / window.measured_s, tail, "the window's own measured rate"
        host = self._host_rate.value
        if host is not None:
            return host, tail, "the host's other processes' spans"
        if settling and self._card_w:
            return self._card_w, 0.0, "the card's power in its first readings"
        return None, 0.0, "nothing yet"

    def _learnt_rate(self) -> tuple[float | None, str]:
        """The node's windows' joules per second as learnt from spans and settled windows
        (None before any), and what it is."""
        line = self._line.fit()
        if line is not None:
            return line[0], "the node's prior"
        run = self._run_rate.value
        if run is not None:
            return run, "the node's prior"
        spans = self._span_rate.value  # from a period of window time at least
        if spans is not None and self._span_rate.seconds >= self.period():
            return spans, "the node's first spans"
        settled = self._prior.value
        if settled is not None:
            return settled, "the node's settled windows"
        return None, "nothing yet"

    def drawn(self, window: Window, seconds: float, tail: bool) -> Fill | None:
        """What ``window`` draws in ``seconds`` of its time (and its ramp-down tail, where
        ``tail``) at the rate the node's windows were measured drawing (never the window's
        own, which is what is in question), scaled by its weight as a guess is, with a fill's
        learnt bias and spread; None before a rate was learnt."""
        rate, basis = self._learnt_rate()
        if rate is None or rate <= 0:
            return None
        return self._at(rate * self._relative_weight(window.weight),
                        seconds + self._tail(window, tail), basis)

    def _at(self, rate: float, seconds: float, basis: str) -> Fill:
        """``seconds`` at ``rate``, with the learnt bias, and the learnt spread as doubt."""
        guess = rate * seconds
        scale = rate * max(seconds, self.period() / 4)
        bias, spread = self.bias_spread()
        joules = max(0.0, guess + bias * scale)
        return Fill(joules, spread * scale + FLOOR * joules, rate, basis)

    def _tail(self, window: Window, alone: bool | float) -> float:
        """The seconds of running a window's ramp-down tail is worth to it: the share it keeps
        (``alone``) of a tail no longer than the window."""
        return min(self.ramp_s / 5, window.seconds) * float(alone)

    def first_guess(self, window: Window, alone: bool | float, measured_unc: float) -> First | None:
        """What the first figure assumes about the part of the window not shared yet: its
        time not yet shared (not reported, or waiting for weights) at the prior, plus, if
        it closes alone, its ramp-down tail (about ``ramp_s / 5`` seconds at that rate:
        ``ramp_s`` is when the tail has all but gone), scaled by its weight against the closed
        windows' (:meth:`_relative_weight`). Called once a window, at its close: the window's
        weight joins that mean here."""
        if window.seconds < MIN_GUESS_S and window.measured_s <= 0:
            return None  # shorter than any work a card shows: only the card can say (at settling)
        unshared = max(0.0, window.seconds - window.measured_s - window.lost_s - window.filled_s)
        weight = window.weight
        if weight is not None and weight > 0:
            self._weights.add(weight * window.seconds, window.seconds)
        weighs = self._relative_weight(weight)
        line = self._line.fit()
        if line is not None:
            # What settled windows like it were charged: the rest of its run at the running
            # rate, and what a window gets beyond its run (its ramp-up, if none of it has
            # been reported yet, is in that offset; once some has, its tail is still to come,
            # at least: a job that starts late makes the offset negative, the tail does not).
            run, offset = line
            if offset is None:
                # One rate through the origin, for windows of about one length: what each
                # got beyond its run (its ramp-down tail, no longer than itself) is in the
                # rate. Its running part is the rate x m / (m + their tail), for windows of
                # m seconds; the rest of this one at it, and this one's tail. (The whole
                # rate for the rest, and a tail at it beside, counted the tail twice where
                # part was reported: isolated 30 ms windows' first figures 27-66% high,
                # benchmarks/results/attribution-2026-12-06e.md.)
                length = self._line.mean_s
                theirs = min(self.ramp_s / 5, length) * float(alone)
                guess = run * length / (length + theirs) * (unshared + self._tail(window, alone))
            else:
                if window.share > 0:
                    offset = max(offset, run * self._tail(window, alone))
                guess = max(0.0, run * unshared + offset)
            # The residual's unit is the guess (a millisecond's worth at least).
            return First(window.share, guess * weighs, max(guess, run * MIN_GUESS_S) * weighs,
                         measured_unc, window.filled_s, "the node's prior")
        rate, tail, basis = self.rate(window, alone)
        if rate is None or rate <= 0:
            return None
        rate *= weighs
        # The residual's unit is the guess itself, with at least a quarter period of time
        # in it: a window closing just after a step still waits on how the next one falls.
        return First(
            window.share, rate * (unshared + tail), rate * max(unshared + tail, self.period() / 4),
            measured_unc, window.filled_s, basis,
        )

    def _relative_weight(self, weight: float | None) -> float:
        """How a window's weight stands to the closed windows' mean (within 10x either way):
        a split by tokens gives a window twice as many tokens a second twice the share of a
        span, and the prior's rate is its windows' mean. 1 by time (every weight 1), and
        while either is unknown."""
        mean = self._weights.value
        if weight is None or mean is None or not (weight > 0 and mean > 0):
            return 1.0
        return min(10.0, max(0.1, weight / mean))

    def fill(self, window: Window, alone: bool, *, settling: bool = False) -> Fill | None:
        """The window's time no reading will cover (``filled_s``), at the prior, with the
        same learnt bias and spread as a first figure's guess; None when nothing is known."""
        rate, _, basis = self.rate(window, alone, settling=settling)
        if rate is None or rate <= 0:
            return None
        return self._at(rate, window.filled_s, basis)

    def unread_fill(self, window: Window, alone: bool, in_flight: float = 1.0) -> Fill | None:
        """The time of a window the card did not read from its start (it closed before the
        card's first span, or straddled it), ``in_flight`` windows beside it on the card: at
        what the node's settled windows were charged a second of their time (their ramp-up, a
        job's late start and their tails in it), once SETTLED_MIN that did work have settled;
        else the host's other processes' rate, read for a period; else its own, where the card
        read most of it. Scaled by its weight as a guess is. None before any: it waits. A
        window none of whose time was read is priced whole, its tail in it, the tail's length
        in doubt; what of that tail a reading took is in its share already. (The card's power
        in its first readings was idle by then, its own falling tail, or a foreign load; one
        span's run rate was read before a late job began; the window's own read part was its
        idle end: each filled such windows at 0.00-0.45x their truth, hostile trials.)"""
        read = window.measured_s
        settled = self._prior
        most = 0.0
        if (self._worked_n >= SETTLED_MIN and self._worked.seconds >= self.period()
                and (settled.value or 0.0) > 0):
            rate, basis = settled.value or 0.0, "the node's settled windows"
            most = self._most  # it may have drawn as the hungriest of them did
        elif self._host_rate.seconds >= self.period() and (self._host_rate.value or 0.0) > 0:
            rate, basis = self._host_rate.value or 0.0, "the host's other processes' spans"
        elif read >= max(self.period(), window.seconds / 2) and window.share > 0:
            # Read for most of its time: what it drew there. (Read for a third, its idle end
            # after the work, it filled the rest at 0.09-0.18x: a hostile trial.)
            rate, basis = window.share / read, "the window's own measured rate"
        else:
            return None
        rate *= self._relative_weight(window.weight)
        # A window's share of a card shared by n is about the card's draw over n, and that
        # draw grows with n by anything from nothing to n-fold. A window with fewer beside it
        # than the settled ones had (or more) is priced halfway between, in ratio, and in
        # doubt to either end. (Alone after requests batched eight at a time: 0.22x, outside
        # for 8 of 8, a hostile trial.)
        beside = self._together.value or 1.0
        ratio = max(1.0, beside) / max(1.0, in_flight)
        rate *= math.sqrt(ratio)
        spread_ = max(math.sqrt(ratio), 1 / math.sqrt(ratio)) - 1
        # Requests that did no card work (a 429, a cache hit) beside ones that did make a mean
        # no window drew: the doubt reaches the most one did (ten of them first: 0.005-0.065x,
        # outside for 6 of 8, a hostile trial).
        hungrier = max(0.0, most * math.sqrt(ratio) - rate)
        if window.measured_s > 0:
            fill = self._at(rate, window.filled_s, basis)
            doubt = fill.uncertainty + spread_ * fill.joules + hungrier * window.filled_s
            return Fill(fill.joules, doubt, rate, basis)
        tail = self._tail(window, alone)
        whole = self._at(rate, window.filled_s + tail, basis)
        # Its tail is taken no longer than itself, but a short job's card ramps down as any
        # does: the rest of a full tail is in doubt (a 5 ms window's 4 J tail, unread: 0.45x
        # its truth, outside, in 8 of 8).
        doubt = (whole.uncertainty + spread_ * whole.joules + hungrier * (window.filled_s + tail)
                 + rate * max(0.0, self.ramp_s / 5 * float(alone) - tail))
        return Fill(max(0.0, whole.joules - window.share), doubt, rate, basis)

    def growth_at(self) -> float:
        """How much the measured part's uncertainty grew from close to settling, per unit
        of scale, for COVER of past windows (0 before there are enough)."""
        return self._learnt()[2]

    def bias_spread(self) -> tuple[float, float]:
        """The learnt bias of first figures' interpolated parts (their median residual) and
        the spread about it that covers COVER of them (split conformal)."""
        bias, spread, _ = self._learnt()
        return bias, spread

    def learnt_for(self, first: First) -> tuple[float, float, float]:
        """(bias, spread, growth) for a first figure: from the windows of its class (nothing
        reported at close, or some) where enough of them settled, else from all."""
        group = _group(first)
        ranks = self._granks[group]
        if ranks is None:
            res, gro = self._by[group]
            if not _ranked(res):
                # Too few of its own to rank: the pooled spread. A draining class (a burst's
                # last requests, whose guesses fall low) is as wide as the farthest of its
                # own fell from the pooled bias, and before any, as a cold start's: a fresh
                # server sees a few a burst, and pooled alone covered 90-92% of them against
                # 100% of the rest. (Every class so widened made isolated requests wider than
                # their figure 1% -> 8-12% of the time: the others keep the pooled.)
                bias, spread, growth = self._learnt()
                if group >= 2 and res:
                    spread = max(spread, max(abs(r - bias) for r in res))
                    growth = max(growth, max(gro))
                elif group >= 2:
                    spread = max(spread, COLD_SPREAD)
                ranks = (bias, spread, growth)
            else:
                ranks = (*_bias_spread(res), _rank(gro))
            self._granks[group] = ranks
        return ranks

    def calibrated(self, first: First) -> bool:
        """Whether the spread a first figure gets is a learnt rank (a dozen residuals of its
        class, or of all where its class leans on the pooled), not a cold start's whole guess
        nor a small draining class's farthest residual."""
        group = _group(first)
        return _ranked(self._by[group][0]) or (group < 2 and _ranked(self._residuals))

    def _learnt(self) -> tuple[float, float, float]:
        ranks = self._ranks
        if ranks is None:
            self._ranks = ranks = (*_bias_spread(self._residuals), _rank(self._growth))
        return ranks


#: The largest magnitude a kept state's sums may hold (joules, seconds and their products),
#: and a residual's (in units of its guess): past these a state is nobody's learning.
MOST_SUM = 1e15
MOST_RESIDUAL = 1e3


#: The rates a kept state holds in "rates" (every release reads these).
KEPT_RATES = frozenset({"settled", "span", "run", "host"})


def _sane(state: Any) -> bool:
    """Whether a kept state is one :meth:`Prior.state` could have made: finite numbers within
    bounds, time and weight never negative, at most :data:`RESIDUALS` residuals in a list,
    growth never negative (a hostile trial's 1e308 J over 1e-300 s made an infinite rate)."""
    def number(x: Any, lo: float, hi: float) -> bool:
        return type(x) in (int, float) and lo <= x <= hi

    def values(xs: Any, lo: float) -> bool:
        return type(xs) is list and len(xs) <= RESIDUALS and all(number(x, lo, MOST_RESIDUAL) for x in xs)

    try:
        rates, line = state["rates"], state["line"]
        ok = (state["schema"] == STATE_SCHEMA and type(state["settled"]) is int
              and 0 <= state["settled"] <= 2**53
              and (state["card_w"] is None or number(state["card_w"], 0.0, MOST_SUM))
              and number(state.get("most_w", 0.0), 0.0, MOST_SUM)
              and type(rates) is dict and set(rates) == KEPT_RATES
              and all(type(r) is list and len(r) == 2 and number(r[0], -MOST_SUM, MOST_SUM)
                      and number(r[1], 0.0, MOST_SUM) and (r[1] > 0 or r[0] == 0)
                      for r in (*rates.values(), state.get("together", [0.0, 0.0]),
                                state.get("worked", [0.0, 0.0])))
              and type(line) is list and len(line) == 6 and number(line[0], 0, 2**53)
              and all(number(x, 0.0 if i in (1, 2, 4) else -MOST_SUM, MOST_SUM)  # sw, sx, sxx >= 0
                      for i, x in enumerate(line) if i)
              and values(state["residuals"], -MOST_RESIDUAL) and values(state["growth"], 0.0)
              and type(state["groups"]) is list and len(state["groups"]) == GROUPS
              and all(type(g) is list and len(g) == 2 and values(g[0], -MOST_RESIDUAL) and values(g[1], 0.0)
                      for g in state["groups"]))
    except (KeyError, TypeError, AttributeError):
        return False
    if not ok:
        return False
    # what the sums make must be finite too (1e15 J over 1e-15 s is a rate of 1e30 W)
    ratios = [r[0] / r[1] for r in rates.values() if r[1] > 0]
    return all(abs(x) <= MOST_SUM for x in ratios) and (line[1] == 0 or line[2] / line[1] <= MOST_SUM)


GROUPS = 4
#: A window closes *draining* where the windows open at close, itself counted, are fewer than
#: this share of those it ran beside on average: a burst's last requests, whose unreported
#: part the card draws more for each (a batching card's draw per request falls as the batch
#: grows). Apart, their first figures missed 19.9% of the time (a hostile trial: 16%).
DRAINING = 0.6


def _group(first: First) -> int:
    """A first figure's class: whether anything was reported at close, and whether its
    request closed draining (:data:`DRAINING`)."""
    return 2 * first.draining + (1 if first.reported > 0 else 0)


def _ranked(values: deque[float]) -> bool:
    """Enough values for the conformal rank at COVER (a dozen at 92%)."""
    return math.ceil((len(values) + 1) * COVER) <= len(values)


def _rank(values: deque[float]) -> float:
    rank = math.ceil((len(values) + 1) * COVER)
    return sorted(values)[rank - 1] if rank <= len(values) else 0.0


def _bias_spread(residuals: deque[float]) -> tuple[float, float]:
    n = len(residuals)
    rank = math.ceil((n + 1) * COVER)
    if rank > n:
        return 0.0, COLD_SPREAD
    ordered = sorted(residuals)
    bias = ordered[n // 2]
    # Each |r - bias| made in C (map), not a generator's frame a residual (11 opcodes
    # each): recomputed after every settled window (benchmarks/opcodes.py, 888 a request).
    return bias, sorted(map(abs, map(operator.sub, ordered, repeat(bias))))[rank - 1]


__all__ = ["COLD_SPREAD", "COVER", "DRAINING", "FLOOR", "STATE_SCHEMA", "Fill", "Prior"]
