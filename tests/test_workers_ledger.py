"""Four real worker processes on one card charge its energy once, not four times."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import workers_card


def run_workers(directory: Path | None) -> tuple[float, float, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Value("d", 0.0)
    where = str(directory) if directory else None
    procs = [
        ctx.Process(target=workers_card.run, args=(i, where, start, 4, 4, out)) for i in range(4)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # every worker has imported everything: the schedule starts together
        assert out.get(timeout=60)[0] == "ready"
    start.value = time.monotonic() + 0.5  # time for each poller to see the counter step
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    charged = sum(r[1] for r in results)
    return charged, caused_by_schedule(), max(r[2] for r in results)


def caused_by_schedule() -> float:
    """The truth, from the same schedule, in closed form."""
    from truecard import Job, TrueCard

    card = TrueCard()
    total = 0.0
    for _, offset, seconds, watts in workers_card.schedule(4, 4):
        job = Job(watts, offset, offset + seconds)
        total += job.truth(card.ramp_up, card.tau)
    return total


def test_four_workers_on_one_card_charge_it_once(tmp_path: Path) -> None:
    charged, caused, _ = run_workers(tmp_path)
    assert abs(charged / caused - 1.0) < 0.1, (charged, caused)


def test_without_the_shared_table_each_worker_charges_what_it_saw() -> None:
    charged, caused, _ = run_workers(None)
    assert charged / caused > 1.5  # the defect the table fixes: every worker took the card
