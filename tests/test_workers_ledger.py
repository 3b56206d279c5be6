"""Real worker processes on one card charge its energy once, not once each, with no setting.

Each worker meters only its own windows, on a card (:mod:`truecard`, read by every worker)
that draws for all of them: ramp-ups, ramp-down tails, whole-mJ steps at jittered times, and
each job running when its request does (a few ms after its window opens, until just before it
closes), however late a loaded machine brings the worker there. The truth is each job's energy
in closed form from the times it ran, never from the ledger. One process holds the card and
reads it; the others take their parts of what it publishes.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import workers_card

from giul_asgi.hostshare import resolve
from giul_asgi.hostshare.keys import folder_name


@dataclass
class Run:
    charged: float  # settled figures, summed over the workers that finished
    first: float  # first figures, likewise, where one was made, over what those requests caused
    caused: float  # what those workers' requests caused
    hosts: list[tuple[float, int]]  # each worker's view of the host's books: charged, workers
    missing: int  # windows with no figure
    contended: int  # windows flagged contended (no foreign load runs here)
    killed: int | None = None
    #: Per worker: its first figures that were numbers, those inside their uncertainty of
    #: their settled figure, and its windows.
    firsts: dict[int, tuple[int, int, int]] | None = None


def run_workers(setting: str | bool | None, shape: str = "steady", per_worker: int = 4,
                kill_holder_after: float | None = None) -> Run:
    """Four workers under ``setting`` (None: nothing set, the default)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Value("d", 0.0)
    abort = ctx.Array("d", [-1.0, 0.0])  # (worker, when): its upstream aborts its jobs then
    plan = workers_card.schedule(4, per_worker, shape=shape)
    ran = ctx.Array("d", [-1.0] * (2 * len(plan)))  # each job's start and stop, as it ran
    node = f"card-{uuid.uuid4().hex[:8]}"  # this run's card: a concurrent run never joins it
    procs = [ctx.Process(target=workers_card.run,
                         args=(i, node, setting, start, 4, per_worker, out, shape, abort, ran))
             for i in range(4)]
    for p in procs:
        p.start()
    killed = None
    try:
        for _ in procs:  # every worker has imported everything: the schedule starts together
            assert out.get(timeout=90)[0] == "ready"
        start.value = time.monotonic() + 0.5  # time for each poller to see the counter step
        if kill_holder_after is not None:
            time.sleep(0.5 + kill_holder_after)
            holder = _holder(node)
            assert holder is not None, "nobody holds the card"
            killed = next(i for i, p in enumerate(procs) if p.pid == holder)
            os.kill(holder, signal.SIGKILL)
            abort[0], abort[1] = float(killed), time.monotonic()
        results = [out.get(timeout=90) for i in range(len(procs)) if i != killed]
    finally:
        for p in procs:
            p.join(15)
            if p.is_alive():
                p.kill()
    survivors = {r[0] for r in results}
    return Run(
        charged=sum(r[1] for r in results),
        first=sum(r[5][0] for r in results) / sum(r[5][1] for r in results),
        caused=workers_card.caused_by(plan, ran, survivors), hosts=[(r[3], r[4]) for r in results],
        missing=sum(r[6] for r in results), contended=sum(r[7] for r in results), killed=killed,
        firsts={r[0]: r[8] for r in results},
    )


def _holder(node: str, key: str | None = None) -> int | None:
    """The pid holding the card's lock (``key``; by default the schedule's card of ``node``)
    in the default place (where the workers, with nothing set, meet), from /proc/locks: the
    kernel's own word."""
    saved = os.environ.pop("GIUL_ASGI_LOAD_DIR", None)
    try:
        root = resolve(None).path
    finally:
        if saved is not None:
            os.environ["GIUL_ASGI_LOAD_DIR"] = saved
    assert root is not None
    lock = root / "cards" / folder_name(key or f"card:schedule:{node}") / "lock"
    if not lock.exists():
        return None
    inode = os.stat(lock).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and fields[-3].endswith(f":{inode}"):
            return int(fields[4])
    return None


def test_four_workers_on_one_card_charge_it_once_with_no_setting() -> None:
    run = run_workers(None)
    assert 0.9 < run.charged / run.caused < 1.1, run
    assert 0.9 < run.first < 1.1, run
    # Any worker answers for the card's books, the same from each: the host's, every worker's
    # charges summed (those that had left, folded in), and while they all ran, four workers.
    assert max(h for h, _ in run.hosts) - min(h for h, _ in run.hosts) < 0.02 * run.charged, run
    assert abs(max(h for h, _ in run.hosts) / run.charged - 1.0) < 0.03, run
    assert max(w for _, w in run.hosts) == 4
    assert run.missing == 0 and run.contended == 0, run


def test_short_requests_from_four_workers_are_charged_once() -> None:
    """Issue 20: 50 ms requests on four workers were charged 1.21x (1.35x on a busy
    machine), first figures 1.34x; every window was flagged contended."""
    run = run_workers(None, shape="short", per_worker=20)
    assert 0.9 < run.charged / run.caused < 1.1, run
    # First figures: the part the card had not reported at close is guessed; on a loaded
    # machine more of it (benchmarks/workers.py gives the figures on a quiet one).
    assert 0.8 < run.first < 1.2, run
    assert run.missing == 0 and run.contended == 0, run


