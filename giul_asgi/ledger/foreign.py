"""The foreign-load watch: what the card draws when none of our windows is on it.

A card drawing above idle with no window open, once a ramp-down after the last window has
passed, carries a load nobody here asked for (another process, a training job). The watch
keeps its level as a ratio of time-decayed sums (a span's stamp error moves energy to its
neighbour, and over consecutive spans those errors cancel), with the mean absolute
deviation of single spans about it, so figures can say ``contended`` with the watts seen,
and a node with ``foreign="subtract"`` can take that level off the spans windows share.

What the watch never sees while windows run is how the level moves under them. Its doubt
has two parts, both ratios of decayed sums like the level (never an average that starts
from zero and takes seconds to grow): how far single spans scatter about the level beyond
what their own step stamps explain (the load itself moves: a bursty load), and the level's
standard error from the spans witnessed so far (a load seen only in short quiet gaps
between requests is known less well than one watched for seconds). And the level taken off
windows is doubted by as far as the last look strayed from it (the mean lags a change), and
by what the load may have done since that look, growing with the time unseen against how
long the level was seen to hold (:meth:`ForeignWatch.moved_w`).
"""

from __future__ import annotations

import math

from ..spans import Span

#: Witnessed foreign power below this (W, or this share of idle) is noise, not a load.
FOREIGN_MIN_W = 5.0
FOREIGN_MIN_SHARE = 0.05
#: Witnessed time before a foreign level is believed (in periods, at least a tenth of a
#: second, less the stamps' jitter: one whole span between two steps of a 100 ms counter
#: reads 94-106 ms, and at a full period a fresh process's first look counted half the time:
#: its next one or two windows charged the foreign load whole), and how long after its last
#: witness figures say ``contended`` by it (a level is taken off, where the node subtracts
#: one, however old: a card never seen quiet again keeps the last, its doubt growing,
#: :meth:`ForeignWatch.moved_w`).
FOREIGN_BELIEVE_PERIODS = 0.75
FOREIGN_BELIEVE_S = 0.075
FOREIGN_KEEP_S = 120.0
#: The subtracted level is uncertain by this many mean absolute deviations of the witness.
FOREIGN_SPREAD = 2.5
#: The foreign level follows the witness with this time constant (seconds).
FOREIGN_TAU_S = 5.0
#: How long a level seen once is trusted unseen (seconds): the time constant of what it may
#: have moved since, or the time it was seen to hold (from the first look that did not stray
#: from it to the last), where longer, up to FOREIGN_STALE_MAX_S (a level held for an hour
#: was trusted unseen for an hour, and a load that stopped under back-to-back requests was
#: never doubted: a hostile trial).
FOREIGN_STALE_S = 1.0
FOREIGN_STALE_MAX_S = 10.0
#: A look farther from the level than this many times its scatter and the look's own stamps'
#: doubt (and than noise) strays: the level has not held, and its time held starts again.
FOREIGN_STRAY = 3.0


