"""What carbon costs: the request path's grading, and the reader thread under a slow provider.

1. ``grade()`` with and without a node's :class:`~giul_asgi.energy.Carbon` (the one value
   the meter hands it: six fields copied and one product), interleaved, medians of repeats:
   what every figure pays for carbon.
2. Why a poll runs off the reader thread: a node on the in-process simulated card, windows
   of 0.3 s back to back, and an intensity provider on 127.0.0.1 that takes ``--delay``
   seconds to answer, polled every ``--every`` seconds, for ``--seconds``. ``off-thread``
   is :class:`~giul_asgi.carbon.CarbonFeed` as shipped (the tick starts a short-lived
   fetch thread); ``inline`` fetches in the tick itself, on the reader thread, as a plain
   chore would. Counted: failed readings the watchdog booked (the card was not read for
   more than ``read_timeout``), the node's lost seconds, the figures that came out
   ``estimated`` instead of ``simulated`` (the card's reader was in trouble), and the
   longest gap between two reads.

    python benchmarks/carbon.py [--seconds 8] [--delay 2] [--every 1] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import statistics
import sys
import threading
import time
import timeit
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server import serve  # noqa: E402

from giul_asgi.carbon import CarbonFeed  # noqa: E402
from giul_asgi.config import Node, Tier  # noqa: E402
from giul_asgi.energy import Carbon, Provenance, Share, grade  # noqa: E402
from giul_asgi.ledger import Ledger  # noqa: E402
from giul_asgi.meter import Meter  # noqa: E402


def grading(repeats: int) -> list[str]:
    share = Share(42.0, 0.5, 1.0, True, Provenance("measured", "nvml_counter", "local", 60.0), 0.3,
                  mean_watts=200.0, concurrency=1.0)
    carbon = Carbon(380.0, 1.3, "electricitymaps", "average", 812.0)
    calls = {
        "no carbon": lambda: grade(share, node="n", tier="t", route="/r", tokens=100, id="x"),
        "carbon": lambda: grade(share, node="n", tier="t", route="/r", tokens=100, id="x",
                                carbon=carbon),
    }
    number = 20000
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeats * 10):
        for name, call in calls.items():  # interleaved
            times[name].append(timeit.timeit(call, number=number) / number * 1e6)
    base = statistics.median(times["no carbon"])
    rows = ["| grade() | median us a call | range | ratio |", "|---|---|---|---|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(f"| {name} | {med:.2f} | {min(ts):.2f}-{max(ts):.2f} | {med / base:.2f} |")
    return rows


class Slow:
    """An Electricity Maps-shaped provider that takes ``delay`` seconds to answer."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await asyncio.sleep(self.delay)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:00:00.000Z")
        body = json.dumps({"zone": "DE", "carbonIntensity": 380, "datetime": stamp}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class Inline(CarbonFeed):
    """The fetch in the tick itself: on the reader thread, as a plain chore would do it."""

    def _start(self, now: float) -> None:
        self.polls += 1
        self._next = math.inf
        self._poll()
        answer, self._answer = self._answer, None
        if answer is not None:
            self._take(answer, self.clock())


class Gaps:
    """Wraps a reader: the longest time between two reads."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.last: float | None = None
        self.longest = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)

    def read(self) -> Any:
        now = time.monotonic()
        if self.last is not None:
            self.longest = max(self.longest, now - self.last)
        self.last = now
        return self.reader.read()


def one_run(kind: str, url: str, seconds: float, every: float) -> dict[str, float]:
    node = Node(f"sim-{kind}", reader="simulated", idle_w=50.0, carbon=url, carbon_every_s=every,
                workers_dir=False)
    ledger = Ledger(node)
    feed_cls = Inline if kind == "inline" else CarbonFeed
    ledger._carbon_feed = feed_cls(url, every_s=every, timeout_s=30.0, node=node.name)
    from giul_asgi.readers.base import ReaderSpec
    from giul_asgi.readers.registry import READERS

    gaps: list[Gaps] = []

    def build() -> Any:
        wrapped = Gaps(READERS["simulated"](ReaderSpec(idle_w=50.0)))
        gaps.append(wrapped)
        return wrapped

    ledger._build = build
    ledger.ensure_started()
    methods: dict[str, int] = {}
    meters = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        meter = Meter(ledger, Tier("8b"))
        meter.open()
        time.sleep(0.3)
        meter.close()
        meters.append(meter)
    ledger.stop(5.0)
    for meter in meters:
        e = meter.figure()
        methods[e.method] = methods.get(e.method, 0) + 1
    totals = ledger.totals()
    return {
        "failed readings": float(totals.read_errors),
        "lost s": totals.lost_s,
        "estimated figures": float(methods.get("estimated", 0) + methods.get("unknown", 0)),
        "figures": float(sum(methods.values())),
        "longest gap s": gaps[0].longest if gaps else math.nan,
        "polls": float(ledger._carbon_feed.polls if ledger._carbon_feed else 0),
    }


def reader_thread(seconds: float, delay: float, every: float, repeats: int) -> list[str]:
    runs: dict[str, list[dict[str, float]]] = {"off-thread": [], "inline": []}
    with serve(Slow(delay)) as base:
        url = base + "/v3/carbon-intensity/latest"
        for _ in range(repeats):
            for kind in runs:  # interleaved
                runs[kind].append(one_run(kind, url, seconds, every))
    keys = ("failed readings", "lost s", "estimated figures", "figures", "longest gap s", "polls")
    rows = ["| poll | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for kind, results in runs.items():
        cells = []
        for key in keys:
            values = [r[key] for r in results]
            med = statistics.median(values)
            cells.append(f"{med:.3g} ({min(values):.3g}-{max(values):.3g})")
        rows.append(f"| {kind} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [
        f"# carbon, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Machine: {platform.machine()}, {platform.processor() or '?'}, "
        f"Python {platform.python_version()}, {threading.active_count()} thread(s) at start; "
        "a 2-core VM shared with other work (medians and ranges of interleaved repeats).",
        "",
        "## The request path: grade() with a node's carbon",
        "",
        *grading(args.repeats),
        "",
        f"## The reader thread: a provider answering in {args.delay:g} s, polled every "
        f"{args.every:g} s, {args.seconds:g} s of 0.3 s windows, {args.repeats} repeats",
        "",
        *reader_thread(args.seconds, args.delay, args.every, args.repeats),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
