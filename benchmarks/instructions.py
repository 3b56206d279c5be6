"""A request's instructions on the loop's thread, counted by callgrind: A/Bs a loaded machine cannot blur.

Wall-clock A/Bs on the shared 2-core VMs move by 10-20% between runs; callgrind counts the
instructions a thread executes whatever else runs. Each arm runs benchmarks/path_profile.py
under ``valgrind --tool=callgrind --separate-threads=yes`` twice, with ``n1`` and ``n2``
requests of one kind; the difference of the main thread's totals over ``n2 - n1`` is one
request's instructions on the loop (the imports, the warm-up and the shutdown cancel out).
The reader thread is counted apart and not reported: under valgrind a request takes about
fifty times longer, so the reader reads fifty times more often per request than it would
(its share per request is benchmarks/overhead.py's schedstat row). The garbage collector is
off during the requests (``--gc`` keeps it): a collection's work lands on whichever thread
allocates when it is due, which moved the main thread's count by 10% between two runs of
the same code. And the reader reads once a second rather than ten times a counter period:
each of its reads hands the GIL back and forth with the loop, which under valgrind's
slowdown is every few requests, and moved the count by a few % more.

Two kinds have no threads at all, and count the same every run: ``ledger`` is
benchmarks/ledger_path.py (a request's whole metering, its path and its share of the
reader's work, in one thread on a virtual clock), ``whole`` the same through a variant's
ASGI stack (``ledger_path.py --asgi VARIANT``: for ours, everything a JSON request costs,
loop and reader; for a peer, everything it costs). These are the A/Bs to trust.

An arm is ``label=PYTHONPATH`` (the package found first on that path is measured: a copy of
another commit's ``giul_asgi`` in /tmp/before, say) and runs each variant asked for.

    python benchmarks/instructions.py --arm before=/tmp/before --arm after=. \\
        --variant giul-asgi-nvml --kind json --kind usage
    python benchmarks/instructions.py --arm before=/tmp/before --arm after=. --kind ledger
    python benchmarks/instructions.py --variant bare --variant giul-asgi --kind whole
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLLECT = False  # --gc


def main_thread_ir(pythonpath: str, variant: str, kind: str, n: int, chunks: int) -> int:
    """Instructions the main thread executed in one run of ``n`` requests (``kind``
    ``ledger``: of benchmarks/ledger_path.py)."""
    if kind == "ledger":
        script = [str(HERE / "ledger_path.py"), str(n)]
    elif kind.startswith("whole"):  # whole, whole-stream, whole-usage
        script = [str(HERE / "ledger_path.py"), str(n), "--asgi", variant,
                  "--kind", kind.partition("-")[2] or "json", "--chunks", str(chunks)]
    else:
        script = [str(HERE / "path_profile.py"), kind, str(n), "--variant", variant,
                  "--chunks", str(chunks), "--settle", "0.05", "--reads-per-period", "0.1",
                  *([] if COLLECT else ["--no-gc"])]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, *script],
            env={**os.environ, "PYTHONHASHSEED": "0",
                 "PYTHONPATH": os.pathsep.join([str(Path(pythonpath).resolve()), str(HERE.parent)])},
            check=True, capture_output=True,
        )
        main = Path(f"{out}-01").read_text(errors="replace")
        found = re.search(r"^summary:\s*(\d+)", main, re.M) or re.search(r"^totals:\s*(\d+)", main, re.M)
        if found is None:
            raise RuntimeError(f"no summary in callgrind's output for {variant} {kind}")
        return int(found.group(1))


def per_request(pythonpath: str, variant: str, kind: str, n1: int, n2: int, chunks: int) -> float:
    a = main_thread_ir(pythonpath, variant, kind, n1, chunks)
    b = main_thread_ir(pythonpath, variant, kind, n2, chunks)
    return (b - a) / (n2 - n1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", default=[],
                        help="label=PYTHONPATH (repeatable); default: this checkout")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--kind", action="append", default=[],
                        choices=("json", "stream", "usage", "ledger", "whole", "whole-stream",
                                 "whole-usage"))
    parser.add_argument("--chunks", type=int, default=1000, help="chunks a stream has")
    parser.add_argument("--n", type=int, nargs=2, default=None, metavar=("N1", "N2"),
                        help="requests in the two runs (default 300 1300 for JSON, 10 60 for streams)")
    parser.add_argument("--gc", action="store_true", help="keep the garbage collector on")
    args = parser.parse_args()
    global COLLECT
    COLLECT = args.gc
    arms = [a.split("=", 1) for a in args.arm] or [["here", str(HERE.parent)]]
    variants = args.variant or ["giul-asgi-nvml"]
    kinds = args.kind or ["json"]
    print(f"# instructions: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"Python {platform.python_version()}, valgrind callgrind, main thread only\n")
    print("| arm | variant | kind | instructions a request | per chunk (stream: over the bare app) |")
    print("|---|---|---|---:|---:|")
    for label, path in arms:
        for kind in kinds:
            n1, n2 = args.n or {"json": (300, 1300), "ledger": (2000, 12000),
                                "whole": (1000, 4000)}.get(kind, (10, 60))
            streams = kind in ("stream", "usage", "whole-stream", "whole-usage")
            bare = per_request(path, "bare", kind, n1, n2, args.chunks) if streams else None
            for variant in variants if kind != "ledger" else ["meter"]:
                ir = per_request(path, variant, kind, n1, n2, args.chunks)
                chunk = f"{(ir - bare) / args.chunks:.0f}" if bare is not None else ""
                print(f"| {label} | {variant} | {kind} | {ir:,.0f} | {chunk} |", flush=True)


if __name__ == "__main__":
    main()
