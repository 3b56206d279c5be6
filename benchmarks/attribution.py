"""Who was charged what, against a truth the ledger did not write: the matrix of scenarios.

Each scenario runs on the real clock against a :class:`truecard.TrueCard` read by the
ledger's own poller thread, with no warm-up: requests start as soon as the ledger does.
The card's physics (ramp-up, ramp-down tails, foreign load, jittered integer-mJ steps,
part-time power sampling) is independent of the ledger, and each request's truth is the
energy its own job caused, tail included, in closed form.

Issue 16 added what a new user meets first: no warm-up in any scenario (a figure for every
window, the first included), a reader that raises, hangs or stops moving after 4 s of good
reads (no first figure made during the fault may say ``measured``), a foreign load witnessed
only in 250 ms gaps between requests, and an upstream whose metrics show only our own load
(no request may be flagged ``contended``). The issue's targets are printed last, ours beside.

Per scenario: the share of requests with a figure; the median and p90 of |error| / truth for
the first figure (what headers and the JSON block carry) and the settled one; the share of
truths inside +-uncertainty_joules for each; the median uncertainty / joules for each;
charged / caused (all requests' settled figures over their truths); the conservation error
|measured - charged - unattributed - in flight| / measured; the share flagged contended.

    python benchmarks/attribution.py             # the whole matrix, about three minutes
    python benchmarks/attribution.py --quick     # fewer requests per scenario
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from truecard import Fault, FaultyReader, Foreign, Gauge, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter

IDLE_W = 70.0


@dataclass
class Request:
    offset: float
    seconds: float
    watts: float
    tokens: int = 0


@dataclass
class Scenario:
    name: str
    requests: list[Request]
    gauge: Gauge = "counter"
    period: float = 0.1
    foreign: Foreign | None = None
    subtract: bool = False
    split: str = "time"
    #: The reader fails this way ``FAULT_AT`` seconds after the ledger starts.
    fault: Fault | None = None
    #: An upstream whose /metrics show its running requests (here: ours alone).
    upstream: bool = False


#: Seconds of good reads before a scenario's fault.
FAULT_AT = 4.0
#: How often the upstream's /metrics are read (the ledger's own pace).
UPSTREAM_EVERY_S = 0.25
#: How long after a window opens the upstream starts the request, and how long before the
#: window closes it has finished (the gateway's own time on either side).
PROXY_S = 0.003


@dataclass
class Outcome:
    truth: float
    first: Energy
    settled: Energy
    during_fault: bool = False


@dataclass
class Row:
    scenario: Scenario
    outcomes: list[Outcome] = field(default_factory=list)
    conservation: float = 0.0
    wall_s: float = 0.0

    def _errors(self, which: str) -> list[float]:
        out = []
        for o in self.outcomes:
            e: Energy = getattr(o, which)
            if e.joules is not None and o.truth > 0:
                out.append(abs(e.joules - o.truth) / o.truth)
        return out

    def _covered(self, which: str) -> float | None:
        hits = [
            abs(e.joules - o.truth) <= (e.uncertainty_joules or 0.0)
            for o in self.outcomes
            if (e := getattr(o, which)).joules is not None
        ]
        return sum(hits) / len(hits) if hits else None

    def _width(self, which: str) -> float | None:
        widths = [
            (e.uncertainty_joules or 0.0) / e.joules
            for o in self.outcomes
            if (e := getattr(o, which)).joules
        ]
        return statistics.median(widths) if widths else None

    def cells(self) -> dict[str, float | None]:
        n = len(self.outcomes)
        first, settled = self._errors("first"), self._errors("settled")
        caused = sum(o.truth for o in self.outcomes)
        charged = sum(o.settled.joules or 0.0 for o in self.outcomes)
        figured = [o for o in self.outcomes if o.settled.joules is not None]
        contended = sum(1 for o in figured if o.settled.contended) / len(figured) if figured else None
        return {
            "with figure": sum(1 for o in self.outcomes if o.first.joules is not None) / n,
            "settled with figure": sum(1 for o in self.outcomes if o.settled.joules is not None) / n,
            "first med": _q(first, 0.5), "first p90": _q(first, 0.9),
            "settled med": _q(settled, 0.5), "settled p90": _q(settled, 0.9),
            "in +-unc first": self._covered("first"), "in +-unc settled": self._covered("settled"),
            "unc/J first": self._width("first"), "unc/J settled": self._width("settled"),
            "charged/caused": charged / caused if caused else None,
            "conservation": self.conservation, "contended": contended,
        }

    def measured_while_failing(self) -> tuple[int, int]:
        """(first figures saying measured, first figures made) among windows opened after
        the reader's fault began."""
        during = [o for o in self.outcomes if o.during_fault]
        return sum(1 for o in during if o.first.method == "measured"), len(during)

    def contended_count(self) -> tuple[int, int]:
        return sum(1 for o in self.outcomes if o.settled.contended), len(self.outcomes)


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(scenario: Scenario, seed: int) -> Row:
    card = TrueCard(idle_w=IDLE_W, period=scenario.period, seed=seed)
    if scenario.foreign is not None:
        card.add_foreign(scenario.foreign)
    node = Node(
        scenario.name, idle_w=IDLE_W, split=scenario.split,
        foreign="subtract" if scenario.subtract else "charge",
    )
    reader = TrueReader(card, scenario.gauge)
    faulty = FaultyReader(reader, scenario.fault, FAULT_AT) if scenario.fault else None
    ledger = Ledger(node, faulty or reader)
    ledger.ensure_started()  # no warm-up: the first request starts at once
    t_start = time.monotonic()
    row = Row(scenario)
    running = 0  # the upstream's own count of the requests it runs

    async def one(req: Request) -> None:
        nonlocal running
        await asyncio.sleep(max(0.0, t_start + req.offset - time.monotonic()))
        meter = Meter(ledger)
        meter.open()
        during = faulty is not None and faulty.failing()
        if scenario.upstream:
            await asyncio.sleep(PROXY_S)
            running += 1
        job = card.start_job(req.watts)
        await asyncio.sleep(req.seconds)
        card.stop_job(job)
        if scenario.upstream:
            running -= 1
            await asyncio.sleep(PROXY_S)
        if req.tokens:
            meter.tokens(req.tokens)
        meter.close()
        first = meter.figure()
        settled = await meter.settled(timeout=15.0)
        row.outcomes.append(Outcome(job.truth(card.ramp_up, card.tau), first, settled, during))

    async def scrape() -> None:
        while True:  # the upstream's /metrics, read at the ledger's pace
            ledger.note_upstream(time.monotonic(), float(running))
            await asyncio.sleep(UPSTREAM_EVERY_S)

    watcher = asyncio.create_task(scrape()) if scenario.upstream else None
    await asyncio.gather(*(one(r) for r in scenario.requests))
    if watcher is not None:
        watcher.cancel()
    await asyncio.sleep(0.3)
    ledger.stop(2.0)
    totals = ledger.totals()
    books = totals.charged_j + totals.unattributed_j + totals.in_flight_j
    row.conservation = abs(totals.measured_j - books) / abs(totals.measured_j) if totals.measured_j else 0.0
    row.wall_s = time.monotonic() - t_start
    return row


