"""What the split's doubt costs the reader a member of a span, beside an earlier commit's.

A busy gateway's card step (about every 100-300 ms on NVML) shares its span among hundreds
to thousands of short windows, and :class:`~giul_asgi.ledger.doubt.RateDoubt` learns from
each span over its members (their seconds in stretches of spans, closed members' ramp-down
tails, contrasts of consecutive stretches). This feeds the same spans, each of ``--members``
windows of 150 us closing inside it (a JSON request's shape) plus a few of the span
before's, to this checkout's doubt and to ``--before DIR``'s (an earlier commit's
``giul_asgi``, ``git archive``'d there), interleaved, and prints the median microseconds a
member a span of each, and the spread each learnt (the same: the arithmetic changes, not
the figures).

    python benchmarks/doubt_cost.py --before DIR [--members 1600] [--repeats 9]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import random
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from _apps import BEFORE, prepare_before

from giul_asgi.spans import CardSpan

SPANS = 40


class _Window:
    __slots__ = ("__weakref__", "t_close", "t_open")

    def __init__(self, t_open: float, t_close: float) -> None:
        self.t_open, self.t_close = t_open, t_close


def spans(members: int, seed: int = 1) -> list[tuple[CardSpan, list[tuple[Any, float]]]]:
    rng = random.Random(seed)
    out: list[tuple[CardSpan, list[tuple[Any, float]]]] = []
    t = 0.0
    before: list[_Window] = []
    for _ in range(SPANS):
        t1 = t + rng.uniform(0.1, 0.3)
        windows = []
        for _ in range(members):
            t_open = rng.uniform(t, t1)
            windows.append(_Window(t_open, min(t1, t_open + 150e-6)))
        inside = [(w, w.t_close - w.t_open) for w in windows] + [(w, 1e-4) for w in before[:20]]
        above = rng.uniform(40, 60)
        span = CardSpan(t0=t, t1=t1, above_j=above, total_j=above + 70 * (t1 - t), stamp_s=0.001,
                        unc_j=1.0, measured_j=above, tails=False, covered=sum(o for _, o in inside),
                        members=len(inside), unseen=0.0, foreign_j=0.0, quiet=False, doubt_w=0.0,
                        foreign_unc_w=0.0, unwatched=False)
        out.append((span, inside))
        before, t = windows, t1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="DIR", required=True)
    parser.add_argument("--members", type=int, default=1600)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    prepare_before(args.before)
    arms = {"before": importlib.import_module(f"{BEFORE}.ledger.doubt"),
            "this checkout": importlib.import_module("giul_asgi.ledger.doubt")}
    data = spans(args.members)
    n = sum(len(members) for _, members in data)
    times: dict[str, list[float]] = {name: [] for name in arms}
    learnt: dict[str, float] = {}
    for r in range(args.repeats):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            doubt = arms[name].RateDoubt(0.1)
            t0 = time.perf_counter()
            for span, members in data:
                doubt.units(span, members, None, span.above_j)
            times[name].append((time.perf_counter() - t0) / n)
            learnt[name] = doubt.quantile()
    print(f"# doubt_cost: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"Python {platform.python_version()}\n")
    print(f"{SPANS} spans of {args.members} members, {args.repeats} interleaved repeats\n")
    print("| arm | us a member a span (median) | repeats | spread learnt (90% quantile) |")
    print("|---|---:|---|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values) * 1e6:.3f} | "
              f"{' '.join(f'{v * 1e6:.2f}' for v in values)} | {learnt[name]:.6f} |")


if __name__ == "__main__":
    main()
