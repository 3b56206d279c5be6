"""The ledger against a card that knows the truth (benchmarks/truecard.py), on a virtual
clock so the schedule is exact, and no warm-up: the first window opens at once."""

from __future__ import annotations

import math
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from truecard import Foreign, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger, TokenSplit
from giul_asgi.ledger.book import MAX_WAIT_S
from giul_asgi.meter import Meter
from giul_asgi.readers.base import Process, Reading

IDLE = 70.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Run:
    """A ledger fed by a virtual poller: reads every ~10 ms of virtual time."""

    def __init__(self, node: Node | None = None, gauge: str = "counter", seed: int = 0) -> None:
        self.clock = Clock()
        self.card = TrueCard(idle_w=IDLE, clock=self.clock, seed=seed)
        self.reader = TrueReader(self.card, gauge)  # type: ignore[arg-type]
        self.ledger = Ledger(node or Node("n", idle_w=IDLE), self.reader, poll=False)
        self.rng = random.Random(seed)

    def advance(self, seconds: float) -> None:
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + 0.01 * self.rng.uniform(0.5, 1.5))
            self.ledger.ingest(self.reader.read())

    def request(self, seconds: float, watts: float, tokens: int | None = None,
                lag: float = 0.0) -> tuple[Meter, float]:
        """A window whose job runs from ``lag`` after it opens (an upstream that starts late)."""
        meter = Meter(self.ledger)
        meter.open()
        self.advance(lag)
        job = self.card.start_job(watts)
        self.advance(seconds - lag)
        self.card.stop_job(job)
        meter.tokens(tokens)
        meter.close()
        return meter, job.truth(self.card.ramp_up, self.card.tau)

    def marked(self, watts: float, before: float, stage: str, after: float) -> Meter:
        """A request that marks ``stage`` after ``before`` seconds and closes ``after`` later."""
        meter = Meter(self.ledger)
        meter.open()
        job = self.card.start_job(watts)
        self.advance(before)
        meter.mark(stage)
        self.advance(after)
        self.card.stop_job(job)
        meter.close()
        return meter

    def books(self) -> float:
        t = self.ledger.totals()
        return abs(t.measured_j - (t.charged_j + t.unattributed_j + t.in_flight_j))


