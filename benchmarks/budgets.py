"""What a budget costs a request: the check alone, the whole request A/B, the budgets' thread.

(a) The check alone, in a loop: ``Budgets.admit`` (one dictionary lookup per budget that
    applies, and the header) and ``Budgets.spend`` (the first figure counted at the close,
    under the lock), for one budget and for three, with 1 and with 10,000 keys spent on.
(b) The same JSON request through the whole middleware (benchmarks/_apps.py's app, its
    ledger live on the busy simulated card, a tenant resolved on every request), without a
    budget and with one (soft, hard never reached, three at once): interleaved repeats, the
    added microseconds over the variant without one (same repeat), medians.
(c) The budgets' thread while requests run back to back, in a fresh process: its CPU per
    request and per second (it writes this worker's row and sums the others' in the
    server's folder, here alone).

    python benchmarks/budgets.py            # all three
    python benchmarks/budgets.py --quick    # fewer repeats, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
# A private place of the benchmark's own, on shared memory as the default place is (a row
# replaced on a disk's file system costs several times as much).
os.environ.setdefault("GIUL_ASGI_LOAD_DIR", tempfile.mkdtemp(
    prefix="giul-bench-budgets-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

from _apps import PATHS, bench_app, our_middleware
from overhead import run_requests
from threads import named_thread_times

from giul_asgi import Budget
from giul_asgi.budgets import Budgets
from giul_asgi.energy import Energy


def tenant(scope: Any) -> str:
    return "team-a"


# -- (a) the check alone --------------------------------------------------------------------------

def check_alone(repeats: int, n: int) -> list[tuple[str, float, float]]:
    """(case, admit ns, spend ns), this thread's CPU (not wall: the machine is shared),
    medians of ``repeats`` loops of ``n`` calls; a dictionary lookup and a call first, for
    scale."""
    cases = {
        "1 budget, 1 key": ([Budget(joules=1e12, hard=True)], 1),
        "1 budget, 10,000 keys": ([Budget(joules=1e12, hard=True)], 10_000),
        "3 budgets, 1 key": ([Budget(joules=1e12, hard=True), Budget(joules=1e12, per="tier"),
                              Budget(joules=1e12, per="route", key="/v1/chat/completions")], 1),
    }
    out = []
    table = {(0, "team-a"): 1.0}
    lookups = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        for _ in range(n):
            table.get((0, "team-a"), 0.0) >= 5.0  # noqa: B015 - the lookup timed
        lookups.append((time.thread_time_ns() - t0) / n)
    out.append(("reference: one dict lookup and compare", statistics.median(lookups), math.nan))
    energy = Energy(12.5, "measured", id="x", settled=True)
    for name, (budgets, keys) in cases.items():
        b = Budgets(budgets, directory="off")
        for k in range(keys - 1):  # keys spent on already, each through its own admission
            slots, _headers = b.admit(f"key:{k:016x}", "/v1/chat/completions", "8b")
            b.spend(slots, energy)
        # The key timed has a figure counted: its usual cost is known (a cold key is held to
        # one request at a time, which a loop of admissions without their closes is not).
        slots, _headers = b.admit("team-a", "/v1/chat/completions", "8b")
        b.spend(slots, energy)
        admit_ns, spend_ns = [], []
        for _ in range(repeats):
            t0 = time.thread_time_ns()
            for _ in range(n):
                slots, _headers = b.admit("team-a", "/v1/chat/completions", "8b")
            t1 = time.thread_time_ns()
            for _ in range(n):
                b.spend(slots, energy)
            t2 = time.thread_time_ns()
            admit_ns.append((t1 - t0) / n)
            spend_ns.append((t2 - t1) / n)
        out.append((name, statistics.median(admit_ns), statistics.median(spend_ns)))
    return out


# -- (b) the request A/B --------------------------------------------------------------------------

VARIANTS: dict[str, list[Budget]] = {
    "no budget": [],
    "1 soft": [Budget(joules=1e12)],
    "1 hard": [Budget(joules=1e12, hard=True)],
    "3 (tenant, tier, route)": [Budget(joules=1e12, hard=True), Budget(joules=1e12, per="tier"),
                                Budget(joules=1e12, per="route", key="/v1/*")],
}


def build(budgets: list[Budget]) -> Any:
    """The benchmark's app behind ours with ``budgets`` (records kept in process: four
    middlewares of one process would share one journal file, which is one server's)."""
    from giul_asgi import Route
    from giul_asgi.records import RecordStore

    return bench_app([our_middleware(tenant=tenant, budgets=budgets, routes=[Route("/v1/*", tier="8b")],
                                     records=RecordStore(share="off"))])


