"""A request's whole metering cost in one thread, on a virtual clock: its path and its share of the reader's.

Every request's work, wherever it runs, done here in one thread in a fixed order: a meter
opens and closes a window on a busy node (a simulated card whose counter steps every 100
ms), makes its first figure, and reports; every 10 ms of virtual time the node's reading is
booked, which shares the spans, settles the windows and hands their settled figures, in
batches, to the statistics and the records by id (what the reader thread does). Requests
come every ``--gap-us`` of virtual time (60 us: a busy node), so each reading settles
about a thousand windows, as in benchmarks/overhead.py.

No threads, no GIL, no real clock: the same instructions every run. Counted by callgrind
(benchmarks/instructions.py ``--script ledger_path.py``), the difference between two runs
of ``n1`` and ``n2`` requests is one request's metering, loop and reader together; timed
(this script alone), it is the same in microseconds.

    python benchmarks/ledger_path.py 20000
"""

from __future__ import annotations

import argparse
import time

from giul_asgi import Node, Tier
from giul_asgi.ledger import Ledger
from giul_asgi.listeners import Listeners
from giul_asgi.meter import Meter
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader, VirtualClock
from giul_asgi.records import RecordStore
from giul_asgi.stats import EnergyStats

READ_EVERY_S = 0.01


def run(n: int, gap_s: float, seconds_s: float) -> float:
    """Seconds of real time per request, for ``n`` requests."""
    clock = VirtualClock()
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1, clock=clock)
    card.start_job(150.0)
    reader = SimulatedReader(card)
    node = Node("bench", idle_w=70.0, reader_factory=lambda _n: reader)
    ledger = Ledger(node, reader, poll=False, clock=clock)
    tier = Tier("8b", 300.0)
    listeners = Listeners([EnergyStats(clock=clock), RecordStore(share=False, clock=clock)])
    next_read = clock.now
    start = time.perf_counter()
    for _ in range(n):
        meter = Meter(ledger, tier, route="/v1/chat/completions")
        meter.open()
        clock.advance(seconds_s)
        meter.close()
        meter.figure(48)
        meter.report(listeners, "ok", 200)
        clock.advance(gap_s - seconds_s)
        if clock.now >= next_read:
            ledger.ingest(reader.read())
            next_read += READ_EVERY_S
    elapsed = time.perf_counter() - start
    for _ in range(30):  # the last windows settle
        clock.advance(READ_EVERY_S)
        ledger.ingest(reader.read())
    return elapsed / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--gap-us", type=float, default=60.0, help="virtual time between requests")
    parser.add_argument("--seconds-us", type=float, default=50.0, help="virtual time a window is open")
    args = parser.parse_args()
    per = run(args.n, args.gap_us / 1e6, args.seconds_us / 1e6)
    print(f"{args.n} requests: {per * 1e6:.2f} us each (loop and reader work, one thread)")


if __name__ == "__main__":
    main()
