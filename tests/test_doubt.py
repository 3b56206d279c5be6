"""The time split's own doubt (giul_asgi/ledger/doubt.py): requests that draw at unlike rates
share spans by time, and rule 5 still holds (the truth inside +-uncertainty for at least 9 in
10), learnt from the spans; a homogeneous mix stays narrow; a window alone has no split doubt.
On a virtual clock against the truth card, so a loaded machine changes nothing."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import batch_card
import pytest
from truecard import Job, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.simulated import VirtualClock

IDLE = 70.0


@dataclass
class Done:
    meter: Meter
    job: Job
    first: float
    first_unc: float
    truth: float = math.nan


class Run:
    """A ledger on a truth card read every ~10 ms of virtual time, requests stepped every 2 ms."""

    def __init__(self, seed: int, split: str = "time", period: float = 0.1, jitter: float = 0.003) -> None:
        self.clock = VirtualClock(100.0)
        self.card = TrueCard(idle_w=IDLE, clock=self.clock, seed=seed, period=period, step_jitter=jitter)
        self.reader = TrueReader(self.card)
        self.ledger = Ledger(Node("n", idle_w=IDLE, split=split), self.reader, poll=False)
        self.rng = random.Random(seed)
        self._next_read = self.clock.now

    def step(self) -> None:
        self.clock.now += 0.002
        if self.clock.now >= self._next_read:
            self.ledger.ingest(self.reader.read())
            self._next_read = self.clock.now + 0.01 * self.rng.uniform(0.5, 1.5)

    def serve(self, requests: list[tuple[float, float, float]]) -> list[Done]:
        """``requests``: (start, seconds, watts above idle) each."""
        t0 = self.clock.now
        waiting = sorted(requests)
        running: list[tuple[Meter, Job, float]] = []
        done: list[Done] = []
        while waiting or running:
            now = self.clock.now - t0
            while waiting and waiting[0][0] <= now:
                _, seconds, watts = waiting.pop(0)
                meter = Meter(self.ledger)
                meter.open()
                running.append((meter, self.card.start_job(watts), now + seconds))
            for item in list(running):
                meter, job, end = item
                if now >= end:
                    self.card.stop_job(job)
                    meter.close()
                    running.remove(item)
                    figure = meter.figure()
                    assert figure.joules is not None and figure.uncertainty_joules is not None
                    done.append(Done(meter, job, figure.joules, figure.uncertainty_joules))
            self.step()
        for _ in range(300):
            self.step()
        for d in done:
            d.truth = d.job.truth(self.card.ramp_up, self.card.tau)
        return done


def rounds(kinds: list[float], rng: random.Random, n: int = 8,
           count: int = 6) -> list[tuple[float, float, float]]:
    """Rounds of ``n`` overlapping requests, drawing in turn at each of ``kinds`` watts (+-3%)."""
    return [(r * 2.5 + rng.uniform(0, 1.0), rng.uniform(0.3, 1.2),
             kinds[i % len(kinds)] * rng.uniform(0.97, 1.03)) for r in range(count) for i in range(n)]


def staggered(n: int, rng: random.Random, spread_s: float, total_w: float,
              count: int = 1) -> list[tuple[float, float, float]]:
    """Rounds of ``n`` requests arriving over ``spread_s``, 0.2-2 s long, sharing ``total_w``
    alike (+-3%): a continuous batch (benchmarks/attribution.py's staggered batch)."""
    return [(r * (spread_s + 2.5) + rng.uniform(0, spread_s),
             min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5))),
             total_w / n * rng.uniform(0.97, 1.03)) for r in range(count) for _ in range(n)]


def first_width(done: list[Done]) -> float:
    return statistics.median(d.first_unc / d.first for d in done)


def served(kinds: list[float]) -> list[Done]:
    return [d for seed in range(4) for d in Run(seed).serve(rounds(kinds, random.Random(seed)))]


