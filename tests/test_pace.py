"""The reader's pace around a stepped counter's steps (pure: times in, waits out), and the
tape's schedule it reads from."""

from __future__ import annotations

import math

import pytest

from giul_asgi.ledger.pace import MIN_HALF_S, STEP_READ_S, StepPace
from giul_asgi.ledger.tape import Tape
from giul_asgi.readers.base import Reading

PLAIN = 0.01
TIGHT = 0.0004  # a line this tight: the first read goes the least lead before its step


def test_no_schedule_is_the_plain_pace() -> None:
    assert StepPace().wait(5.0, None, PLAIN) == PLAIN


def test_a_read_just_before_the_step_then_reads_across_it() -> None:
    pace, step = StepPace(), (10.0, TIGHT, 0.1)
    assert pace.wait(9.95, step, PLAIN) == pytest.approx(0.05 - MIN_HALF_S)
    assert pace.wait(10.0 - MIN_HALF_S, step, PLAIN) == STEP_READ_S
    assert pace.wait(10.0, step, PLAIN) == STEP_READ_S


def test_the_lead_grows_with_the_spread_within_a_quarter_period() -> None:
    assert StepPace().wait(9.9, (10.0, 0.004, 0.1), PLAIN) == pytest.approx(0.1 - 0.01)
    assert StepPace().wait(9.9, (10.0, 0.03, 0.1), PLAIN) == pytest.approx(0.1 - 0.025)


def test_a_late_step_is_read_for_a_quarter_period_then_the_plain_pace() -> None:
    pace, step = StepPace(), (10.0, TIGHT, 0.1)
    assert pace.wait(10.024, step, PLAIN) == STEP_READ_S
    assert pace.wait(10.025, step, PLAIN) == PLAIN


def test_a_step_seen_by_the_first_read_before_it_brings_that_read_forward() -> None:
    """The line runs late (or the thread came back late): the step was booked by the read
    meant to come before it. The next first read comes a lead sooner, and each step caught
    after it takes an eighth of that back."""
    pace = StepPace()
    assert pace.wait(9.95, (10.0, TIGHT, 0.1), PLAIN) == pytest.approx(0.05 - MIN_HALF_S)
    # That read booked the step: the tape expects the next one.
    assert pace.wait(9.999, (10.1, TIGHT, 0.1), PLAIN) == pytest.approx(0.101 - 2 * MIN_HALF_S)
    assert pace.early == pytest.approx(MIN_HALF_S)
    assert pace.wait(10.1 - 2 * MIN_HALF_S, (10.1, TIGHT, 0.1), PLAIN) == STEP_READ_S
    pace.wait(10.101, (10.2, TIGHT, 0.1), PLAIN)  # caught after the first read
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
        read_at, seen = at - 0.005, value(at - 0.005)
        while value(read_at) == seen and read_at < at + 0.025:  # across the step
            tape.feed(Reading(read_at, joules=value(read_at)))
            read_at += 0.002
        tape.feed(Reading(read_at, joules=value(read_at)))
    assert max(misses) < 0.004
