"""Where a request's time goes on the production path, every thread counted: py-spy's GIL samples.

A busy gateway worker's requests are bound by one thing, the GIL: whatever any thread of
ours does while holding it (the loop's request path, the reader's settling, the writers of
the shared statistics and records) is time the loop cannot serve. benchmarks/overhead.py
times the whole; this attributes it. It runs benchmarks/path_profile.py (``n`` requests of
one kind, back to back on one loop, as overhead.py times them) under ``py-spy record --gil``:
a sample is taken only of the thread that holds the GIL, so the samples split the process's
busy time between the parts below, whichever thread did them. py-spy stops the process for
each sample (with ``--nonblocking`` a stack read while it changes is dropped, and the loop's
quick-changing stacks were dropped far more often than a writer thread's long C calls, which
then read as half the time). Each part's share times the wall time a request takes in runs
of the same script without the profiler (``--repeats``, interleaved) is its microseconds.

A sample goes to the first part of its thread's (the loop's, or the other threads') whose
function is on its stack, in the order of :data:`PARTS`; on the loop, what is under our
middleware and in no part of ours is the app (and Starlette) inside it; what is outside the
middleware is the loop and the server's side, as in the bare app.

    python benchmarks/gil_parts.py   # ours, NVML path: a worker of several, a process of its own, unshared
    python benchmarks/gil_parts.py --variant giul-asgi-nvml-unshared
    python benchmarks/gil_parts.py --variant bare --variant prometheus-fastapi-instrumentator

Needs ``py-spy`` (``pip install py-spy``; reading another process's memory may need
``--cap-add SYS_PTRACE`` in a container).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (part, the function on a sample's stack that puts it there), first match wins: the
#: shared writes before the book, the book before the output, the threads by their loops.
PARTS: tuple[tuple[str, str], ...] = (
    ("loop: the record kept by id (first figure; memory, and the ring the other workers read)",
     "RecordStore.put "),
    ("loop: the answer written in place (the server's statistics)", "HostStats.answered "),
    ("loop: the card table's open and close events", "CardTable.opened "),
    ("loop: the card table's open and close events", "CardTable.closed "),
    ("loop: window open", "Ledger.open "),
    ("loop: first figure: the book takes the close and shares", "Ledger.share "),
    ("loop: first figure: graded", "Meter._grade "),
    ("loop: window close (route label, tray)", "Exchange.close "),
    ("loop: output (parse, headers, block, splice)", "parse_object "),
    ("loop: output (parse, headers, block, splice)", "energy_headers "),
    ("loop: output (parse, headers, block, splice)", "splice_object "),
    ("loop: output (parse, headers, block, splice)", "energy_json "),
    ("loop: output (parse, headers, block, splice)", "Responder.send_start "),
    ("loop: the settled figure's ticket (Meter.report)", "Meter.report "),
    ("reader: records kept by id (settled; memory and ring)", "RecordStore.settled "),
    ("reader: statistics (counted, and written for the other workers)", "HostStats.settled "),
    ("reader: statistics (counted, and written for the other workers)", "EnergyStats.settled "),
    ("reader: settled figures graded", "Meter.grade_settled "),
    ("reader: reading the card, booking, sharing, settling", "Poller._run "),
    ("writer thread: the server's statistics rows", "giul-host-stats"),
    ("writer thread: records' ring census and fold", "giul-records"),
    ("other threads of ours", "Thread._bootstrap "),
    ("loop: our middleware's own (the exchange, the responder's choice, the meter)",
     "giul_asgi/"),
    ("loop: the app and Starlette (under our middleware)", "EnergyMiddleware.__call__ "),
    ("loop: the app and Starlette (the bare app's, or under a peer)", "Starlette.__call__ "),
    ("loop: asyncio and the benchmark's server side", ""),
)


def wall_us(variant: str, kind: str, n: int) -> float:
    """Microseconds a request takes in path_profile.py without a profiler."""
    out = subprocess.run(
        [sys.executable, str(HERE / "path_profile.py"), kind, str(n), "--variant", variant, "--no-gc"],
        capture_output=True, text=True, check=True,
    ).stdout
    found = re.search(r": ([\d.]+) us each", out)
    if found is None:
        raise RuntimeError(f"path_profile.py said no time: {out[-500:]}")
    return float(found.group(1))


def samples(variant: str, kind: str, n: int, rate: int) -> Counter[tuple[str, ...]]:
    """py-spy's GIL-holder samples of one run: each stack (thread name first) and its count."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.txt"
        subprocess.run(
            [spy, "record", "--gil", "--threads", "--rate", str(rate), "--format", "raw",
             "--output", str(raw), "--", sys.executable, str(HERE / "path_profile.py"), kind, str(n),
             "--variant", variant, "--no-gc"],
            capture_output=True, text=True, check=True,
        )
        counts: Counter[tuple[str, ...]] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            counts[tuple(stack.split(";"))] += int(count)
        return counts


