"""When the reader thread reads next: across the counter's own steps, once it knows them.

A stepped counter (NVML's energy register: every 20-100 ms) holds its value between steps,
so of all the reads in a period only the last before a step and the first after it say
anything. Read ten times a period at random phases, as the reader did, the card costs ten
wake-ups a period, and each is a GIL hand-over that a loop running Python flat out makes
wait (benchmarks/gil_race.py: 2 ms at the median, seconds at worst). Once the tape has
learnt the steps' period and phase (:meth:`Tape.next_step`), the reader sleeps until just
before the next step and reads every ``STEP_READ_S`` across it until it sees it: about
three reads a period, bracketing each step within ``STEP_READ_S``, which is what the tape
learns the line from and what a window's first figure rests on. The reads go where the
step is, not where the line says it is, so the brackets' middles keep the line honest: a
pair placed either side of the line's own step would bracket every step inside it and
teach the line only where it already was. A step still unseen a quarter period after its
time (a counter that stopped, a line gone wrong, a reader held off its reads) leaves the
plain pace to read until the next step is booked.

Pure: times in, a wait out, so the schedule is tested without a thread or a clock.
"""

from __future__ import annotations

#: Between reads across a step (s): the width of the brackets paced reads make.
STEP_READ_S = 0.002
#: The least lead of the first read before a predicted step (s).
MIN_HALF_S = 0.002
#: The lead in the line's spreads (how far one step strays from the learnt line).
SPREADS = 2.5


class StepPace:
    """Where the next read goes, across the step the tape expects next.

    ``early`` is how much sooner than its lead the first read before a step goes: a step
    already there at that read (it strays further from the line than the line's spread
    says, the line runs late, or the thread was let back to the GIL late) adds a lead's
    worth, and each step caught after it takes an eighth of one off, so about one step in
    nine is early; the tape weighs the wide bracket such a step leaves by its width."""

    def __init__(self) -> None:
        self.early = 0.0
        self._aimed: tuple[float, bool] | None = None  # (the step aimed at, the first read before it)

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
        if now < at + period / 4:
            self._aimed = (at, False)
            return min(STEP_READ_S, plain)
        self._aimed = None
        return plain


__all__ = ["MIN_HALF_S", "SPREADS", "STEP_READ_S", "StepPace"]
