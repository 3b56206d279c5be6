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
alike).

    python benchmarks/batch_card.py
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from truecard import TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.simulated import VirtualClock

IDLE_W = 70.0


class BatchCard(TrueCard):
    """A :class:`TrueCard` (its steps and jitter) whose draw above idle is ``per_w x N^exponent``
    with N requests in flight, each request's part of it alike; no ramps."""

    def __init__(self, clock: Callable[[], float], seed: int, per_w: float, exponent: float) -> None:
        super().__init__(idle_w=IDLE_W, clock=clock, seed=seed)
        self.per_w, self.exponent = per_w, exponent
        self.n = 0
        # At each event: its time, the card's energy above idle and one member's integral so
        # far, and the requests in flight after it.
        self._t: list[float] = [self.t0]
        self._above: list[float] = [0.0]
        self._member: list[float] = [0.0]
        self._n: list[int] = [0]

    def _draw(self, n: int) -> float:
        return self.per_w * n ** self.exponent if n > 0 else 0.0

    def _advance(self, t: float) -> None:
        dt = t - self._t[-1]
        self._t.append(t)
        self._above.append(self._above[-1] + self._draw(self.n) * dt)
        self._member.append(self._member[-1] + (self._draw(self.n) / self.n * dt if self.n else 0.0))

    def begin(self) -> float:
        """A request starts now: the member integral at its start."""
        self._advance(self.clock())
        self.n += 1
        self._n.append(self.n)
        return self._member[-1]

    def end(self) -> float:
        """A request ends now: the member integral at its end."""
        self._advance(self.clock())
        self.n -= 1
        self._n.append(self.n)
        return self._member[-1]

    def energy(self, t: float) -> float:
        i = bisect.bisect_right(self._t, t) - 1
        return self.idle_w * (t - self.t0) + self._above[i] + self._draw(self._n[i]) * (t - self._t[i])


def _card(clock: Callable[[], float], seed: int, in_flight: int, exponent: float) -> BatchCard:
    """The card: per_w x N^exponent, 20 W a request at the mean in flight, whatever the exponent."""
    return BatchCard(clock, seed, per_w=20.0 * in_flight ** (1 - exponent), exponent=exponent)


def _arrivals(rng: random.Random, in_flight: int, seconds: float) -> list[tuple[float, float]]:
    """(start, length) of each request: 0.2-2 s long, arriving at random, ``in_flight`` on average."""
    arrivals, t = [], 0.0
    while t < seconds:
        arrivals.append((t, min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5)))))
        t += rng.expovariate(in_flight / 0.65)
    return arrivals


def run(exponent: float, seed: int, in_flight: int, seconds: float) -> dict[str, float]:
    clock = VirtualClock(100.0)
    card = _card(clock, seed, in_flight, exponent)
    reader = TrueReader(card)
    ledger = Ledger(Node("batch", idle_w=IDLE_W), reader, poll=False)
    rng = random.Random(seed)
    arrivals = _arrivals(rng, in_flight, seconds)
    t0, next_read = clock.now, clock.now
    running: list[tuple[Meter, float, float]] = []
    done: list[tuple[Meter, float, float, float, float]] = []  # meter, truth, first, first unc
    while arrivals or running:
        now = clock.now - t0
        while arrivals and arrivals[0][0] <= now:
            _, length = arrivals.pop(0)
            meter = Meter(ledger)
            meter.open()
            running.append((meter, card.begin(), now + length))
        for item in list(running):
            meter, began, until = item
            if now >= until:
                truth = card.end() - began
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


async def run_nvml(exponent: float, seed: int, in_flight: int, seconds: float) -> dict[str, float]:
    """The same on the production path and the real clock: ``Node(reader="nvml")`` over
    benchmarks/fake_pynvml (its counter stepping every 100 ms), its own poller thread."""
    import asyncio
    import time

    import fake_pynvml

    card = _card(time.monotonic, seed, in_flight, exponent)
    fake_pynvml.install([fake_pynvml.Gpu(card)], fake_pynvml.Driver(seed=seed))
    ledger = Ledger(Node("batch", idle_w=IDLE_W, reader="nvml", workers_dir=False))
    ledger.ensure_started()
    done: list[tuple[Meter, float, float, float]] = []

    async def one(delay: float, length: float) -> None:
        await asyncio.sleep(delay)
        meter = Meter(ledger)
        meter.open()
        began = card.begin()
        await asyncio.sleep(length)
        truth = card.end() - began
        meter.close()
        first = meter.figure()
        if first.joules is not None and first.uncertainty_joules is not None:
            done.append((meter, truth, first.joules, first.uncertainty_joules))

    arrivals = _arrivals(random.Random(seed), in_flight, seconds)
    try:
        await asyncio.gather(*(one(t, length) for t, length in arrivals))
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
    args = parser.parse_args()
    print(f"# batch_card.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    where = ("the NVML reader over fake_pynvml, real clock" if args.path == "nvml"
             else "the Python reader, virtual clock")
    print(f"    about {args.in_flight} requests in flight for {args.seconds:g} s (0.2-2 s each), seeds "
          f"0-{args.seeds - 1}, {where}, 100 ms counter\n")
    print("| exponent | seed | n | settled inside | first inside | settled error (median) | settled width "
          "| first width | spread learnt (c) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for exponent in args.exponents:
        for seed in range(args.seeds):
            if args.path == "nvml":
                import asyncio

                r = asyncio.run(run_nvml(exponent, seed, args.in_flight, args.seconds))
            else:
                r = run(exponent, seed, args.in_flight, args.seconds)
            print(f"| {exponent:g} | {seed} | {r['n']:.0f} | {100 * r['settled inside']:.0f}% "
                  f"| {100 * r['first inside']:.0f}% | {100 * r['settled error']:.1f}% "
                  f"| {100 * r['settled width']:.1f}% | {100 * r['first width']:.1f}% | {r['c']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