def isolated(n: int, seconds: float, rng: random.Random, watts: float = 180.0) -> list[Request]:
    out, t = [], 0.0
    for _ in range(n):
        out.append(Request(t, seconds * rng.uniform(0.9, 1.1), watts * rng.uniform(0.9, 1.1)))
        t += seconds + rng.uniform(0.25, 0.5)
    return out


def batch(n: int, rng: random.Random, spread_s: float, total_w: float, rounds: int = 1) -> list[Request]:
    """Staggered arrivals sharing a card whose load is shared alike (a continuous batch)."""
    out = []
    for r in range(rounds):
        base = r * (spread_s + 2.5)
        for _ in range(n):
            seconds = min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5)))
            start = base + rng.uniform(0, spread_s)
            out.append(Request(start, seconds, total_w / n * rng.uniform(0.97, 1.03)))
    return out


def heterogeneous(n: int, rng: random.Random) -> list[Request]:
    """Each request decodes at its own rate and draws in proportion (equal J per token)."""
    out = []
    for _ in range(n):
        rate = rng.uniform(20, 120)
        seconds = min(2.0, max(0.2, rng.lognormvariate(math.log(0.6), 0.5)))
        out.append(Request(rng.uniform(0, 1.0), seconds, rate * 0.2, int(rate * seconds)))
    return out