def test_short_requests_get_an_honest_first_figure_not_a_confident_near_zero() -> None:
    # The old ledger: 30 ms at 180 W on a 100 ms counter gave first figures of 0.15-2.9 J,
    # "measured", for ~9 J caused. Now the unreported part comes from the measured prior.
    run = Run()
    run.advance(0.5)
    hits, firsts, estimated = 0, [], 0
    for _ in range(30):
        meter, truth = run.request(0.03, 180.0)
        first = meter.figure()
        run.advance(0.3)
        settled = meter.figure()
        assert settled.settled and settled.joules is not None
        if first.joules is None:
            continue
        firsts.append(first.joules / truth)
        hits += abs(first.joules - truth) <= (first.uncertainty_joules or 0)
        assert not first.settled and first.backend == "nvml_counter"
        # Issue 16: a figure mostly interpolated said "measured"; now it is an estimate
        # that says from what.
        estimated += first.method == "estimated"
        assert first.method == "measured" or "interpolated from the" in (first.error or "")
    assert len(firsts) >= 27 and hits >= 0.9 * len(firsts)
    assert estimated >= len(firsts) // 2  # 30 ms on a 100 ms counter: mostly not reported yet
    assert sorted(firsts)[len(firsts) // 2] > 0.7  # the typical first figure is not near zero


def test_first_and_settled_come_from_one_model() -> None:
    run = Run()
    run.advance(0.3)
    gaps = []
    for _ in range(20):
        meter, _ = run.request(0.3, 180.0)
        first = meter.figure().joules
        run.advance(0.4)
        settled = meter.figure().joules
        assert first is not None and settled is not None
        gaps.append(abs(first - settled) / settled)
    # The old ledger's two models disagreed by 6-12% (median) at 300 ms.
    assert sorted(gaps)[len(gaps) // 2] < 0.05


def test_a_steady_foreign_load_is_witnessed_flagged_and_subtracted() -> None:
    node = Node("n", idle_w=IDLE, foreign="subtract")
    run = Run(node)
    run.card.add_foreign(Foreign(150.0, start=0.0))
    run.advance(1.0)  # the card is seen busy with no window open
    charged, caused = 0.0, 0.0
    for _ in range(10):
        meter, truth = run.request(0.3, 180.0)
        run.advance(0.4)
        e = meter.figure()
        assert e.contended is True and e.foreign_watts is not None
        assert abs(e.foreign_watts - 150.0) < 15.0
        charged += e.joules or 0.0
        caused += truth
    assert abs(charged / caused - 1.0) < 0.1  # the old ledger charged 2.0x
    assert run.books() < 1e-9 * run.ledger.totals().measured_j
    assert run.ledger.totals().foreign_j > 0


def test_a_foreign_load_charged_by_choice_is_still_flagged() -> None:
    run = Run()
    run.card.add_foreign(Foreign(150.0, start=0.0))
    run.advance(1.0)
    meter, truth = run.request(0.3, 180.0)
    run.advance(0.4)
    e = meter.figure()
    assert e.contended is True and (e.joules or 0) > 1.5 * truth


def test_contended_is_null_only_when_nobody_could_look() -> None:
    run = Run()
    meter, _ = run.request(0.3, 180.0)  # no time between windows has been seen yet
    assert meter.figure().contended is None
    run.advance(1.0)
    meter, _ = run.request(0.3, 180.0)
    run.advance(0.4)
    assert meter.figure().contended is False


def test_a_foreign_process_on_the_card_marks_figures_contended() -> None:
    run = Run(Node("n", idle_w=IDLE, serving="vllm"))
    run.ledger.note_processes([Process(10, "vllm"), Process(11, "python3")])
    meter, _ = run.request(0.1, 100.0)
    assert meter.figure().contended is True
    run.ledger.note_processes([Process(10, "vllm")])
    run.advance(0.05)
    meter, _ = run.request(0.1, 100.0)
    assert meter.figure().contended is False


def test_staggered_batch_conserves_and_shares_fairly() -> None:
    run = Run(seed=3)
    rng = random.Random(5)
    meters: list[tuple[Meter, object, float]] = []
    starts = sorted(rng.uniform(0, 1.0) for _ in range(16))
    ends = {i: s + rng.uniform(0.3, 1.2) for i, s in enumerate(starts)}
    t0 = run.clock.now
    jobs: dict[int, tuple[Meter, object]] = {}
    done: list[tuple[Meter, object]] = []
    while len(done) < 16:
        now = run.clock.now - t0
        for i, s in enumerate(starts):
            if i not in jobs and s <= now:
                m = Meter(run.ledger)
                m.open()
                jobs[i] = (m, run.card.start_job(20.0))
        for i, (m, job) in list(jobs.items()):
            if ends[i] <= now and not m.closed:
                run.card.stop_job(job)  # type: ignore[arg-type]
                m.close()
                done.append((m, job))
        run.advance(0.005)
    run.advance(0.5)
    errors = []
    for m, job in done:
        e = m.figure()
        truth = job.truth(run.card.ramp_up, run.card.tau)  # type: ignore[attr-defined]
        assert e.settled and e.joules is not None and e.split in ("time", "exclusive")
        errors.append(abs(e.joules - truth) / truth)
        meters.append((m, job, truth))
    assert sorted(errors)[8] < 0.05
    assert run.books() < 1e-9 * run.ledger.totals().measured_j


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.4), st.floats(0.0, 0.3), st.floats(0.0, 300.0)),
        min_size=1, max_size=8,
    ),
    st.sets(st.integers(0, 200), max_size=20),
    st.booleans(),
)
def test_books_balance_for_any_schedule_with_failures_and_resets(
    schedule: list[tuple[float, float, float]], failing: set[int], reset: bool
) -> None:
    """charged + unattributed + in flight == measured above idle, to rounding."""
    run = Run(seed=len(schedule))
    reads = 0
    real_read = run.reader.read

    def read() -> Reading:
        nonlocal reads
        reads += 1
        if reads in failing:
            return Reading(run.clock.now, error="GPU is lost")
        if reset and reads == 90:
            run.card.t0 = run.clock.now  # a driver reload: the counter starts again
            run.card.idle_w = IDLE
        return real_read()

    run.reader.read = read  # type: ignore[method-assign]
    meters = []
    for gap, seconds, watts in schedule:
        run.advance(gap)
        meter, _ = run.request(seconds, watts)
        meters.append(meter)
    run.advance(0.5)
    measured = run.ledger.totals().measured_j
    assert run.books() <= 1e-9 * max(1.0, abs(measured))
    for meter in meters:
        e = meter.figure()
        assert e.joules is None or e.joules > 0  # never a measured zero


def test_token_split_never_holds_the_book_hostage() -> None:
    run = Run(Node("n", idle_w=IDLE, split="tokens"))
    run.ledger.book.split = TokenSplit()
    stream = Meter(run.ledger)
    stream.open()
    long_job = run.card.start_job(50.0)
    done = []
    for _ in range(60):
        meter, _ = run.request(0.2, 100.0, tokens=20)
        run.advance(0.1)
        done.append(meter)
    run.advance(MAX_WAIT_S + 1.0)
    # The old ledger: 0 of 10,000 requests counted while one stream stayed open.
    assert sum(m.settled_now for m in done) == len(done)
    assert len(run.ledger.book._waiting) < 2_000
    assert any("time" in (m.figure().split or "") for m in done)
    run.card.stop_job(long_job)
    stream.close()
    assert run.books() < 1e-9 * run.ledger.totals().measured_j


