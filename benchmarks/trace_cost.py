"""What a node's trace costs the request path: a window's open and close, trace off and on.

With ``Node(trace=DIR)`` the request path appends one tuple per open, mark and close to an
in-memory deque under the ledger's lock it already holds; the reader thread writes them
(not timed here: it is off the request path). This measures the difference side by side:
two ledgers on the same true card and virtual clock, one traced, in interleaved batches of
open+close (the ledger's own, and through a Meter, which also grades nothing until asked),
medians of repeats. Between batches both are fed readings until their windows settle, and
the traced one's buffer is written out, as its reader thread would.

    python benchmarks/trace_cost.py
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from truecard import TrueCard, TrueReader

from giul_asgi import Meter, Node, Tier
from giul_asgi.ledger import Ledger

IDLE = 70.0
BATCH = 2_000
REPEATS = 61


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def build(trace: str | None, clock: Clock, others: int) -> tuple[Ledger, TrueReader]:
    card = TrueCard(idle_w=IDLE, clock=clock)
    card.start_job(150.0)
    reader = TrueReader(card)
    ledger = Ledger(Node("bench", idle_w=IDLE, trace=trace), reader, poll=False)
    for _ in range(others):  # windows that stay open beside the measured ones
        ledger.open()
    return ledger, reader


def settle(clock: Clock, pairs: list[tuple[Ledger, TrueReader]]) -> None:
    for _ in range(40):
        clock.now += 0.01
        for ledger, reader in pairs:
            ledger.ingest(reader.read())
    for ledger, _ in pairs:
        if ledger._trace is not None:
            ledger._trace.write()  # the reader thread's chore


def ledger_batch(ledger: Ledger) -> float:
    about = ("id-1", "/v1/chat/completions", "large")
    start = time.perf_counter()
    for _ in range(BATCH):
        window = ledger.open()
        ledger.close(window, 42, about)
    return (time.perf_counter() - start) / BATCH * 1e6


def meter_batch(ledger: Ledger) -> float:
    tier = Tier("large")
    start = time.perf_counter()
    for _ in range(BATCH):
        meter = Meter(ledger, tier, route="/v1/chat/completions")
        meter.open()
        meter.tokens(42)
        meter.close()
    return (time.perf_counter() - start) / BATCH * 1e6


def measure(batch: Callable[[Ledger], float], others: int, directory: str) -> tuple[float, float]:
    clock = Clock()
    off = build(None, clock, others)
    on = build(directory, clock, others)
    settle(clock, [off, on])
    times: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(REPEATS):
        order = [("off", off), ("on", on)] if i % 2 == 0 else [("on", on), ("off", off)]
        for name, (ledger, _) in order:
            times[name].append(batch(ledger))
        settle(clock, [off, on])
    on[0].stop()
    off[0].stop()
    return statistics.median(times["off"]), statistics.median(times["on"])


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for label, batch in (("Ledger.open+close", ledger_batch), ("Meter open+close", meter_batch)):
            for others in (0, 64):
                sub = Path(directory) / f"{label[:5]}-{others}"
                sub.mkdir()
                off, on = measure(batch, others, str(sub))
                rows.append((label, others, off, on))
    lines = [
        f"# trace_cost: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs",
        "",
        f"Median of {REPEATS} interleaved batches of {BATCH} open+close (us per window); the "
        "reader thread's writing is not on this path and not timed.",
        "",
        "| path | windows open beside | trace off us | trace on us | on - off us | on / off |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, others, off, on in rows:
        lines.append(f"| {label} | {others} | {off:.2f} | {on:.2f} | {on - off:+.2f} | {on / off:.2f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