def inside(done: list[Done], first: bool = False) -> float:
    hits = 0
    for d in done:
        e = d.meter.figure()
        assert e.settled and e.joules is not None and e.uncertainty_joules is not None
        joules, unc = (d.first, d.first_unc) if first else (e.joules, e.uncertainty_joules)
        hits += abs(joules - d.truth) <= unc
    return hits / len(done)


def width(done: list[Done]) -> float:
    return statistics.median(d.meter.figure().uncertainty_joules / d.meter.figure().joules  # type: ignore[operator]
                             for d in done)


def test_requests_at_unlike_rates_shared_by_time_hold_the_truth_nine_times_in_ten() -> None:
    """Half the requests draw three times what the other half do; the time split charges
    them alike (tens of percent off), and says so: >= 90% of settled and first figures hold
    the truth within +-uncertainty, the first round included (the cold spread), the later
    ones once learnt. A mix drawing alike (+-3%) learns that its members do, and its band
    stays narrow: a small part of the unlike mix's."""
    unlike = served([15.0, 45.0])
    assert statistics.median(abs(d.meter.figure().joules - d.truth) / d.truth for d in unlike) > 0.3  # type: ignore[operator]
    learnt = [d for d in unlike if d.job.start > 100.0 + 2.5]  # after the first round
    settled, first = inside(unlike), inside(unlike, first=True)
    assert settled >= 0.9 and first >= 0.9, (settled, first)
    assert inside(learnt) >= 0.9, inside(learnt)
    alike = served([30.0])
    alike_learnt = [d for d in alike if d.job.start > 100.0 + 2.5]
    assert width(alike_learnt) < 0.15, width(alike_learnt)
    assert width(alike_learnt) < width(learnt) / 4, (width(alike_learnt), width(learnt))


def test_a_window_alone_in_its_spans_has_no_split_doubt() -> None:
    """A request alone on the card is charged what the card measured in its time: no split
    can be wrong about it, so its uncertainty is the card's alone; two requests at unlike
    rates beside each other carry the split's doubt."""
    run = Run(seed=1)
    done = run.serve([(0.0, 0.5, 30.0), (1.0, 0.6, 15.0), (1.1, 0.6, 45.0)])
    alone, *shared = (d.meter.window for d in done)
    assert alone is not None
    assert alone.alone and alone.split_own == alone.split_lin == alone.split_sq == 0.0
    assert alone.rate_units is None and alone.rate_own == alone.rate_lin == 0.0
    for window in shared:
        assert window is not None and not window.alone and window.rate_own > 0.05 * window.share


def test_a_continuous_batch_drawing_alike_is_not_widened_by_the_cards_stamps_nor_a_cold_start() -> None:
    """About sixteen requests in flight for six seconds, drawing alike (+-3%): what the
    stretches' contrasts miss is mostly the counter's stamps (a few ms of the card's whole
    draw), not the members. Taken off, each window priced at the spread learnt by its close
    and its settling (not the cold spread of the spans it ran in), and the part not shared
    yet at close priced at that spread too, the band stays within about 1.5x of the card's
    own doubt (that alone, main: 4.9% settled, 8.1% first), the truth inside it for 9 in 10.
    (The stamps read as members' spread and the spans priced as they came: 13.7% and 24.5%.)"""
    rng = random.Random(0)
    requests, t = [], 0.0
    while t < 6.0:
        seconds = min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5)))
        requests.append((t, seconds, 20.0 * rng.uniform(0.97, 1.03)))
        t += rng.expovariate(16 / 0.65)
    done = Run(seed=0).serve(requests)
    assert inside(done) >= 0.9 and inside(done, first=True) >= 0.9, (inside(done), inside(done, first=True))
    assert width(done) < 0.09, width(done)
    assert first_width(done) < 0.14, first_width(done)