def test_a_window_before_the_first_step_gets_a_figure_from_the_same_model() -> None:
    """Issue 16: a window opened before a fresh ledger's first counter step had no figure
    ("no baseline reading yet"). Its time before the step is filled from the first spans'
    rate, inside its uncertainty; the rest is measured; the books still balance."""
    covered = 0
    for seed in range(12):
        run = Run(seed=seed)
        meter, truth = run.request(0.5, 180.0)  # opens before any reading at all
        first = meter.figure()
        run.advance(0.5)
        settled = meter.figure()
        for e in (first, settled):
            assert e.joules is not None and e.method in ("measured", "estimated")
            covered += abs(e.joules - truth) <= (e.uncertainty_joules or 0.0)
        assert settled.settled and "baseline" not in (settled.error or "")
        totals = run.ledger.totals()
        assert 0 < totals.estimated_j < 0.5 * truth  # what was filled is booked apart
        assert run.books() < 1e-9 * totals.measured_j
    assert covered >= 0.9 * 24


def test_a_short_cold_window_waits_for_a_rate_then_settles_as_an_estimate() -> None:
    run = Run(seed=2)  # the card's first step falls 96 ms after it starts
    meter, truth = run.request(0.05, 180.0)  # wholly before the first step
    run.advance(0.4)
    assert not meter.settled_now  # nothing learnt yet to fill it from
    for _ in range(3):  # one settled window's rate is no basis (SETTLED_MIN)
        later, _ = run.request(0.3, 180.0)
        run.advance(0.4)
    e = meter.figure()
    assert e.settled and e.joules is not None and e.method == "estimated"
    assert "interpolated from" in (e.error or "")
    assert abs(e.joules - truth) <= (e.uncertainty_joules or 0.0)
    assert later.figure().method == "measured"


class Faulty:
    """Feeds the ledger what its poller would while a reader fails in one of three ways:
    every read raises (the poller books each as a failed reading), every read hangs (the
    watchdog books one failure per read_timeout), or the counter stops moving."""

    def __init__(self, run: Run, fault: str) -> None:
        self.run, self.fault = run, fault
        self.last: Reading | None = None
        self.hung_since: float | None = None

    def advance(self, seconds: float, failing: bool) -> None:
        run = self.run
        end = run.clock.now + seconds
        while run.clock.now < end:
            run.clock.now = min(end, run.clock.now + 0.01 * run.rng.uniform(0.5, 1.5))
            if not failing:
                self.last = run.reader.read()
                self.hung_since = None
                run.ledger.ingest(self.last)
            elif self.fault == "raises":
                run.ledger.ingest(Reading(run.clock.now, error="RuntimeError: GPU is lost"))
            elif self.fault == "hangs":
                since = self.hung_since = self.hung_since or run.clock.now
                if run.clock.now - since >= 1.0:  # the watchdog, every read_timeout
                    self.hung_since = run.clock.now
                    run.ledger.ingest(Reading(run.clock.now, error="a read blocked for more than 1 s"))
            else:
                assert self.last is not None and self.last.joules is not None
                run.ledger.ingest(Reading(run.clock.now, joules=self.last.joules))

    def request(self, seconds: float, watts: float, failing: bool) -> tuple[Meter, float]:
        run = self.run
        meter = Meter(run.ledger)
        meter.open()
        job = run.card.start_job(watts)
        self.advance(seconds, failing)
        run.card.stop_job(job)
        meter.close()
        return meter, job.truth(run.card.ramp_up, run.card.tau)


@pytest.mark.parametrize("fault", ["raises", "hangs", "stops"])
def test_first_figures_made_while_the_reader_fails_never_say_measured(fault: str) -> None:
    """Issue 16: after 4 s of good reads, a counter that raises, hangs or stops moving
    left 6-7 of 7 first figures saying "measured" (100% interpolated)."""
    run = Run(seed=5)
    faulty = Faulty(run, fault)
    for _ in range(7):
        faulty.request(0.3, 180.0, failing=False)
        faulty.advance(0.25, failing=False)
    firsts = []
    for _ in range(7):
        meter, truth = faulty.request(0.3, 180.0, failing=True)
        firsts.append((meter.figure(), truth))
        faulty.advance(0.25, failing=True)
    assert [e.method for e, _ in firsts].count("measured") == 0
    for e, _ in firsts:
        assert e.method in ("estimated", "unknown") and e.backend == "nvml_counter"
        assert e.joules is None or "interpolated from the node's prior" in (e.error or "")
    known = [(e, truth) for e, truth in firsts if e.joules is not None]
    assert len(known) >= 6
    assert sum(abs(e.joules - t) <= (e.uncertainty_joules or 0) for e, t in known) >= 0.9 * len(known)  # type: ignore[operator]
    # The reader recovers: once the card reports again, figures are measured again.
    faulty.advance(0.5, failing=False)
    for _ in range(3):
        meter, truth = faulty.request(0.3, 180.0, failing=False)
        faulty.advance(0.4, failing=False)
    e = meter.figure()
    assert e.method == "measured" and e.settled and math.isclose(e.joules or 0, truth, rel_tol=0.05)
    assert run.books() < 1e-9 * run.ledger.totals().measured_j


