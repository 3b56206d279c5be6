"""Another gateway replica on the same upstream: is ours charged its own part, inside its doubt?

Two replicas send requests (0.2-0.5 s at 180 W) to one inference server on one card; this
process sees only its own windows, and the server's running requests through its /metrics. The
server counts a request from 3 ms after its window opens to 3 ms before it closes; it is scraped
every 0.25 s at a phase of its own, the count taken somewhere in the scrape's 4 ms and the ledger
told at its end. A virtual clock and the truth card (benchmarks/truecard.py) with the ledger read
every ~10 ms, so the truth of each request is the card's own, not what the ledger assumes.

The server's count (``--counts``): ``lag:L`` is its count as it stood L seconds before (0: in the
step itself); ``hold:P`` is updated every P seconds; ``sglang:P`` every P seconds while it runs
requests and as each one starts, never while idle (a count logged every few decode steps).

    python benchmarks/upstream_replicas.py                # this tree, 8 seeds a shape, lag:0
    python benchmarks/upstream_replicas.py --tree DIR     # another tree (a copy of an older commit)
    python benchmarks/upstream_replicas.py --counts lag:0,lag:0.05,lag:0.1,lag:0.2,hold:0.2,sglang:0.4

Prints, per count, foreign mode and shape: settled / truth (median, p10, p90), the share of first
and settled figures inside +- their uncertainty, of settled figures said ``contended``, and the
median settled width.
"""

from __future__ import annotations

import argparse
import inspect
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

LONG, SHORT = (0.2, 0.5), (0.03, 0.1)  # our requests' lengths (theirs are LONG)
SHAPES = (  # name, our gap, theirs, another replica at all, our lengths
    ("ours back to back, theirs back to back", 0.02, 0.02, True, LONG),
    ("ours 0.4 s apart, theirs back to back", 0.4, 0.02, True, LONG),
    ("ours back to back, theirs 0.4 s apart", 0.02, 0.4, True, LONG),
    ("ours 30-100 ms, 5 ms apart, theirs back to back", 0.005, 0.02, True, SHORT),
    ("ours back to back, no other replica", 0.02, 0.02, False, LONG),
    ("ours 0.4 s apart, no other replica", 0.4, 0.4, False, LONG),
    ("ours 30-100 ms, 5 ms apart, no other replica", 0.005, 0.02, False, SHORT),
)


def counter(kind: str, engine: list[tuple[float, float]], start: float, rng: random.Random
            ) -> Callable[[float], int]:
    """The server's count at ``x`` as ``kind`` says it keeps it (the module's docstring)."""

    def running(x: float) -> int:
        return sum(1 for a, b in engine if a <= x <= b)

    how, _, value = kind.partition(":")
    every = float(value or 0)
    if how == "lag":
        return lambda x: running(x - every)
    phase = start + rng.uniform(0.0, every)
    if how == "hold":
        return lambda x: running(phase + math.floor((x - phase) / every) * every)
    if how == "sglang":
        end = max(b for _, b in engine)
        ticks = [phase + k * every for k in range(int((end - start) / every) + 2)]
        updates = sorted({a for a, _ in engine} | {u for u in ticks if running(u) > 0})
        return lambda x: running(max((u for u in updates if u <= x), default=start))
    raise SystemExit(f"--counts: {kind!r} is not lag:L, hold:P or sglang:P")


