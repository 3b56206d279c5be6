"""The reader's pace around a stepped counter's steps (pure: times in, waits out), and the
tape's schedule it reads from."""

from __future__ import annotations

import math

import pytest

from giul_asgi.ledger.pace import MIN_HALF_S, StepPace
from giul_asgi.ledger.tape import Tape
from giul_asgi.readers.base import Reading

PLAIN = 0.01
TIGHT = 0.0004  # a line this tight: the pair is the least half-width either side


def test_no_schedule_is_the_plain_pace() -> None:
    assert StepPace().wait(5.0, None, PLAIN) == PLAIN


def test_a_read_just_before_the_step_then_just_after() -> None:
    pace, step = StepPace(), (10.0, TIGHT, 0.1)
    assert pace.wait(9.95, step, PLAIN) == pytest.approx(0.05 - MIN_HALF_S)
    assert pace.wait(10.0 - MIN_HALF_S, step, PLAIN) == pytest.approx(2 * MIN_HALF_S)
    assert pace.wait(10.0, step, PLAIN) == pytest.approx(MIN_HALF_S)


def test_the_pair_widens_with_the_spread_within_a_quarter_period() -> None:
    assert StepPace().wait(9.9, (10.0, 0.004, 0.1), PLAIN) == pytest.approx(0.1 - 0.01)
    assert StepPace().wait(9.9, (10.0, 0.03, 0.1), PLAIN) == pytest.approx(0.1 - 0.025)


def test_a_late_step_is_read_for_a_quarter_period_then_the_plain_pace() -> None:
    pace, step = StepPace(), (10.0, TIGHT, 0.1)
    assert pace.wait(10.0 + MIN_HALF_S, step, PLAIN) == MIN_HALF_S
    assert pace.wait(10.024, step, PLAIN) == MIN_HALF_S
    assert pace.wait(10.025, step, PLAIN) == PLAIN


def test_a_step_seen_by_the_read_before_it_brings_that_read_forward() -> None:
    """The line runs late (or the thread came back late): the step was booked by the read
    meant to come before it. The next read before a step comes a half-width sooner, and
    each step caught after it takes an eighth of that back."""
    pace = StepPace()
    assert pace.wait(9.95, (10.0, TIGHT, 0.1), PLAIN) == pytest.approx(0.05 - MIN_HALF_S)
    # That read booked the step: the tape expects the next one.
    assert pace.wait(9.999, (10.1, TIGHT, 0.1), PLAIN) == pytest.approx(0.101 - 2 * MIN_HALF_S)
    assert pace.early == pytest.approx(MIN_HALF_S)
    assert pace.wait(10.1 - 2 * MIN_HALF_S, (10.1, TIGHT, 0.1), PLAIN) == pytest.approx(3 * MIN_HALF_S)
    pace.wait(10.103, (10.2, TIGHT, 0.1), PLAIN)  # caught between its pair
    assert pace.early == pytest.approx(MIN_HALF_S * 7 / 8)


def test_the_tape_expects_the_step_a_period_after_the_last_it_booked() -> None:
    """Paced reads (two around each step) keep the line: the next step is where the card
    steps, within the brackets' width."""
    period, phase, jitter = 0.1, 0.037, 0.002
    tape = Tape("counter", 70.0)

    def value(t: float) -> float:
        k = math.floor((t - phase) / period)
        at = phase + k * period + jitter * math.sin(k)
        if at > t:
            at -= period
        return math.floor(200.0 * at * 1000) / 1000

    t = 5.0
    while tape.next_step() is None:  # the plain pace until the line is learnt
        tape.feed(Reading(t, joules=value(t)))
        t += 0.01
        assert t < 7.0
    misses = []
    for _ in range(30):
        step = tape.next_step()
        assert step is not None
        at, _spread, learnt = step
        assert learnt == pytest.approx(period, rel=0.01)
        k = round((at - phase) / period)
        misses.append(abs(at - (phase + k * period + jitter * math.sin(k))))
        for read_at in (at - 0.004, at + 0.004):
            tape.feed(Reading(read_at, joules=value(read_at)))
    assert max(misses) < 0.004