def test_a_reader_failing_now_is_named_in_the_first_figure() -> None:
    run = Run(seed=2)
    run.advance(0.5)
    for _ in range(3):
        run.request(0.3, 180.0)
        run.advance(0.3)
    meter = Meter(run.ledger)
    meter.open()
    job = run.card.start_job(180.0)
    run.advance(0.2)
    run.ledger.ingest(Reading(run.clock.now, error="NVMLError_Unknown"))
    run.card.stop_job(job)
    meter.close()
    e = meter.figure()
    assert e.method == "estimated" and "the reader is failing: NVMLError_Unknown" in (e.error or "")
    # A window that drew nothing (measured at idle) says it failed to measure, and why.
    idle = Meter(run.ledger)
    idle.open()
    run.advance(0.2)
    run.ledger.ingest(Reading(run.clock.now, error="NVMLError_Unknown"))
    idle.close()
    e = idle.figure()
    assert e.joules is None or e.method == "estimated"
    assert e.joules is not None or "NVMLError_Unknown" in (e.error or "")


def test_a_window_closed_after_shutdown_settles_at_once() -> None:
    run = Run()
    run.advance(0.5)
    meter = Meter(run.ledger)
    meter.open()
    run.advance(0.2)
    run.ledger.stop()
    meter.close()
    assert meter.settled_now
    e = meter.figure()
    assert e.joules is None and "stopped" in (e.error or "")
    assert run.ledger._poller is None  # closing did not restart a reader


class Wedged:
    """A driver whose every call blocks: building it, and each read."""

    backend, source, method, kind, period = "nvml_counter", "local", "measured", "counter", 0.1
    clock = staticmethod(time.monotonic)

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s

    def read(self) -> Reading:
        time.sleep(self.block_s)
        return Reading(time.monotonic(), joules=1.0)

    def close(self) -> None:
        time.sleep(self.block_s)


def test_a_wedged_driver_costs_figures_never_time() -> None:
    def build(_node: Node) -> Wedged:
        time.sleep(3.0)  # NVML init and the probe, blocked
        return Wedged(3.0)

    ledger = Ledger(Node("w", idle_w=IDLE, reader="nvml", reader_factory=build), read_timeout=0.2)
    started = time.monotonic()
    meter = Meter(ledger)
    meter.open()  # the first request starts the poller: it must not wait for the driver
    opened = time.monotonic() - started
    meter.close()
    e = meter.figure()
    assert opened < 0.05
    assert e.joules is None and e.method == "unknown"
    started = time.monotonic()
    ledger.stop(timeout=0.3)
    assert time.monotonic() - started < 1.0


@pytest.mark.anyio
async def test_startup_waits_for_a_wedged_driver_only_its_bound() -> None:
    import anyio

    def build(_node: Node) -> Wedged:
        time.sleep(3.0)
        return Wedged(3.0)

    ledger = Ledger(Node("w2", idle_w=IDLE, reader="nvml", reader_factory=build))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        started = time.monotonic()
        await ledger.wait_ready(0.2)
        waited = time.monotonic() - started
        group.cancel_scope.cancel()
    assert waited < 1.0 and ticks >= 5  # the loop ran all the while
    ledger.stop(timeout=0.1)


@pytest.mark.anyio
async def test_a_reader_asked_for_by_name_that_cannot_start_fails_startup() -> None:
    from giul_asgi.errors import ReaderUnavailable

    def build(_node: Node) -> Wedged:
        raise ReaderUnavailable("NVML would not start", remedy="check the driver")

    ledger = Ledger(Node("bad", idle_w=IDLE, reader="nvml", reader_factory=build))
    with pytest.raises(ReaderUnavailable, match="check the driver"):
        await ledger.wait_ready(1.0)
    meter = Meter(ledger)
    meter.open()
    meter.close()
    assert meter.figure().error and "unavailable" in (meter.figure().error or "")


def test_reads_come_from_a_real_thread_and_settle_windows_on_the_real_clock() -> None:
    card = TrueCard(idle_w=IDLE, seed=2)
    ledger = Ledger(Node("real", idle_w=IDLE), TrueReader(card))
    ledger.ensure_started()  # what lifespan startup does; a lazy start loses the first window
    meter = Meter(ledger)
    time.sleep(0.3)
    meter.open()
    job = card.start_job(150.0)
    time.sleep(0.3)
    card.stop_job(job)
    meter.close()
    deadline = time.monotonic() + 2.0
    while not meter.settled_now and time.monotonic() < deadline:
        time.sleep(0.02)
    ledger.stop()
    e = meter.figure()
    truth = job.truth(card.ramp_up, card.tau)
    assert e.settled and e.joules is not None
    assert abs(e.joules - truth) <= max(e.uncertainty_joules or 0, 0.1 * truth)
    assert ledger.totals().reads > 20