def scenarios(quick: bool) -> list[Scenario]:
    rng = random.Random(7)
    k = 2 if quick else 1
    return [
        Scenario("isolated 30 ms, 100 ms counter", isolated(40 // k, 0.03, rng)),
        Scenario("isolated 100 ms, 100 ms counter", isolated(30 // k, 0.1, rng)),
        Scenario("isolated 300 ms, 100 ms counter", isolated(24 // k, 0.3, rng)),
        Scenario("isolated 300 ms, 20 ms counter", isolated(24 // k, 0.3, rng), period=0.02),
        Scenario(
            "isolated 300 ms, counter moves every read", isolated(24 // k, 0.3, rng), gauge="every_read"
        ),
        Scenario("isolated 1 s, 100 ms counter", isolated(12 // k, 1.0, rng)),
        Scenario("isolated 300 ms, part-time instant power", isolated(24 // k, 0.3, rng), gauge="instant"),
        Scenario("staggered batch of 16", batch(16, rng, 1.0, 320.0, rounds=3 // k or 1)),
        Scenario("staggered batch of 256", batch(256, rng, 2.0, 400.0)),
        Scenario(
            "foreign steady 150 W, subtract", isolated(24 // k, 0.3, rng),
            foreign=Foreign(150.0, start=-1.0), subtract=True,
        ),
        Scenario(
            "foreign steady 150 W, charged", isolated(16 // k, 0.3, rng),
            foreign=Foreign(150.0, start=-1.0),
        ),
        Scenario(
            "foreign bursty 150 W, subtract", isolated(24 // k, 0.3, rng),
            foreign=Foreign(150.0, start=-1.0, on_s=0.4, off_s=0.6), subtract=True,
        ),
        Scenario("heterogeneous rates, token split", heterogeneous(16, rng), split="tokens"),
        Scenario("heterogeneous rates, time split", heterogeneous(16, rng)),
        Scenario(
            "foreign steady 150 W, subtract, 250 ms gaps", spaced(40 // k, 0.3, 0.25, rng),
            foreign=Foreign(150.0, start=-1.0), subtract=True,
        ),
        Scenario("upstream metrics, our load only", spaced(20 // k, 0.3, 0.25, rng), upstream=True),
        *(
            Scenario(f"reader {fault} after 4 s", spaced(16, 0.3, 0.25, rng), fault=fault)
            for fault in ("raises", "hangs", "stops")
        ),
    ]


def spaced(n: int, seconds: float, gap: float, rng: random.Random, watts: float = 180.0) -> list[Request]:
    """Requests of ``seconds`` one after another with ``gap`` between them."""
    out, t = [], 0.0
    for _ in range(n):
        length = seconds * rng.uniform(0.95, 1.05)
        out.append(Request(t, length, watts * rng.uniform(0.9, 1.1)))
        t += length + gap
    return out


def fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if pct else f"{value:.3g}"


def table(rows: list[Row]) -> str:
    cols = [
        "with figure", "settled with figure", "first med", "first p90", "settled med", "settled p90",
        "in +-unc first", "in +-unc settled", "unc/J first", "unc/J settled",
        "charged/caused", "conservation", "contended",
    ]
    lines = [
        "| scenario | n | " + " | ".join(cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for row in rows:
        cells = row.cells()
        shown = []
        for c in cols:
            v = cells[c]
            if c == "charged/caused":
                shown.append(fmt(v, pct=False))
            elif c == "conservation":
                shown.append("-" if v is None else f"{v:.1e}")
            else:
                shown.append(fmt(v))
        lines.append(f"| {row.scenario.name} | {len(row.outcomes)} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help="run scenarios whose name contains this")
    args = parser.parse_args()
    rows = []
    for i, scenario in enumerate(scenarios(args.quick)):
        if args.only and args.only not in scenario.name:
            continue
        rows.append(asyncio.run(run(scenario, seed=i)))
        print(f"  {scenario.name}: {rows[-1].wall_s:.1f} s", file=sys.stderr)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# attribution.py, {stamp}, {platform.node()} ({os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}){' --quick' if args.quick else ''}\n")
    print(table(rows))
    print()
    print(targets(rows))


def targets(rows: list[Row]) -> str:
    """The issue's targets, with what this run measured beside them."""

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    figured = [
        min(r.cells()["with figure"] or 0.0, r.cells()["settled with figure"] or 0.0) for r in rows
    ]
    faults = [r.measured_while_failing() for r in rows if r.scenario.fault]
    foreign = [r for r in rows if "250 ms gaps" in r.scenario.name]
    upstream = [r.contended_count() for r in rows if r.scenario.upstream]
    lines = [
        "| what | today (issue 16) | target | this run |",
        "|---|---|---|---|",
        "| 4 workers, no setting: charged / caused | 3.67-3.8 | 0.9-1.1 | not measured here |",
        f"| windows with a figure (first and settled), no warm-up, every scenario | 75-92% | 100% | "
        f"{share(min(figured)) if figured else '-'} (lowest scenario) |",
        "| first figures saying `measured` while the reader fails | 6-7 of 7 | 0 | "
        + (", ".join(f"{r.scenario.fault} {m} of {n}" for r, (m, n) in zip(
            [r for r in rows if r.scenario.fault], faults, strict=True)) or "-") + " |",
        "| foreign subtract, short gaps: truth inside +- uncertainty, first / settled | 75% / 42% "
        "| >= 90% / >= 90% | "
        + (" ; ".join(f"{share(r.cells()['in +-unc first'])} / {share(r.cells()['in +-unc settled'])}"
                      for r in foreign) or "-") + " |",
        "| false `contended` with upstream metrics | 10 of 10 | 0 | "
        + (", ".join(f"{c} of {n}" for c, n in upstream) or "-") + " |",
        "| idle process, CPU | 2.3-2.6% of a core | <= 0.3% | not measured here |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
