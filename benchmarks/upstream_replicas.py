"""Another gateway replica on the same upstream: is ours charged its own part, inside its doubt?

Two replicas send requests (0.2-0.5 s at 180 W) to one inference server on one card; this
process sees only its own windows, and the server's running requests through its /metrics. The
server counts a request from 3 ms after its window opens to 3 ms before it closes; it is scraped
every 0.25 s at a phase of its own, the count taken somewhere in the scrape's 4 ms. A virtual
clock and the truth card (benchmarks/truecard.py) with the ledger read every ~10 ms, so the
truth of each request is the card's own, not what the ledger assumes.

    python benchmarks/upstream_replicas.py                # this tree, 8 seeds a shape
    python benchmarks/upstream_replicas.py --tree DIR     # another tree (a copy of an older commit)

Prints, per foreign mode and shape: settled / truth (median, p10, p90), the share of first and
settled figures inside +- their uncertainty, and the median settled width.
"""

from __future__ import annotations

import argparse
import inspect
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SHAPES = (  # name, our gap, theirs, another replica at all
    ("ours back to back, theirs back to back", 0.02, 0.02, True),
    ("ours 0.4 s apart, theirs back to back", 0.4, 0.02, True),
    ("ours back to back, theirs 0.4 s apart", 0.02, 0.4, True),
    ("ours back to back, no other replica", 0.02, 0.02, False),
)


def one(seed: int, ours_gap: float, theirs_gap: float, foreign: str, theirs: bool, n: int = 14,
        scrape_s: float = 0.004, proxy_s: float = 0.003, every_s: float = 0.25) -> list[tuple[float, ...]]:
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
    for who, gap, count in (("ours", ours_gap, n), ("theirs", theirs_gap, 10 * n if theirs else 0)):
        t = start + rng.uniform(0.0, 0.3)
        for i in range(count):
            seconds = rng.uniform(0.2, 0.5)
            events += [(t, f"{who} open", i), (t + seconds, f"{who} close", i)]
            engine.append((t + proxy_s, t + seconds - proxy_s))
            t += seconds + gap * rng.uniform(0.5, 1.5)
    end = max(t for t, kind, _ in events if kind == "ours close")
    t = start + rng.uniform(0.0, every_s)
    while t < end:
        events.append((t, "scrape", 0))
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
            taken = t + rng.uniform(-scrape_s / 2, scrape_s / 2)
            running = float(sum(1 for a, b in engine if a <= taken <= b))
            if spread:
                run.ledger.note_upstream(t, running, spread_s=scrape_s / 2)
            else:
                run.ledger.note_upstream(t, running)
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
        rows.append((settled.joules / truth, abs(first.joules - truth) <= first.uncertainty_joules,
                     abs(settled.joules - truth) <= settled.uncertainty_joules,
                     settled.uncertainty_joules / truth))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path[:0] = [str(tree), str(tree / "tests"), str(ROOT / "benchmarks")]
    import giul_asgi

    assert Path(giul_asgi.__file__).resolve().is_relative_to(tree), giul_asgi.__file__
    print(f"tree {tree}\n")
    print("| foreign | shape | n | settled/truth med [p10, p90] | inside first | inside settled "
          "| settled width med |")
    print("|---|---|---:|---|---:|---:|---:|")
    for foreign in ("charge", "subtract"):
        for name, ours_gap, theirs_gap, theirs in SHAPES:
            rows = [r for s in range(args.seeds) for r in one(s, ours_gap, theirs_gap, foreign, theirs)]
            ratio = sorted(r[0] for r in rows)
            width = sorted(r[3] for r in rows)
            k = len(rows)
            spread = f"{ratio[k // 2]:.2f} [{ratio[k // 10]:.2f}, {ratio[-(k // 10)]:.2f}]"
            print(f"| {foreign} | {name} | {k} | {spread} "
                  f"| {100 * sum(r[1] for r in rows) / k:.0f}% | {100 * sum(r[2] for r in rows) / k:.0f}% "
                  f"| {100 * width[k // 2]:.0f}% |")


if __name__ == "__main__":
    main()