def test_a_window_closed_just_before_the_stop_settles_measured_not_lost() -> None:
    """A stranger's trial: under gunicorn's --max-requests, each recycled worker's last
    answer settled unknown ("closed after the ledger's last reading"): the one read at the
    stop came before the counter's next step. Stopping, the reader reads on while closed
    windows wait (a couple of periods at most), within the middleware's 0.5 s."""
    for seed in range(3):
        card = TrueCard(idle_w=IDLE, seed=seed)
        ledger = Ledger(Node("last", idle_w=IDLE), TrueReader(card))
        ledger.ensure_started()
        meter = Meter(ledger)
        time.sleep(0.3)
        meter.open()
        job = card.start_job(150.0)
        time.sleep(0.25)
        card.stop_job(job)
        meter.close()
        ledger.stop(0.5)  # at once, as a worker's shutdown does
        e = meter.figure()
        truth = job.truth(card.ramp_up, card.tau)
        assert e.settled and e.joules is not None and e.method == "measured", e
        assert abs(e.joules - truth) <= max(e.uncertainty_joules or 0, 0.1 * truth), (e, truth)


def test_energy_counter_watts_match_the_card_on_every_counter_kind() -> None:
    for gauge, period in (("counter", 0.1), ("counter", 0.02), ("every_read", 0.1)):
        run = Run()
        run.card.period = period
        run.reader.gauge = gauge  # type: ignore[assignment]
        run.advance(0.5)
        meters = []
        for _ in range(6):
            meters.append(run.request(0.3, 180.0))
            run.advance(0.3)  # isolated: a neighbour's ramp-down tail is not in its span
        for meter, truth in meters[1:]:
            e = meter.figure()
            assert e.joules is not None and math.isclose(e.joules, truth, rel_tol=0.03), gauge


def test_the_upstreams_whole_load_shares_the_card_among_replicas() -> None:
    """Two more requests of another replica run on the upstream: we are charged ours only."""
    run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics"))
    run.advance(0.5)
    charged, caused = 0.0, 0.0
    for _ in range(8):
        theirs = [run.card.start_job(180.0) for _ in range(2)]  # the other replica's requests
        meter = Meter(run.ledger)
        meter.open()
        job = run.card.start_job(180.0)
        run.ledger.note_upstream(run.clock.now, 3.0)  # theirs and ours
        run.advance(0.3)
        run.card.stop_job(job)
        for other in theirs:
            run.card.stop_job(other)
        run.ledger.note_upstream(run.clock.now, 1.0)  # ours, about to close
        meter.close()
        run.advance(0.4)
        run.ledger.note_upstream(run.clock.now, 0.0)
        e = meter.figure()
        assert e.contended is True
        charged += e.joules or 0.0
        caused += job.truth(run.card.ramp_up, run.card.tau)
    # Without the upstream's load, this replica would have been charged about 3x.
    assert abs(charged / caused - 1.0) < 0.1
    assert run.books() < 1e-9 * run.ledger.totals().measured_j


def test_an_upstream_running_only_our_requests_is_no_foreign_load() -> None:
    """Issue 16: with upstream= and foreign="subtract", 10 of 10 sequential requests were
    flagged contended and 83.9 J booked foreign with no foreign load: the upstream's count,
    held between its samples past our window's close, read as load we could not see."""
    run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics", foreign="subtract"))
    running = 0
    next_sample = run.clock.now
    meters = []

    def advance(seconds: float) -> None:
        nonlocal next_sample
        end = run.clock.now + seconds
        while run.clock.now < end:
            run.advance(min(0.01, end - run.clock.now))
            if run.clock.now >= next_sample:  # the upstream's /metrics, every 0.25 s
                run.ledger.note_upstream(run.clock.now, float(running))
                next_sample = run.clock.now + 0.25

    advance(0.5)
    for _ in range(10):
        meter = Meter(run.ledger)
        meter.open()
        advance(0.003)
        running += 1
        job = run.card.start_job(180.0)
        advance(0.3)
        run.card.stop_job(job)
        running -= 1
        advance(0.003)
        meter.close()
        meters.append((meter, job.truth(run.card.ramp_up, run.card.tau)))
        advance(0.25)
    advance(0.5)
    for meter, truth in meters:
        e = meter.figure()
        assert e.contended is False and e.settled
        assert math.isclose(e.joules or 0, truth, rel_tol=0.05)
    assert run.ledger.totals().foreign_j < 0.01 * sum(t for _, t in meters)


def test_a_read_that_hangs_is_booked_as_failed_by_the_watchdog() -> None:
    """The reader builds, then its reads block: the watchdog books each overrun as a failed
    read, the tape turns the failure into a gap, and windows say why, never a figure."""
    card = TrueCard(idle_w=IDLE, seed=4)
    reader = TrueReader(card)
    hang = {"now": False}
    real_read = reader.read

    def read() -> Reading:
        if hang["now"]:
            time.sleep(5.0)
        return real_read()

    reader.read = read  # type: ignore[method-assign]
    ledger = Ledger(Node("hang", idle_w=IDLE), reader, read_timeout=0.1)
    ledger.ensure_started()
    time.sleep(0.3)
    hang["now"] = True
    meter = Meter(ledger)
    started = time.monotonic()
    meter.open()
    meter.close()
    assert time.monotonic() - started < 0.05
    deadline = time.monotonic() + 4.0
    while not meter.settled_now and time.monotonic() < deadline:
        time.sleep(0.05)
    totals = ledger.totals()
    assert totals.read_errors >= 3 and "blocked for more than 0.1 s" in (totals.last_error or "")
    e = meter.figure()
    # Never measured: unknown, or an estimate from the card's first readings that says why.
    assert e.settled and e.method in ("unknown", "estimated") and "blocked" in (e.error or "")
    ledger.stop(timeout=0.2)


