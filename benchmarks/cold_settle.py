"""How a fresh process settles the windows its card did not read from their start.

A window that opens and closes before the ledger's tape has its first span (no warm-up, or
no ASGI lifespan, so the first request starts the reader; a cold burst while the driver
initialises) has time no reading covers. What it settles at is filled from something else;
this benchmark says how well, on a virtual clock (each shape exact and repeatable), against
the truth card's own closed form (benchmarks/truecard.py: ramp-up, exponential ramp-down
tail, integer-mJ counter steps with jitter, a part-time instant gauge), never the ledger's.

Shapes (8 seeds each; each seed a fresh ledger whose first request is the cold one, then the
card's first readings, then warm requests that teach the node):

- ``counter 100 ms, 100 ms job``: the commit that found it (attribution.py's isolated 100 ms);
- ``instant gauge, idle 1 s after``: a gauge whose next request's first span still reads idle;
- ``counter 20 ms, job 30 ms late``: the upstream starts each job after the window opens;
- ``counter 20 ms, 5 ms job``: a short job whose ramp-down tail is most of its energy;
- ``20 x 20 ms burst, instant gauge``: a cold burst read only as its own tail falls;
- ``another's 50 W beside, 100 ms job``: a steady load of another's on the card all along,
  charged with it (``foreign="charge"``): the card's first readings show only that load.

Per shape: the cold windows' settled figure against their truth (median ratio, inside their
uncertainty, methods); and, for 5,000 windows waiting at once with nothing to learn from,
the reader's CPU a second while they wait.

    python benchmarks/cold_settle.py               # this tree
    python benchmarks/cold_settle.py --tree DIR    # another tree (git archive REV | tar -x -C DIR)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("GIUL_ASGI_LOAD_DIR", tempfile.mkdtemp(prefix="cold-settle-"))

IDLE = 70.0
SEEDS = 8


@dataclass
class Rig:
    """A ledger read by hand on a virtual clock: reads every ~10 ms while ``advance`` runs."""

    gauge: str
    seed: int
    period: float = 0.1
    steady_w: float = 0.0
    api: Any = None
    card: Any = None
    reader: Any = None
    ledger: Any = None
    now: list[float] = field(default_factory=lambda: [1000.0])

    def __post_init__(self) -> None:
        import random

        from truecard import TrueCard, TrueReader

        from giul_asgi.config import Node
        from giul_asgi.ledger import Ledger

        self.card = TrueCard(idle_w=IDLE, period=self.period, clock=lambda: self.now[0], seed=self.seed)
        if self.steady_w:
            self.card.start_job(self.steady_w)
        self.reader = TrueReader(self.card, self.gauge)  # type: ignore[arg-type]
        self.ledger = Ledger(Node("cold", idle_w=IDLE), self.reader, poll=False)
        self.rng = random.Random(self.seed)

    def advance(self, seconds: float) -> None:
        end = self.now[0] + seconds
        while self.now[0] < end:
            self.now[0] = min(end, self.now[0] + 0.01 * self.rng.uniform(0.5, 1.5))
            self.ledger.ingest(self.reader.read())

    def window(self, seconds: float, watts: float, *, lag: float = 0.0, read: bool = True) -> tuple[Any, Any]:
        """A request: its window, and the card's job for it from ``lag`` after it opened
        (read: the card is read meanwhile; else the clock moves with nobody reading)."""
        from giul_asgi.meter import Meter

        meter = Meter(self.ledger)
        meter.open()
        move: Callable[[float], None] = self.advance if read else self._skip
        move(lag)
        job = self.card.start_job(watts) if watts > 0 else None
        move(seconds - lag)
        if job is not None:
            self.card.stop_job(job)
        meter.close()
        return meter, job

    def _skip(self, seconds: float) -> None:
        self.now[0] += seconds

    def truth(self, job: Any, seconds: float) -> float:
        """What the window caused, and (foreign="charge") the steady load beside it that a
        window alone on the card is charged."""
        own = 0.0 if job is None else float(job.truth(self.card.ramp_up, self.card.tau))
        return own + self.steady_w * seconds


@dataclass
class Shape:
    name: str
    gauge: str
    period: float
    cold: list[tuple[float, float, float]]  # (seconds, watts, lag) of each cold window
    idle_after: float = 0.3
    warm: tuple[float, float, float] = (0.3, 200.0, 0.0)
    steady_w: float = 0.0


SHAPES = [
    Shape("counter 100 ms, 100 ms job", "counter", 0.1, [(0.1, 200.0, 0.0)]),
    Shape("instant gauge, idle 1 s after", "instant", 0.1, [(0.1, 200.0, 0.0)], idle_after=1.0,
          warm=(0.1, 200.0, 0.0)),
    Shape("counter 20 ms, job 30 ms late", "counter", 0.02, [(0.1, 200.0, 0.03)],
          warm=(0.1, 200.0, 0.03)),
    Shape("counter 20 ms, 5 ms job", "counter", 0.02, [(0.005, 200.0, 0.0)]),
    Shape("20 x 20 ms burst, instant gauge", "instant", 0.1, [(0.02, 150.0, 0.0)] * 20,
          warm=(0.2, 200.0, 0.0)),
    Shape("another's 50 W beside, 100 ms job", "counter", 0.1, [(0.1, 200.0, 0.0)], steady_w=50.0),
]


def run_shape(shape: Shape) -> dict[str, Any]:
    ratios: list[float] = []
    inside = total = 0
    methods: Counter[str] = Counter()
    for seed in range(SEEDS):
        rig = Rig(shape.gauge, seed, shape.period, shape.steady_w)
        colds = []
        for seconds, watts, lag in shape.cold:
            meter, job = rig.window(seconds, watts, lag=lag, read=False)
            colds.append((meter, rig.truth(job, seconds)))
        rig.advance(shape.idle_after)
        seconds, watts, lag = shape.warm
        for _ in range(10 if seconds else 0):
            rig.window(seconds, watts, lag=lag)
            rig.advance(0.2)
        end = rig.now[0] + 12.0
        while rig.now[0] < end and not all(m.settled_now for m, _ in colds):
            rig.advance(0.05)
        for meter, truth in colds:
            e = meter.figure()
            total += 1
            methods[e.method] += 1
            if e.joules is not None:
                ratios.append(e.joules / truth)
                inside += e.uncertainty_joules is not None and abs(e.joules - truth) <= e.uncertainty_joules
    return {"shape": shape.name, "n": total, "ratio": statistics.median(ratios) if ratios else None,
            "lo": min(ratios) if ratios else None, "hi": max(ratios) if ratios else None,
            "inside": inside, "methods": dict(methods)}


def waiting_cost(n: int = 5000) -> float:
    """The reader's CPU (ms a second of readings) while ``n`` windows closed before the first
    reading wait with nothing to learn from (the card idle after them)."""
    rig = Rig("instant", 1)
    for _ in range(n):
        rig.window(0.002, 0.0, read=False)
        rig.now[0] -= 0.002 - 0.3 / n  # overlapping, 0.3 s in all
    rig.now[0] += 0.3
    cpu = time.thread_time()
    rig.advance(5.0)
    return (time.thread_time() - cpu) / 5.0 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", help="a tree whose giul_asgi to measure instead of this one")
    args = parser.parse_args()
    tree = Path(args.tree).resolve() if args.tree else HERE.parent
    sys.path.insert(0, str(tree))
    import giul_asgi

    assert Path(giul_asgi.__file__).resolve().is_relative_to(tree), giul_asgi.__file__

    print(f"# cold_settle: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"Python {platform.python_version()}, giul_asgi from {Path(giul_asgi.__file__).parent}")
    print()
    print(f"{SEEDS} seeds a shape, virtual clock; settled cold windows against their truth.")
    print()
    print("| shape | cold windows | settled/truth median [min, max] | inside +-unc | methods |")
    print("|---|---:|---|---:|---|")
    for shape in SHAPES:
        r = run_shape(shape)
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]"
        methods = ", ".join(f"{k} {v}" for k, v in sorted(r["methods"].items()))
        print(f"| {r['shape']} | {r['n']} | {ratio} | {r['inside']} of {r['n']} | {methods} |")
    print()
    print(f"5,000 windows waiting at once, nothing to learn from: the reader {waiting_cost():.0f} ms "
          "of CPU a second of readings (every ~10 ms).")


if __name__ == "__main__":
    main()