async def request_ab(repeats: int, n: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process-CPU microseconds per JSON request, per variant, interleaved."""
    apps = {name: build(budgets) for name, budgets in VARIANTS.items()}
    path = PATHS["json"]
    for app in apps.values():
        await run_requests(app, path, max(50, n // 4))
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, app in apps.items():
            c0 = time.process_time()
            wall.setdefault(name, []).append(await run_requests(app, path, n) * 1e6)
            cpu.setdefault(name, []).append((time.process_time() - c0) / n * 1e6)
            await asyncio.sleep(0.3)  # the readers' and the budgets' busy linger, uncounted
    return wall, cpu


def added(values: dict[str, list[float]]) -> dict[str, float]:
    base = values["no budget"]
    return {name: statistics.median([v - b for v, b in zip(vs, base, strict=True)])
            for name, vs in values.items()}


# -- (c) the budgets' thread ------------------------------------------------------------------------

async def thread_cost(seconds: float) -> tuple[int, float, float]:
    """(requests, budgets' thread CPU us per request, its CPU ms per second) while one
    budgeted app serves JSON requests back to back for ``seconds``."""
    app = build([Budget(joules=1e12, hard=True)])
    path = PATHS["json"]
    await run_requests(app, path, 50)
    await asyncio.sleep(0.5)
    before = named_thread_times("giul-budgets")
    t0, count = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        await run_requests(app, path, 100)
        count += 100
    took = time.perf_counter() - t0
    spent = named_thread_times("giul-budgets") - before
    return count, spent.cpu_s / count * 1e6, spent.cpu_s / took * 1e3


def _fresh_thread_cost(seconds: float) -> tuple[int, float, float]:
    """:func:`thread_cost` in a fresh process (this one holds (b)'s middlewares, whose
    budgets' threads would be counted too)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--thread-only", str(seconds)], check=True,
                         capture_output=True, text=True).stdout
    count, per_request, per_second = json.loads(out.strip().splitlines()[-1])
    return int(count), float(per_request), float(per_second)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--thread-only", type=float, default=None, metavar="SECONDS",
                        help="only (c), as JSON (how (c) runs in a fresh process)")
    args = parser.parse_args()
    if args.thread_only is not None:
        import json

        print(json.dumps(asyncio.run(thread_cost(args.thread_only))))
        return
    repeats, n, seconds = (3, 300, 1.0) if args.quick else (31, 1000, 5.0)
    start_load = _load()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# budgets: {now}, {platform.node() or 'host'}, {platform.machine()}, "
          f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}\n")
    print(f"    python benchmarks/budgets.py{' --quick' if args.quick else ''}\n")
    print(f"Load average at start: {start_load}\n")
    print(f"## (a) the check alone, this thread's CPU, median of {repeats} loops of 100,000 calls\n")
    print("| case | admit ns | spend (at the close) ns |\n|---|---:|---:|")
    for name, admit_ns, spend_ns in check_alone(repeats, 100_000):
        print(f"| {name} | {admit_ns:.0f} | {'' if math.isnan(spend_ns) else f'{spend_ns:.0f}'} |")
    wall, cpu = asyncio.run(request_ab(repeats, n))
    print(f"\n## (b) one JSON request through the middleware, median of {repeats} interleaved repeats "
          f"of {n}\n")
    print("Added us per request over the same middleware without a budget (its own us in brackets).\n")
    print("| variant | wall us added | process CPU us added |\n|---|---:|---:|")
    wall_added, cpu_added = added(wall), added(cpu)
    for name in VARIANTS:
        if name == "no budget":
            own_wall, own_cpu = statistics.median(wall[name]), statistics.median(cpu[name])
            print(f"| {name} | ({own_wall:.1f}) | ({own_cpu:.1f}) |")
        else:
            print(f"| {name} | {wall_added[name]:.2f} | {cpu_added[name]:.2f} |")
    count, per_request, per_second = _fresh_thread_cost(seconds)
    print(f"\n## (c) the budgets' thread, {count} requests back to back over {seconds:g} s\n")
    print("| CPU us per request | CPU ms per second |\n|---:|---:|")
    print(f"| {per_request:.2f} | {per_second:.1f} |")
    print(f"\nLoad average at end: {_load()}")


if __name__ == "__main__":
    main()
