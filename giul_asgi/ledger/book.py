"""Spans in, shares out: how one node's energy is divided among the windows that used it.

Each span of energy above idle is decided once for the host (:mod:`.decider`: whose windows
are its members, what a foreign or unseen load takes; a :class:`~giul_asgi.spans.CardSpan`),
and each process's book takes its part and divides it among its own windows
(:mod:`.members`), in proportion to their time in it (or by a :class:`~.window.Split`'s
weight, such as tokens per second). A span with no window open is ``unattributed``. Over any
period::

    charged + unattributed == measured above idle        (to float rounding)

The same spans give the *allocated* basis: the idle floor of each span's time with a window
open is shared by the same members and rule (``idle_charged``), the rest is idle with no
window open (``idle_unattributed``), so that over any period::

    charged + idle_charged + unattributed + idle_unattributed == all the card drew

One model makes both figures a window gets. Its **settled** share is the sum of its parts
of the spans it overlapped. Its **first** share, at close, is the same sum over the spans
the card has reported so far, plus the part not reported yet at the node's prior
(:mod:`.prior`). Time no reading will ever cover (before the tape's first step, a gap where
the reader failed) is filled from the same prior, in both figures, and booked apart as
``estimated_j``: it was never measured, so it is outside the identity above.

The decider asks two watches: a load witnessed on the card with no window open
(:mod:`.foreign`), and load nobody on the host can see (:mod:`.unseen`: the upstream's
running requests beyond every window here). Either marks figures ``contended`` (the last
span says so); the first is taken off the spans with ``foreign="subtract"``, the second
always.

No clock, no lock, no I/O: the ledger serialises calls and gives the times.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..energy import Provenance, Share
from ..spans import NOBODY, CardSpan, Counted, Coverage, Gap, Piece, Span
from .decider import Decider
from .doubt import RateDoubt
from .members import Members, Windows
from .phases import SpanSplit, Weighed
from .prior import DRAINING, FLOOR, MIN_GUESS_S, Prior
from .unseen import COUNT_LAG_S, most_at_once
from .window import First, Split, TimeSplit, TokenSplit, Unwatched, Waiting, Window, spread

#: Intervals waiting for an open window's weight: at most this many, for at most this long.
MAX_WAITING = 2_000
MAX_WAIT_S = 10.0
_NOT_REPORTED = "not settled: the card has not reported this window yet"
_UNWATCHED = ("a foreign load nobody could look for yet may be in it (foreign='subtract'): "
              "it settles once one was looked for")
_UNWATCHED_SETTLED = ("charged whole: a foreign load nobody could look for may be in it "
                      "(foreign='subtract'): its doubt is all of that part")
_UNWATCHED_JUDGED = ("part of it shared spans nobody could look for a foreign load in "
                     "(foreign='subtract'): what the level seen after and the node's rate agree "
                     "was foreign is taken off; its doubt is all of that part")


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
    estimated_j: float = 0.0
    #: This book's part of the spans it took, and what of it no window could be charged.
    received_j: float = 0.0
    forfeit_j: float = 0.0
    #: All the card drew in the spans (idle included); the idle floor charged to settled
    #: windows, and to windows not settled yet; the idle floor no window was allocated
    #: (time with none open, a window that could not be measured).
    drawn_j: float = 0.0
    idle_charged_j: float = 0.0
    idle_in_flight_j: float = 0.0
    idle_unattributed_j: float = 0.0
    #: The idle floor of the spans this book took, and what of it no window could be charged
    #: (the allocated basis's received and forfeit, as above idle's).
    idle_received_j: float = 0.0
    idle_forfeit_j: float = 0.0


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
        self.split = split or TimeSplit()
        self.ramp_s = ramp_s
        self.subtract_foreign = subtract_foreign
        self.period = period
        self.measures = measures
        self.error: str | None = None if measures else "no reader for this node"
        #: Why the card is not reporting now (a failing reader, a gap, a reset), until the
        #: next span: first figures made meanwhile are estimates and say so.
        self.trouble: str | None = None
        self.stopped = False  # after shutdown no reading will come: windows settle at close
        #: The card's draw (idle included) in the last span read, and the most it was read at
        #: over a step or so: what a first figure's unreported part is priced between.
        self._draw_w: float | None = None
        self._most_w = 0.0
        self.prior = Prior(ramp_s, period)
        #: The host's view of the card's spans (used where this book decides them).
        self.decider = Decider(ramp_s=ramp_s, subtract_foreign=subtract_foreign, period=period)
        self.windows = Windows(ramp_s)
        #: How far members draw from one rate, for spans shared by time and by the split's
        #: weights where the split does not say its own doubt (the time and token splits):
        #: each model's misses are its own, so each learns apart.
        self._by_time = RateDoubt(ramp_s)
        self._by_weight = RateDoubt(ramp_s)
        self._waiting: deque[Waiting] = deque()
        self._t_end: float | None = None  # where the last booked piece ended
        #: Where the first span read began: a window opened before it was not read from its
        #: start (a fresh card's first readings came after it, or during it).
        self._read_from: float | None = None
        #: What a foreign or unseen load took of the spans this book decided.
        self.external_j = 0.0
        #: The card's books where this book decides alone (:meth:`count`); a book that
        #: takes its part of a shared card keeps only what it received and what became of it.
        self.measured_j = 0.0
        self.charged_j = 0.0
        self.unattributed_j = 0.0
        self.foreign_j = 0.0
        self.estimated_j = 0.0
        #: This book's part of the spans it took, and what of it no window could be charged
        #: (a window that could not be measured, a member gone): the process's own books.
        self.received_j = 0.0
        self.forfeit_j = 0.0
        #: The allocated basis: all the card drew (where this book decides alone), the idle
        #: floor charged to windows, and the floor no window was allocated.
        self.drawn_j = 0.0
        self.idle_charged_j = 0.0
        self.idle_unattributed_j = 0.0
        self.idle_forfeit_j = 0.0
        self.idle_received_j = 0.0
        #: What the last span said of the card's contention: (foreign level, seen recently,
        #: a foreign process in the card's list, an unseen load lately).
        self._contention: tuple[float | None, bool, bool | None, bool] = (None, False, None, False)
        self.lost_s = 0.0
        self._busy_booked = 0.0
        self._time_booked = 0.0

    @property
    def split(self) -> Split:
        """How overlapping windows share a span (the node's rule)."""
        return self._split

    @split.setter
    def split(self, split: Split) -> None:
        self._split = split
        # The same split where its weights depend on where time falls in a span, else None:
        # asked per close and per span, and a runtime Protocol's isinstance costs microseconds
        # (py-spy: 4% of a JSON request's share on the loop).
        self._spans: SpanSplit | None = split if isinstance(split, SpanSplit) else None

    # -- windows ------------------------------------------------------------------------
    def enter(self, window: Window) -> Window:
        """A window the request path opened joins the book (the ledger's tray hands it on).
        Time it had before the last piece booked (its open was stamped, then the reader
        booked a reading before the window reached the tray) is not measured for it: filled."""
        self.windows.enter(window)
        if self.split.known_at_open:
            window.weight = 1.0
        end = self._t_end
        if end is not None and window.t_open < end:
            window.filled_s += end - window.t_open
        return window

    def open_windows(self) -> list[Window]:
        """The windows open now."""
        return list(self.windows.open.values())

    def mark(self, window: Window, name: str, t: float) -> list[Window]:
        """Mark a stage's end; returns the windows this settles: a mark may fix the window's
        weight (the phase split's ``prefill``), and the spans that waited only for it are shared."""
        if window.t_close is not None:
            return []
        if window.marks is None or window.stage_shares is None:
            window.marks, window.stage_shares = [], [window.share]
        window.marks.append((name, t))
        window.stage_shares.append(0.0)
        settled: list[Window] = []
        if window.weight is None and not self.split.known_at_open:
            window.weight = self.split.weight(window)
            if window.weight is not None and window.waits_on:
                self._release(settled, window)
        return settled

    def close(
        self, window: Window, t: float, tokens: int | None = None,
        usage: tuple[int, int] | None = None,
    ) -> list[Window]:
        """Close the window (``usage``: its prompt and completion tokens, where known);
        returns the windows this settles (spans that waited on it)."""
        if not self.windows.shut(window, t):
            return []
        window.tokens = tokens
        window.usage = usage
        if not self.split.known_at_open:
            window.weight = self.split.weight(window)
        settled: list[Window] = []
        if window.waits_on:  # spans that waited only for its weight are shared first
            self._release(settled, window)
        if not self.measures:
            window.error = self.error
            window.seen_end = True
            window.first = First(window.share, 0.0, 0.0)
        else:
            # Its ramp-down tail is to come, whoever's time it falls in: on a busy card the
            # others' tails fall in its time as much, on average (until settled windows tell).
            self._price(window)
            # The prior's First is this window's own, made now: completed in place (two
            # dataclasses.replace calls cost a close 2-3 us: benchmarks/results/first_in_place-2026-12-07.md).
            first = window.first = self.prior.first_guess(window, True, _measured_unc(window))
            if first is not None and self._spans is None:
                ahead = self._ahead(window, first.guess)
                if ahead > 0:
                    first.unc = _measured_unc(window, ahead)
            if first is not None and (self.windows.n + 1) < DRAINING * (window.concurrency or 1.0):
                first.draining = True
            spans = self._spans
            if first is not None and spans is not None:
                window.first = spans.first(window, first)
        if self.stopped:
            self._settle_uncovered(window, settled)
        self._try_settle(window, settled)
        if window.settled:
            self.windows.closing.remove(window)
        return settled

    def abandon(self, window: Window, t: float) -> list[Window]:
        """Close a window whose figure nobody will read (a re-bound request)."""
        window.abandoned = True
        return self.close(window, t)

    # -- pieces from the tape -------------------------------------------------------------
    @property
    def unsettled(self) -> bool:
        """Closed windows still waiting on the card (read without the lock: a list's length)."""
        return bool(self.windows.closing)

    def book(self, piece: Piece, now: float) -> list[Window]:
        """A card this book is alone on: decide each span for itself (nobody else's windows)
        and take it whole. Returns the windows settled."""
        if isinstance(piece, Span):
            span = self.decide(piece)
            self.count(span)
            return self.take(span, now, span.covered)
        return self.take(piece, now, 0.0)

    def count(self, span: CardSpan) -> None:
        """Book what the host's windows did not take of ``span`` as this book's own (the
        card is this book's alone: its books are the card's)."""
        self.measured_j += span.measured_j
        self.unattributed_j += span.unattributed_j
        self.drawn_j += span.total_j
        self.idle_unattributed_j += span.idle_unattributed_j
        self.foreign_j += span.external_j
        self.external_j += span.external_j

    def take(self, piece: CardSpan | Gap, now: float, mine: float) -> list[Window]:
        """Take this book's part of one piece of the card (``mine``: the window-seconds the
        decider counted for this book's windows); a gap is filled by each window in it.
        Returns the windows settled."""
        settled: list[Window] = []
        end = self._t_end
        if end is None:
            self._before_start(piece.t0)
        elif piece.t0 > end + 1e-9:
            self._gap(Gap(end, piece.t0, "no reading covered this time"), settled)
        if isinstance(piece, Gap):
            self._gap(piece, settled)
        else:
            self.trouble = None
            if self._read_from is None:
                self._read_from = piece.t0
            self._span(piece, mine, settled)
        self._t_end = piece.t1
        self._see_ends(piece.t1, settled)
        self._expire_waiting(now, settled)
        return settled

    def note_trouble(self, why: str) -> None:
        """The reader failed: until the next span, first figures are estimates that say why."""
        self.trouble = why

    def coverage(self, t0: float, t1: float) -> Coverage:
        """This book's windows' time in (t0, t1] (what a decider adds up for the host)."""
        return self.windows.coverage(t0, t1)

    def _before_start(self, t: float) -> None:
        """Windows opened before the tape's first piece: no reading will cover that time,
        so it is filled from the prior."""
        for window in self.windows.unsettled():
            end = t if window.t_close is None else min(window.t_close, t)
            if end > window.t_open:
                window.filled_s += end - window.t_open

    def _gap(self, gap: Gap, settled: list[Window]) -> None:
        """Time whose energy is unknown: each window in it fills its part from the prior
        (a closed window's ramp-down tail, about a fifth of its time, at its rate)."""
        self.lost_s += gap.t1 - gap.t0
        members, tails = self.windows.members(gap.t0, gap.t1)
        for window, overlap in members:
            window.filled_s += overlap / 5 if tails else overlap
            if gap.fault:
                window.trouble = gap.why
        if gap.fault:
            self.trouble = gap.why

    def decide(self, span: Span, others: Coverage = NOBODY) -> CardSpan:
        """What the host's windows share of ``span``: this book's windows and ``others``
        (every other process's on the card). Made once per span, by the process that reads
        the card (:class:`~.decider.Decider`)."""
        return self.decider.decide(span, self.coverage(span.t0, span.t1) + others,
                                   self.provenance.idle_watts)

    def _span(self, span: CardSpan, mine: float, settled: list[Window]) -> None:
        self._contention = (span.level, span.level_recent, span.processes_foreign, span.unseen_recent)
        seconds = span.seconds
        if seconds > 0:
            self._draw_w = draw = span.total_j / seconds
            if seconds >= 0.5 * self.prior.period() and draw > self._most_w:
                self._most_w = draw  # a span of a step's length or so: a stamp's jitter is small in it
        if span.covered <= 0:
            if seconds > 0:
                self.prior.learn_card(span.measured_j / seconds)
            return
        windows = self.windows
        members = windows.tails(span.t0, span.t1) if span.tails else windows.overlapping(span.t0, span.t1)
        if (not members or mine <= 0) and not span.tails and not span.unwatched:
            # Only other processes' windows were in it (as the decider counted): their rate.
            self.prior.learn_host(span.part(span.covered - mine), span.covered - mine)
        if not members:
            if mine > 0:  # the decider saw windows of ours that have gone (abandoned)
                part = span.part(mine)
                idle = span.idle_part(mine)
                self.received_j += part
                self.forfeit_j += part
                self.idle_received_j += idle
                self.idle_forfeit_j += idle
            return
        if mine <= 0:
            # The decider had not seen these windows yet (opened just before it read the
            # card): their time in this span is not measured for them, but filled.
            if not span.tails:
                for window, overlap in members:
                    window.filled_s += overlap
            return
        above = span.part(mine)
        idle = span.idle_part(mine)
        self.received_j += above
        self.idle_received_j += idle
        covered = sum(overlap for _, overlap in members)
        self._busy_booked += covered
        self._time_booked += seconds
        if not span.tails and not span.unwatched:
            # The rate of the span, per window-second of members on the host (what this book
            # was given for its own window-seconds, as the decider counted them).
            self.prior.learn_span(above / mine, covered, seconds, members, span.t1)
        open_members = 0
        if not self.split.known_at_open:
            open_members = sum(1 for w, _ in members if w.weight is None and w.t_close is None)
        if not open_members:
            self._share(span, above, idle, members, by_time=False)
            return
        # A split by weights known only at close: the span waits for its open windows.
        waiting = Waiting(span, above, members, open_members, idle=idle)
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
        return self.windows.load_at(t)

    def note_upstream(self, t: float, running: float, others: Counted = (0, []),
                      spread_s: float = 0.0, waiting: float = 0.0) -> None:
        """The upstream's running requests, counted within ``t`` +- ``spread_s`` (its whole
        load: ours, ``others`` of other processes on the card, and what nobody here sees),
        beside ``waiting`` it holds queued: as many of the windows surely in it may be those."""
        surely, maybe = self.windows.ours_at(t, spread_s, COUNT_LAG_S)
        surely += others[0]
        maybe += others[1]
        queued = min(surely, int(waiting))  # the ledger's: finite, 0 or more
        if queued:  # a window of ours may be queued all through the count, not running
            surely -= queued
            maybe += [(t - spread_s - COUNT_LAG_S, t + spread_s)] * queued
        self.decider.note_upstream(t, running, surely, most_at_once(maybe))

    def _share(
        self, span: CardSpan, above: float, idle_j: float, members: Members, *, by_time: bool,
    ) -> None:
        weights, rule, doubts = self._weights(span, above, members, by_time=by_time)
        units: list[tuple[float, float]] | None = None
        if doubts is None:  # a split that does not say its own: how far members drew from it
            units = (self._by_time if weights is None else self._by_weight).units(
                span, members, weights, above)
        at = 0 if weights is None else 2  # where a member's units of this learner add up
        total = sum(weights) if weights is not None else sum(overlap for _, overlap in members)
        seconds = span.seconds
        idle = self.provenance.idle_watts
        # Energy in the part of the span no window (of any process) covered may or may not
        # be theirs: half of it is each window's edge ambiguity, where a neighbour's
        # ramp-down could be in it or nobody has looked at the card between windows. Where
        # the card has been seen quiet (the decider says), only the witnessed level's own
        # doubt remains there.
        uncovered = max(0.0, 1.0 - span.covered / seconds) if seconds > 0 else 0.0
        uncovered_j = 0.0
        if span.quiet:
            uncovered_j = span.doubt_w * uncovered * seconds
            uncovered = 0.0
        # The card's own doubts (its step stamps, its reading, a subtracted foreign level)
        # fall on every member on the host: this book's windows carry their part of them.
        mine = span.fraction_of(above)
        per_stamp = 2 * span.stamp_s * (abs(span.above_j) / seconds + (idle or 0.0)) * mine \
            if seconds > 0 else 0.0
        foreign_unc = span.foreign_unc_w * seconds * mine
        uncovered_j *= mine
        # Asked to take a foreign load off but none could be looked for yet (no quiet time
        # seen): all of the span may be one.
        unwatched = span.unwatched
        shared = span.members > 1 or span.unseen > 0  # load nobody here sees shares it too
        tails = span.tails
        for i, (window, overlap) in enumerate(members):
            part = (overlap if weights is None else weights[i]) / total
            share = above * part
            window.share += share
            window.idle_share += idle_j * part
            if not tails and seconds > 0:
                window.power_j += span.total_j * (overlap / seconds)
                window.measured_s += overlap
                window.host_busy_s += span.covered / seconds * overlap
            edge = overlap < seconds * (1 - 1e-9)
            if edge:
                if span.quiet:
                    window.linear_unc += uncovered_j * part
                window.edge_sq += (0.5 * abs(share) * uncovered) ** 2
                window.linear_unc += per_stamp * part
                if shared:
                    # Where windows come and go in a shared span, a closing window's tail
                    # goes to the others, and theirs to it: about ramp_s / 5 at its rate.
                    window.edge_sq += (abs(share) / overlap * self.ramp_s / 5) ** 2
            window.linear_unc += span.unc_j * mine * part
            if doubts is not None:  # what the split itself cannot know of this share
                rates_j, own_j, others_sq = doubts[i]
                window.split_lin += rates_j
                window.split_own += own_j
                window.split_sq += others_sq
            elif units is not None:
                own_u, others_u = units[i]
                if own_u or others_u:
                    summed = window.rate_units
                    if summed is None:
                        summed = window.rate_units = [0.0, 0.0, 0.0, 0.0]
                    summed[at] += own_u
                    summed[at + 1] += others_u
            if unwatched:
                window.linear_unc += abs(share)
                seen = window.unwatched
                if seen is None:
                    seen = window.unwatched = Unwatched()
                seen.joules += share
                seen.card_s += seconds * mine * part
                if tails:
                    seen.tail = True
                else:
                    seen.seconds += overlap
                if span.unseen:
                    seen.unseen = True
            else:
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
                spread(window, start, start + overlap, share, window.stage_shares)

    def _price(self, window: Window) -> None:
        """The window's time and token split doubt in joules, at the spreads learnt so far."""
        units = window.rate_units
        if units is None:
            return
        by_time, by_weight = self._by_time.quantile(), self._by_weight.quantile()
        window.rate_own = by_time * units[0] + by_weight * units[2]
        window.rate_lin = by_time * units[1] + by_weight * units[3]

    def _ahead(self, window: Window, guess: float) -> float:
        """The time or token split's doubt of the part of a closing window not shared yet
        (``guess`` joules of it): its own deviation goes on in it, beside as many windows as
        it mostly ran with or are open now. Without it, that part's doubt reached the first
        figure only through the prior's learnt growth, whose cold start's ranks stay."""
        members = max(self.windows.n + 1, window.concurrency or 1.0)
        if members <= 1 or guess <= 0:
            return 0.0
        doubt = self._by_time if self.split.known_at_open else self._by_weight
        return doubt.quantile() * guess * (1 - 1 / members)

    def _weights(
        self, span: CardSpan, above: float, members: Members, *, by_time: bool,
    ) -> Weighed:
        """Each member's weight in ``span`` (None: by its time in it), the rule's name, and
        each member's doubt from the split (None: none said)."""
        split, spans = self.split, self._spans
        if by_time:
            doubts = spans.time_doubts(span, members, above) if spans is not None else None
            return Weighed(None, "time", doubts)
        if split.known_at_open:
            return Weighed(None, split.name)
        if spans is not None:
            weighed = spans.weigh(span, members, above)
            if weighed.weights is None or sum(weighed.weights) > 0:
                return weighed
            return Weighed(None, "time", spans.time_doubts(span, members, above))
        known = [w.weight for w, _ in members]
        if all(k is not None and k > 0 for k in known):
            return Weighed([k * overlap for k, (_, overlap) in zip(known, members, strict=True)],  # type: ignore[operator]
                           split.name)
        return Weighed(None, "time")  # a weight is unknown (no tokens): this span by time

    def _resolve(self, waiting: Waiting, settled: list[Window], *, by_time: bool) -> None:
        if waiting.done:
            return
        waiting.done = True
        for window, _ in waiting.members:
            window.waiting -= 1
        self._share(waiting.span, waiting.above, waiting.idle, waiting.members, by_time=by_time)
        for window, _ in waiting.members:
            self._try_settle(window, settled)

    def _release(self, settled: list[Window], closed: Window) -> None:
        """A window's weight is known (at its close, or a mark that fixed it): spans that
        waited only for it can be shared."""
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
        learnt_at = self.prior.learnt_at
        for window in self.windows.ended(t):
            closed = window.t_close
            if window.tried_at == learnt_at and closed is not None and t - closed < MAX_WAIT_S:
                continue  # waits for a rate, and nothing was learnt since it looked
            window.seen_end = True
            self._try_settle(window, settled)
        self.windows.drop_settled()

    def _try_settle(self, window: Window, settled: list[Window]) -> None:
        if window.settled or window.t_close is None or not window.seen_end or window.waiting:
            return
        unwatched = window.unwatched
        if unwatched is not None and not unwatched.seen and self._unwatched_waits(window, unwatched):
            return
        measures = self.measures and not window.abandoned and window.lost_s <= 0
        if measures and window.filled_s > 0:
            end = self._t_end if self._t_end is not None else window.t_close
            waits = window.trouble is None and not self.stopped and end - window.t_close < MAX_WAIT_S
            if self._cold(window):
                # The card's power in its first readings is no rate for a window that worked
                # before them: idle by then (or its own tail, or another's load), it filled a
                # fresh process's first 100 ms window, `measured` at 0.05-0.5x its truth,
                # outside its uncertainty in 4 seeds of 6. It waits for what the node's
                # settled windows teach (Prior.unread_fill), 10 s at most.
                window.tried_at = -1
                fill = self.prior.unread_fill(window, window.alone, _in_flight(window) or 1.0)
                if fill is None and waits:
                    window.tried_at = self.prior.learnt_at  # looked again once it changes
                    return
            else:
                fill = self.prior.fill(window, window.alone, settling=True)
            if fill is None:
                if waits:
                    return  # a cold start, nothing learnt yet to fill it from: wait for a rate
                window.lost_s = window.filled_s
                read = window.measured_s
                window.error = window.trouble or (
                    f"the card was read for {read * 1000:.0f} ms of its {window.seconds * 1000:.0f} ms "
                    "and nothing was learnt to fill the rest from" if read > 0
                    else "no reading covered this window")
                measures = False
            else:
                window.fill_j, window.fill_unc, window.basis = fill.joules, fill.uncertainty, fill.basis
        self._price(window)
        window.settled = True
        if not measures or window.share + window.fill_j <= 0:
            self.forfeit_j += window.share
            self.idle_forfeit_j += window.idle_share
        else:
            self.charged_j += window.share
            self.idle_charged_j += window.idle_share
            self.estimated_j += window.fill_j
            if window.filled_s <= 0 and not window.unwatched:
                self.prior.learn_settled(window, _measured_unc(window), _in_flight(window) or 1.0)
        settled.append(window)

    def _cold(self, window: Window) -> bool:
        """Whether the window began before the card's first span was read, with no fault (a
        reader failing from the start fills from what the node learnt, a kept prior too) and
        doing work (a window shorter than any work a card shows settles on the card's power)."""
        start = self._read_from
        return ((start is None or window.t_open < start) and window.trouble is None
                and window.seconds >= MIN_GUESS_S)

    def _unwatched_waits(self, window: Window, unwatched: Unwatched) -> bool:
        """Whether a window charged spans nobody could look for a foreign load in waits. A
        fresh process's first windows under a steady 150 W foreign load settled at 2.3-2.8x
        their truth (benchmarks/results/foreign_late-2026-12-07.md). Once the card has been
        looked at (a level witnessed) and the node knows what its windows draw a second, it
        settles with what both say was foreign taken off (:meth:`_take_foreign`). It waits at
        most ``MAX_WAIT_S`` after its close, and never more than ``MAX_WAITING`` windows:
        then it settles charged whole, and says so."""
        if unwatched.unseen:
            return False  # load nobody here sees was in them: no level is taken off such spans
        level = self._contention[0]
        if level is not None:
            own = self.prior.drawn(window, unwatched.seconds, unwatched.tail)
            if own is not None:
                self._take_foreign(window, unwatched, level, own.joules)
                return False
        assert window.t_close is not None
        end = self._t_end if self._t_end is not None else window.t_close
        return (not self.stopped and end - window.t_close < MAX_WAIT_S
                and len(self.windows.closing) <= MAX_WAITING)

    def _take_foreign(self, window: Window, unwatched: Unwatched, level: float, own: float) -> None:
        """Take off the window's share of the unwatched spans only what both witnesses say
        was foreign: no more than the level seen after them over its part of their time, and
        no more than what is left beyond ``own`` (what it would have drawn there at the node's
        learnt rate). Neither alone holds (two hostile trials, 2026-12-07): a level seen after
        the spans took a load that began later off windows that had none of it under them
        (0.17x their truth); the learnt rate alone took a heavy window's own draw off it where
        there was no foreign load at all (0.30x), or judged it from one light window or a kept
        prior of another workload (0.06-0.67x). Whatever is taken, the truth lies between none
        and all of that share being foreign: its doubt stays all of it. Its stages keep their
        proportions. What is taken goes to ``forfeit``, as a foreign load."""
        blind = max(unwatched.joules, 0.0)
        taken = max(0.0, min(level * unwatched.card_s, blind - own))  # own >= 0: never past blind
        before = window.share
        window.share -= taken
        stages = window.stage_shares
        if stages is not None and taken > 0 and before > 0:
            kept = max(window.share, 0.0) / before
            window.stage_shares = [value * kept for value in stages]
        self.forfeit_j += taken
        self.foreign_j += taken
        unwatched.seen = True

    # -- contention -----------------------------------------------------------------------
    def contended(self) -> tuple[bool | None, float | None]:
        """(contended, foreign watts) as the last span said: ``None`` when nobody could look."""
        level, level_recent, processes_foreign, unseen_recent = self._contention
        by_power: bool | None = None
        if level is not None and level_recent:
            by_power = level > 0
        by_process = processes_foreign
        if unseen_recent:
            by_process = True  # the upstream serves load nobody on the host saw
        if by_power is None and by_process is None:
            return None, None
        contended = bool(by_power) or bool(by_process)
        return contended, (level if level else None) if by_power is not None else None

    def note_processes(self, foreign: bool | None) -> None:
        """What the card's process list says: a process other than the node's server."""
        self.decider.processes_foreign = foreign
        level, level_recent, _, unseen_recent = self._contention
        self._contention = (level, level_recent, foreign, unseen_recent)

    # -- answers --------------------------------------------------------------------------
    def share(self, window: Window) -> Share:
        """The window's share now: settled, or first (with the unreported part filled)."""
        settled = window.settled
        joules: float | None = None
        uncertainty = interpolated = 0.0
        idle: float | None = None
        error, trouble, basis = window.error, window.trouble, None
        if not self.measures or window.lost_s > 0:
            error, trouble = error or self.error, None
        elif settled:
            joules, interpolated, basis = window.share + window.fill_j, window.fill_j, window.basis
            if window.filled_s > 0 and window.measured_s <= 0:
                interpolated = joules  # none of its own time was read, only (part of) its tail
            uncertainty = _measured_unc(window) + window.fill_unc
            idle = window.idle_share + self._idle_guess(window, window.filled_s)
        else:
            trouble = trouble or self.trouble
            first = window.first
            if first is None:
                error = error or trouble or _NOT_REPORTED
            else:
                joules, uncertainty, interpolated, idle = self._first(window, first)
                basis = first.basis
                if window.unwatched is not None and not window.unwatched.seen:
                    error = error or _UNWATCHED
        if settled and window.unwatched is not None:
            error = error or (_UNWATCHED_JUDGED if window.unwatched.seen else _UNWATCHED_SETTLED)
        contended, foreign_w = self.contended()
        mean_watts = window.power_j / window.measured_s if window.measured_s > 0 else None
        if not settled and joules is not None:
            mean_watts = self._first_watts(window, joules, idle)
        # One construction: a dict of the common fields and ** was a third of the share's
        # cost (see the commit).
        return Share(
            joules, uncertainty, interpolated, settled, self.provenance, window.seconds,
            mean_watts=mean_watts,
            concurrency=_in_flight(window), split=window.rules or "exclusive",
            contended=contended, foreign_watts=foreign_w, error=error, trouble=trouble,
            basis=basis, idle_joules=idle,
        )

    def _first(self, window: Window, first: First) -> tuple[float, float, float, float]:
        """A first figure's (joules, uncertainty, interpolated, idle joules): the reported
        share, the filled part, and what of the guess neither has taken yet."""
        bias, spread_, growth = self.prior.learnt_for(first)
        # The spans still to come will add their own doubt to the settled figure (a shared
        # last span, an edge): as much as it grew for COVER of the windows settled before.
        measured_unc = max(_measured_unc(window), first.unc + growth * first.scale)
        guess = max(0.0, first.guess + bias * first.scale)
        # What has been reported (or found unreportable) since close belongs to the same
        # part: the figure is the reported share, the filled part, and what of the guess
        # neither has taken yet.
        reported_since = max(0.0, window.share - first.reported)
        fill_j = fill_unc = taken = 0.0
        if window.filled_s > 0:
            fill = self.prior.fill(window, window.alone)
            if fill is not None:
                fill_j, fill_unc = fill.joules, fill.uncertainty
                taken = fill.rate * max(0.0, window.filled_s - first.filled)
        left = max(0.0, guess - reported_since - taken)
        # The idle floor of the time not reported yet (after the last span) and of the time
        # no reading covers: the window's part of it, as if the windows in flight shared it.
        booked = self._t_end if self._t_end is not None else window.t_open
        assert window.t_close is not None
        unreported = max(0.0, window.t_close - max(window.t_open, booked))
        # The measured part's doubt (the card's edges) and the guess's (how far the prior's
        # guesses fell) are independent: once the spread is a learnt rank, in quadrature
        # (added, first figures covered their settled ones 99-100% under steady load at up
        # to twice the width they needed); before, added (a cold spread is no quantile, and
        # in quadrature a fresh process's early figures fell outside: a suite run's 3.28 J
        # off against 2.78 +- 0.5).
        interpolated_unc = spread_ * first.scale + FLOOR * guess + fill_unc
        unc = (math.hypot(measured_unc, interpolated_unc) if self.prior.calibrated(first)
               else measured_unc + interpolated_unc)
        return (window.share + fill_j + left, unc, fill_j + left,
                window.idle_share + self._idle_guess(window, window.filled_s + unreported))

    def _first_watts(self, window: Window, joules: float, idle: float | None) -> float | None:
        """The card's mean draw over a window not yet reported whole: the reported part as
        measured; the rest at what its first figure implies (what it is charged there, idle
        share included, times the windows in flight), but no more than the card has been
        read drawing and no less than it drew in the last span read.

        The reported part alone was a ramp's start (a stranger's trial read 0.32-0.45x the
        settled mean, and None for a window no reading had reached yet); the implied draw
        alone read 1.06-1.4x high under steady load (the charge holds a ramp-down tail) and
        2,400-20,000 W on a 700 W card in a burst (a hostile trial); the last span's alone
        read the idle floor for requests that began after it (the same stranger's case)."""
        seconds = window.seconds
        rest_s = seconds - window.measured_s
        level = self._draw_w
        if seconds <= 0 or rest_s <= 1e-9 * seconds or level is None:
            return window.power_j / window.measured_s if window.measured_s > 0 else None
        rest_j = max(0.0, joules - window.share) + max(0.0, (idle or 0.0) - window.idle_share)
        implied = rest_j * max(1.0, _in_flight(window) or 1.0) / rest_s
        rest_w = max(level, min(implied, self._most_w))
        return (window.power_j + rest_w * rest_s) / seconds

    def _idle_guess(self, window: Window, seconds: float) -> float:
        """The idle floor of ``seconds`` of the window that no span has shared: idle_w x the
        time over the windows in flight beside it (this book's, on average)."""
        idle_w = self.provenance.idle_watts
        if not idle_w or seconds <= 0:
            return 0.0
        return idle_w * seconds / max(1.0, _in_flight(window) or 1.0)

    def stage_values(self, window: Window) -> list[float] | None:
        """The window's share per stage (then the tail after the last mark)."""
        if window.stage_shares is None:
            return None
        values = list(window.stage_shares)
        if window.t_close is None or window.marks is None:
            return values
        if window.settled:
            if window.fill_j > 0:  # where the filled time fell is unknown: by time
                spread(window, window.t_open, window.t_close, window.fill_j, values)
            return values
        share = self.share(window)
        extra = (share.joules or 0.0) - window.share
        if extra > 0:
            start = max(window.t_open, self._t_end if self._t_end is not None else window.t_open)
            spread(window, start, window.t_close, extra, values)
        return values

    def force_settle(self) -> list[Window]:
        """Settle every closed window now (shutdown): waiting spans by time, and whatever
        the tape never covered booked as lost, since no reading will cover it."""
        settled: list[Window] = []
        while self._waiting:
            self._resolve(self._waiting.popleft(), settled, by_time=True)
        self.stopped = True
        for window in list(self.windows.closing):
            self._settle_uncovered(window, settled)
        self.windows.closing = []
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
        unsettled: dict[int, Window] = {id(w): w for w in self.windows.unsettled()}
        waiting = 0.0
        for item in self._waiting:
            if item.done:
                continue
            waiting += item.above
            for window, _ in item.members:
                unsettled[id(window)] = window
        in_flight = waiting + sum(w.share for w in unsettled.values() if not w.settled)
        idle_waiting = sum(item.idle for item in self._waiting if not item.done)
        idle_in_flight = idle_waiting + sum(w.idle_share for w in unsettled.values() if not w.settled)
        contended, foreign_w = self.contended()
        return BookTotals(
            measured_j=self.measured_j, charged_j=self.charged_j,
            unattributed_j=self.unattributed_j + self.forfeit_j, foreign_j=self.foreign_j,
            in_flight_j=in_flight, lost_s=self.lost_s, windows_open=self.windows.n,
            foreign_watts=foreign_w, contended=contended,
            mean_concurrency=self._busy_booked / self._time_booked if self._time_booked else None,
            estimated_j=self.estimated_j, received_j=self.received_j, forfeit_j=self.forfeit_j,
            drawn_j=self.drawn_j, idle_charged_j=self.idle_charged_j, idle_in_flight_j=idle_in_flight,
            idle_unattributed_j=self.idle_unattributed_j + self.idle_forfeit_j,
            idle_received_j=self.idle_received_j, idle_forfeit_j=self.idle_forfeit_j,
        )


def _in_flight(window: Window) -> float | None:
    """The windows in flight on the card beside this one, on average over it: the host's
    (every worker's, from the spans read: each span's window-seconds over its length) where
    a reading has covered some of it, else this book's own. A worker's own count alone read
    1.0-1.98 for three requests on two workers (a stranger's trial)."""
    local = window.concurrency
    if local is None or window.measured_s <= 0:
        return local
    return max(local, window.host_busy_s / window.measured_s)


def _measured_unc(window: Window, ahead: float = 0.0) -> float:
    """The measured part's own doubt: edges in quadrature, stamps and levels added; the
    split's own doubt, independent of the card's, in quadrature with them (``ahead``: the
    time or token split's doubt of the part not shared yet, the same deviation's)."""
    card = math.sqrt(window.edge_sq) + window.linear_unc
    lin, own = window.split_lin + window.rate_lin, window.split_own + window.rate_own + ahead
    if not (lin or own or window.split_sq):
        return card
    return math.sqrt(card * card + lin * lin + own * own + window.split_sq)


__all__ = ["MAX_WAIT_S", "Book", "BookTotals", "Split", "TimeSplit", "TokenSplit", "Window"]
