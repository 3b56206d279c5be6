"""A request's whole metering cost in one thread, on a virtual clock: its path and its share of the reader's.

Every request's work, wherever it runs, done here in one thread in a fixed order: a meter
opens and closes a window on a busy node (a simulated card whose counter steps every 100
ms), makes its first figure, and reports; every 10 ms of virtual time the node's reading is
booked, which shares the spans, settles the windows and hands their settled figures, in
batches, to the statistics and the records by id (what the reader thread does). Requests
come every ``--gap-us`` of virtual time (60 us: a busy node), so each reading settles
about a thousand windows, as in benchmarks/overhead.py.

``--asgi VARIANT`` sends each request through one of benchmarks/_apps.py's stacks instead
(a JSON answer, or with ``--kind stream`` or ``usage`` an SSE stream of ``--chunks``
chunks; ``giul-asgi``: ours on that ledger, with the statistics and the records kept in
process; a peer or ``bare`` for comparison), so the count is the whole request: the app,
the middleware, and for ours the reader's share.

No threads, no GIL, no real clock: the same instructions every run. Counted by callgrind
(benchmarks/instructions.py ``--ledger``), the difference between two runs of ``n1`` and
``n2`` requests is one request's cost, loop and reader together; timed (this script alone),
it is the same in microseconds.

    python benchmarks/ledger_path.py 20000
    python benchmarks/ledger_path.py 20000 --asgi giul-asgi
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

READ_EVERY_S = 0.01


def _ledger(package: str) -> tuple[Any, Any, Any]:
    """(clock, reader, ledger) of a busy simulated node that nothing polls, booked as under
    a reader thread: what the request path records waits for the reading (or a figure asked
    for) rather than being booked at once."""
    simulated = importlib.import_module(f"{package}.readers.simulated")
    pkg = importlib.import_module(package)
    clock = simulated.VirtualClock()
    card = simulated.SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1, clock=clock)
    card.start_job(150.0)
    reader = simulated.SimulatedReader(card)
    node = pkg.Node("bench", idle_w=70.0, reader_factory=lambda _n: reader)
    ledger = importlib.import_module(f"{package}.ledger").Ledger(node, reader, poll=False, clock=clock)
    if hasattr(ledger, "_deferring"):
        ledger._deferring = lambda: True
    return clock, reader, ledger


def run(n: int, gap_s: float, seconds_s: float, package: str = "giul_asgi") -> float:
    """Seconds of real time per request, for ``n`` requests through a meter."""
    pkg = importlib.import_module(package)
    clock, reader, ledger = _ledger(package)
    tier = pkg.Tier("8b", 300.0)
    listeners = importlib.import_module(f"{package}.listeners").Listeners([
        pkg.EnergyStats(clock=clock), importlib.import_module(f"{package}.records").RecordStore(
            share=False, clock=clock),
    ])
    Meter = importlib.import_module(f"{package}.meter").Meter
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


class _Lasting:
    """Inside the meter: the request lasts ``seconds`` of the virtual clock, the reader
    booking its readings meanwhile (one every :data:`READ_EVERY_S`), as an upstream's answer
    of that length would. A window shorter than a millisecond gets no guessed first figure
    (giul_asgi.ledger.prior.MIN_GUESS_S): a benchmark's answer of microseconds takes a path
    no LLM request takes."""

    def __init__(self, app: Any, clock: Any, reader: Any, ledger: Any, seconds: float) -> None:
        self.app, self.clock, self.reader, self.ledger, self.seconds = app, clock, reader, ledger, seconds

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            left = self.seconds
            while left > 0:
                step = min(left, READ_EVERY_S)
                self.clock.advance(step)
                self.read()
                left -= step
        await self.app(scope, receive, send)

    def read(self) -> None:
        """A reading, booked (the reader thread's work: benchmarks/opcodes.py counts it apart)."""
        self.ledger.ingest(self.reader.read())


async def run_asgi(variant: str, n: int, gap_s: float, package: str = "giul_asgi",
                   kind: str = "json", chunks: int = 1000, seconds_s: float = 0.0) -> float:
    """Seconds of real time per request, for ``n`` requests of ``kind`` through ``variant``
    (ours: each lasting ``seconds_s`` of the virtual clock, see :class:`_Lasting`)."""
    from _apps import PATHS, bench_app, build
    from overhead import run_requests
    from starlette.middleware import Middleware

    ledger = None
    if variant == "giul-asgi":
        pkg = importlib.import_module(package)
        clock, reader, ledger = _ledger(package)
        ledgers = pkg.Ledgers()
        ledgers._by_name[ledger.node.name] = ledger  # this one, nothing polls it
        records = importlib.import_module(f"{package}.records").RecordStore(share=False, clock=clock)
        lasting = [Middleware(_Lasting, clock=clock, reader=reader, ledger=ledger, seconds=seconds_s)]
        app = bench_app([Middleware(pkg.EnergyMiddleware, nodes=[ledger.node], tiers=[pkg.Tier("8b", 300.0)],
                                    ledgers=ledgers, stats=pkg.EnergyStats(clock=clock), records=records),
                         *(lasting if seconds_s > 0 else [])])
    else:
        app = build(variant)
    path = PATHS[kind].replace("{n}", str(chunks))
    await run_requests(app, path, 100 if kind == "json" else 5)  # built, its caches filled
    next_read = 0.0
    start = time.perf_counter()
    for _ in range(n):
        await run_requests(app, path, 1)
        if ledger is not None:
            clock.advance(gap_s)
            if clock.now >= next_read:
                ledger.ingest(reader.read())
                next_read = clock.now + READ_EVERY_S
    elapsed = time.perf_counter() - start
    if ledger is not None:
        for _ in range(30):
            clock.advance(READ_EVERY_S)
            ledger.ingest(reader.read())
    return elapsed / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("--gap-us", type=float, default=60.0, help="virtual time between requests")
    parser.add_argument("--seconds-us", type=float, default=50.0,
                        help="virtual time a window is open (with --asgi: 0, the app's own instant)")
    parser.add_argument("--asgi", metavar="VARIANT", help="through this stack of benchmarks/_apps.py")
    parser.add_argument("--kind", default="json", choices=("json", "stream", "usage"))
    parser.add_argument("--chunks", type=int, default=1000, help="a stream's chunks")
    parser.add_argument("--package", default="giul_asgi", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.asgi:
        seconds = args.seconds_us / 1e6 if "--seconds-us" in sys.argv else 0.0
        per = asyncio.run(run_asgi(args.asgi, args.n, args.gap_us / 1e6, args.package,
                                   args.kind, args.chunks, seconds))
    else:
        per = run(args.n, args.gap_us / 1e6, args.seconds_us / 1e6, args.package)
    print(f"{args.n} requests: {per * 1e6:.2f} us each (loop and reader work, one thread)")


if __name__ == "__main__":
    main()