def test_a_large_batch_drawing_alike_learns_its_spread_past_the_stamps() -> None:
    """A batch of 256 drawing alike (+-3%) in one two-second round: each member's joules in a
    stretch are below what a step stamped a few ms off moves, so the misses alone say a
    spread of about 0.1; the stamps' part taken off (as the single spans' misses show it),
    what is learnt is near nothing, and the requests that closed while the spread was cold
    settle at the spread learnt by then: 6.7% wide settled (main: 5.7%; priced as the spans
    came, with the stamps in, 84%), first figures 20% (main 8.6%; before, 88%), the truth
    inside for 9 in 10."""
    run = Run(seed=0)
    done = run.serve(staggered(256, random.Random(0), 2.0, 400.0))
    learnt = run.ledger.book._by_time.learnt()
    assert learnt is not None and math.sqrt(learnt) < 0.05, learnt
    assert inside(done) >= 0.9 and inside(done, first=True) >= 0.9, (inside(done), inside(done, first=True))
    assert width(done) < 0.12, width(done)
    assert first_width(done) < 0.3, first_width(done)


def test_rates_drawn_uniformly_apart_in_one_short_burst_hold_the_truth_nine_times_in_ten() -> None:
    """Sixteen requests in a one-second burst, each at its own rate between 4 and 24 W
    (benchmarks/attribution.py's heterogeneous rates; a spread of 0.41): a handful of
    contrasts, whose spread read alone fell well short of it (0.1-0.4 with 3-5 contrasts),
    so the bound is an upper one, and the stamps' part taken off does not eat it: >= 90%
    of settled and first figures hold the truth."""
    done = []
    for seed in range(4):
        rng = random.Random(seed)
        requests = [(rng.uniform(0, 1.0), min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5))),
                     0.2 * rng.uniform(20, 120)) for _ in range(16)]
        done += Run(seed).serve(requests)
    assert statistics.median(abs(d.meter.figure().joules - d.truth) / d.truth for d in done) > 0.1  # type: ignore[operator]
    assert inside(done) >= 0.9 and inside(done, first=True) >= 0.9, (inside(done), inside(done, first=True))


def test_a_batch_that_runs_unchanged_learns_no_spread_rather_than_an_absurd_one() -> None:
    # The same eight windows through every span: no stretch's contrast has anyone's seconds
    # change, so its miss is the stamps' and a common change's alone. Read as the members'
    # spread over a scale of nothing, it made the spread 1e7-1e16 (a hostile review).
    from giul_asgi.ledger.doubt import COLD_SPREAD, RateDoubt
    from giul_asgi.ledger.phases import Z90
    from giul_asgi.ledger.window import Window
    from giul_asgi.spans import CardSpan

    rng = random.Random(1)
    windows = [Window(-1.0, 0.0) for _ in range(8)]
    doubt = RateDoubt(0.1)
    t = 0.0
    for _ in range(200):
        t1 = t + rng.uniform(0.08, 0.3)
        members = [(w, t1 - t) for w in windows]
        above = rng.uniform(40, 60) * (t1 - t)
        span = CardSpan(t0=t, t1=t1, above_j=above, total_j=above + IDLE * (t1 - t), stamp_s=0.001,
                        unc_j=0.1, measured_j=above, tails=False, covered=8 * (t1 - t), members=8,
                        unseen=0.0, foreign_j=0.0, quiet=False, doubt_w=0.0, foreign_unc_w=0.0,
                        unwatched=False)
        units = doubt.units(span, members, None, above)
        assert units is not None and all(math.isfinite(a) and math.isfinite(b) for a, b in units)
        t = t1
    assert doubt.quantile() <= Z90 * COLD_SPREAD * 1.0001, doubt.quantile()