class _Later:
    """A poller that never runs: settled windows wait in ``Ledger._handing`` for deliver()."""

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


class _Listener:
    def __init__(self) -> None:
        self.got = 0

    def settled(self, batch: list[object]) -> None:
        self.got += len(batch)


def _settled_before_its_hand_over() -> tuple[Run, Meter, list[float | None]]:
    """A window with an on_settled, settled by a reading and not handed over yet (as on a
    server between two reads), and what its on_settled got."""
    run = Run()
    run.ledger._poller = _Later()  # type: ignore[assignment]
    called: list[float | None] = []
    run.advance(0.3)  # the card read before the window opens: a reading covers it
    meter = Meter(run.ledger)
    meter.open()
    job = run.card.start_job(150.0)
    meter.on_settled(lambda energy: called.append(energy.joules))
    run.advance(0.05)
    run.card.stop_job(job)
    meter.close()
    while not meter.settled_now:
        run.advance(0.01)
    return run, meter, called


def test_a_report_after_its_window_settled_but_before_the_hand_over_keeps_the_callbacks() -> None:
    # A report taken from the tray meanwhile threw the window's waiting callbacks away as
    # "run already": an on_settled never ran (a hostile review).
    run, meter, called = _settled_before_its_hand_over()
    listener = _Listener()
    meter.report(listener, "ok", 200)  # into the tray, after the settle
    assert meter.window is not None
    run.ledger.share(meter.window)  # a request-path call takes the tray: the report now
    run.ledger.deliver(float("inf"))
    assert len(called) == 1 and called[0] is not None
    assert listener.got == 1


def test_a_report_taken_while_the_reader_hands_its_window_over_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reader took the window's callbacks (handing it over) between the report's look at
    # them and its add: the ticket landed on a window nobody fires again (a hostile review).
    # The callbacks are taken under the ledger's lock now, as the report looks and adds.
    import threading

    from giul_asgi.ledger import ledger as ledger_module

    run, meter, called = _settled_before_its_hand_over()
    paused, resume = threading.Event(), threading.Event()
    real = ledger_module.waiting_on

    def preempted(window: object, callback: object) -> None:
        paused.set()
        resume.wait(0.5)  # the reader's hand-over cannot take the lock meanwhile: it waits
        real(window, callback)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_module, "waiting_on", preempted)
    listener = _Listener()
    meter.report(listener, "ok", 200)
    assert meter.window is not None
    request = threading.Thread(target=run.ledger.share, args=(meter.window,))
    request.start()
    assert paused.wait(5)
    reader = threading.Thread(target=run.ledger.deliver, args=(float("inf"),))
    reader.start()
    resume.set()
    request.join(5)
    reader.join(5)
    run.ledger.deliver(float("inf"))
    assert len(called) == 1 and listener.got == 1


def _before_any_reading(run: Run, watts: float = 200.0, seconds: float = 0.1,
                        lag: float = 0.0) -> tuple[Meter, float]:
    """A fresh ledger's first window, opened and closed before the card was first read (no
    warm-up, no lifespan), the card working for it from ``lag`` after it opened (an upstream
    that starts the job late); and what it caused."""
    meter = Meter(run.ledger)
    meter.open()
    run.clock.now += lag
    job = run.card.start_job(watts)
    run.clock.now += seconds - lag  # nothing read meanwhile
    run.card.stop_job(job)
    meter.close()
    return meter, job.truth(run.card.ramp_up, run.card.tau)


def _taught(run: Run, first: Meter) -> Energy:
    """``first``'s figure once three windows like it (100 ms at 200 W) have settled."""
    for _ in range(3):
        run.request(0.1, 200.0)
        run.advance(0.3)
    run.advance(0.5)
    return first.figure()


def test_a_window_before_the_first_reading_settles_on_a_rate_its_windows_teach() -> None:
    # The card's power in its first readings (idle by then, or the window's own tail) filled
    # a fresh process's first 100 ms window: `measured` at 0.05-0.5x its truth, outside its
    # uncertainty, in 4 seeds of 6 (benchmarks/attribution.py's isolated 100 ms, NVML path).
    for seed in range(6):
        run = Run(seed=seed)
        first, truth = _before_any_reading(run)
        run.advance(0.5)
        assert not first.settled_now  # nothing learnt: it waits rather than guess from idle
        e = _taught(run, first)
        assert e.settled and e.method == "estimated", e
        assert e.joules is not None and e.uncertainty_joules is not None
        assert abs(e.joules - truth) <= e.uncertainty_joules, (seed, e.joules, e.uncertainty_joules, truth)