#: Frames that are the app's, Starlette's or the benchmark's (anything else under ours,
#: the standard library's or a C call, is ours).
THEIRS = ("(starlette/", "(starlette_exporter/", "(prometheus", "(_apps.py", "(overhead.py",
          "(path_profile.py")


def attribute(counts: Counter[tuple[str, ...]]) -> tuple[Counter[str], int]:
    """Samples by part (only those taken while the requests ran), and their total. A
    sample is ours up to its deepest frame of ours, and only where no frame of the app's,
    Starlette's or the benchmark's is deeper (our responder sends through the server's
    ``send``, and the app's response calls ours: the deepest one says whose work it is)."""
    parts: Counter[str] = Counter()
    total = 0
    for stack, count in counts.items():
        text = ";".join(stack)
        if "run_requests" not in text and "Thread._bootstrap" not in text:
            continue  # imports, the stack's build: not the requests'
        total += count
        ours = [i for i, frame in enumerate(stack) if "giul_asgi/" in frame]
        theirs = [i for i, frame in enumerate(stack) if any(t in frame for t in THEIRS)]
        if ours and (not theirs or ours[-1] > theirs[-1]):
            text = ";".join(stack[: ours[-1] + 1])
        else:
            inside = any("EnergyMiddleware.__call__" in f for f in stack)
            text = ";".join([*(["EnergyMiddleware.__call__ (the app inside)"] if inside else []),
                             *(f for f in stack if "giul_asgi/" not in f)])
        # The loop's parts for the loop's samples, the threads' for the others': a function
        # both call (the grade, a record's JSON) is the caller's thread's work.
        loop = not any("Thread._bootstrap" in frame for frame in stack)  # threads start there
        for part, marker in PARTS:
            if part.startswith("loop:") == loop and marker in text:
                parts[part] += count
                break
    return parts, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--kind", default="json", choices=("json", "stream", "usage"))
    parser.add_argument("-n", type=int, default=60000, help="requests a run")
    parser.add_argument("--rate", type=int, default=400, help="py-spy's samples a second")
    parser.add_argument("--repeats", type=int, default=3,
                        help="unprofiled runs of each variant, interleaved (their median is the wall)")
    args = parser.parse_args()
    variants = args.variant or ["giul-asgi-nvml-workers", "giul-asgi-nvml", "giul-asgi-nvml-unshared"]
    print(f"# gil_parts: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}\n")
    print(f"    python benchmarks/gil_parts.py {' '.join(sys.argv[1:])}".rstrip() + "\n")
    print(f"Load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeats):  # interleaved: a load that comes and goes falls on every variant
        for variant in variants:
            walls[variant].append(wall_us(variant, args.kind, args.n))
    for variant in variants:
        wall = statistics.median(walls[variant])
        parts, total = attribute(samples(variant, args.kind, args.n, args.rate))
        runs = ", ".join(f"{w:.1f}" for w in walls[variant])
        print(f"## {variant}, {args.kind}: {wall:.1f} us a request without the profiler (median of "
              f"{runs}), {total} samples\n")
        print("| part | share of the GIL's busy time | us a request |")
        print("|---|---:|---:|")
        for part, count in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"| {part} | {count / total:.1%} | {wall * count / total:.1f} |")
        print()
    print(f"Load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
