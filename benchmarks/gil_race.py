"""Why a saturated event loop starves a reader thread: the GIL's hand-over, measured alone.

A thread that waits ``--period`` (``threading.Event.wait``, as the poller does), then makes one
driver call through benchmarks/fake_pynvml (a ctypes call, GIL released, about 20 us), beside
an asyncio loop that runs Python in slices with ``await asyncio.sleep(0)`` between. For each
slice length and GIL switch interval (``sys.setswitchinterval``): the reads per second the
thread got (it asks for 1 / period), how late it had the GIL back after each wait (from the
wait's end) and after each driver call (from the call's deadline), and its voluntary
switches (/proc: every block, a lost race for the GIL among them) per read.

CPython hands the GIL to a waiting thread only when the holder lets it go: at a blocking
call, or when asked to after the waiter has waited a whole switch interval (5 ms) with no
switch in between. A loop that lets the GIL go at every ``sleep(0)`` (its selector's poll)
and takes it back at once, more often than every switch interval, keeps resetting the
waiter's timer: the waiter runs only when it wins a race it mostly loses. Slices longer than
the interval, or an interval shorter than the slices, bound the wait.

    python benchmarks/gil_race.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml
from threads import thread_times

#: (slice of Python in ms, None: the loop idles; switch interval in ms)
CONFIGS: tuple[tuple[float | None, float], ...] = (
    (None, 5.0), (2.0, 5.0), (0.5, 5.0), (6.0, 5.0), (2.0, 1.0),
)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one(slice_ms: float | None, interval_ms: float, seconds: float, period: float) -> dict[str, float]:
    driver = fake_pynvml.install([fake_pynvml.Gpu(fake_pynvml.busy_card())],
                                 fake_pynvml.Driver(stall_every=10**9))
    gpu = fake_pynvml.nvmlDeviceGetHandleByIndex(0)
    stop = threading.Event()
    wake_lags: list[float] = []
    reads = 0
    native: list[int] = []

    def reader() -> None:
        nonlocal reads
        native.append(threading.get_native_id())
        alarm = threading.Event()
        while not stop.is_set():
            t = time.monotonic()
            alarm.wait(period)
            wake_lags.append((time.monotonic() - t - period) * 1e6)
            fake_pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
            reads += 1

    async def loop() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if slice_ms is None:
                await asyncio.sleep(0.001)
                continue
            until = time.perf_counter() + slice_ms / 1000
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(0)

    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_ms / 1000)
    thread = threading.Thread(target=reader, name="race-reader")
    thread.start()
    while not native:
        time.sleep(0.001)
    before = thread_times(native)
    t0 = time.perf_counter()
    try:
        asyncio.run(loop())
    finally:
        wall = time.perf_counter() - t0
        spent = thread_times(native) - before
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
        fake_pynvml.uninstall()
    call_lags = [lag / 1000 for lag in driver.stats.lags_ns]
    return {"reads_per_s": reads / wall, "wake_p50": _q(wake_lags, .5), "wake_p90": _q(wake_lags, .9),
            "wake_max": max(wake_lags, default=float("nan")), "call_p50": _q(call_lags, .5),
            "call_p90": _q(call_lags, .9), "call_max": max(call_lags, default=float("nan")),
            "blocks_per_read": spent.voluntary / max(reads, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--period", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_start = os.getloadavg()
    runs: dict[tuple[float | None, float], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for slice_ms, interval_ms in CONFIGS:  # interleaved
            runs.setdefault((slice_ms, interval_ms), []).append(
                one(slice_ms, interval_ms, args.seconds, args.period))
    print(f"# gil_race: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores "
          f"(nproc), Python {platform.python_version()}\n")
    print(f"    python benchmarks/gil_race.py --seconds {args.seconds:g} --period {args.period:g} "
          f"--repeats {args.repeats}\n")
    print("Load average at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f} (1, 5, 15 min)\n".format(
        *load_start, *os.getloadavg()))
    print(f"A thread asks for a read every {args.period * 1000:g} ms ({1 / args.period:.0f} a second): "
          "Event.wait, then one fake_pynvml counter read (20 us median in C, GIL released). Medians "
          f"of {args.repeats} interleaved runs of {args.seconds:g} s.\n")
    print("| loop | switch interval | reads/s | GIL back after the wait, us p50 / p90 / max "
          "| after the driver call, us p50 / p90 / max | reader blocks a read |")
    print("|---|---:|---:|---|---|---:|")
    for (slice_ms, interval_ms), rs in runs.items():
        def med(key: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r[key] for r in rs)
        loop = "idle (sleep 1 ms)" if slice_ms is None else f"{slice_ms:g} ms slices, sleep(0) between"
        print(f"| {loop} | {interval_ms:g} ms | {med('reads_per_s'):.0f} | {med('wake_p50'):.0f} / "
              f"{med('wake_p90'):.0f} / {med('wake_max'):.0f} | {med('call_p50'):.0f} / "
              f"{med('call_p90'):.0f} / {med('call_max'):.0f} | {med('blocks_per_read'):.1f} |")


if __name__ == "__main__":
    main()
