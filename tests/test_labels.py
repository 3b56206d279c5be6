"""Labels that stay true while a reader fails, down to a request's stages."""

from __future__ import annotations

import time

import pytest
from test_ledger import IDLE, Faulty, Run
from truecard import FaultyReader, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.base import Reading


def test_a_stage_is_labelled_by_the_same_rule_as_its_figure() -> None:
    run = Run(seed=5)
    faulty = Faulty(run, "raises")
    for _ in range(6):
        faulty.request(0.3, 180.0, failing=False)
        faulty.advance(0.25, failing=False)
    meter = Meter(run.ledger)
    meter.open()
    job = run.card.start_job(180.0)
    faulty.advance(0.2, failing=True)
    meter.mark("retrieve")
    faulty.advance(0.2, failing=True)
    run.card.stop_job(job)
    meter.close()
    e = meter.figure()
    assert e.method == "estimated" and set(e.stages) == {"retrieve"}
    stage = e.stages["retrieve"]
    assert stage.method == "estimated" and "the reader is failing" in (stage.error or "")


@pytest.mark.parametrize("fault", ["raises", "hangs", "stops"])
def test_through_the_real_reader_thread_no_first_figure_says_measured_while_it_fails(fault: str) -> None:
    """The same three faults read by the ledger's own poller and watchdog, on the real clock
    (the virtual test above feeds the ledger what they would)."""
    card = TrueCard(idle_w=IDLE, seed=3)
    # A hang outlasts the test: a read that returns after a second brings a real reading,
    # and a window its span covers is measured.
    reader = FaultyReader(TrueReader(card), fault, after=2.0, hang_s=4.0)  # type: ignore[arg-type]
    ledger = Ledger(Node(f"fails-{fault}", idle_w=IDLE), reader, read_timeout=0.2)  # type: ignore[arg-type]
    ledger.ensure_started()
    try:
        # Requests until one is measured while the reader works (a loaded machine's reader
        # may take a request or two to learn the card: those say estimated, as they should).
        before: list[Energy] = []
        while not reader.failing() and not any(e.method == "measured" for e in before):
            before.append(_request(card, ledger, 0.4))
        while not reader.failing():
            time.sleep(0.02)
        time.sleep(0.3)
        during = [_request(card, ledger, 0.2) for _ in range(4)]
    finally:
        ledger.stop(timeout=0.5)
    assert any(e.method == "measured" for e in before)
    assert [e.method for e in during].count("measured") == 0, [e.error for e in during]
    for e in during:
        assert e.joules is None or "interpolated from" in (e.error or "")


def _request(card: TrueCard, ledger: Ledger, seconds: float) -> Energy:
    meter = Meter(ledger)
    meter.open()
    job = card.start_job(180.0)
    time.sleep(seconds)
    card.stop_job(job)
    meter.close()
    e = meter.figure()
    time.sleep(0.1)
    return e


def test_a_reader_that_never_worked_says_its_error_in_place_of_not_settled() -> None:
    """A dead agent URL: every figure said "not settled: the card has not reported this
    window yet" forever; the reader's own error now stands in its place."""
    run = Run()
    run.reader.read = lambda: Reading(run.clock.now, error="ConnectError: Connection refused")  # type: ignore[method-assign]
    run.advance(0.3)
    meter, _ = run.request(0.3, 180.0)
    first = meter.figure()
    assert first.joules is None and first.method == "unknown"
    assert first.error == "the reader is failing: ConnectError: Connection refused"
    run.advance(2.0)
    settled = meter.figure()
    assert settled.settled and settled.joules is None
    assert "Connection refused" in (settled.error or "")


def test_a_figure_made_just_after_a_counter_reset_is_an_estimate_that_says_so() -> None:
    run = Run(seed=4)
    run.advance(0.5)
    for _ in range(4):
        run.request(0.3, 180.0)
        run.advance(0.3)
    run.card.t0 = run.clock.now  # a driver reload: the counter starts again from zero
    meter, truth = run.request(0.05, 180.0)
    e = meter.figure()
    assert e.method == "estimated" and "driver reset" in (e.error or "")
    assert e.joules is not None and abs(e.joules - truth) <= (e.uncertainty_joules or 0.0)
    run.advance(0.5)
    for _ in range(2):
        later, _ = run.request(0.3, 180.0)
        run.advance(0.4)
    assert later.figure().method == "measured"  # the card reports again
