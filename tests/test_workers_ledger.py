"""Four real worker processes on one card charge its energy once, not four times, with no setting."""

from __future__ import annotations

import multiprocessing
import time
import uuid

import workers_card


def run_workers(setting: str | bool | None) -> tuple[float, float, list[tuple[float, int]]]:
    """Four workers under ``setting`` (None: nothing set, the default); returns what they
    charged, what the schedule caused, and each one's view of the host's books."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Value("d", 0.0)
    node = f"card-{uuid.uuid4().hex[:8]}"  # this run's card: a concurrent run never joins it
    procs = [
        ctx.Process(target=workers_card.run, args=(i, node, setting, start, 4, 4, out)) for i in range(4)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every worker has imported everything: the schedule starts together
            assert out.get(timeout=60)[0] == "ready"
        start.value = time.monotonic() + 0.5  # time for each poller to see the counter step
        results = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    charged = sum(r[1] for r in results)
    return charged, caused_by_schedule(), [(r[3], r[4]) for r in results]


def caused_by_schedule() -> float:
    """The truth, from the same schedule, in closed form."""
    from truecard import Job, TrueCard

    card = TrueCard()
    total = 0.0
    for _, offset, seconds, watts in workers_card.schedule(4, 4):
        job = Job(watts, offset, offset + seconds)
        total += job.truth(card.ramp_up, card.tau)
    return total


def test_four_workers_on_one_card_charge_it_once_with_no_setting() -> None:
    charged, caused, hosts = run_workers(None)
    assert 0.9 < charged / caused < 1.1, (charged, caused)
    # Any worker answers for the host's books: the last to look saw every other's charges
    # (those that had left, frozen), and while they all ran, each saw four workers.
    assert abs(max(h for h, _ in hosts) / charged - 1.0) < 0.03, (hosts, charged)
    assert max(w for _, w in hosts) == 4


def test_sharing_off_each_worker_charges_what_it_saw() -> None:
    charged, caused, hosts = run_workers("off")
    assert charged / caused > 1.5  # the defect sharing fixes: every worker took the card
    assert all(workers == 1 for _, workers in hosts)