def test_a_burst_from_idle_on_four_workers_is_charged_once() -> None:
    """Issue 20: 32 requests of 0.4 s from idle were charged 1.31-2.06x settled, 1.14-2.10x
    first, every one contended (the other workers' windows read as a foreign load)."""
    run = run_workers(None, shape="burst", per_worker=8)
    assert 0.9 < run.charged / run.caused < 1.1, run
    assert 0.8 < run.first < 1.2, run
    assert run.missing == 0 and run.contended == 0, run


def test_a_worker_started_beside_warm_ones_guesses_from_their_spans_not_unknown() -> None:
    """Issue 21: a fresh process's first answers said unknown (gunicorn's recycled worker,
    2 of 5 rounds in a stranger's trial) though the card's other workers knew its rate. A
    worker that joins the card 1.5 s after three warm ones and sends 50 ms requests (closed
    before any span of its own is published) makes every first figure a number, from the
    spans it took of the others, inside its uncertainty of its settled figure 9 times in 10."""
    run = run_workers(None, shape="late", per_worker=6)
    assert run.firsts is not None and 3 in run.firsts, run
    made, inside, windows = run.firsts[3]
    assert windows == 6 and made == windows, run
    assert inside >= windows - 1, run
    assert 0.9 < run.charged / run.caused < 1.1, run
    assert run.missing == 0 and run.contended == 0, run


def test_killing_the_card_s_holder_hands_the_card_to_another_worker() -> None:
    """kill -9 of the process that reads the card: another takes the card over (the kernel
    frees the lock) and its tape goes on from the last holder's (a span, not a gap), and the
    survivors' requests are still charged once. The killed worker's requests stop at its
    death, as an inference server aborts the requests of a gateway whose connections drop."""
    run = run_workers(None, per_worker=6, kill_holder_after=0.8)
    assert run.killed is not None
    assert 0.9 < run.charged / run.caused < 1.1, run
    assert run.missing == 0, run
    assert max(w for _, w in run.hosts) >= 3


def test_sharing_off_each_worker_charges_what_it_saw() -> None:
    run = run_workers("off")
    assert run.charged / run.caused > 1.5  # the defect sharing fixes: every worker took the card
    assert all(workers == 1 for _, workers in run.hosts)


def test_no_card_counter_falls_from_any_worker_across_the_holder_s_kill(tmp_path: Path) -> None:
    """Issue 20: every node counter never decreases from any worker's answer. Four workers
    keep windows open on one card; the test asks them, one after another in a shuffled
    order, for the books they would serve, and halfway kills the card's holder with -9
    while windows are in flight. A hostile tester saw the allocated counter fall 298.65 ->
    296.46 after such a kill: each worker held its own highest of a figure that differed by
    worker (its own idle in flight taken out), and each added its own fresh books to the
    others' as last published."""
    card = workers_card.FileCard.create(tmp_path / "card.jsonl")
    node = f"books-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(4)]
    procs = [ctx.Process(target=workers_card.books_worker, args=(i, node, str(card), pipes[i][1]))
             for i in range(4)]
    for p in procs:
        p.start()
    conns = {i: pipes[i][0] for i in range(4)}
    rng = random.Random(7)
    answers: list[dict[str, Any]] = []

    def ask_all() -> None:
        order = list(conns)
        rng.shuffle(order)
        for i in order:
            conns[i].send("books")
            assert conns[i].poll(60), f"worker {i} did not answer"
            answers.append({**conns[i].recv(), "worker": i})

    try:
        pids = {}
        for i, conn in conns.items():
            assert conn.poll(90), f"worker {i} did not start"
            pids[i] = conn.recv()[1]
        key = f"card:file:{card}"
        deadline = time.monotonic() + 60
        # Until every worker answers for the host's card (before it sits at the table, a
        # worker's books are its own, a series of their own), and the card is read.
        while (len(answers) < 4 or any(a["process"] is not None or a["reads"] == 0 for a in answers[-4:])
               or _holder(node, key) is None):
            assert time.monotonic() < deadline, "the workers never met at the card's table"
            ask_all()
            time.sleep(0.05)
        del answers[:]
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            ask_all()
        holder = _holder(node, key)
        killed = next(i for i, pid in pids.items() if pid == holder)
        assert answers[-1]["windows_open"] > 0  # windows in flight, the holder's among them
        os.kill(pids[killed], signal.SIGKILL)
        del conns[killed]
        at_kill = len(answers)
        # Until another worker reads the card again (and a while after): the books go on.
        measured = answers[-1]["measured_j"]
        deadline, after = time.monotonic() + 60, None
        while after is None or time.monotonic() < after:
            assert time.monotonic() < deadline, "nobody took the card over"
            ask_all()
            if after is None and answers[-1]["measured_j"] > measured:
                after = time.monotonic() + 1.5
        for conn in conns.values():
            conn.send("stop")
    finally:
        for p in procs:
            p.join(15)
            if p.is_alive():
                p.kill()
    assert len(answers) - at_kill > 20 and at_kill > 20, (at_kill, len(answers))
    falls = {name: [(a["worker"], a[name], b["worker"], b[name]) for a, b in itertools.pairwise(answers)
                    if b[name] < a[name]]
             for name in workers_card.COUNTERS}
    assert not any(falls.values()), "; ".join(f"{name}: {len(f)} falls, the first {f[:2]}"
                                              for name, f in falls.items() if f)
    last = answers[-1]
    assert last["allocated_j"] > last["charged_j"] > 0 and last["workers"] >= 3