def test_a_mix_that_turns_unlike_is_priced_so_within_a_round() -> None:
    """A minute of requests drawing alike (about sixteen in flight), then rounds of eight at
    15 W and 45 W: the long sums (forgetting over RATES_TAU_S of span-seconds) held the alike
    minute's spread, near nothing, and the mix's figures were 31-34% wide for errors of 40%:
    335 of 384 settled figures outside, to the last round (a hostile trial). What the last few
    contrasts say bounds the spread too: from the mix's second round on, the truth is inside
    for 9 in 10 (its first round was priced before any contrast of it)."""
    for seed in range(2):
        run = Run(seed=seed)
        rng = random.Random(seed)
        alike, t = [], 0.0
        while t < 60.0:
            alike.append((t, min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5))),
                          20.0 * rng.uniform(0.97, 1.03)))
            t += rng.expovariate(16 / 0.65)
        run.serve(alike)
        t0 = run.clock.now
        done = run.serve(rounds([15.0, 45.0], random.Random(seed + 10), count=12))
        later = [d for d in done if d.job.start - t0 >= 2.5]  # the mix's second round on
        settled, first = inside(later), inside(later, first=True)
        assert settled >= 0.9 and first >= 0.9, (seed, settled, first)


def test_a_batch_drawing_alike_on_a_20_ms_counter_is_not_widened_by_its_last_contrasts() -> None:
    """Eight contrasts of a batch of 256 drawing alike on a 20 ms counter are mostly the stamps'
    noise: what they say swung from nothing to ten times the cold spread, and as a floor under
    the spread it made first figures 2-7x as wide for errors of 2% (a hostile trial: p90 6.6-9.0
    where the long bound alone said 1.3-1.8). It raises the spread no further than the cold one."""
    for seed in (1, 2):
        done = Run(seed=seed, period=0.02, jitter=0.001).serve(
            staggered(256, random.Random(seed + 10), 2.0, 400.0, count=3))
        widths = sorted(d.first_unc / d.first for d in done)
        assert widths[int(0.9 * len(widths))] < 3.0, (seed, widths[int(0.9 * len(widths))])
        assert inside(done) >= 0.9 and inside(done, first=True) >= 0.9


@pytest.mark.parametrize("exponent", [1.0, 0.6, 0.0])
def test_unlike_requests_keep_their_doubt_whatever_the_cards_law(exponent: float) -> None:
    # Light and heavy requests at random, 3x apart, ~16 in flight, on a card whose draw is the
    # sum of theirs, grows as the batch^0.6, or is fixed (a cap; benchmarks/batch_card.py). A
    # guard for any change that learns the card's law (one that did, 196eb4d, was reverted:
    # benchmarks/results/batch_card-2026-12-07b.md, and the next test).
    r = batch_card.run(exponent, 0, 16, 20.0, unlike=3.0)
    assert r["settled error"] > 0.3  # shared by time, they are charged far from what they caused
    assert r["settled inside"] >= 0.9 and r["first inside"] >= 0.9, r


def test_a_few_heavy_requests_always_in_flight_beside_light_bursts_hold_their_truth() -> None:
    # On a card whose draw is the sum of its requests', four clients send heavy requests back to
    # back (6x a light one) while light ones come in bursts: the spans' energy is a constant
    # plus a little a light request, as a card whose draw grows slower than its batch would
    # draw for alike ones. 196eb4d took it for one and priced the requests as alike: 42-77% of
    # settled figures outside (a hostile trial's shape; 0% before it and now).
    for seed in range(2):
        rng = random.Random(seed)
        arrivals: list[tuple[float, float, float]] = []
        for _ in range(4):
            t = rng.uniform(0, 0.5)
            while t < 40.0:
                length = rng.uniform(4.0, 8.0)
                arrivals.append((t, length, 6.0))
                t += length + rng.uniform(0, 0.01)
        t = 0.3
        while t < 40.0:
            arrivals += [(t + rng.uniform(0, 0.3), rng.uniform(0.3, 1.0), 1.0)
                         for _ in range(rng.choice([0, 4, 10, 20, 30]))]
            t += rng.uniform(0.8, 2.0)
        r = batch_card.run(1.0, seed, 8, 40.0, arrivals=arrivals)
        assert r["settled inside"] >= 0.9 and r["first inside"] >= 0.9, (seed, r)
