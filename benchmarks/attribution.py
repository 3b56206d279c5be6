"""Who was charged what, against a truth the ledger did not write: the matrix of scenarios.

Each scenario runs on the real clock against a :class:`truecard.TrueCard` read by the
ledger's own poller thread, with no warm-up: requests start as soon as the ledger does.
The card's physics (ramp-up, ramp-down tails, foreign load, jittered integer-mJ steps,
part-time power sampling) is independent of the ledger, and each request's truth is the
energy its own job caused, tail included, in closed form.

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

from truecard import Foreign, Gauge, TrueCard, TrueReader

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


@dataclass
class Outcome:
    truth: float
    first: Energy
    settled: Energy


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
            "first med": _q(first, 0.5), "first p90": _q(first, 0.9),
            "settled med": _q(settled, 0.5), "settled p90": _q(settled, 0.9),
            "in +-unc first": self._covered("first"), "in +-unc settled": self._covered("settled"),
            "unc/J first": self._width("first"), "unc/J settled": self._width("settled"),
            "charged/caused": charged / caused if caused else None,
            "conservation": self.conservation, "contended": contended,
        }


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
    ledger = Ledger(node, TrueReader(card, scenario.gauge))
    ledger.ensure_started()  # no warm-up: the first request starts at once
    t_start = time.monotonic()
    row = Row(scenario)

    async def one(req: Request) -> None:
        await asyncio.sleep(max(0.0, t_start + req.offset - time.monotonic()))
        meter = Meter(ledger)
        meter.open()
        job = card.start_job(req.watts)
        await asyncio.sleep(req.seconds)
        card.stop_job(job)
        if req.tokens:
            meter.tokens(req.tokens)
        meter.close()
        first = meter.figure()
        settled = await meter.settled(timeout=15.0)
        row.outcomes.append(Outcome(job.truth(card.ramp_up, card.tau), first, settled))

    await asyncio.gather(*(one(r) for r in scenario.requests))
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
    ]


def fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if pct else f"{value:.3g}"


def table(rows: list[Row]) -> str:
    cols = [
        "with figure", "first med", "first p90", "settled med", "settled p90",
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


if __name__ == "__main__":
    main()
