"""What a span of the card is for the whole host, decided once by the process that reads it.

A card drawing above idle with no window on it, once a ramp-down after the last window has
passed, carries a load nobody on the host asked for (:mod:`.foreign`); the upstream may run
requests nobody here sees (:mod:`.unseen`); the card's process list may show a foreign
process. Given every process's windows' time in a span (a
:class:`~giul_asgi.spans.Coverage`), the decider says what the host's windows share of it: a
:class:`~giul_asgi.spans.CardSpan`, taken by every process for its own windows. A process
alone on its card decides with nobody else's coverage. No clock, no lock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from ..spans import CardSpan, Coverage, Span, union_s
from .foreign import ForeignWatch
from .unseen import Unseen

#: The least time a window's span read below the floor stays a debt (a counter period where
#: that is longer): a host node's readings step every 10 ms with the CPU's, its card's every
#: 100 ms, and the windows' share of the card's step repays the CPU readings' before it.
DEBT_S = 0.12


class Decider:
    """The host's view of one card's spans: the foreign watch, the unseen load, the card's
    process list."""

    def __init__(self, *, ramp_s: float, subtract_foreign: bool, period: Callable[[], float]) -> None:
        self.ramp_s = ramp_s
        self.subtract_foreign = subtract_foreign
        self.period = period
        self.foreign = ForeignWatch()
        self.unseen = Unseen()
        #: Energy below the idle floor in spans no window was in, not yet netted (<= 0).
        self._below = 0.0
        #: The same in spans windows were in, as ``[t1, joules < 0]``, oldest first: repaid by
        #: the next spans, with windows or without, for a counter period, then dropped.
        self._debts: deque[list[float]] = deque()
        #: The card's process list showed a process other than the node's server (None:
        #: nobody could look).
        self.processes_foreign: bool | None = None
        #: A quiet span not witnessed yet: the next span says whether a window opened within
        #: its step's doubt after it (a stamp too early puts a window's ramp-up in it).
        self._held: tuple[Span, float | None] | None = None

    def decide(self, span: Span, host: Coverage, idle_w: float | None) -> CardSpan:
        """What the host's windows (``host``: every process's coverage of the span) share of
        ``span``, after a witnessed foreign load and load nobody here sees."""
        tails = host.open_s <= 0 < host.tail_s
        covered = host.by(tails)
        period = self.period()
        above = span.above_j
        seconds = span.seconds
        unseen = unseen_doubt = 0.0
        foreign_j = 0.0
        measured = span.above_j
        self._witness_held(host)
        if covered <= 0:
            # Quiet only where the span's start, to its step's doubt, is a ramp-down past the
            # last close (a late stamp must not make a window's energy a foreign load), and
            # its end, to its step's doubt, before the next open: held until the next span.
            if span.t0 - span.stamp_s >= host.last_close + self.ramp_s:
                self._held = (span, idle_w)
            measured = above = self._net_below(span, period)
        else:
            measured = above = self._net_below_windows(span, period)
            # Load nobody on the host sees (the upstream's requests beyond every window here)
            # draws its part of the span like a window would.
            unseen = self.unseen.window_seconds(span.t0, span.t1)
            unseen_doubt = self.unseen.doubt_seconds(span.t0, span.t1)
        level = self.foreign.level(period, idle_w)
        if covered > 0 and level is not None and self.subtract_foreign and not unseen:
            foreign_j = min(max(above, 0.0), level * seconds)
            above -= foreign_j
        doubt_w = self.foreign.doubt_w() if level is not None else 0.0
        foreign_unc_w = 0.0
        if self.subtract_foreign and level is not None:
            # The level taken off windows' spans is a mean of looks, as old as the last: how
            # far that look strayed from it, and what the load may have done since, add to
            # the doubt of the level itself.
            moved = 0.0
            if covered > 0 and seconds > 0:  # measured is netted: never below zero here
                moved = self.foreign.moved_w((span.t0 + span.t1) / 2, level, measured / seconds)
            foreign_unc_w = math.hypot(doubt_w, moved)
        if unseen_doubt > 0 and seconds > 0:
            # The host's part is covered / (covered + unseen) of the span: off by as much as
            # the unseen window-seconds may be, in the card's watts.
            unseen_w = max(measured, 0.0) / seconds * unseen_doubt / (covered + unseen)
            foreign_unc_w = math.hypot(foreign_unc_w, unseen_w)
        return CardSpan(
            span.t0, span.t1, above, span.total_j, span.stamp_s, span.unc_j, measured,
            tails=tails, covered=covered, members=host.tail_n if tails else host.open_n,
            unseen=unseen, foreign_j=foreign_j,
            # Energy in the part no window covered may be a neighbour's ramp-down, unless the
            # card was seen quiet and no window closed within a ramp-down before the span.
            quiet=level is not None and host.last_close <= span.t0 - self.ramp_s,
            doubt_w=doubt_w, foreign_unc_w=foreign_unc_w,
            unwatched=self.subtract_foreign and level is None,
            level=level, level_recent=self.foreign.recent(span.t1),
            processes_foreign=self.processes_foreign, unseen_recent=self.unseen.recent(span.t1),
            period=period, busy_s=0.0 if tails else min(seconds, union_s(host.busy)),
        )

    def _witness_held(self, host: Coverage) -> None:
        """Witness the quiet span held back, unless a window of the next span (``host``:
        its coverage) opened within the held span's step doubt after its end: a burst from
        idle whose first step was stamped early read as a foreign load of hundreds of watts,
        and flagged every window of it contended."""
        held = self._held
        if held is None:
            return
        self._held = None
        span, idle_w = held
        first_open = min((a for a, _ in host.busy), default=None)
        if first_open is None or first_open >= span.t1 + span.stamp_s:
            self.foreign.witness(span, idle_w)

    def _net_below(self, span: Span, period: float) -> float:
        """The energy above idle booked for a span no window was in, never below zero: a
        span read below the floor (its step stamped late and the next early, a reading
        between two steps; a floor set a little high) is netted against the next such
        spans, up to two counter periods of the card's draw (what a stamp can move between
        neighbours), and the rest is the card drawing below ``idle_w`` (its books' idle
        part is what it drew). So the books' sums only rise, and balance at every reading."""
        net = self._repay(span, period, span.above_j) + self._below
        watts = abs(span.total_j) / span.seconds if span.seconds > 0 else 0.0
        self._below = max(min(0.0, net), -(2 * period * watts + max(span.unc_j, 0.0)))
        return max(0.0, net)

    def _net_below_windows(self, span: Span, period: float) -> float:
        """The energy above idle booked for a span windows were in, never below zero: no
        window is given a negative share. A span read below the floor (a step stamped late;
        on a host node, the CPU's readings between the card's steps; windows that drew
        nothing) is a debt the next spans repay, with windows or without, so a window that
        covers both still gets their sum. A debt older than a counter period (and
        :data:`DEBT_S`) is no stamp's or step's doing but the card drawing below ``idle_w``
        (a floor set a little high): dropped, never taken from the next window that draws (a
        hostile trial: zero-watt windows held for 8 s with a floor 2 W high took 15 J off the
        request after them, 0.31x its truth). What was read below the floor with no window in
        it is never taken from a window."""
        above = span.above_j
        if above < 0:
            self._repay(span, period, 0.0)  # expire what is too old
            self._debts.append([span.t1, above])
            return 0.0
        return self._repay(span, period, above)

    def _repay(self, span: Span, period: float, above: float) -> float:
        """``above`` less the debts of windows' spans read below the floor that are young
        enough (:meth:`_net_below_windows`), oldest first (a span below the floor repays
        nothing); what is left of it. Older debts are dropped here."""
        debts = self._debts
        horizon = span.t0 - max(period, DEBT_S) - span.stamp_s
        while debts and debts[0][0] < horizon:
            debts.popleft()
        while debts and above > 0:
            debt = debts[0]
            paid = min(above, -debt[1])
            debt[1] += paid
            above -= paid
            if debt[1] >= 0:
                debts.popleft()
        return above

    def note_upstream(self, t: float, running: float, ours: int, maybe: int = 0) -> None:
        """The upstream ran ``running`` requests at ``t`` while ``ours`` windows of the host
        were surely in its count, and ``maybe`` more at most may have been."""
        self.unseen.note_upstream(t, running, ours, maybe)


__all__ = ["Decider"]
