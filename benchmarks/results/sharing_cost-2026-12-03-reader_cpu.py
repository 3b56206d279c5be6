"""Reader and loop thread CPU per JSON request (schedstat), N requests on one loop, R repeats.

    PYTHONPATH=. python benchmarks/results/sharing_cost-2026-12-03-reader_cpu.py 5000 5 giul-asgi-nvml
"""

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _apps import BUILDERS, PATHS
from overhead import run_requests
from threads import named_thread_times


async def main(n: int, repeats: int, variant: str) -> None:
    app = BUILDERS[variant]()
    path = PATHS["json"]
    await run_requests(app, path, 300)
    await asyncio.sleep(1.5)
    reader, loop = [], []
    for _ in range(repeats):
        before = named_thread_times("giul-reader")
        t0 = time.thread_time()
        await run_requests(app, path, n)
        loop.append((time.thread_time() - t0) / n * 1e6)
        await asyncio.sleep(1.2)
        reader.append((named_thread_times("giul-reader") - before).cpu_s / n * 1e6)
    print(variant, "reader us/req", [round(r, 1) for r in reader], f"median {statistics.median(reader):.1f}",
          f"| loop us/req median {statistics.median(loop):.1f}")


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
