"""Readings in, above-idle spans (or gaps) out: everything we know about a card's counter.

A reader gives cumulative joules (a counter) or watts (a gauge) at the times it was read.
The tape turns them into :class:`Span` s, each the energy above idle between two instants,
and :class:`Gap` s where the energy is unknown. It is pure and synchronous: a list of
readings in, a list of spans out, testable without a clock or a thread.

What a real counter does, and what the tape makes of it:

- It moves in steps (about every 100 ms on A100/H100, every 20 ms on V100-class, or at
  every read on some), so the energy a read reports is as of the counter's last step, not
  the read. Each change is seen between two reads, which brackets its step; the update
  period is learnt from how often the value changes, and the phase from the brackets of
  many steps folded onto one. A span ends at the step, not at the read.
- It is monotonic and moves in whole millijoules. A drop is a reset (driver reload) only
  when it is large: to near zero, or more than the card could draw in the time. A wobble of
  a few mJ is not an event; nor is a rise that implies less than idle power, which stays
  folded into the next span and teaches no phase.
- Until a step has been seen, a baseline's time is unknown: the first span starts at the
  first step seen, and what came before is a gap, never energy charged as exact.
- A counter that stops moving for many periods is stale (a frozen driver), not free energy.

A power gauge is integrated with the trapezoid rule between its samples.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable

from ..readers.base import Kind, Reading
from ..spans import Gap, Piece, Span

#: Readings may fail this long (in learnt periods, at least MIN_GAP_S) before a gap is booked.
GAP_PERIODS = 10
MIN_GAP_S = 1.0
#: A counter that has not moved in this many periods (at least STALE_MIN_S) is stale.
STALE_PERIODS = 20
STALE_MIN_S = 2.0
#: Fewer than this share of reads unchanged: the counter moves at every read.
EVERY_READ_SHARE = 0.9
#: Only reads at most this long after the one before tell (and no more than NARROW of the
#: hint): a counter stepping every 20 ms read every 22-32 ms (a starved reader, or a node's
#: period set long) changes at every read too, and was taken for one that moves at every read,
#: each step stamped at its read with no doubt, up to a period off (28% of settled figures
#: outside, a hostile trial). Every 10 ms or more, a stepped counter changes at under 90% of
#: such reads; the plain pace (5-15 ms) makes half its reads this short.
EVERY_READ_GAP_S = 0.01
#: Watts we allow a card before a drop is a reset rather than a wobble (when none seen yet).
DEFAULT_MAX_W = 2000.0
#: Brackets kept for learning the period and phase.
BRACKETS = 24
#: Brackets up to this share of a period wide count alike in the line (a reader's plain
#: pace brackets every step about a tenth of a period wide); a wider one by its width^-2.
WIDTH_FLOOR = 0.2
#: Brackets a line rests on before the reader is paced by it (a line from the first four was
#: seen 3% off the period), and the most spread, in periods, of a line it is paced by.
PACE_BRACKETS = 8
PACE_SPREAD = 0.1
#: A bracket wider than this share of a period says little of where its step fell, and a
#: reader dozing at one read a period (an idle card read for other processes) locks its
#: reads to the steps' phase: only narrower ones teach the line (see StepClock.step).
NARROW = 0.35
#: How far (periods) a line is carried past the newest step it rests on to place the step of
#: a wide bracket: its period's error grows with the distance (a line learnt over 3 s was 7 ms
#: off after 8 s of a reader dozing at one read a period).
REACH = 20
#: And past the last narrow bracket, a wide bracket's step (whose read may fall either side
#: of a line point by the line's drift): a reader busy enough to bracket steps narrowly
#: refreshes its line every period or two.
WIDE_REACH = 2


class StepClock:
    """When a stepped counter steps: its update period and phase, learnt from brackets.

    Each change is seen between two reads, so its step lies in ``(a, b]``. The period is
    first the median gap between consecutive changes; each recent bracket is then numbered
    by how many periods it lies before the newest, and a least-squares line through the
    brackets' middles gives the period to a fraction of a millisecond and where the newest
    step fell, far closer than its own bracket says. A middle counts less where its bracket
    is wider than ``WIDTH_FLOOR`` of a period (weight 1 / width^2): a reader paced across the
    steps (giul_asgi.ledger.pace) brackets most within a few ms, and a step that its first
    read already saw leaves a bracket a period wide, with a middle up to half a period off,
    that would pull the line as hard as they do.
    """

    def __init__(self, hint: float = 0.1) -> None:
        self.hint = hint  # the period expected before one is learnt
        self._brackets: deque[tuple[float, float]] = deque(maxlen=BRACKETS)
        self._reads = deque[bool](maxlen=64)  # True for a read that saw a change
        self.period: float | None = None
        self._line: tuple[float, float] | None = None  # a step on the learnt line, its +-

    def saw(self, changed: bool, gap: float = 0.0) -> None:
        """A read that did or did not see the value change, ``gap`` after the one before:
        only reads well inside any counter's period apart (:data:`EVERY_READ_GAP_S`) tell a
        counter that moves at every read from a stepped one (read once a period, a stepped
        counter changes at every read too; the learnt period is no guide: one that moves at
        every read is learnt as the gap)."""
        if gap < min(NARROW * self.hint, EVERY_READ_GAP_S):
            self._reads.append(changed)

    @property
    def every_read(self) -> bool:
        """The counter changes at (nearly) every read: its value is as of the read."""
        reads = self._reads
        return len(reads) >= 8 and sum(reads) >= EVERY_READ_SHARE * len(reads)

    def step(self, a: float, b: float, after: float | None = None) -> tuple[float, float]:
        """The step seen by a read at ``b`` after an unchanged read at ``a``, the last step
        booked being at ``after``: (time, +-)."""
        period, line = self.period, self._line
        if self.every_read:
            # Its value is as of the read, however long since the last: a line learnt from
            # its first reads (before they showed it moves at every read) is their pace, and
            # put the step of a read that came late on that pace's grid, ms from the read
            # (70 W of idle x 4 ms read as the window's: +0.2-0.4 J, 0.1% figures outside).
            self._brackets.append((a, b))
            return b, 0.0
        if period is not None and line is not None and b - a > 1.5 * period:
            # A long silence (a reader that dozed while no window was open, a slow read):
            # many steps fell in it, the last within a period before the read, where the
            # learnt line puts it. The bracket's middle would put the step, and the span's
            # end, in the silence; nor does so wide a bracket teach the line anything.
            # The last line point at or before the read, or the next where a step straying
            # as far as steps do would fall before it (the read saw that one, early): the
            # point before it would put the step, and the span's start, a period early.
            # A line carried far past the steps it rests on drifts by its period's error:
            # then the last period before the read, and all of it in doubt.
            anchor, spread = line
            if b - anchor > REACH * period:
                return b - period / 2, period / 2
            at = anchor + period * math.floor((b + 3 * spread - anchor) / period)
            return min(max(at, b - period, a + 1e-6), b), min(period / 2, spread + period / 20)
        each = period or self.hint
        if b - a > 1.5 * each and not self.every_read:
            # The same long silence before any line is learnt (a tape that just took the card
            # over from a holder stopped for seconds, resumed from its last step): the last
            # step is still within a period before the read. Its middle put the silence's
            # energy in its first half and read the second as a counter that did not move,
            # filled again from the prior (a hostile trial: 1.5-1.8x after a stop and a kill).
            return b - each / 2, each / 2
        half = (b - a) / 2
        if b - a > NARROW * (period or self.hint) and not self.every_read:
            # A bracket a good part of a period wide says where its step fell to within its
            # width, no better: a reader dozing at one read a period (an idle card read for a
            # server's other workers) locks its reads to the steps' phase, and brackets a
            # period wide taught the line a period 12% short and put steps 30-100 ms from
            # where they fell with a doubt of 4 ms (an idle span then held a period's energy
            # too many, read as a foreign load of 60 W, and the burst after it as contended).
            # It teaches nothing. Its step is where a line learnt from narrow brackets puts
            # it, within its bracket (a reader starved by a saturated loop reads late, and
            # its brackets' middles put steps tens of ms off: first figures' p90 error 3-5%
            # -> 13-22%); with no such line, its middle, in doubt by half its width.
            if period is None or line is None or b - line[0] > WIDE_REACH * period:
                return a + half, half
            # The last line point in the bracket, if it is after the step booked last; else
            # the next one, which the read saw early (a read just before a line point, at
            # one read a period, saw the point before it half of the time).
            anchor, spread = line
            seen = anchor + period * math.floor((b - anchor) / period)
            if seen <= a or (after is not None and seen <= after + period / 2):
                seen += period
            clamped = min(max(seen, a + 1e-6), b)
            return clamped, min(half, max(spread, abs(clamped - seen), 0.0005))
        self._brackets.append((a, b))
        mids = [(x + y) / 2 for x, y in self._brackets]
        if len(mids) < 4:
            return a + half, half
        gaps = sorted(y - x for x, y in itertools.pairwise(mids) if y > x)
        rough = gaps[len(gaps) // 2] if gaps else None
        if not rough or rough <= 0:
            return a + half, half
        newest = mids[-1]
        ks = [round((m - newest) / rough) for m in mids]
        floor = WIDTH_FLOOR * rough
        ws = [1.0 / max(y - x, floor) ** 2 for x, y in self._brackets]
        total = sum(ws)
        n = total * total / sum(w * w for w in ws)  # the brackets' worth, in equal ones
        mean_k = sum(w * k for w, k in zip(ws, ks, strict=True)) / total
        mean_m = sum(w * m for w, m in zip(ws, mids, strict=True)) / total
        var_k = sum(w * (k - mean_k) ** 2 for w, k in zip(ws, ks, strict=True))
        if var_k <= 0:
            return a + half, half
        period = sum(w * (k - mean_k) * (m - mean_m) for w, k, m in zip(ws, ks, mids, strict=True)) / var_k
        if not 0.5 * rough < period < 1.5 * rough:
            return a + half, half  # the numbering is off: the period drifts or reads stalled
        self.period = period
        at = mean_m - period * mean_k  # where the line puts the newest step (k = 0)
        # The brackets' middles scatter about the line by the steps' own jitter and by where
        # in its bracket each step fell (uniform: width^2 / 12). Take the second out: what
        # is left is how far one step strays from the line, plus the line's own error.
        scatter = sum(w * (m - (at + period * k)) ** 2 for w, k, m in zip(ws, ks, mids, strict=True)) / total
        widths = sum(w * (y - x) ** 2 for w, (x, y) in zip(ws, self._brackets, strict=True)) / (12 * total)
        spread = math.sqrt(max(0.0, scatter - widths) + scatter / n)
        # The newest step itself jitters about the line: where the line falls outside its
        # bracket, the step was at the bracket's nearer end.
        seen = at if after is None else self._seen(b, after, period, at, spread)
        clamped = min(max(seen, a + 1e-6), b)
        self._line = (at, spread)
        return clamped, min(half, max(spread, abs(clamped - seen), 0.0005))

    @staticmethod
    def _seen(b: float, after: float, period: float, at: float, spread: float) -> float:
        """Which step on the line a read at ``b`` saw, the last booked being at ``after``: the
        latest at or before ``b`` (give or take a step's stray) that comes a step after it,
        else the first that does (a step the read saw early). The newest bracket's own
        number on the line is no guide where it is wide: its middle, up to half a period
        from its step, is rounded to either neighbour."""
        first = at + period * (math.floor((after + period / 2 - at) / period) + 1)
        last = at + period * math.floor((b + 3 * spread - at) / period)
        return max(first, last)

    def next_after(self, t: float) -> tuple[float, float] | None:
        """The first step the learnt line puts after ``t``, and how far a step strays from
        the line (s); None before the line rests on ``PACE_BRACKETS`` brackets, while its
        spread is more than ``PACE_SPREAD`` of a period, or where the counter moves at every
        read: nothing to read around."""
        period, line = self.period, self._line
        if (period is None or line is None or self.every_read or len(self._brackets) < PACE_BRACKETS
                or line[1] > PACE_SPREAD * period):
            return None
        anchor, spread = line
        return anchor + period * (math.floor((t - anchor) / period) + 1), spread


class Tape:
    """One node's readings, turned into spans above idle and gaps, in time order."""

    def __init__(self, kind: Kind, idle_w: float | None, *, period_hint: float = 0.1) -> None:
        self.kind = kind
        self.idle_w = idle_w
        self.period_hint = period_hint
        self.steps = StepClock(period_hint)
        # The counter's baseline: its value, when it was true (None: not yet known), and the
        # last read that still showed it (a step after it lies after that read).
        self._base_j: float | None = None
        self._base_t: float | None = None
        self._quiet_t = 0.0
        self._first_t: float | None = None
        self._last_w: tuple[float, float] | None = None  # a gauge's last sample
        self._change_t: deque[float] = deque(maxlen=BRACKETS)  # when a gauge's value changed
        self._last_good: float | None = None
        self._fail_t: float | None = None  # failing since, where no reading ever worked
        self.max_w = 0.0
        self.reads = 0
        self.errors = 0
        self.resets = 0
        self.last_error: str | None = None
        self.end: float | None = None  # where the last span or gap ended
        self._resumed = False  # the baseline is another process's (see resume)

    @property
    def period(self) -> float:
        """The update period: learnt where the counter shows it, else the reader's hint."""
        return self.steps.period or self.period_hint

    def feed_all(self, readings: Iterable[Reading]) -> list[Piece]:
        out: list[Piece] = []
        for reading in readings:
            out += self.feed(reading)
        return out

    def feed(self, reading: Reading) -> list[Piece]:
        """Book one reading; return the spans and gaps it closes."""
        self.reads += 1
        if not reading.ok:
            self.errors += 1
            self.last_error = reading.error or "empty reading"
            return self._failing(reading.t)
        self._last_good = reading.t
        self._fail_t = None
        if reading.joules is not None and self.kind != "power":
            return self._counter(reading.t, reading.joules)
        if reading.watts is not None:
            return self._gauge(reading.t, reading.watts)
        return self._failing(reading.t)

    # -- failures -------------------------------------------------------------------------
    def _max_gap(self) -> float:
        return max(GAP_PERIODS * self.period, MIN_GAP_S)

    def _failing(self, t: float) -> list[Piece]:
        """A failed read loses nothing by itself (a counter carries on counting); failing
        for longer than the gap limit gives the time up as unknown."""
        start = self._base_t if self._base_t is not None else self._first_t
        if self._last_w is not None:
            start = self._last_w[0]
        if start is None:
            # Failing since before any good reading (a dead agent URL): the time is given
            # up all the same, so windows settle and say why instead of waiting forever.
            if self._fail_t is None:
                self._fail_t = t
            start = self._fail_t
        if t - start <= self._max_gap():
            return []
        self._forget()
        self._fail_t = t
        return [self._gap(start, t, f"reader failed: {self.last_error}")]

    def _forget(self) -> None:
        self._base_j = self._base_t = None
        self._first_t = None
        self._last_w = None

    def _gap(self, t0: float, t1: float, why: str, fault: bool = True) -> Gap:
        self.end = t1
        return Gap(t0, t1, why, fault)

    # -- counters -------------------------------------------------------------------------
    def _counter(self, t: float, joules: float) -> list[Piece]:
        base_j, base_t = self._base_j, self._base_t
        gap = t - self._quiet_t  # since the read before (each read sets _quiet_t)
        if base_j is None:
            # A baseline whose time is unknown until the counter is seen to step.
            self._base_j, self._base_t, self._quiet_t = joules, None, t
            if self._first_t is None:
                self._first_t = t
            return []
        delta = joules - base_j
        since = t - (base_t if base_t is not None else self._quiet_t)
        if self._resumed:
            self._resumed = False
            if delta < 0 or delta > max(self.max_w, DEFAULT_MAX_W) * max(since, self.period):
                # Not the same counter (another origin: a restarted upstream's simulated card,
                # another reader) or a reset meanwhile: from scratch. The time between is this
                # tape's before its first reading, not a fault of the card: windows in it fill
                # from the prior as a fresh start's do (a fault made every first answer after
                # a demo restart a tier hint, 12 of 15 in a stranger's trial).
                self._base_j, self._base_t, self._quiet_t, self._first_t = joules, None, t, t
                return [self._gap(base_t, t, "the card's reader changed hands; its counter did not "
                                  "follow on", fault=False)] if base_t is not None and t > base_t else []
        if delta < 0:
            drop = -delta
            if joules < 0.01 * base_j or drop > max(self.max_w, DEFAULT_MAX_W) * max(since, self.period):
                return self._reset(t, joules)
            self.steps.saw(False, gap)
            self._quiet_t = t  # a wobble: the baseline never moves backwards
            return []
        if delta == 0 or (since > 0 and delta / since < self._least_step_w()):
            self.steps.saw(False, gap)
            self._quiet_t = t
            anchor = base_t if base_t is not None else self._first_t
            if anchor is not None and t - anchor > max(STALE_PERIODS * self.period, STALE_MIN_S):
                self._forget()
                return [self._gap(anchor, t, f"energy counter did not move for {t - anchor:.1f} s")]
            return []
        self.steps.saw(True, gap)
        step, stamp = self.steps.step(self._quiet_t, t, base_t)
        self._quiet_t = t
        if base_t is None:
            # The first step seen: the baseline's time is now known. What came before it
            # cannot be placed, so it is a gap rather than energy charged as exact.
            first = self._first_t if self._first_t is not None else step
            self._base_j, self._base_t = joules, step
            return [self._gap(first, step, "no baseline reading yet", fault=False)] if step > first else []
        step = max(step, base_t + 1e-9)
        dt = step - base_t
        self._base_j, self._base_t = joules, step
        self.max_w = max(self.max_w, delta / dt) if dt > self.period / 2 else self.max_w
        self.end = step
        return [Span(base_t, step, delta - (self.idle_w or 0.0) * dt, delta, stamp, 0.001)]

    def _least_step_w(self) -> float:
        """A rise implying less than this is not a step (half the idle floor, if known)."""
        return 0.5 * self.idle_w if self.idle_w else 0.0

    def _reset(self, t: float, joules: float) -> list[Piece]:
        self.resets += 1
        start = self._base_t if self._base_t is not None else self._first_t
        self._forget()
        self._base_j, self._base_t, self._quiet_t, self._first_t = joules, None, t, t
        if start is None or t <= start:
            return []
        return [self._gap(start, t, "energy counter went down (driver reset)")]

    # -- gauges ---------------------------------------------------------------------------
    def _gauge(self, t: float, watts: float) -> list[Piece]:
        last = self._last_w
        self._last_w = (t, watts)
        if last is None:
            return []
        t0, w0 = last
        dt = t - t0
        if dt <= 0:
            self._last_w = last
            return []
        if dt > self._max_gap():
            return [self._gap(t0, t, f"no power sample for {dt:.1f} s")]
        # A gauge's value changes once per sensor period (learnt like a counter's): a change
        # may have happened anywhere in the last one, and the sensor may have seen only part
        # of it, so the span is uncertain by the change over that period.
        self.steps.saw(watts != w0)
        if watts != w0:
            self._change_t.append(t)
            if len(self._change_t) >= 4:
                gaps = sorted(b - a for a, b in itertools.pairwise(self._change_t))
                self.steps.period = gaps[len(gaps) // 2]
        sensor = max(dt, self.steps.period or self.period_hint)
        total = (w0 + watts) / 2 * dt
        self.max_w = max(self.max_w, w0, watts)
        self.end = t
        return [Span(t0, t, total - (self.idle_w or 0.0) * dt, total, 0.0, abs(watts - w0) * sensor)]

    # -- the schedule -------------------------------------------------------------------------
    def next_step(self) -> tuple[float, float, float] | None:
        """When the counter should step next: the learnt line's step about a period after
        the last one booked, how far a step strays from the line, and the period (s). None
        before a step is booked or a line learnt, on a gauge, or on a counter that moves at
        every read: the reader then reads at its plain pace."""
        if self.kind == "power" or self._base_t is None:
            return None
        step = self.steps.next_after(self._base_t + self.period / 2)
        return None if step is None else (*step, self.period)

    # -- health ---------------------------------------------------------------------------
    def baseline(self) -> tuple[float, float] | None:
        """Where the next span starts: the counter's value at its last step and that step's
        time (a gauge: its last sample's time and watts); None before one is known. Another
        process that takes the card over resumes from it (:meth:`resume`)."""
        if self.kind != "power" and self._base_j is not None and self._base_t is not None:
            return self._base_j, self._base_t
        if self.kind == "power" and self._last_w is not None:
            return self._last_w[1], self._last_w[0]
        return None

    def resume(self, value: float, t: float) -> None:
        """Start from another tape's :meth:`baseline` of the same card (its last holder's),
        so the time between the two holders is a span, not a gap. A first reading that does
        not follow from it (a counter that went down, or rose faster than a card can draw:
        another counter) starts afresh instead."""
        if not (math.isfinite(value) and math.isfinite(t)):
            return
        if self.kind == "power":
            self._last_w = (t, value)
        else:
            self._base_j, self._base_t, self._quiet_t = value, t, t
            self._resumed = True

    @property
    def last_good(self) -> float | None:
        """When the last good reading was taken (None: never)."""
        return self._last_good

    def age(self, now: float) -> float | None:
        """Seconds since the last good reading; None before the first."""
        return None if self._last_good is None else max(0.0, now - self._last_good)

