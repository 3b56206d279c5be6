"""Requests drawing alike on a card whose draw grows slower than its batch, as a GPU's does.

benchmarks/truecard.py's jobs each draw their own watts, so the card's draw is the sum of its
jobs': the accuracy matrix never shows a batch whose draw per request falls as it grows. A GPU
under continuous batching does (benchmarks/results/simulated_batch-2026-12-07.md: the README's
simulated card, capped, made requests drawing alike 500-700% wide). This card draws
``per_w x N^exponent`` above idle with N requests in flight (1: each its own, the matrix's; 0.6:
a sublinear batch; 0: a fixed draw, a cap), shared alike; each request's truth is its part of
that, integrated over its life, independent of the ledger. A ledger reads it (a counter
stepping every 100 ms, jittered, integer millijoules) on a virtual clock, requests arriving at
random with about ``--in-flight`` open; it prints, per exponent, how many figures hold their
truth and how wide they are, and the spread the time split learnt (0 for requests drawing
alike). ``--unlike R``: light and heavy requests at random, R times apart (the card then draws
``N^(exponent - 1)`` times the masses in flight).

    python benchmarks/batch_card.py [--unlike 3] [--path nvml]
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import platform
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from truecard import Job, PhasedJob, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.simulated import VirtualClock

IDLE_W = 70.0
#: A request of mass 1's draw (W) at the card's mean batch.
UNIT_W = 20.0


class BatchCard(TrueCard):
    """A :class:`TrueCard` (its steps and jitter) whose draw above idle is ``per_w x N^exponent``
    with N requests in flight, each request's part of it alike; no ramps. A request of ``mass``
    m draws m times a request of mass 1 beside it (the card: ``per_w x N^(exponent - 1) x`` the
    masses in flight): unlike requests."""

    def __init__(self, clock: Callable[[], float], seed: int, per_w: float, exponent: float,
                 unit_w: float = UNIT_W) -> None:
        super().__init__(idle_w=IDLE_W, clock=clock, seed=seed)
        self.per_w, self.exponent = per_w, exponent
        self.unit_w = unit_w  # a request of mass 1's draw at the card's mean batch
        self.n = 0
        self.mass = 0.0
        # At each event: its time, the card's energy above idle and one member of mass 1's
        # integral so far, and the requests in flight after it and their masses.
        self._t: list[float] = [self.t0]
        self._above: list[float] = [0.0]
        self._member: list[float] = [0.0]
        self._n: list[tuple[int, float]] = [(0, 0.0)]

    @classmethod
    def at_mean(cls, clock: Callable[[], float], seed: int, in_flight: int, exponent: float) -> BatchCard:
        """The card: per_w x N^exponent, UNIT_W a request at ``in_flight``, whatever the exponent."""
        return cls(clock, seed, per_w=UNIT_W * in_flight ** (1 - exponent), exponent=exponent)

    def _per_member(self, n: int) -> float:
        return self.per_w * n ** (self.exponent - 1) if n > 0 else 0.0

    def _advance(self, t: float) -> None:
        dt = t - self._t[-1]
        self._t.append(t)
        self._above.append(self._above[-1] + self._per_member(self.n) * self.mass * dt)
        self._member.append(self._member[-1] + self._per_member(self.n) * dt)

    def begin(self, mass: float = 1.0) -> float:
        """A request starts now: the member integral at its start."""
        with self._lock:  # a reader thread reads the card while the loop's requests come and go
            self._advance(self.clock())
            self.n += 1
            self.mass += mass
            self._n.append((self.n, self.mass))
            return self._member[-1]

    def end(self, mass: float = 1.0) -> float:
        """A request ends now: the member integral at its end (its truth: its mass times the
        integral's change over its life)."""
        with self._lock:
            self._advance(self.clock())
            self.n -= 1
            self.mass = self.mass - mass if self.n else 0.0
            self._n.append((self.n, self.mass))
            return self._member[-1]

    def energy(self, t: float) -> float:
        with self._lock:
            i = bisect.bisect_right(self._t, t) - 1
            n, mass = self._n[i]
            return (self.idle_w * (t - self.t0) + self._above[i]
                    + self._per_member(n) * mass * (t - self._t[i]))

    def start_job(self, watts: float) -> BatchJob:
        """A request as :class:`TrueCard`'s callers start one: of ``watts / unit_w`` mass, drawing
        ``watts`` where the batch is at the card's mean."""
        mass = watts / self.unit_w
        return BatchJob(watts, self.clock(), mass=mass, began=self.begin(mass))

    def stop_job(self, job: Job | PhasedJob) -> None:
        if not isinstance(job, BatchJob):
            raise TypeError("a BatchCard stops only the jobs it started")
        job.stop = self.clock()
        job.ended = self.end(job.mass)


@dataclass(eq=False)
class BatchJob(Job):
    """A request on a :class:`BatchCard`, used as :class:`truecard.Job` is: its truth, once
    stopped, is its part of the card's draw over its life (its mass times a member's)."""

    mass: float = 1.0
    began: float = 0.0
    ended: float | None = None

    def truth(self, ramp_up: float = 0.0, tau: float = 0.0) -> float:
        assert self.ended is not None
        return self.mass * (self.ended - self.began)


def _arrivals(rng: random.Random, in_flight: int, seconds: float,
              unlike: float = 1.0) -> list[tuple[float, float, float]]:
    """(start, length, mass) of each request: 0.2-2 s long, arriving at random, ``in_flight`` on
    average; its mass 1, or where ``unlike`` > 1, a light or a heavy one at random, ``unlike``
    times apart (mean 1). (In turn, light then heavy, the contrasts of neighbouring stretches
    see their deviations cancel: 52-61% of settled figures inside on an additive card. A limit
    of the split's doubt, benchmarks/results/batch_card-2026-12-07b.md.)"""
    arrivals, t = [], 0.0
    masses = (2 / (1 + unlike), 2 * unlike / (1 + unlike))
    while t < seconds:
        mass = rng.choice(masses) if unlike > 1 else 1.0  # alike: the arrivals of earlier runs
        arrivals.append((t, min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5))), mass))
        t += rng.expovariate(in_flight / 0.65)
    return arrivals


