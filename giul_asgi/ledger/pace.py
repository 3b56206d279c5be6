"""When the reader thread reads next: around the counter's own steps, once it knows them.

A stepped counter (NVML's energy register: every 20-100 ms) holds its value between steps,
so of all the reads in a period only the last before a step and the first after it say
anything. Read ten times a period at random phases, as the reader did, the card costs ten
wake-ups a period, and each is a GIL hand-over that a loop running Python flat out makes
wait (benchmarks/gil_race.py: 2 ms at the median, seconds at worst). Once the tape has
learnt the steps' period and phase (:meth:`Tape.next_step`), the reader sleeps until just
before the next step, reads, and reads again just after it: two reads a period, bracketing
each step within a few ms, which is what the tape learns the line from and what a window's
first figure rests on. A step later than that is read for again every half-width for a
quarter period at most; past it (a counter that stopped, a line gone wrong, a reader held
off its reads) the plain pace takes over until the next step is booked.

Pure: times in, a wait out, so the schedule is tested without a thread or a clock.
"""

from __future__ import annotations

#: The least half-width of the pair of reads around a predicted step (s).
MIN_HALF_S = 0.002
#: The half-width in the line's spreads (how far one step strays from the learnt line).
SPREADS = 2.5


class StepPace:
    """Where the next read goes, around the step the tape expects next.

    ``early`` is how much sooner than its half-width the read before a step goes: a step
    already there at that read (it strays further from the line than the line's spread
    says, the line runs late, or the thread was let back to the GIL late) adds a half-width,
    and each step caught after it takes an eighth of one off, so about one step in nine is
    early. Without it a line a few ms late would have every read before a step see it, and
    a bracket of a period teaches the line nothing (:data:`~.tape.WIDE_SHARE`): it would
    never be put right."""

    def __init__(self) -> None:
        self.early = 0.0
        self._aimed: tuple[float, bool] | None = None  # (the step aimed at, a read before it)

    def wait(self, now: float, step: tuple[float, float, float] | None, plain: float) -> float:
        """Seconds to wait before the next read: ``step`` is the next step the tape
        expects (its time, spread and the counter's period), ``plain`` the plain pace's."""
        if step is None:
            self._aimed = None
            return plain
        at, spread, period = step
        half = min(max(MIN_HALF_S, SPREADS * spread), period / 4)
        aimed = self._aimed
        if aimed is not None and aimed[0] < at - period / 2:  # the step aimed at is booked
            self.early = min(self.early + half, period / 4) if aimed[1] else max(0.0, self.early - half / 8)
        lead = half + self.early
        if now < at - lead:
            self._aimed = (at, True)
            return at - lead - now
        self._aimed = (at, False)
        if now < at + half:
            return at + half - now
        if now < at + period / 4:
            return min(half, plain)
        self._aimed = None
        return plain


__all__ = ["MIN_HALF_S", "SPREADS", "StepPace"]