def test_a_window_before_the_first_reading_with_nothing_to_learn_from_is_unknown() -> None:
    run = Run(seed=1)
    first, _ = _before_any_reading(run)
    run.advance(11.0)  # the card read idle all along: no rate for a window that worked
    e = first.figure()
    assert e.settled and e.joules is None and e.method == "unknown", e
    assert "no reading covered this window" in (e.error or "")


@pytest.mark.parametrize(("gauge", "lag", "seconds", "then"), [
    # An instant gauge whose next request's first span still read idle, a counter whose
    # upstream starts each job 30 ms late, and a 5 ms request whose 4 J tail nobody read:
    # filled from one span's run rate (or its own time only) they settled at 0.00-0.45x,
    # outside, in 5-8 of 8 (a hostile trial of the change above).
    ("instant", 0.0, 0.1, 0.1),
    ("counter", 0.03, 0.1, 0.1),
    ("counter", 0.0, 0.005, 0.3),
])
def test_a_window_before_the_first_reading_is_filled_from_whole_settled_windows(
    gauge: str, lag: float, seconds: float, then: float,
) -> None:
    outside = 0
    for seed in range(8):
        run = Run(gauge=gauge, seed=seed)
        first, truth = _before_any_reading(run, seconds=seconds, lag=lag)
        run.advance(1.0)  # the card read idle for a second
        for _ in range(3):
            run.request(then, 200.0, lag=lag)
            run.advance(0.3)
        run.advance(0.5)
        e = first.figure()
        assert e.settled and e.joules is not None and e.uncertainty_joules is not None, e
        # None of its own time was read (a share after it is its tail's): never `measured`.
        assert e.method == "estimated", e
        outside += abs(e.joules - truth) > e.uncertainty_joules
    assert outside <= 1


def test_windows_waiting_for_a_rate_are_looked_at_again_only_when_one_was_learnt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 5,000 windows before the card's first reading, each retried at every reading, took 65%
    # of a core for ten seconds (a hostile trial); they settle as before.
    from giul_asgi.ledger.prior import Prior

    calls = [0]
    real = Prior.unread_fill

    def counted(self: Prior, *args: object) -> object:
        calls[0] += 1
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Prior, "unread_fill", counted)
    run = Run(seed=2)
    meters = [_before_any_reading(run, seconds=0.002)[0] for _ in range(200)]
    run.advance(MAX_WAIT_S / 2)  # hundreds of readings, nothing learnt
    assert calls[0] <= 2 * len(meters)
    assert not any(m.settled_now for m in meters)
    run.advance(MAX_WAIT_S)
    assert all(m.settled_now and m.figure().method == "unknown" for m in meters)


def test_a_window_read_only_in_part_says_so_when_nothing_fills_the_rest() -> None:
    run = Run(seed=3)
    meter = Meter(run.ledger)
    meter.open()
    job = run.card.start_job(200.0)
    run.clock.now += 0.15  # unread
    run.advance(0.1)  # the card's first readings: a span of its last 23 ms, less than half a period
    run.card.stop_job(job)
    meter.close()
    run.advance(MAX_WAIT_S + 1)
    e = meter.figure()
    assert e.settled and e.method == "unknown", e
    assert e.error == ("the card was read for 23 ms of its 250 ms and nothing was learnt to fill "
                       "the rest from"), e.error


def test_a_cold_burst_is_not_filled_from_its_own_ramp_down() -> None:
    # Twenty 20 ms windows back to back before the first reading, on a gauge that holds its
    # value a period: read after them, the card's falling tail looked like a busy card and
    # filled them at 0.34-0.6x, 4 of 20 inside (a hostile trial).
    for seed in range(4):
        run = Run(gauge="instant", seed=seed)
        colds = [_before_any_reading(run, watts=150.0, seconds=0.02) for _ in range(20)]
        run.advance(0.3)
        for _ in range(10):
            run.request(0.2, 200.0)
            run.advance(0.1)
        run.advance(0.5)
        figures = [(meter.figure(), truth) for meter, truth in colds]
        assert all("first readings" not in (e.error or "") for e, _ in figures)
        inside = [e for e, t in figures if e.joules is not None and e.uncertainty_joules is not None
                  and abs(e.joules - t) <= e.uncertainty_joules]
        assert len(inside) >= 18, (seed, len(inside))


