"""Reader thread CPU per request (schedstat), N JSON requests on one loop, R repeats."""
import asyncio, sys, statistics, time
sys.path.insert(0, "/work/main/benchmarks")
from _apps import BUILDERS, PATHS
from overhead import run_requests
from threads import named_thread_times

async def main(n, reps, variant):
    app = BUILDERS[variant]()
    path = PATHS["json"]
    await run_requests(app, path, 300)
    await asyncio.sleep(1.5)
    out = []
    for _ in range(reps):
        before = named_thread_times("giul-reader")
        t0 = time.thread_time()
        await run_requests(app, path, n)
        loop_cpu = time.thread_time() - t0
        await asyncio.sleep(1.2)
        d = named_thread_times("giul-reader") - before
        out.append((d.cpu_s / n * 1e6, loop_cpu / n * 1e6))
    print(variant, "reader us/req", [round(a, 1) for a, _ in out], "median %.1f" % statistics.median(a for a, _ in out),
          "| loop us/req median %.1f" % statistics.median(b for _, b in out))
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