class ForeignWatch:
    """The level of above-idle power witnessed with no window on the card."""

    def __init__(self) -> None:
        self._j = 0.0
        self._s = 0.0
        self._dev_j = 0.0  # decayed sum of |span watts - level| x seconds
        self._noise_j = 0.0  # decayed sum of what the spans' stamps explain of it
        self.noise_w = 0.0
        self.level_w: float | None = None  # the witnessed level (W above idle)
        self.dev_w = 0.0  # mean absolute deviation of single spans from the level
        self.seen_s = 0.0
        self.seen_t: float | None = None  # when the level was last witnessed
        self.first_t: float | None = None  # the first look since the level last strayed
        self.spans = 0
        self.edge_s = 0.0  # the step doubt at the end of the last span witnessed
        self.last_w = 0.0  # the last span witnessed (W above idle)

    def witness(self, span: Span, idle_w: float | None) -> None:
        seconds = span.seconds
        if idle_w is None or seconds <= 0:
            return
        watts = span.above_j / seconds
        decay = math.exp(-seconds / FOREIGN_TAU_S)
        # How far a span's watts may stray by its stamps alone (both ends, and its mJ).
        noise = 2 * span.stamp_s * (abs(watts) + idle_w) / seconds + span.unc_j / seconds
        # One span has no scatter to compare: its stamps' doubt stands in for it.
        deviation = noise if self.level_w is None else abs(watts - self.level_w)
        if deviation > max(FOREIGN_STRAY * (self.dev_w + noise), FOREIGN_MIN_W, FOREIGN_MIN_SHARE * idle_w):
            self.first_t = None  # it strayed: the level has held since this look, no longer
        self._j = self._j * decay + span.above_j
        self._dev_j = self._dev_j * decay + deviation * seconds
        self._noise_j = self._noise_j * decay + noise * seconds
        self._s = self._s * decay + seconds
        self.level_w = self._j / self._s
        self.dev_w = self._dev_j / self._s
        self.noise_w = self._noise_j / self._s
        self.seen_s += seconds
        self.seen_t = span.t1
        if self.first_t is None:
            self.first_t = span.t0
        self.spans += 1
        self.edge_s = span.stamp_s
        self.last_w = watts

    def level(self, period: float, idle_w: float | None) -> float | None:
        """The foreign load's watts above idle, when one has been witnessed long enough
        (0.0 when what was witnessed is noise)."""
        level = self.level_w
        if level is None or self.seen_s < max(FOREIGN_BELIEVE_S, FOREIGN_BELIEVE_PERIODS * period):
            return None
        # A step stamped late or early moves energy between neighbouring spans: inside a
        # run of witnessed spans it cancels, but at the run's end (a window opens next) it
        # stays in the level. What that edge could add is no load (a burst from idle whose
        # quiet span held 3.5 J of its neighbour's, over half a second seen, read as 7 W).
        edge_w = 2 * self.edge_s * ((idle_w or 0.0) + abs(level)) / self._s
        return level if level >= max(FOREIGN_MIN_W, FOREIGN_MIN_SHARE * (idle_w or 0.0), edge_w) else 0.0

    def doubt_w(self) -> float:
        """How far the level may be from the load under the windows, in watts: how much
        the load itself moves, and the level's standard error from the spans seen."""
        moves = max(0.0, self.dev_w - self.noise_w)
        return FOREIGN_SPREAD * (moves + self.dev_w / math.sqrt(max(1, self.spans)))

    def moved_w(self, t: float, level: float, drawn_w: float) -> float:
        """How far the load may be from ``level`` at ``t`` on a card drawing ``drawn_w`` above
        idle: at least as far as the last look put it (a level is a decayed mean over 5 s of
        looks, and lags a load that started or moved), and, unseen since, toward anything from
        none of it to all of the draw, the more the longer it went unseen against how long it
        held (FOREIGN_STALE_S to FOREIGN_STALE_MAX_S). A level seen once and never again
        (requests back to back) was taken off with the doubt of that one look for good: 0.4 s
        bursts seen in one look before requests 50-100 ms apart, 33-58% of figures inside their
        uncertainty (now 98-100%); a load that appeared under back-to-back requests after looks
        at 0 W, 0 of 50 (now 42); one that started after quiet looks, 37% of the next ten
        requests' settled figures (now 88%); a floor set 10 W high, 14% (now 97%: a hostile
        harness, virtual clock, benchmarks/results/foreign_stale-2026-12-07.md)."""
        seen_t, first_t = self.seen_t, self.first_t
        if seen_t is None or first_t is None:
            return 0.0
        strayed = abs(self.last_w - level)
        if t <= seen_t:
            return strayed
        held = min(FOREIGN_STALE_MAX_S, max(FOREIGN_STALE_S, seen_t - first_t))
        # Linear to all of it: a load that stopped unseen misses by all of the level, which a
        # doubt that only tends to it never covers.
        return max(strayed, max(level, drawn_w - level) * min(1.0, (t - seen_t) / held))

    def recent(self, now: float | None) -> bool:
        return self.seen_t is not None and (now is None or now - self.seen_t <= FOREIGN_KEEP_S)


__all__ = [
    "FOREIGN_KEEP_S", "FOREIGN_SPREAD", "FOREIGN_STALE_MAX_S", "FOREIGN_STALE_S", "FOREIGN_STRAY",
    "FOREIGN_TAU_S", "ForeignWatch",
]