def run(exponent: float, seed: int, in_flight: int, seconds: float, unlike: float = 1.0,
        arrivals: list[tuple[float, float, float]] | None = None) -> dict[str, float]:
    """One run on the virtual clock (``arrivals``: (start, length, mass) each, instead of
    :func:`_arrivals`')."""
    clock = VirtualClock(100.0)
    card = BatchCard.at_mean(clock, seed, in_flight, exponent)
    reader = TrueReader(card)
    ledger = Ledger(Node("batch", idle_w=IDLE_W), reader, poll=False)
    rng = random.Random(seed)
    arrivals = sorted(arrivals) if arrivals is not None else _arrivals(rng, in_flight, seconds, unlike)
    t0, next_read = clock.now, clock.now
    running: list[tuple[Meter, float, float, float]] = []
    done: list[tuple[Meter, float, float, float, float]] = []  # meter, truth, first, first unc
    while arrivals or running:
        now = clock.now - t0
        while arrivals and arrivals[0][0] <= now:
            _, length, mass = arrivals.pop(0)
            meter = Meter(ledger)
            meter.open()
            running.append((meter, card.begin(mass), now + length, mass))
        for item in list(running):
            meter, began, until, mass = item
            if now >= until:
                truth = mass * (card.end(mass) - began)
                meter.close()
                running.remove(item)
                first = meter.figure()
                if first.joules is not None and first.uncertainty_joules is not None:
                    done.append((meter, truth, first.joules, first.uncertainty_joules, now))
        clock.now += 0.002
        if clock.now >= next_read:
            ledger.ingest(reader.read())
            next_read = clock.now + 0.01 * rng.uniform(0.5, 1.5)
    for _ in range(300):
        clock.now += 0.002
        if clock.now >= next_read:
            ledger.ingest(reader.read())
            next_read = clock.now + 0.01 * rng.uniform(0.5, 1.5)
    return _summary([(m.figure(), truth, first, unc) for m, truth, first, unc, _ in done], ledger)


