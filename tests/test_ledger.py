"""The ledger: energy shared among overlapping windows, conserved, bounded, honest."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from conftest import warm_up
from hypothesis import given, settings
from hypothesis import strategies as st

from giul_asgi import Ledger, Node, TokenSplit
from giul_asgi.readers import Reading, SimulatedCard, SimulatedReader, VirtualClock
from giul_asgi.readers.base import NullReader


def tick(ledger: Ledger, clock: VirtualClock, seconds: float, step: float = 0.05) -> None:
    """Advance the clock, reading at a jittered poll period as the ledger's task does."""
    jitter = random.Random(7)  # the same reads whatever ran before: tests stay independent
    remaining = seconds
    while remaining > 1e-12:
        dt = min(step * jitter.uniform(0.6, 1.4), remaining)
        clock.advance(dt)
        remaining -= dt
        ledger.read_now()


def test_overlapping_requests_share_the_card_not_multiply_it(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    """The seed charged 16 concurrent requests 16x the energy; here they split it."""
    windows = [sim_ledger.open() for _ in range(16)]
    jobs = [card.start_job(200.0 / 16) for _ in windows]
    tick(sim_ledger, clock, 0.5)
    for window, job in zip(windows, jobs, strict=True):
        card.stop_job(job)
        sim_ledger.close(window)
    tick(sim_ledger, clock, 0.2)
    figures = [sim_ledger.energy(w) for w in windows]
    total = sum(e.joules or 0.0 for e in figures)
    truth = sum(j.true_joules for j in jobs)
    assert truth == pytest.approx(100.0)
    assert total == pytest.approx(truth, rel=0.05)  # not 16 x 100 J
    for e in figures:
        assert e.method == "simulated" and e.settled
        assert e.concurrency == pytest.approx(16.0)
        assert e.split == "time"
        assert e.joules == pytest.approx(100.0 / 16, rel=0.05)
    totals = sim_ledger.totals()
    assert totals.conservation_error_j == pytest.approx(0.0, abs=1e-9)


def test_a_window_alone_is_exclusive(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    window = sim_ledger.open()
    job = card.start_job(150.0)
    tick(sim_ledger, clock, 1.0)
    card.stop_job(job)
    sim_ledger.close(window)
    tick(sim_ledger, clock, 0.2)
    e = sim_ledger.energy(window)
    assert e.split == "exclusive" and e.concurrency == pytest.approx(1.0)
    assert e.joules == pytest.approx(150.0, rel=0.05)
    assert e.mean_watts is not None and 150 < e.mean_watts < 230


def test_short_windows_on_a_stepped_counter_all_get_a_figure(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    """30 ms requests on a 100 ms counter: the seed came back 70% unknown."""
    figures = []
    truth = []
    for _ in range(40):
        window = sim_ledger.open()
        job = card.start_job(250.0)
        clock.advance(0.03)
        card.stop_job(job)
        sim_ledger.close(window)
        clock.advance(0.02)
        sim_ledger.read_now()
        figures.append(window)
        truth.append(job.true_joules)
    tick(sim_ledger, clock, 0.3)
    energies = [sim_ledger.energy(w) for w in figures]
    assert all(e.joules is not None and e.settled for e in energies)
    assert all(e.uncertainty_joules is not None and e.uncertainty_joules > 0 for e in energies)
    assert sum(e.joules or 0 for e in energies) == pytest.approx(sum(truth), rel=0.05)


def test_provisional_share_then_settled(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    job = card.start_job(100.0)
    tick(sim_ledger, clock, 0.3)  # the ledger now knows the card's above-idle power
    window = sim_ledger.open()
    clock.advance(0.02)
    sim_ledger.close(window)
    provisional = sim_ledger.energy(window)
    assert provisional.settled is False
    assert provisional.joules == pytest.approx(2.0, rel=0.05)  # 100 W x 20 ms
    assert provisional.uncertainty_joules == pytest.approx(provisional.joules)
    tick(sim_ledger, clock, 0.2)
    card.stop_job(job)
    settled = sim_ledger.energy(window)
    assert settled.settled is True and settled.joules is not None


def test_first_window_before_any_power_is_unknown_until_settled(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    window = sim_ledger.open()
    job = card.start_job(100.0)
    clock.advance(0.01)
    sim_ledger.close(window)
    e = sim_ledger.energy(window)
    assert e.joules is None and e.settled is False and e.method == "unknown"
    card.stop_job(job)
    tick(sim_ledger, clock, 0.3)
    settled = sim_ledger.energy(window)
    assert settled.settled and settled.joules is not None
    assert abs(settled.joules - job.true_joules) <= (settled.uncertainty_joules or 0)


def test_no_idle_floor_charges_above_zero_and_says_so(card: SimulatedCard, clock: VirtualClock) -> None:
    ledger = Ledger(Node("noidle"), SimulatedReader(card))
    warm_up(ledger, clock)
    window = ledger.open()
    tick(ledger, clock, 1.0)
    ledger.close(window)
    tick(ledger, clock, 0.2)
    e = ledger.energy(window)
    assert e.idle_known is False and e.idle_watts is None
    # The whole idle draw, labelled so; the edge intervals are inside the uncertainty.
    assert abs((e.joules or 0) - 60.0) <= (e.uncertainty_joules or 0)
    assert e.joules == pytest.approx(60.0, rel=0.15)


def test_idle_floor_set_too_high_is_a_failed_measurement_not_zero(
    card: SimulatedCard, clock: VirtualClock
) -> None:
    ledger = Ledger(Node("high", idle_w=90.0), SimulatedReader(card))
    ledger.read_now()
    window = ledger.open()
    tick(ledger, clock, 0.5)
    ledger.close(window)
    tick(ledger, clock, 0.2)
    e = ledger.energy(window)
    assert e.joules is None and e.method == "unknown"
    assert ledger.energy(window, tokens=100, hint_per_1k=500.0).method == "estimated"
    totals = ledger.totals()
    assert totals.charged_j == 0.0  # nothing charged that was not measured
    assert totals.conservation_error_j == pytest.approx(0.0, abs=1e-9)


def test_brief_reader_errors_lose_nothing_on_a_counter(card: SimulatedCard, clock: VirtualClock) -> None:
    failing = {"on": False}
    reader = SimulatedReader(card, fail=lambda: "GPU is lost" if failing["on"] else None)
    ledger = Ledger(Node("flaky", idle_w=60.0), reader)
    ledger.read_now()
    window = ledger.open()
    job = card.start_job(100.0)
    tick(ledger, clock, 0.2)
    failing["on"] = True
    tick(ledger, clock, 0.3)  # shorter than the gap limit
    failing["on"] = False
    tick(ledger, clock, 0.2)
    card.stop_job(job)
    ledger.close(window)
    tick(ledger, clock, 0.2)
    e = ledger.energy(window)
    assert e.joules == pytest.approx(job.true_joules, rel=0.05)
    assert ledger.totals().read_errors > 0


def test_a_reader_that_dies_mid_window_leaves_it_unknown(card: SimulatedCard, clock: VirtualClock) -> None:
    failing = {"on": False}
    reader = SimulatedReader(card, fail=lambda: "GPU is lost" if failing["on"] else None)
    ledger = Ledger(Node("dies", idle_w=60.0), reader)
    ledger.read_now()
    window = ledger.open()
    tick(ledger, clock, 0.2)
    failing["on"] = True
    tick(ledger, clock, 2.0)
    ledger.close(window)
    tick(ledger, clock, 0.2)
    e = ledger.energy(window, tokens=10, hint_per_1k=1000.0)
    assert e.method == "estimated" and e.joules == pytest.approx(10.0)
    assert "GPU is lost" in (e.error or "")
    assert ledger.totals().lost_s > 1.0
    assert ledger.totals().conservation_error_j == pytest.approx(0.0, abs=1e-9)


def test_token_split_weights_by_tokens_per_second(card: SimulatedCard, clock: VirtualClock) -> None:
    ledger = Ledger(Node("tok", idle_w=60.0), SimulatedReader(card), split=TokenSplit())
    ledger.read_now()
    a, b = ledger.open(), ledger.open()
    ja, jb = card.start_job(150.0), card.start_job(50.0)
    tick(ledger, clock, 1.0)
    card.stop_job(ja)
    card.stop_job(jb)
    ledger.close(a, tokens=300)
    ledger.close(b, tokens=100)
    tick(ledger, clock, 0.2)
    ea, eb = ledger.energy(a), ledger.energy(b)
    assert ea.split == "tokens" and eb.split == "tokens"
    assert (ea.joules or 0) / (eb.joules or 1) == pytest.approx(3.0, rel=0.02)
    assert ea.joules == pytest.approx(ja.true_joules, rel=0.05)


def test_a_node_chooses_its_split(card: SimulatedCard) -> None:
    assert Ledger(Node("t", split="tokens"), SimulatedReader(card)).split.name == "tokens"
    assert Ledger(Node("t"), SimulatedReader(card)).split.name == "time"


def test_token_split_without_tokens_falls_back_to_time(card: SimulatedCard, clock: VirtualClock) -> None:
    ledger = Ledger(Node("tok2", idle_w=60.0), SimulatedReader(card), split=TokenSplit())
    ledger.read_now()
    a, b = ledger.open(), ledger.open()
    tick(ledger, clock, 0.5)
    ledger.close(a, tokens=100)
    ledger.close(b)  # no tokens known
    tick(ledger, clock, 0.2)
    assert ledger.energy(a).split == "time"


def test_pending_intervals_are_bounded(card: SimulatedCard, clock: VirtualClock) -> None:
    ledger = Ledger(
        Node("bounded", idle_w=60.0), SimulatedReader(card), split=TokenSplit(), max_pending=50
    )
    ledger.read_now()
    long = ledger.open()
    card.start_job(100.0)
    tick(ledger, clock, 20.0)  # 400 intervals wait on the long window's tokens
    assert len(ledger._pending) <= 50
    ledger.close(long, tokens=10)
    tick(ledger, clock, 0.2)
    assert ledger.energy(long).settled
    assert ledger.totals().conservation_error_j == pytest.approx(0.0, abs=1e-6)


def test_stages_are_graded_and_the_total_is_not_their_sum(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    window = sim_ledger.open()
    job = card.start_job(50.0)
    tick(sim_ledger, clock, 0.4)
    sim_ledger.mark(window, "retrieve")
    card.stop_job(job)
    job = card.start_job(300.0)
    tick(sim_ledger, clock, 0.6)
    sim_ledger.mark(window, "generate")
    card.stop_job(job)
    tick(sim_ledger, clock, 0.2)  # an unnamed tail after the last mark
    sim_ledger.close(window)
    tick(sim_ledger, clock, 0.2)
    e = sim_ledger.energy(window)
    assert set(e.stages) == {"retrieve", "generate"}
    assert e.stages["retrieve"].seconds == pytest.approx(0.4)
    assert e.stages["retrieve"].joules == pytest.approx(20.0, rel=0.2)
    assert e.stages["generate"].joules == pytest.approx(180.0, rel=0.1)
    stage_sum = sum(s.joules or 0 for s in e.stages.values())
    assert (e.joules or 0) >= stage_sum


def test_memory_stays_bounded_over_many_windows(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    for i in range(3000):
        window = sim_ledger.open()
        clock.advance(0.01)
        sim_ledger.close(window)
        if i % 5 == 0:
            sim_ledger.read_now()
    tick(sim_ledger, clock, 0.3)
    assert not sim_ledger._open and not sim_ledger._closed and not sim_ledger._pending
    assert len(sim_ledger.readings) <= 512


def test_null_reader_settles_at_once_as_unknown() -> None:
    ledger = Ledger(Node("none", reader="none"), NullReader("nothing to read here"))
    window = ledger.open()
    ledger.close(window)
    e = ledger.energy(window)
    assert e.settled and e.joules is None and e.backend == "none" and e.source == "none"
    assert e.error == "nothing to read here"


# -- the property: conservation for any schedule --------------------------------------------

window_spec = st.tuples(
    st.floats(0.0, 2.0), st.floats(0.001, 1.5), st.floats(0.0, 300.0), st.integers(0, 500)
)


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(window_spec, min_size=1, max_size=40),
    gauge=st.sampled_from(["counter", "instant"]),
    idle=st.sampled_from([60.0, 75.0, None]),
    token_split=st.booleans(),
    reset_at=st.one_of(st.none(), st.floats(0.1, 2.5)),
    step=st.sampled_from([0.05, 0.03, 0.1]),
)
def test_charged_plus_unattributed_equals_measured(
    specs: list[tuple[float, float, float, int]],
    gauge: str,
    idle: float | None,
    token_split: bool,
    reset_at: float | None,
    step: float,
) -> None:
    clock = VirtualClock()
    card = SimulatedCard(idle_w=60.0, cap_w=400.0, counter_period=0.1, clock=clock)
    ledger = Ledger(
        Node("prop", idle_w=idle), SimulatedReader(card, gauge=gauge),  # type: ignore[arg-type]
        split=TokenSplit() if token_split else None,
    )
    start = clock()
    ledger.read_now()
    events: list[tuple[float, int, int]] = []
    for i, (t0, dur, _load, _tok) in enumerate(specs):
        events += [(t0, 1, i), (t0 + dur, 0, i)]
    events.sort()
    windows: dict[int, object] = {}
    jobs: dict[int, object] = {}
    next_read = start + step
    did_reset = False
    for t, kind, i in events:
        while next_read <= start + t:
            clock.now = next_read
            if reset_at is not None and not did_reset and next_read - start >= reset_at:
                card.reset_counter()
                did_reset = True
            ledger.read_now()
            next_read += step
        clock.now = max(clock.now, start + t)
        if kind == 1:
            windows[i] = ledger.open()
            jobs[i] = card.start_job(specs[i][2])
        else:
            card.stop_job(jobs[i])  # type: ignore[arg-type]
            ledger.close(windows[i], tokens=specs[i][3])  # type: ignore[arg-type]
    for _ in range(int(1.0 / step) + 2):
        clock.advance(step)
        ledger.read_now()
    totals = ledger.totals()
    assert totals.windows_open == 0 and totals.in_flight_j == pytest.approx(0.0, abs=1e-9)
    reported = sum(
        e.joules for w in windows.values()
        if (e := ledger.energy(w)).method != "estimated" and e.joules is not None  # type: ignore[arg-type]
    )
    scale = max(abs(totals.measured_j), abs(totals.charged_j), abs(totals.unattributed_j), 1.0)
    assert abs(totals.conservation_error_j) <= 1e-6 * scale
    # What the requests were told adds up to what the books say was charged.
    assert reported == pytest.approx(totals.charged_j, rel=1e-6, abs=1e-9)
    assert all(ledger.energy(w).settled for w in windows.values())  # type: ignore[arg-type]


def test_readings_stamp_steps_between_reads() -> None:
    """The midpoint rule: a step seen at t after an unchanged read at t - dt is put at t - dt/2."""
    clock = VirtualClock(0.0)
    values = iter([0.0, 0.0, 10.0])

    class Scripted:
        backend, source, method, kind, period, blocking = (
            "nvml_counter", "local", "measured", "counter", 0.1, False
        )

        def __init__(self) -> None:
            self.clock = clock

        def read(self) -> Reading:
            return Reading(t=clock(), joules=next(values))

        def close(self) -> None: ...

    ledger = Ledger(Node("mid", idle_w=0.0), Scripted())  # type: ignore[arg-type]
    ledger.read_now()
    clock.advance(0.05)
    ledger.read_now()
    clock.advance(0.05)
    ledger.read_now()
    assert ledger._t_last == pytest.approx(0.075)


def test_delayed_reads_are_stamped_at_the_learnt_steps(
    sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock
) -> None:
    """Under load the reader task may read only every few steps. Once the phase is learnt,
    each interval still ends at the step the counter reflects, not at the late read."""
    job = card.start_job(200.0)
    tick(sim_ledger, clock, 0.5)
    window = sim_ledger.open()
    for _ in range(6):
        clock.advance(0.137)  # slower than the 100 ms counter: no read sees it unchanged
        sim_ledger.read_now()
    sim_ledger.close(window)
    card.stop_job(job)
    tick(sim_ledger, clock, 0.3)
    e = sim_ledger.energy(window)
    assert e.settled and e.mean_watts == pytest.approx(260.0, rel=0.02)
    assert e.joules == pytest.approx(200.0 * e.seconds, rel=0.1)
    # And a late read's interval ends at the card's step, not at the read. (A read that lands
    # within the phase's own few-ms error of a step can be placed a step off: rare.)
    errors, late = [], []
    for _ in range(11):
        clock.advance(0.137)
        sim_ledger.read_now()
        step = math.floor(clock() / 0.1 + 1e-9) * 0.1
        errors.append(abs(sim_ledger._t_last - step))
        late.append(clock() - step)
    assert statistics.median(errors) < 0.005 < statistics.median(late)
