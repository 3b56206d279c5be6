"""One request's path, repeated, for a profiler or an instruction counter to look at.

Builds one of benchmarks/_apps.py's stacks (ours on the NVML path over fake_pynvml by
default), warms it, then runs ``n`` requests of one kind back to back on one loop, as
benchmarks/overhead.py times them: a JSON answer, or a stream of ``chunks`` chunks (plain,
or with ``"usage": null`` on every chunk). With ``--profile`` it runs them under cProfile or
pyinstrument and prints where the time went; without, it only runs them, for
``valgrind --tool=callgrind`` (see benchmarks/instructions.py, which counts a request's
instructions on the loop's thread, whatever the machine's load).

    python benchmarks/path_profile.py json 20000 --profile cprofile
    python benchmarks/path_profile.py usage 200 --chunks 1000 --profile pyinstrument
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _apps import BUILDERS, PATHS
from overhead import run_requests


async def run(variant: str, kind: str, n: int, chunks: int, profile: str | None, settle: float,
              collect: bool) -> None:
    app = BUILDERS[variant]()
    path = PATHS[kind].replace("{n}", str(chunks))
    await run_requests(app, path, 200)  # builds the stack, starts the reader, fills caches
    await asyncio.sleep(settle)
    if not collect:
        gc.collect()
        gc.disable()  # counted apart: a collection's work lands on whichever thread allocates
    collections = [g["collections"] for g in gc.get_stats()]
    if profile == "cprofile":
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        await run_requests(app, path, n)
        wall = time.perf_counter() - t0
        prof.disable()
        print(f"{n} x {kind} in {wall:.3f} s ({wall / n * 1e6:.1f} us each, under cProfile)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(35)
    elif profile == "pyinstrument":
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        await run_requests(app, path, n)
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    else:
        t0 = time.perf_counter()
        await run_requests(app, path, n)
        print(f"{n} x {kind}: {(time.perf_counter() - t0) / n * 1e6:.1f} us each")
    await asyncio.sleep(settle)
    if collect:
        done = [g["collections"] - c for g, c in zip(gc.get_stats(), collections, strict=True)]
        print("collections per request, by generation: " + ", ".join(f"{d / n:.4f}" for d in done))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(PATHS))
    parser.add_argument("n", type=int)
    parser.add_argument("--variant", default="giul-asgi-nvml", choices=sorted(BUILDERS))
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--profile", choices=("cprofile", "pyinstrument"))
    parser.add_argument("--settle", type=float, default=0.3,
                        help="seconds idle after the warm-up and after the requests")
    parser.add_argument("--no-gc", action="store_true",
                        help="no garbage collection during the requests (instruction counts)")
    parser.add_argument("--reads-per-period", type=float, default=None,
                        help="the reader's pace (default the poller's own: 10 a counter period)")
    args = parser.parse_args()
    if args.reads_per_period is not None:
        from giul_asgi.ledger import poller

        poller.READS_PER_PERIOD = args.reads_per_period  # type: ignore[misc]
    asyncio.run(run(args.variant, args.kind, args.n, args.chunks, args.profile, args.settle,
                    not args.no_gc))


if __name__ == "__main__":
    main()
