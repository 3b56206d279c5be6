"""What the rolling statistics cost: per record, in resident memory, and per /energy render.

Records spread over 50 routes, 4 nodes (one tier each) and two methods, on a simulated
clock covering the same 5000 s (83 min: every ring full) at both sizes, so the two sizes
differ only in how many requests were recorded. Each size runs in a fresh process; memory
is the growth of VmRSS from before the statistics were built.

    python benchmarks/stats.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SPAN_S = 5000.0


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def one(n: int) -> dict[str, Any]:
    import random

    from giul_asgi.energy import Energy
    from giul_asgi.serve.endpoint import EnergyEndpoint, _dumps
    from giul_asgi.stats import EnergyStats

    rng = random.Random(1)
    figures = [
        Energy(rng.lognormvariate(3, 1.2) if i % 20 else None, "measured" if i % 7 else "estimated",
               node=f"gpu{i % 4}", tier=f"tier{i % 4}", route=f"/v1/route{i % 50}",
               seconds=rng.uniform(0.05, 3), tokens=rng.randint(1, 800), contended=False)
        for i in range(5000)
    ]
    before = rss_kib()
    clock = [1_800_000_000.0]
    stats = EnergyStats(clock=lambda: clock[0])
    dt = SPAN_S / n
    record = stats.record
    laps = []
    chunk = n // 20
    for c in range(20):
        t0 = time.perf_counter()
        for i in range(c * chunk, (c + 1) * chunk):
            clock[0] += dt
            record(figures[i % 5000], outcome="ok", status=200)
        laps.append((time.perf_counter() - t0) / chunk * 1e6)
    # The clock's own cost (a lambda and an add per record), to take off.
    t0 = time.perf_counter()
    for _ in range(chunk):
        clock[0] += dt
        (lambda: clock[0])()
    clock_us = (time.perf_counter() - t0) / chunk * 1e6
    grown = rss_kib() - before

    class Totals:
        def __init__(self, k: int) -> None:
            self.node, self.reads = f"gpu{k}", 10
            self.measured_j, self.charged_j, self.unattributed_j = 1e5, 9e4, 1e4

    class Ledger:
        def __init__(self, k: int) -> None:
            self.t = Totals(k)

        def totals(self) -> Totals:
            return self.t

    endpoint = EnergyEndpoint(stats=stats, ledgers=[Ledger(k) for k in range(4)])
    render: dict[str, float] = {}
    for window in ("1m", "15m", "1h", "all"):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            body = _dumps(endpoint.snapshot(window))
            times.append((time.perf_counter() - t0) * 1e3)
        render[window] = statistics.median(times)
    return {"n": n, "record_us": statistics.median(laps), "record_us_max_lap": max(laps),
            "clock_us": clock_us, "rss_mib": grown / 1024, "render_ms": render, "bytes": len(body),
            "dropped": stats.dropped}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]))))
        return
    rows = []
    for n in (100_000, 1_000_000):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
        out = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True,
                             text=True, check=True, env=env)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    head = (f"# benchmarks/stats.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\n"
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; 50 routes x 4 nodes x 4 tiers x 2 methods, {SPAN_S:.0f} s "
            "simulated (every ring full) at both sizes; one process per size.\n")
    lines = [head,
             "| records | record us (median of 20 laps) | slowest lap us | clock's own us | RSS growth MiB "
             "| /energy 1m ms | 15m ms | 1h ms | all ms | JSON bytes (all) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rd = r["render_ms"]
        lines.append(
            f"| {r['n']:,} | {r['record_us']:.2f} | {r['record_us_max_lap']:.2f} | {r['clock_us']:.2f} "
            f"| {r['rss_mib']:.1f} | {rd['1m']:.1f} | {rd['15m']:.1f} | {rd['1h']:.1f} | {rd['all']:.1f} "
            f"| {r['bytes']:,} |")
    a, b = rows
    lines.append(f"\nRSS 1e6 vs 1e5: {b['rss_mib'] / a['rss_mib'] - 1:+.1%}. "
                 "Targets: record < 5 us, memory within 10%, /energy < 50 ms.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
