"""A worker process of a gateway on a card it shares with three others (for test_workers_ledger).

Every worker knows the whole schedule, so each one's true card shows everybody's load, as a
real card would; each meters only its own requests, as a real worker does.
"""

from __future__ import annotations

import random
import time
from typing import Any

from truecard import Job, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter

IDLE = 70.0


def schedule(workers: int, per_worker: int, seed: int = 11) -> list[tuple[int, float, float, float]]:
    rng = random.Random(seed)
    return [
        (w, rng.uniform(0.3, 2.3), rng.uniform(0.2, 0.6), rng.uniform(60.0, 120.0))
        for w in range(workers) for _ in range(per_worker)
    ]


def run(index: int, directory: str | None, start: Any, workers: int, per_worker: int, out: Any) -> None:
    """``start`` is a shared value the parent sets once every worker is reading."""
    plan = schedule(workers, per_worker)
    card = TrueCard(idle_w=IDLE, seed=5)
    out.put(("ready", index))
    while start.value == 0.0:
        time.sleep(0.005)
    t_start = start.value
    card.t0 = t_start
    card._phase = 0.041  # every process's card steps at the same times
    for _, offset, seconds, watts in plan:
        card.jobs.append(Job(watts, t_start + offset, t_start + offset + seconds))
    ledger = Ledger(Node("shared-card", idle_w=IDLE, workers_dir=directory), TrueReader(card))
    ledger.ensure_started()
    while ledger.totals().reads < 5 and time.monotonic() < t_start:
        time.sleep(0.005)
    mine = sorted((o, s) for w, o, s, _ in plan if w == index)
    meters = []
    for offset, seconds in mine:
        time.sleep(max(0.0, t_start + offset - time.monotonic()))
        meter = Meter(ledger)
        meter.open()
        time.sleep(max(0.0, t_start + offset + seconds - time.monotonic()))
        meter.close()
        meters.append(meter)
    deadline = time.monotonic() + 3.0
    while not all(m.settled_now for m in meters) and time.monotonic() < deadline:
        time.sleep(0.05)
    charged = sum(m.figure().joules or 0.0 for m in meters)
    ledger.stop(1.0)
    out.put((index, charged, ledger.totals().measured_j))
