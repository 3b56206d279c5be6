"""Who was charged what, against a truth the ledger did not write: the matrix of scenarios.

Each scenario runs on the real clock against a :class:`truecard.TrueCard` read by the
ledger's own poller thread, with no warm-up: requests start as soon as the ledger's reader is
built, as the middleware's lifespan startup waits for it.
The card's physics (ramp-up, ramp-down tails, foreign load, jittered integer-mJ steps,
part-time power sampling) is independent of the ledger, and each request's truth is the
energy its own job caused, tail included, in closed form.

Issue 16 added what a new user meets first: no warm-up in any scenario (a figure for every
window, the first included), a reader that raises, hangs or stops moving after 4 s of good
reads (no first figure made during the fault may say ``measured``), a foreign load witnessed
only in 250 ms gaps between requests, and an upstream whose metrics show only our own load
(no request may be flagged ``contended``). The issue's targets are printed last, ours beside.

Issue 22 runs every scenario on two paths: ``nvml``, the production path (``Node(reader=
"nvml")``, whose reader imports benchmarks/fake_pynvml over the scenario's truth card: every
NVML call one ctypes call into C with the GIL released, faults as a driver fails), and
``truecard``, the truth card read directly by a Python reader, as before. It adds a saturated
loop: the event loop runs Python flat out (2 ms slices with ``await asyncio.sleep(0)``
between, as a busy gateway's loop does) while 300 ms windows are metered. Each scenario runs
in a fresh process of its own; ``--runs N`` repeats the chosen ones (new seeds), and the
saturated scenario's runs get a table of their own with how the reader kept up: readings
per 100 ms period (the poller asks for ten), the time between driver reads, and how late
the reader had the GIL back after each driver call.

Issue 23 adds a card whose power depends on the phase (truecard's PhasedJob: each request's
prefill at about four times its decode's watts), and a mix of long prompts with short answers
and the reverse, charged by the time split, the token split (completion tokens) and the phase
split: from each stream's first event (the responder's ``prefill`` mark), and with no marks at
all, from each request's usage tokens at the upstream's own seconds per token (vLLM's prefill
and decode time sums). A table sets the three side by side.

Per scenario: the share of requests with a figure; the median and p90 of |error| / truth for
the first figure (what headers and the JSON block carry) and the settled one; the share of
truths inside +-uncertainty_joules for each; the median uncertainty / joules for each (the
width); the p90 of how far each first figure fell from its own settled figure, and the share
of settled figures inside the first's +-uncertainty (the first figure's sharpness with the
split's convention set apart, which the settled figure shares); charged / caused (all
requests' settled figures over their truths); the conservation error |measured - charged -
unattributed - in flight| / measured; the share flagged contended; readings per 100 ms period.

    python benchmarks/attribution.py                     # the whole matrix, both paths
    python benchmarks/attribution.py --quick             # fewer requests per scenario
    python benchmarks/attribution.py --only saturated --runs 10 --path nvml
    python benchmarks/attribution.py --only "mixed phases"   # the three splits side by side
    python benchmarks/attribution.py --only saturated --runs 10 --path nvml --pace uniform,steps

``--pace`` runs each chosen scenario under each of the reader thread's busy paces, interleaved
(``uniform``: ten reads a counter period at random phases, the GIL's switch interval left
alone, as before issue 22; ``steps``: two reads around each step once the tape knows them,
giul_asgi.ledger.pace, and the switch interval lowered where the reader is kept waiting,
giul_asgi.switch; ``steps-only``: the steps' pace alone; ``main``: whatever the tree
at ``--main-root`` does, a checkout of main, say: its giul_asgi, this tree's benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_pynvml
from batch_card import BatchCard
from threads import named_thread_times
from truecard import Fault, FaultyReader, Foreign, Gauge, TrueCard, TrueReader

from giul_asgi.asgi.options import Options
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
    #: A phased request: its first ``prefill_s`` at ``prefill_w``, the rest at ``watts``;
    #: its usage (prompt, completion tokens); streamed: its first event marks the end of prefill.
    prefill_s: float = 0.0
    prefill_w: float = 0.0
    prompt: int = 0
    completion: int = 0
    streamed: bool = True


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
    #: An upstream whose /metrics show its running requests (ours, and ``replica``'s).
    upstream: bool = False
    #: Another gateway replica's requests on the same upstream, back to back (180 W,
    #: 0.2-0.5 s, 10-30 ms apart): in the upstream's count, never in ours.
    replica: bool = False
    #: The event loop runs Python flat out beside the requests (SLICE_S slices).
    saturate: bool = False
    #: An upstream whose /metrics show its token counters and its requests' summed prefill and
    #: decode seconds (vLLM's), read by the phase split.
    phase_metrics: bool = False
    #: A card whose draw grows as its batch^law (benchmarks/batch_card.BatchCard, 20 W a request
    #: at ``law_batch`` in flight, no ramps) rather than the sum of its jobs' watts.
    law: float | None = None
    law_batch: int = 16


#: Seconds of good reads before a scenario's fault.
FAULT_AT = 4.0
#: How often the upstream's /metrics are read (the ledger's own pace).
UPSTREAM_EVERY_S = 0.25
#: How long after a window opens the upstream starts the request, and how long before the
#: window closes it has finished (the gateway's own time on either side).
PROXY_S = 0.003
#: A saturated loop's slice of Python work between two ``await asyncio.sleep(0)``.
SLICE_S = 0.002
#: A fresh process's windows before this many have settled get the cold spread (the split
#: conformal rank at 92% needs a dozen residuals): the warm width is the median after them.
WARM = 12
#: The reading paths: production's (NVML over fake_pynvml) and the truth card read directly.
READ_PATHS = ("nvml", "truecard")


@dataclass
class Outcome:
    truth: float
    first: Energy
    settled: Energy
    during_fault: bool = False


def _truth(o: Outcome) -> float | None:
    return o.truth


def _settled_j(o: Outcome) -> float | None:
    return o.settled.joules


@dataclass
class Row:
    scenario: Scenario
    outcomes: list[Outcome] = field(default_factory=list)
    conservation: float = 0.0
    wall_s: float = 0.0
    reads: int = 0
    #: How the reader kept up, on the NVML path: ms between driver reads, us until the GIL
    #: was back after each (p50, p90, max).
    read_gaps_ms: tuple[float, float, float] | None = None
    gil_lags_us: tuple[float, float, float] | None = None
    #: The reader thread over the requests: CPU seconds, and times it blocked (a sleep, the
    #: GIL, a lock: each a hand-over it waited for).
    reader_cpu_s: float = 0.0
    reader_blocks: int = 0

    def _errors(self, which: str, against: Callable[[Outcome], float | None] = _truth) -> list[float]:
        """|figure - reference| / reference for each ``which`` figure: against the truth, or
        (``_settled_j``) against the request's own settled figure, which sets the split's
        convention apart (the first figure's sharpness alone)."""
        out = []
        for o in self.outcomes:
            e: Energy = getattr(o, which)
            ref = against(o)
            if e.joules is not None and ref is not None and ref > 0:
                out.append(abs(e.joules - ref) / ref)
        return out

    def _covered(self, which: str, against: Callable[[Outcome], float | None] = _truth) -> float | None:
        hits = [
            abs(e.joules - ref) <= (e.uncertainty_joules or 0.0)
            for o in self.outcomes
            if (e := getattr(o, which)).joules is not None and (ref := against(o)) is not None
        ]
        return sum(hits) / len(hits) if hits else None

    def _width(self, which: str, skip: int = 0) -> float | None:
        widths = [
            (e.uncertainty_joules or 0.0) / e.joules
            for o in self.outcomes[skip:]
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
            "first to settled p90": _q(self._errors("first", _settled_j), 0.9),
            "settled in +-unc first": self._covered("first", _settled_j),
            "in +-unc first": self._covered("first"), "in +-unc settled": self._covered("settled"),
            "unc/J first": self._width("first"), "unc/J settled": self._width("settled"),
            "unc/J first, warm": self._width("first", skip=WARM),
            "charged/caused": charged / caused if caused else None,
            "conservation": self.conservation, "contended": contended,
            "reads/period": self.reads / (self.wall_s / 0.1) if self.wall_s else None,
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


def _gpu(card: TrueCard, scenario: Scenario) -> fake_pynvml.Gpu:
    """The scenario's card as NVML shows it: its gauge, and its fault from FAULT_AT on."""
    gauge = scenario.gauge
    return fake_pynvml.Gpu(
        card, counter=gauge in ("counter", "every_read"), every_read=gauge == "every_read",
        instant=gauge in ("counter", "every_read", "instant"),
        fault=scenario.fault, fault_at=card.clock() + FAULT_AT,
    )


async def _saturate(stop: asyncio.Event) -> None:
    """Python work flat out on the loop: SLICE_S slices, ``await asyncio.sleep(0)`` between."""
    while not stop.is_set():
        until = time.perf_counter() + SLICE_S
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


def _spread(values: list[float]) -> tuple[float, float, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return (ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], ordered[-1])


async def run(scenario: Scenario, seed: int, path: str = "truecard") -> Row:
    card = (TrueCard(idle_w=IDLE_W, period=scenario.period, seed=seed) if scenario.law is None
            else BatchCard.at_mean(time.monotonic, seed, scenario.law_batch, scenario.law))
    if scenario.foreign is not None:
        card.add_foreign(scenario.foreign)
    faulty: FaultyReader | None = None
    gpu: fake_pynvml.Gpu | None = None
    driver: fake_pynvml.Driver | None = None
    if path == "nvml":
        gpu = _gpu(card, scenario)
        driver = fake_pynvml.install([gpu], fake_pynvml.Driver(seed=seed))
        node = Node(
            scenario.name, idle_w=IDLE_W, split=scenario.split, reader="nvml",
            foreign="subtract" if scenario.subtract else "charge",
        )
        ledger = Ledger(node)
    else:
        node = Node(
            scenario.name, idle_w=IDLE_W, split=scenario.split,
            foreign="subtract" if scenario.subtract else "charge",
        )
        reader = TrueReader(card, scenario.gauge)
        faulty = FaultyReader(reader, scenario.fault, FAULT_AT) if scenario.fault else None
        ledger = Ledger(node, faulty or reader)
    # As the middleware's lifespan startup does: the reader built (its first turn at the card's
    # table), at most startup_timeout; no warm-up beyond that: the first request starts at once.
    # (Until 2026-12-07 the first request started before the reader was built: on the NVML
    # path, whose start costs 50 ms, the first window of a 30-100 ms scenario closed before
    # it, as a server without lifespan's first request still does.)
    await ledger.wait_ready(Options().startup_timeout)
    t_start = time.monotonic()
    t_start_ns = time.monotonic_ns()
    reader0 = None
    row = Row(scenario)
    running = 0  # the upstream's own count of the requests it runs
    engine = [0.0, 0.0, 0.0, 0.0]  # its prompt and generation tokens, prefill and decode seconds
    stop_saturating = asyncio.Event()
    saturator = asyncio.create_task(_saturate(stop_saturating)) if scenario.saturate else None

    def failing() -> bool:
        if gpu is not None:
            return gpu.failing() is not None
        return faulty is not None and faulty.failing()

    async def one(req: Request) -> None:
        nonlocal running, reader0
        await asyncio.sleep(max(0.0, t_start + req.offset - time.monotonic()))
        if reader0 is None:  # the reader thread exists by now
            reader0 = named_thread_times("giul-reader-")
        meter = Meter(ledger)
        meter.open()
        during = failing()
        if scenario.upstream:
            await asyncio.sleep(PROXY_S)
            running += 1
        job: Any
        if req.prefill_s > 0:
            job = card.start_phased(req.prefill_w, req.watts)
            began = time.monotonic()
            await asyncio.sleep(req.prefill_s)
            card.end_prefill(job)
            prefilled = time.monotonic()
            if req.streamed:
                meter.first_out()  # as the SSE responder does when the first event goes out
            await asyncio.sleep(req.seconds - req.prefill_s)
            if scenario.phase_metrics:  # the engine's histograms observe a request as it ends
                engine[0] += req.prompt
                engine[1] += req.completion
                engine[2] += prefilled - began
                engine[3] += time.monotonic() - prefilled
        else:
            job = card.start_job(req.watts)
            await asyncio.sleep(req.seconds)
        card.stop_job(job)
        if scenario.upstream:
            running -= 1
            await asyncio.sleep(PROXY_S)
        if req.tokens:
            meter.tokens(req.tokens)
        if req.prompt or req.completion:
            meter.usage(req.prompt, req.completion)
        meter.close()
        first = meter.figure()
        settled = await meter.settled(timeout=15.0)
        row.outcomes.append(Outcome(job.truth(card.ramp_up, card.tau), first, settled, during))

    async def scrape() -> None:
        while True:  # the upstream's /metrics, read at the ledger's pace
            ledger.note_upstream(time.monotonic(), float(running))
            await asyncio.sleep(UPSTREAM_EVERY_S)

    async def scrape_phases() -> None:
        while True:  # vLLM's token counters and phase-time sums, read at the ledger's pace
            ledger.note_phases(*engine)
            await asyncio.sleep(UPSTREAM_EVERY_S)

    async def other_replica() -> None:
        nonlocal running
        replica_rng = random.Random(24)
        while True:
            job = card.start_job(180.0 * replica_rng.uniform(0.9, 1.1))
            running += 1
            try:
                await asyncio.sleep(replica_rng.uniform(0.2, 0.5))
            finally:
                card.stop_job(job)
                running -= 1
            await asyncio.sleep(replica_rng.uniform(0.01, 0.03))

    replica = asyncio.create_task(other_replica()) if scenario.replica else None
    watcher = asyncio.create_task(scrape()) if scenario.upstream else None
    phase_watcher = asyncio.create_task(scrape_phases()) if scenario.phase_metrics else None
    await asyncio.gather(*(one(r) for r in scenario.requests))
    for task in (watcher, phase_watcher, replica):
        if task is not None:
            task.cancel()
    stop_saturating.set()
    if saturator is not None:
        await saturator
    t_end_ns = time.monotonic_ns()
    if reader0 is not None:
        spent = named_thread_times("giul-reader-") - reader0
        row.reader_cpu_s, row.reader_blocks = spent.cpu_s, spent.voluntary
    row.reads = ledger.totals().reads
    row.wall_s = time.monotonic() - t_start
    await asyncio.sleep(0.3)
    ledger.stop(2.0)
    totals = ledger.totals()
    books = totals.charged_j + totals.unattributed_j + totals.in_flight_j
    row.conservation = abs(totals.measured_j - books) / abs(totals.measured_j) if totals.measured_j else 0.0
    if driver is not None:
        pairs = [(s, lag) for s, lag in zip(driver.stats.starts_ns, driver.stats.lags_ns, strict=True)
                 if t_start_ns <= s <= t_end_ns]
        starts = [s for s, _ in pairs]
        row.read_gaps_ms = _spread([(b - a) / 1e6 for a, b in itertools.pairwise(starts)])
        row.gil_lags_us = _spread([lag / 1000 for _, lag in pairs])
        fake_pynvml.uninstall()
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


#: The phase card: a request's prefill and decode watts, and the tokens per second of each.
PREFILL_W, DECODE_W = 120.0, 30.0
PROMPT_TPS, COMPLETION_TPS = 4000.0, 40.0


def mixed_phases(n: int, rng: random.Random, rounds: int = 3, spread_s: float = 1.5) -> list[Request]:
    """Continuous batching with a mix: half the requests long prompts with short answers
    (55-80% of their time in prefill), half short prompts with long answers (3-10%), each
    prefill at about four times its decode's watts, in overlapping rounds."""
    out = []
    for r in range(rounds):
        base = r * (spread_s + 2.0)
        for i in range(n):
            seconds = rng.uniform(0.4, 1.4)
            share = rng.uniform(0.55, 0.8) if i % 2 == 0 else rng.uniform(0.03, 0.1)
            prefill_s = seconds * share
            completion = round((seconds - prefill_s) * COMPLETION_TPS)
            out.append(Request(
                base + rng.uniform(0, spread_s), seconds, DECODE_W * rng.uniform(0.9, 1.1), completion,
                prefill_s=prefill_s, prefill_w=PREFILL_W * rng.uniform(0.9, 1.1),
                prompt=round(prefill_s * PROMPT_TPS), completion=completion,
            ))
    return out


def _unstreamed(requests: list[Request]) -> list[Request]:
    return [replace(r, streamed=False) for r in requests]


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
        Scenario(
            "foreign bursty 150 W, subtract, 150 ms gaps", spaced(40 // k, 0.3, 0.15, rng),
            foreign=Foreign(150.0, start=-1.0, on_s=0.4, off_s=0.6), subtract=True,
        ),
        Scenario("upstream metrics, our load only", spaced(20 // k, 0.3, 0.25, rng), upstream=True),
        *(
            Scenario(f"reader {fault} after 4 s", spaced(16, 0.3, 0.25, rng), fault=fault)
            for fault in ("raises", "hangs", "stops")
        ),
        # Issue 22, last so the scenarios before keep their requests and seeds.
        Scenario("saturated loop, isolated 300 ms, 100 ms counter",
                 isolated(24 // k, 0.3, random.Random(22)), saturate=True),
        # Issue 23: one mix of phased requests, charged by each split.
        *_phase_scenarios(mixed_phases(16 // k, random.Random(23))),
        # Another replica's requests on the upstream, back to back beside ours (a hostile
        # review: ours took the whole card, 2.0x).
        Scenario("upstream metrics, another replica back to back",
                 spaced(24 // k, 0.3, 0.02, random.Random(24)), upstream=True, replica=True),
        # A GPU under continuous batching draws less per request as the batch grows: the time
        # split's doubt reads that as the requests' spread (batch_card-2026-12-07b.md).
        Scenario("staggered batch of 16, card drawing batch^0.6",
                 batch(16, random.Random(16), 1.0, 320.0, rounds=3 // k or 1), law=0.6),
    ]


def _phase_scenarios(mix: list[Request]) -> list[Scenario]:
    return [
        Scenario("mixed phases, time split", mix),
        Scenario("mixed phases, token split", mix, split="tokens"),
        Scenario("mixed phases, phase split (first-event marks)", mix, split="phases"),
        Scenario("mixed phases, phase split (usage + upstream phase times, no marks)",
                 _unstreamed(mix), split="phases", phase_metrics=True),
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


COLS = [
    "with figure", "settled with figure", "first med", "first p90", "settled med", "settled p90",
    "in +-unc first", "in +-unc settled", "unc/J first", "unc/J settled",
    "first to settled p90", "settled in +-unc first", "charged/caused", "conservation", "contended",
    "reads/period",
]


def _cell(c: str, v: float | None) -> str:
    if c in ("charged/caused", "reads/period"):
        return fmt(v, pct=False)
    if c == "conservation":
        return "-" if v is None else f"{v:.1e}"
    return fmt(v)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | path | n | " + " | ".join(COLS) + " |",
        "|---|---|---:|" + "---:|" * len(COLS),
    ]
    for r in results:
        cells = r["cells"]
        lines.append(f"| {r['name']} | {r['path']} | {r['n']} | "
                     + " | ".join(_cell(c, cells[c]) for c in COLS) + " |")
    return "\n".join(lines)


def _three(values: list[float] | None, unit: str) -> str:
    return "-" if not values else " / ".join(f"{v:.0f}" if unit == "us" else f"{v:.1f}" for v in values)


def runs_table(results: list[dict[str, Any]]) -> str:
    """One line per run of the saturated scenario: did every window get a figure, and did
    the reader keep up (readings a period, time between driver reads, GIL back after each)."""
    lines = [
        "| run | path | with figure, first / settled | charged/caused | first p90 | first unc/J "
        f"| first unc/J after {WARM} "
        "| reads/period | ms between driver reads p50 / p90 / max "
        "| us until the GIL was back p50 / p90 / max | reader blocks a read | reader CPU % |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in results:
        c = r["cells"]
        lines.append(
            f"| {r['run']} | {r['path']} | {fmt(c['with figure'])} / {fmt(c['settled with figure'])} "
            f"| {fmt(c['charged/caused'], pct=False)} | {fmt(c['first p90'])} | {fmt(c['unc/J first'])} "
            f"| {fmt(c['unc/J first, warm'])} | {fmt(c['reads/period'], pct=False)} "
            f"| {_three(r['read_gaps_ms'], 'ms')} "
            f"| {_three(r['gil_lags_us'], 'us')} | {r['reader_blocks'] / max(r['reads'], 1):.1f} "
            f"| {100 * r['reader_cpu_s'] / r['wall_s']:.1f} |")
    return "\n".join(lines)


def phases_table(results: list[dict[str, Any]]) -> str:
    """The mixed-phase scenarios side by side: one mix, charged by each split."""
    lines = [
        "| split | path | n | settled med | settled p90 | first med | first p90 | in +-unc first "
        "| in +-unc settled | unc/J settled | charged/caused |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r["cells"]
        lines.append(
            f"| {r['name'].removeprefix('mixed phases, ')} | {r['path']} | {r['n']} "
            f"| {fmt(c['settled med'])} | {fmt(c['settled p90'])} | {fmt(c['first med'])} "
            f"| {fmt(c['first p90'])} | {fmt(c['in +-unc first'])} | {fmt(c['in +-unc settled'])} "
            f"| {fmt(c['unc/J settled'])} | {fmt(c['charged/caused'], pct=False)} |")
    return "\n".join(lines)


def child(index: int, path: str, seed: int, quick: bool, run_no: int,
          pace: str | None = None) -> dict[str, Any]:
    """One scenario on one path (and pace), in this (fresh) process: what the parent tabulates."""
    scenario = scenarios(quick)[index]
    if pace == "main":
        pass  # the tree's own poller, as it is
    elif pace is not None:
        import giul_asgi.ledger.poller

        if pace == "steps-only":  # the steps' pace, the GIL's switch interval left alone
            os.environ["GIUL_ASGI_SWITCH_INTERVAL"] = "off"
        giul_asgi.ledger.poller.PACE = pace.removesuffix("-only")  # type: ignore[attr-defined]
    row = asyncio.run(run(scenario, seed=seed, path=path))
    return {
        "index": index, "name": scenario.name, "path": path if pace is None else f"{path} {pace}",
        "seed": seed, "run": run_no,
        "n": len(row.outcomes), "cells": row.cells(), "faults": row.measured_while_failing(),
        "contended_count": row.contended_count(), "fault": scenario.fault,
        "upstream": scenario.upstream and not scenario.replica,
        "saturate": scenario.saturate, "wall_s": row.wall_s,
        "read_gaps_ms": row.read_gaps_ms, "gil_lags_us": row.gil_lags_us,
        "reader_cpu_s": row.reader_cpu_s, "reader_blocks": row.reader_blocks, "reads": row.reads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help="run scenarios whose name contains this")
    parser.add_argument("--path", default=",".join(READ_PATHS), help="nvml, truecard or both (comma)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each chosen scenario (new seeds)")
    parser.add_argument("--child", nargs=4, type=int, metavar=("INDEX", "PATH", "SEED", "RUN"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--pace", help="uniform, steps, steps-only, main (comma): the reader's busy pace")
    parser.add_argument("--main-root", help="the tree whose giul_asgi the children of --pace main import")
    parser.add_argument("--child-path", help=argparse.SUPPRESS)
    parser.add_argument("--child-pace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        index, _, seed, run_no = args.child
        print(json.dumps(child(index, args.child_path, seed, args.quick, run_no, args.child_pace)))
        return
    paces: list[str | None] = [p for p in args.pace.split(",") if p] if args.pace else [None]
    paths = [p for p in args.path.split(",") if p]
    load_start = os.getloadavg()
    results: list[dict[str, Any]] = []
    for run_no in range(1, args.runs + 1):
        for i, scenario in enumerate(scenarios(args.quick)):
            if args.only and args.only not in scenario.name:
                continue
            for path, pace in itertools.product(paths, paces):  # interleaved, scenario by scenario
                seed = i + 1000 * (run_no - 1)
                root = str(Path(__file__).resolve().parent.parent)
                if pace == "main":
                    if not args.main_root:
                        parser.error("--pace main needs --main-root")
                    root = args.main_root
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(i), "0", str(seed), str(run_no),
                     "--child-path", path, *(["--child-pace", pace] if pace else []),
                     *(["--quick"] if args.quick else [])],
                    capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": root},
                )
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
                done = results[-1]
                print(f"  run {run_no} {scenario.name} [{done['path']}]: {done['wall_s']:.1f} s",
                      file=sys.stderr)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# attribution.py, {stamp}, {platform.node()} ({os.cpu_count()} CPUs (nproc), "
          f"Python {platform.python_version()}){' --quick' if args.quick else ''}\n")
    print(f"    python benchmarks/attribution.py {shlex.join(sys.argv[1:])}".rstrip() + "\n")
    print("Load average at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f} (1, 5, 15 min)\n".format(
        *load_start, *os.getloadavg()))
    print(table(results))
    saturated = [r for r in results if r["saturate"]]
    if saturated:
        print(f"\nThe saturated loop, run by run ({SLICE_S * 1000:g} ms slices of Python with "
              "`await asyncio.sleep(0)` between; the uniform pace, main's, asks for 10 readings a "
              "period, the steps' pace about 3; the "
              "reader's blocks are its voluntary switches, /proc/self/task/TID/status: every sleep, "
              "wait for the GIL or a lock):\n")
        print(runs_table(saturated))
    phased = [r for r in results if r["name"].startswith("mixed phases")]
    if phased:
        print(f"\nOne mix of phased requests (prefill at ~{PREFILL_W:g} W, decode at ~{DECODE_W:g} W "
              "above idle; half long prompts with short answers, half the reverse), charged by "
              "each split:\n")
        print(phases_table(phased))
    print()
    print(targets(results))


#: Scenarios whose first figures are held to issue 22's >= 300 ms target: not those whose
#: error is the design's (a foreign load charged on purpose, the time split of unequal rates,
#: the time and token splits of unequal phases: their figures are the split's convention, tens
#: of percent from what each request caused, and since the split says its own doubt their
#: uncertainty covers that, 100% inside at a width near the figure's own in
#: results/attribution-2026-12-06b-time-doubt.md, so the target's p90 and width cannot hold),
#: nor a failing reader's (estimated by design).
def _held(r: dict[str, Any]) -> bool:
    name = r["name"]
    wrong_by_design = "time split" in name or (name.startswith("mixed phases") and "phase split" not in name)
    return not (name.startswith("isolated 30 ms") or name.startswith("isolated 100 ms")
                or "charged" in name or wrong_by_design or r["fault"])


def targets(results: list[dict[str, Any]]) -> str:
    """The issues' targets, with what this run measured beside them."""

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    lines = [
        "| what | target | path | this run |",
        "|---|---|---|---|",
    ]
    for path in sorted({r["path"] for r in results}):
        mine = [r for r in results if r["path"] == path]
        saturated = [r for r in mine if r["saturate"]]
        if saturated:
            figured = [min(r["cells"]["with figure"] or 0.0, r["cells"]["settled with figure"] or 0.0)
                       for r in saturated]
            ratio = [r["cells"]["charged/caused"] or 0.0 for r in saturated]
            good = sum(1 for f, c in zip(figured, ratio, strict=True) if f >= 1.0 and 0.9 <= c <= 1.1)
            lines.append(f"| saturated loop: windows with a figure, charged/caused | 100%, 0.9-1.1, ten runs "
                         f"in ten | {path} | {share(min(figured))}-{share(max(figured))}, {min(ratio):.2f}-"
                         f"{max(ratio):.2f}; {good} of {len(saturated)} runs meet both |")
        held = [r for r in mine if _held(r)]
        if held:
            worst_p90 = max(held, key=lambda r: r["cells"]["first p90"] or 0.0)
            worst_w = max(held, key=lambda r: r["cells"]["unc/J first"] or 0.0)
            worst_in = min(held, key=lambda r: r["cells"]["in +-unc first"] or 0.0)
            lines.append(
                f"| first figures at >= 300 ms, every scenario incl. a saturated loop | p90 <= 15%, median "
                f"width <= 20%, >= 90% inside | {path} | worst p90 {share(worst_p90['cells']['first p90'])} "
                f"({worst_p90['name']}), worst width {share(worst_w['cells']['unc/J first'])} "
                f"({worst_w['name']}), least inside {share(worst_in['cells']['in +-unc first'])} "
                f"({worst_in['name']}) |")
        if held:  # the same figures against their own settled ones: the split's convention apart
            worst_to = max(held, key=lambda r: r["cells"]["first to settled p90"] or 0.0)
            worst_cov = min(held, key=lambda r: r["cells"]["settled in +-unc first"] or 0.0)
            lines.append(
                f"| (the same, against their own settled figure) | p90 <= 15%, >= 90% inside | {path} | "
                f"worst p90 {share(worst_to['cells']['first to settled p90'])} ({worst_to['name']}), "
                f"least inside {share(worst_cov['cells']['settled in +-unc first'])} ({worst_cov['name']}) |")
        short = [r for r in mine if r["name"].startswith("isolated 30 ms")]
        for r in short:
            lines.append(f"| first figures at 30 ms | p90 <= 30%, width <= 60% | {path} | "
                         f"p90 {share(r['cells']['first p90'])}, width {share(r['cells']['unc/J first'])} |")
        figured_all = [min(r["cells"]["with figure"] or 0.0, r["cells"]["settled with figure"] or 0.0)
                       for r in mine]
        lines.append(f"| windows with a figure (first and settled), no warm-up, every scenario | 100% "
                     f"| {path} | {share(min(figured_all))} (lowest scenario) |")
        faults = [(r["fault"], r["faults"]) for r in mine if r["fault"]]
        if faults:
            lines.append("| first figures saying `measured` while the reader fails | 0 | " + path + " | "
                         + ", ".join(f"{f} {m} of {n}" for f, (m, n) in faults) + " |")
        foreign = [r for r in mine if "ms gaps" in r["name"] and "subtract" in r["name"]]
        for r in foreign:
            lines.append(f"| {r['name']}: truth inside +- uncertainty, first / settled "
                         f"| >= 90% / >= 90% | {path} | {share(r['cells']['in +-unc first'])} / "
                         f"{share(r['cells']['in +-unc settled'])} |")
        upstream = [r["contended_count"] for r in mine if r["upstream"]]
        if upstream:
            lines.append("| false `contended` with upstream metrics | 0 | " + path + " | "
                         + ", ".join(f"{c} of {n}" for c, n in upstream) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
