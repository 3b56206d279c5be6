"""What CPython's cyclic collector costs each stack: its passes a request, their time, the longest.

A request's objects that are still alive when the next one starts count toward the
collector's next pass (700 allocations by default), and what survives two passes is
promoted to the old generation, whose growth brings a full pass over every object in the
process. The bare app and the peers free everything a request made before the next one:
they trigger no pass at all. Ours keeps a request's window, meter and ticket until a reading
settles its figure (a tenth of a second or more), and its records by id for minutes, so
every pass, and the longest one, a full pass that holds the GIL (the loop and the reader
stall), is its cost.

Each measurement runs in a fresh process (the collector's counts are the process's):
``--fill`` requests first (the records store full, as in a worker that has run a while),
then ``--n`` requests back to back on one loop, timed by ``gc.callbacks``; then, with the
collector off, 1,000 more, and the objects they left in the youngest generation a request
(what a request keeps until its figure settles). Variants interleave, ``--repeats`` times;
medians. ``--before DIR``: an earlier commit's package (``git archive``'d there) beside this
one, on the NVML path.

    .venv/bin/python benchmarks/collector.py [--n 20000] [--repeats 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("bare", "starlette-exporter", "prometheus-fastapi-instrumentator", "giul-asgi",
            "giul-asgi-nvml")
BEFORE = "giul-asgi-nvml-before"
IN_FLIGHT_N = 1000


async def _measure(variant: str, n: int, fill: int) -> dict[str, Any]:
    from _apps import BUILDERS, PATHS, before_on_path
    from overhead import READERS, run_requests, until_settled

    if variant == BEFORE:
        before_on_path()
    app = BUILDERS[variant]()
    path = PATHS["json"]
    ours = variant in READERS

    async def settle() -> None:
        if ours:
            await until_settled(app, 5.0)

    await run_requests(app, path, 500)
    await settle()
    await run_requests(app, path, fill)
    await settle()
    await asyncio.sleep(0.3)

    passes: dict[int, list[float]] = collections.defaultdict(list)
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            passes[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    cpu, wall = time.process_time(), time.perf_counter()
    await run_requests(app, path, n)
    wall = time.perf_counter() - wall
    await settle()
    cpu = time.process_time() - cpu
    gc.callbacks.remove(timed)
    tracked = len(gc.get_objects())

    gc.collect()
    gc.disable()
    await run_requests(app, path, IN_FLIGHT_N)
    young = gc.get_objects(generation=0)
    kinds = collections.Counter(type(o).__qualname__ for o in young)
    gc.enable()
    await settle()
    return {
        "variant": variant, "n": n,
        "passes": {g: len(passes.get(g, ())) for g in range(3)},
        "us": {g: sum(passes.get(g, ())) / n * 1e6 for g in range(3)},
        "longest_ms": max((max(v) for v in passes.values()), default=0.0) * 1e3,
        "tracked": tracked, "wall_us": wall / n * 1e6, "cpu_us": cpu / n * 1e6,
        "in_flight": len(young) / IN_FLIGHT_N,
        "kinds": [(k, round(c / IN_FLIGHT_N, 2)) for k, c in kinds.most_common(6)
                  if c >= IN_FLIGHT_N / 10],
    }


def _one(variant: str, n: int, fill: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--one", variant, "--n", str(n), "--fill", str(fill)],
                         capture_output=True, text=True, env=os.environ, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{variant}: the measurement failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--fill", type=int, default=12_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", metavar="DIR")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_measure(args.one, args.n, args.fill))))
        return
    variants: tuple[str, ...] = VARIANTS
    if args.before:
        from _apps import prepare_before

        prepare_before(args.before)
        variants = (*variants, BEFORE)
    print(f"# collector: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (nproc), "
          f"Python {platform.python_version()}")
    print(f"\n    python benchmarks/collector.py {' '.join(sys.argv[1:])}\n")
    print(f"Load average at start: {_load()}\n")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            runs[v].append(_one(v, args.n, args.fill))
    print(f"{args.n} JSON requests back to back on one loop, in process, after {args.fill} "
          f"(median of {args.repeats} fresh processes, interleaved). Passes by generation "
          "(0 / 1 / 2), their time a request, the longest pause, objects the collector "
          f"tracks after, and the objects {IN_FLIGHT_N} requests left in the youngest "
          "generation a request, with the collector off (what a request keeps until its "
          "figure settles).\n")
    print("| variant | passes 0 / 1 / 2 | us a request 0 / 1 / 2 | in all us a request | longest ms "
          "| tracked | in flight a request | most of them |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for v in variants:
        rs = runs[v]

        def med(f: Any, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(f(r) for r in rs)

        passes = " / ".join(f"{med(lambda r, g=g: r['passes'][str(g)]):.0f}" for g in range(3))
        us = " / ".join(f"{med(lambda r, g=g: r['us'][str(g)]):.1f}" for g in range(3))
        total = med(lambda r: sum(r["us"].values()))
        kinds = ", ".join(f"{k} {c:g}" for k, c in rs[len(rs) // 2]["kinds"])
        print(f"| {v} | {passes} | {us} | {total:.1f} | {med(lambda r: r['longest_ms']):.1f} | "
              f"{med(lambda r: r['tracked']):.0f} | {med(lambda r: r['in_flight']):.2f} | {kinds} |")
    print("\nEach run's collector time a request, us (all generations): "
          + "; ".join(f"{v} " + " ".join(f"{sum(r['us'].values()):.1f}" for r in runs[v]) for v in variants))
    print(f"\nLoad average at end: {_load()}")


if __name__ == "__main__":
    main()
