"""How long a JSON request's first figure waits for its ledger's lock on the NVML path.

The request path asks the ledger for its first figure under the ledger's one lock
(``Ledger.share``); the reader thread holds the same lock while it books a reading and, as
the card's holder, decides and takes each span (``Ledger._book_reading``, ``Ledger._publish``): work
that grows with the windows a span holds. Where the two meet, the event loop waits for the
rest of the reader's hold, and every request behind it with it. This measures both sides on
benchmarks/_apps.py's ``giul-asgi-nvml`` stack (the NVML reader over fake_pynvml), ``n``
JSON requests back to back on one loop, with the host's sharing on (the default) and off
(``GIUL_ASGI_LOAD_DIR=off``), each run in a fresh process, interleaved, medians of repeats:

- the first figure's call: median, mean and 99th percentile (the mean less the median is
  about what waiting for the reader costs a request);
- the reader's holds: how many a second, their median, 99th percentile and longest, and the
  share of the run's wall time the reader held the lock.

    python benchmarks/lock_waits.py [--requests 5000] [--repeats 3] [--out FILE]
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
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = {"sharing on (default)": {}, "sharing off": {"GIUL_ASGI_LOAD_DIR": "off"}}


def _timed(store: list[float], fn: Any) -> Any:
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            store.append(clock() - t)
    return timed


def one(n: int) -> dict[str, Any]:
    """In the child: time the first figures and the reader's holds over ``n`` requests."""
    sys.path.insert(0, str(HERE))
    from giul_asgi.ledger.ledger import Ledger

    shares: list[float] = []
    holds: list[float] = []
    Ledger.share = _timed(shares, Ledger.share)  # type: ignore[method-assign]
    # The reader's work under the lock: a reading booked, a span decided and taken.
    Ledger._book_reading = _timed(holds, Ledger._book_reading)  # type: ignore[method-assign]
    Ledger._publish = _timed(holds, Ledger._publish)  # type: ignore[method-assign]
    from _apps import BUILDERS, PATHS
    from overhead import run_requests

    async def main() -> dict[str, Any]:
        app = BUILDERS["giul-asgi-nvml"]()
        await run_requests(app, PATHS["json"], 300)  # builds the stack, starts the reader
        await asyncio.sleep(1.0)
        shares.clear()
        holds.clear()
        start = time.perf_counter()
        await run_requests(app, PATHS["json"], n)
        wall = time.perf_counter() - start
        share, hold = sorted(shares), sorted(holds)
        return {
            "us_per_request": wall / n * 1e6,
            "share_p50": share[len(share) // 2] * 1e6, "share_mean": statistics.fmean(share) * 1e6,
            "share_p99": share[int(len(share) * 0.99)] * 1e6,
            "holds_per_s": len(hold) / wall, "hold_p50": hold[len(hold) // 2] * 1e6,
            "hold_p99": hold[int(len(hold) * 0.99)] * 1e6, "hold_max": hold[-1] * 1e6,
            "held_pct": 100 * sum(hold) / wall,
        }
    return asyncio.run(main())


COLUMNS = (("us_per_request", "us a request"), ("share_p50", "first figure p50 us"),
           ("share_mean", "mean us"), ("share_p99", "p99 us"), ("holds_per_s", "reader holds /s"),
           ("hold_p50", "hold p50 us"), ("hold_p99", "hold p99 us"), ("hold_max", "longest us"),
           ("held_pct", "lock held, % of wall"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.requests)))
        return 0
    load = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode, env in MODES.items():
            out = subprocess.run([sys.executable, __file__, "--one", "--requests", str(args.requests)],
                                 capture_output=True, text=True, check=True,
                                 env={**os.environ, **env})
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat + 1} {mode}: {runs[mode][-1]}", file=sys.stderr)
    lines = [
        f"# lock_waits: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node() or 'host'}, "
        f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}",
        "",
        f"    python benchmarks/lock_waits.py --requests {args.requests} --repeats {args.repeats}",
        "",
        "Load average at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(
            *load, *os.getloadavg()),
        "",
        f"{args.requests} JSON requests back to back on one loop, each mode in a fresh process, "
        f"interleaved; medians of {args.repeats} (min-max). Times include the timing wrappers' own.",
        "",
        "| mode | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for mode, rs in runs.items():
        cells = []
        for key, _ in COLUMNS:
            values = [r[key] for r in rs]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
