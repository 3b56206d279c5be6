"""What giving way changes: the loop's and the reader's threads, trees side by side.

JSON requests back to back on one loop (as benchmarks/overhead.py times them), ours on the
production path (``giul-asgi-nvml``: the NVML reader over benchmarks/fake_pynvml, a process of
its own). Each tree (``--tree LABEL=DIR``: the ``giul_asgi`` found first on ``DIR``) runs in a
fresh process, the trees alternated, ``--repeats`` times. Per request: the loop's thread's CPU
(and of it the kernel's: the futex wakes of a thread waiting for the GIL), the reader
thread's CPU and its voluntary switches (each a wait: for a read's time, or for the GIL); per
second, the counter reads the driver saw. And for a tree that gives way, how often it did and
how much of the loop's time the pauses and the reader's turns after them took.

    python benchmarks/give_way.py --tree before=/tmp/before --tree after=. --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _kernel_us(tid: int) -> float:
    """A thread's system time so far (us; /proc, clock ticks)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK") * 1e6


async def one(n: int) -> dict[str, float]:
    """In this process: ``n`` JSON requests on the NVML path, the threads' books over them."""
    import threading

    sys.path.insert(1, str(HERE))
    import fake_pynvml
    from _apps import BUILDERS, PATHS
    from overhead import run_requests
    from threads import main_thread_times, named_thread_times

    import giul_asgi
    from giul_asgi.ledger import poller

    tree = os.environ["GIVE_WAY_TREE"]
    assert tree in giul_asgi.__file__, f"{giul_asgi.__file__} is not {tree}'s"

    given = {"pauses": 0.0, "s": 0.0}
    turns = getattr(poller, "TURNS", None)
    if turns is not None:  # a tree that gives way: its pauses counted, with the turns after them
        let_go = turns._let_go

        def counted(seconds: float) -> None:
            t0 = time.perf_counter()
            let_go(seconds)
            given["pauses"] += 1
            given["s"] += time.perf_counter() - t0

        turns._let_go = counted
    app = BUILDERS["giul-asgi-nvml"]()
    path = PATHS["json"]
    await run_requests(app, path, 500)  # builds the stack, starts the reader
    await asyncio.sleep(0.5)
    driver = fake_pynvml.driver()
    reads0 = driver.calls().get("counter", 0)
    main_tid = threading.main_thread().native_id
    assert main_tid is not None
    # Not counted (nan) in a tree without TURNS: one before giving way, or its first form.
    given["pauses"], given["s"] = (0.0, 0.0) if turns is not None else (float("nan"), float("nan"))
    main0, reader0, kernel0 = main_thread_times(), named_thread_times("giul-reader-"), _kernel_us(main_tid)
    t0 = time.perf_counter()
    await run_requests(app, path, n)
    wall = time.perf_counter() - t0
    main, reader = main_thread_times() - main0, named_thread_times("giul-reader-") - reader0
    return {
        "wall_us": wall / n * 1e6, "main_cpu_us": main.cpu_s / n * 1e6,
        "main_kernel_us": (_kernel_us(main_tid) - kernel0) / n, "reader_cpu_us": reader.cpu_s / n * 1e6,
        "reader_switches": reader.voluntary / n,
        "reads_per_s": (driver.calls().get("counter", 0) - reads0) / wall,
        "pauses_per_s": given["pauses"] / wall, "given_share": given["s"] / wall,
    }


ROWS = (
    ("wall_us", "wall, us a request", "{:.1f}"),
    ("main_cpu_us", "loop's thread CPU, us a request", "{:.1f}"),
    ("main_kernel_us", "of it in the kernel (ticks), us", "{:.1f}"),
    ("reader_cpu_us", "reader thread CPU, us a request", "{:.1f}"),
    ("reader_switches", "reader's voluntary switches a request", "{:.3f}"),
    ("reads_per_s", "counter reads a second", "{:.0f}"),
    ("pauses_per_s", "pauses a second (giving way)", "{:.0f}"),
    ("given_share", "loop's time given (pauses and turns)", "{:.1%}"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one(args.n))))
        return
    trees = [tree.split("=", 1) for tree in args.tree or ["here=" + str(HERE.parent)]]
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for r in range(args.repeats):
        for label, folder in trees if r % 2 == 0 else reversed(trees):
            code = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); sys.argv = sys.argv[2:]; "
                    "runpy.run_path(sys.argv[0], run_name='__main__')")
            where = str(Path(folder).resolve())
            out = subprocess.run(
                [sys.executable, "-c", code, where, __file__, "--one", "--n", str(args.n)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "GIVE_WAY_TREE": where},
            )
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# give_way: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}\n")
    print(f"    python benchmarks/give_way.py {' '.join(sys.argv[1:])}\n")
    print(f"JSON requests back to back, {args.n} a run, giul-asgi-nvml (a process of its own); medians of "
          f"{args.repeats} alternated runs, each in a fresh process (least-most in brackets).\n")
    print("| what | " + " | ".join(label for label, _ in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for key, what, form in ROWS:
        cells = []
        for label, _ in trees:
            values = [run[key] for run in results[label]]
            cells.append(f"{form.format(statistics.median(values))} ({form.format(min(values))}-"
                         f"{form.format(max(values))})")
        print(f"| {what} | " + " | ".join(cells) + " |")
    print(f"\nLoad average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