def one(seed: int, ours_gap: float, theirs_gap: float, foreign: str, theirs: bool, count: str = "lag:0",
        ours_s: tuple[float, float] = LONG, scrape_s: float = 0.004, proxy_s: float = 0.003,
        every_s: float = 0.25) -> list[tuple[Any, ...]]:
    from test_ledger import IDLE, Run

    from giul_asgi.config import Node
    from giul_asgi.ledger import Ledger
    from giul_asgi.meter import Meter

    spread = "spread_s" in inspect.signature(Ledger.note_upstream).parameters  # older trees: none
    run = Run(Node("n", idle_w=IDLE, foreign=foreign, upstream="http://127.0.0.1:9/metrics"), seed=seed)
    rng = random.Random(seed * 7 + 1)
    run.advance(0.5)
    start = run.clock.now
    events: list[tuple[float, str, int]] = []
    engine: list[tuple[float, float]] = []  # when the server runs each request
    n = round(9.8 / sum(ours_s))  # about 5 s of ours
    plan = (("ours", ours_gap, n, ours_s), ("theirs", theirs_gap, 140 if theirs else 0, LONG))
    for who, gap, many, lengths in plan:
        t = start + rng.uniform(0.0, 0.3)
        for i in range(many):
            seconds = rng.uniform(*lengths)
            events += [(t, f"{who} open", i), (t + seconds, f"{who} close", i)]
            engine.append((t + proxy_s, t + seconds - proxy_s))
            t += seconds + gap * rng.uniform(0.5, 1.5)
    end = max(t for t, kind, _ in events if kind == "ours close")
    gauge = counter(count, engine, start, rng)
    t = start + rng.uniform(0.0, every_s)
    while t < end:
        events.append((t + scrape_s, "scrape", 0))  # told as it ends
        t += every_s
    events.sort()
    live: dict[tuple[str, int], tuple[Any, Any]] = {}
    done: list[tuple[Any, Any, Any]] = []
    for t, kind, i in events:
        if t > end:
            break
        run.advance(t - run.clock.now)
        who, _, what = kind.partition(" ")
        if kind == "scrape":
            middle = t - scrape_s / 2
            running = float(gauge(middle + rng.uniform(-scrape_s / 2, scrape_s / 2)))
            if spread:
                run.ledger.note_upstream(middle, running, spread_s=scrape_s / 2)
            else:
                run.ledger.note_upstream(middle, running)
        elif what == "open":
            meter = Meter(run.ledger).open() if who == "ours" else None
            live[who, i] = (meter, run.card.start_job(180.0))
        else:
            meter, job = live.pop((who, i))
            run.card.stop_job(job)
            if meter is not None:
                meter.close()
                done.append((meter, job, meter.figure()))
    run.advance(2.0)
    rows = []
    for meter, job, first in done[2:]:  # the first two: before the server's count is known
        truth = job.truth(run.card.ramp_up, run.card.tau)
        settled = meter.figure()
        first_in = first.joules is not None and abs(first.joules - truth) <= (first.uncertainty_joules or 0.0)
        rows.append((settled.joules / truth, first_in,
                     abs(settled.joules - truth) <= settled.uncertainty_joules,
                     settled.uncertainty_joules / truth, bool(settled.contended)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--counts", default="lag:0", help="the server's counts to try, comma-separated")
    parser.add_argument("--foreign", default="charge,subtract", help="the node's foreign modes")
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path[:0] = [str(tree), str(tree / "tests"), str(ROOT / "benchmarks")]
    import giul_asgi

    assert Path(giul_asgi.__file__).resolve().is_relative_to(tree), giul_asgi.__file__
    print(f"tree {tree}\n")
    print("| count | foreign | shape | n | settled/truth med [p10, p90] | inside first | inside settled "
          "| contended | settled width med |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|")
    for count in args.counts.split(","):
        for foreign in args.foreign.split(","):
            for name, ours_apart, theirs_apart, theirs, lengths in SHAPES:
                rows = [r for seed in range(args.seeds)
                        for r in one(seed, ours_apart, theirs_apart, foreign, theirs, count, lengths)]
                table_row(count, foreign, name, rows)


def table_row(count: str, foreign: str, name: str, rows: list[tuple[Any, ...]]) -> None:
    ratio = sorted(r[0] for r in rows)
    width = sorted(r[3] for r in rows)
    k = len(rows)
    spread = f"{ratio[k // 2]:.2f} [{ratio[k // 10]:.2f}, {ratio[-(k // 10)]:.2f}]"
    inside_first, inside, contended = (100 * sum(r[i] for r in rows) / k for i in (1, 2, 4))
    print(f"| {count} | {foreign} | {name} | {k} | {spread} | {inside_first:.0f}% | {inside:.0f}% "
          f"| {contended:.0f}% | {100 * width[k // 2]:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