def test_a_window_before_the_first_reading_is_not_filled_at_another_load_on_the_card() -> None:
    # A steady load of another's on the card, read after the cold window: taken for its rate
    # (a "busy card"), it filled the window at 0.22-0.40x what it was charged (its own work and
    # the load beside it, foreign="charge"), outside for 8 of 8 (a hostile trial).
    outside = 0
    for seed in range(8):
        run = Run(seed=seed)
        run.card.start_job(50.0)  # the other load, there all along
        first, job_truth = _before_any_reading(run)
        run.advance(1.0)
        e = _taught(run, first)
        assert e.settled and e.method == "estimated", e
        assert "first readings" not in (e.error or ""), e.error
        truth = job_truth + 50.0 * 0.1  # charged alone on the card: the load beside it too
        assert e.joules is not None and e.uncertainty_joules is not None
        outside += abs(e.joules - truth) > e.uncertainty_joules
    assert outside <= 1


def _together(run: Run, n: int, seconds: float, watts: float) -> None:
    """``n`` requests at once, each its own job of ``watts`` on the card."""
    meters = [Meter(run.ledger) for _ in range(n)]
    for meter in meters:
        meter.open()
    jobs = [run.card.start_job(watts) for _ in range(n)]
    run.advance(seconds)
    for job, meter in zip(jobs, meters, strict=True):
        run.card.stop_job(job)
        meter.close()


@pytest.mark.parametrize("shape", ["batched after", "no work first", "ten idle first", "lighter first"])
def test_a_cold_window_is_filled_within_its_doubt_whatever_the_windows_after_it(shape: str) -> None:
    # A second hostile trial: a cold request alone, then requests 8 at a time (0.22x, outside
    # 8 of 8); then first requests that did no card work (0.08-0.24x); then a first warm
    # request lighter than the rest, one settled window ending the wait (0.41x): all outside.
    outside = 0
    for seed in range(8):
        run = Run(seed=seed)
        first, truth = _before_any_reading(run, watts=250.0 if shape == "batched after" else 200.0)
        run.advance(0.3)
        if shape == "batched after":
            for _ in range(6):
                _together(run, 8, 0.3, 50.0)
                run.advance(0.2)
        else:
            if shape in ("no work first", "ten idle first"):  # a 429, a cache hit
                n, seconds = (5, 0.005) if shape == "no work first" else (10, 0.05)
                for _ in range(n):
                    run.request(seconds, 0.0)
                    run.advance(0.05)
            else:
                run.request(0.3, 80.0)
                run.advance(0.2)
            for _ in range(5):
                run.request(0.3, 200.0)
                run.advance(0.2)
        run.advance(0.5)
        e = first.figure()
        assert e.settled and e.method == "estimated" and e.joules is not None, e
        assert e.uncertainty_joules is not None
        outside += abs(e.joules - truth) > e.uncertainty_joules
    assert outside <= 1


def test_a_recycled_worker_keeps_how_many_ran_beside_the_windows_it_learnt_from() -> None:
    # A third hostile trial: a worker that restored its server's kept prior, learnt from
    # requests batched eight at a time, priced its first request (alone, before the card's
    # first reading) at their per-request rate: 0.22-0.24x, outside for 6 of 6.
    outside = 0
    for seed in range(6):
        old = Run(seed=seed)
        for _ in range(12):
            _together(old, 8, 0.3, 50.0)
            old.advance(0.2)
        kept = old.ledger.book.prior.state()
        new = Run(seed=seed + 100)
        assert new.ledger.book.prior.restore(kept)
        first, truth = _before_any_reading(new, watts=250.0)
        new.advance(0.5)
        e = first.figure()
        assert e.settled and e.method == "estimated" and e.joules is not None, e
        assert e.uncertainty_joules is not None
        outside += abs(e.joules - truth) > e.uncertainty_joules
    assert outside == 0


def test_a_reader_failing_from_its_start_fills_from_a_kept_prior() -> None:
    # A fourth hostile trial: with no span ever read, every window counted as one before the
    # card's first reading, and a kept prior that had not counted windows that did work (an
    # older release's, or one of short requests) settled them unknown where they had settled
    # estimated, inside. A fault's windows fill as a failure's do.
    old = Run(seed=4)
    for _ in range(20):
        old.request(0.3, 180.0)
        old.advance(0.2)
    kept = old.ledger.book.prior.state()
    four = ("settled", "span", "run", "host")  # what an older release kept
    older = {k: v for k, v in kept.items() if k not in ("together", "worked", "most_w")}
    older["rates"] = {k: v for k, v in kept["rates"].items() if k in four}
    for state in (kept, older):
        new = Run(seed=5)
        assert new.ledger.book.prior.restore(state)
        meter = Meter(new.ledger)
        meter.open()
        job = new.card.start_job(180.0)
        for _ in range(30):  # the reader raises at every read
            new.clock.now += 0.01
            new.ledger.ingest(Reading(new.clock.now, error="NVMLError_GpuIsLost"))
        new.card.stop_job(job)
        meter.close()
        for _ in range(100):
            new.clock.now += 0.01
            new.ledger.ingest(Reading(new.clock.now, error="NVMLError_GpuIsLost"))
        e = meter.figure()
        truth = job.truth(new.card.ramp_up, new.card.tau)
        assert e.settled and e.method == "estimated" and e.joules is not None, e
        assert e.uncertainty_joules is not None and abs(e.joules - truth) <= e.uncertainty_joules, e
