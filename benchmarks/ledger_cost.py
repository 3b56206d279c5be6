"""What the ledger costs as concurrency grows: reads stay flat, per-window work stays small.

For 1, 64 and 1024 windows in flight on one node (a simulated card on the real clock):

- ``reads/s``: reader calls per second made by the node's one background task, while
  requests come and go for a few seconds (target: independent of concurrency);
- ``CPU us/request``: process CPU time per request over that run, all work included
  (the reader task, sharing each interval, settling, the requests' own open/close);
- ``open+close us``: one window opened and closed while N others stay open, timed in a
  tight loop (target: under 20 us);
- ``settle us/window``: the reading that settles a batch of closed windows, per window.

    python benchmarks/ledger_cost.py
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import statistics
import time
from datetime import UTC, datetime

from giul_asgi import Ledger, Ledgers, Meter, Node
from giul_asgi.readers import SimulatedCard, SimulatedReader

RUN_SECONDS = 3.0


def sim(name: str) -> tuple[Node, SimulatedCard]:
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
    card.start_job(200.0)
    return Node(name, idle_w=70.0, reader_factory=lambda _n: SimulatedReader(card)), card


async def steady_load(concurrency: int) -> tuple[float, float, int]:
    """Keep ``concurrency`` requests in flight for RUN_SECONDS: (reads/s, CPU us/req, n)."""
    node, _card = sim(f"load-{concurrency}")
    ledgers = Ledgers()
    ledger = ledgers.get(node)
    reader = ledger.reader
    done = 0
    stop = time.monotonic() + RUN_SECONDS
    rng = random.Random(concurrency)

    async def client() -> None:
        nonlocal done
        while time.monotonic() < stop:
            async with Meter.for_node(node, ledgers=ledgers):
                await asyncio.sleep(rng.uniform(0.005, 0.05))
            done += 1

    Meter.for_node(node, ledgers=ledgers).open().close()  # start the reader task
    reads0 = reader.reads  # type: ignore[attr-defined]
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    reads = reader.reads - reads0  # type: ignore[attr-defined]
    await ledger.aclose()
    return reads / wall, cpu / max(done, 1) * 1e6, done


def open_close_us(concurrency: int, loops: int = 50_000) -> float:
    node, _ = sim(f"oc-{concurrency}")
    ledger = Ledger(node)
    ledger.read_now()
    others = [ledger.open() for _ in range(concurrency)]
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(loops):
            ledger.close(ledger.open())
        samples.append((time.perf_counter() - start) / loops * 1e6)
        ledger.read_now()  # book what piled up, as the task would
    for window in others:
        ledger.close(window)
    return min(samples)


def settle_us(concurrency: int) -> float:
    node, _ = sim(f"settle-{concurrency}")
    ledger = Ledger(node)
    ledger.read_now()
    time.sleep(0.11)
    ledger.read_now()
    samples = []
    for _ in range(5):
        windows = [ledger.open() for _ in range(concurrency)]
        for window in windows:
            ledger.close(window)
        time.sleep(0.11)  # let the counter step
        start = time.perf_counter()
        ledger.read_now()
        samples.append((time.perf_counter() - start) / concurrency * 1e6)
        assert all(w.settled for w in windows)
    return statistics.median(samples)


def main() -> None:
    print(f"# ledger_cost: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"\nSimulated card on the real clock, counter period 100 ms (the ledger polls it at "
          f"50 ms, jittered). Load runs {RUN_SECONDS:.0f} s per row.\n")
    print("| windows in flight | requests | reads/s | CPU us/request | open+close us | "
          "settle us/window |")
    print("|---:|---:|---:|---:|---:|---:|")
    for concurrency in (1, 64, 1024):
        reads, cpu, n = asyncio.run(steady_load(concurrency))
        oc = open_close_us(concurrency)
        st = settle_us(concurrency)
        print(f"| {concurrency} | {n} | {reads:.1f} | {cpu:.1f} | {oc:.2f} | {st:.2f} |")
    print("\nTargets: reads/s independent of concurrency; open+close under 20 us per window.")
    print("CPU us/request includes asyncio's own cost of the sleeping client tasks, and at 1")
    print("window the reader's fixed 20 reads/s over few requests. settle us/window is one")
    print("reading (taken after 110 ms asleep) divided by the windows it settles.")


if __name__ == "__main__":
    main()