async def run_nvml(exponent: float, seed: int, in_flight: int, seconds: float,
                   unlike: float = 1.0) -> dict[str, float]:
    """The same on the production path and the real clock: ``Node(reader="nvml")`` over
    benchmarks/fake_pynvml (its counter stepping every 100 ms), its own poller thread."""
    import asyncio
    import time

    import fake_pynvml

    card = BatchCard.at_mean(time.monotonic, seed, in_flight, exponent)
    fake_pynvml.install([fake_pynvml.Gpu(card)], fake_pynvml.Driver(seed=seed))
    ledger = Ledger(Node("batch", idle_w=IDLE_W, reader="nvml", workers_dir=False))
    ledger.ensure_started()
    done: list[tuple[Meter, float, float, float]] = []

    async def one(delay: float, length: float, mass: float) -> None:
        await asyncio.sleep(delay)
        meter = Meter(ledger)
        meter.open()
        began = card.begin(mass)
        await asyncio.sleep(length)
        truth = mass * (card.end(mass) - began)
        meter.close()
        first = meter.figure()
        if first.joules is not None and first.uncertainty_joules is not None:
            done.append((meter, truth, first.joules, first.uncertainty_joules))

    arrivals = _arrivals(random.Random(seed), in_flight, seconds, unlike)
    try:
        await asyncio.gather(*(one(t, length, mass) for t, length, mass in arrivals))
        await asyncio.sleep(1.5)
        return _summary([(m.figure(), truth, first, unc) for m, truth, first, unc in done], ledger)
    finally:
        ledger.stop()
        fake_pynvml.uninstall()


def _summary(figures: list[tuple[Any, float, float, float]], ledger: Ledger) -> dict[str, float]:
    settled = [(e, truth, first, unc) for e, truth, first, unc in figures
               if e.settled and e.joules is not None and e.uncertainty_joules is not None]
    learnt = ledger.book._by_time.learnt()
    return {
        "n": len(settled),
        "settled inside": sum(abs(e.joules - truth) <= e.uncertainty_joules for e, truth, _, _ in settled)
        / len(settled),
        "first inside": sum(abs(first - truth) <= unc for _, truth, first, unc in settled) / len(settled),
        "settled error": statistics.median(abs(e.joules - truth) / truth for e, truth, _, _ in settled),
        "settled width": statistics.median(e.uncertainty_joules / e.joules for e, _, _, _ in settled),
        "first width": statistics.median(unc / first for _, _, first, unc in settled),
        "c": math.sqrt(learnt) if learnt is not None else math.nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exponents", type=float, nargs="+", default=[1.0, 0.6, 0.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--path", choices=("virtual", "nvml"), default="virtual",
                        help="virtual: Python reader, virtual clock; nvml: the production path, real clock")
    parser.add_argument("--unlike", type=float, default=1.0,
                        help="light and heavy requests at random, this many times apart (1: alike)")
    args = parser.parse_args()
    print(f"# batch_card.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    where = ("the NVML reader over fake_pynvml, real clock" if args.path == "nvml"
             else "the Python reader, virtual clock")
    mix = "alike" if args.unlike <= 1 else f"light and heavy at random, {args.unlike:g}x apart"
    print(f"    about {args.in_flight} requests in flight for {args.seconds:g} s (0.2-2 s each, {mix}), "
          f"seeds 0-{args.seeds - 1}, {where}, 100 ms counter\n")
    print("| exponent | seed | n | settled inside | first inside | settled error (median) | settled width "
          "| first width | spread learnt (c) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for exponent in args.exponents:
        for seed in range(args.seeds):
            if args.path == "nvml":
                import asyncio

                r = asyncio.run(run_nvml(exponent, seed, args.in_flight, args.seconds, args.unlike))
            else:
                r = run(exponent, seed, args.in_flight, args.seconds, args.unlike)
            print(f"| {exponent:g} | {seed} | {r['n']:.0f} | {100 * r['settled inside']:.0f}% "
                  f"| {100 * r['first inside']:.0f}% | {100 * r['settled error']:.1f}% "
                  f"| {100 * r['settled width']:.1f}% | {100 * r['first width']:.1f}% | {r['c']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
