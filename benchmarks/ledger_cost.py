"""What the ledger costs as concurrency grows: reads stay flat, per-window work stays small.

For 1, 64 and 1024 windows in flight on one node:

- ``reads/s``: reads per second made by the node's one poller thread while requests come
  and go for a few seconds on the real clock (target: independent of concurrency);
- ``CPU us/request``: process CPU time per request over that run, all work included (the
  poller, sharing each span, settling, the requests' own open/close, asyncio's tasks);
- ``open+close us``: one window opened and closed while N others stay open (tight loop);
- ``settle us/window``: the reads (every 10 ms) from a batch's close until all of it has
  settled, per window.

    python benchmarks/ledger_cost.py
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from truecard import TrueCard, TrueReader

from giul_asgi import Ledgers, Meter, Node
from giul_asgi.ledger import Ledger

RUN_SECONDS = 3.0
IDLE = 70.0


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def steady_load(concurrency: int) -> tuple[float, float, int]:
    """Keep ``concurrency`` requests in flight for RUN_SECONDS: (reads/s, CPU us/req, n)."""
    card = TrueCard(idle_w=IDLE)
    card.start_job(200.0)
    reader = TrueReader(card)
    node = Node(f"load-{concurrency}", idle_w=IDLE, reader_factory=lambda _n: reader)
    ledgers = Ledgers()
    ledger = ledgers.get(node)
    ledger.ensure_started()
    await asyncio.sleep(0.2)
    done = 0
    stop = time.monotonic() + RUN_SECONDS
    rng = random.Random(concurrency)

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            async with Meter(ledger):
                await asyncio.sleep(rng.uniform(0.005, 0.05))
            done += 1

    reads0 = reader.reads
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    reads = reader.reads - reads0
    ledger.stop()
    return reads / wall, cpu / max(done, 1) * 1e6, done


def virtual(name: str) -> tuple[Ledger, TrueCard, TrueReader, Clock]:
    clock = Clock()
    card = TrueCard(idle_w=IDLE, clock=clock)
    card.start_job(200.0)
    reader = TrueReader(card)
    ledger = Ledger(Node(name, idle_w=IDLE), reader, poll=False)
    for _ in range(100):
        clock.now += 0.01
        ledger.ingest(reader.read())
    return ledger, card, reader, clock


def open_close_us(concurrency: int, loops: int = 50_000) -> float:
    ledger, _, reader, clock = virtual(f"oc-{concurrency}")
    others = [ledger.open() for _ in range(concurrency)]
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(loops):
            ledger.close(ledger.open())
        samples.append((time.perf_counter() - start) / loops * 1e6)
        clock.now += 0.2
        ledger.ingest(reader.read())  # book what piled up, as the poller would
    for window in others:
        ledger.close(window)
    return min(samples)


def settle_us(concurrency: int) -> float:
    ledger, _, reader, clock = virtual(f"settle-{concurrency}")
    samples = []
    for _ in range(5):
        windows = [ledger.open() for _ in range(concurrency)]
        clock.now += 0.05
        for window in windows:
            ledger.close(window)
        spent = 0.0
        while not all(w.settled for w in windows):  # reads every 10 ms, as the poller makes
            clock.now += 0.01
            start = time.perf_counter()
            ledger.ingest(reader.read())
            spent += time.perf_counter() - start
        samples.append(spent / concurrency * 1e6)
    return statistics.median(samples)


def main() -> None:
    print(f"# ledger_cost: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"\nTrue card (benchmarks/truecard.py), counter period 100 ms, read by the poller "
          f"thread every ~10 ms. Load runs {RUN_SECONDS:.0f} s per row.\n")
    print("| windows in flight | requests | reads/s | CPU us/request | open+close us | "
          "settle us/window |")
    print("|---:|---:|---:|---:|---:|---:|")
    for concurrency in (1, 64, 1024):
        reads, cpu, n = asyncio.run(steady_load(concurrency))
        oc = open_close_us(concurrency)
        st = settle_us(concurrency)
        print(f"| {concurrency} | {n} | {reads:.1f} | {cpu:.1f} | {oc:.2f} | {st:.2f} |")
    print("\nTargets: reads/s independent of concurrency; open+close under 20 us per window.")


if __name__ == "__main__":
    main()
