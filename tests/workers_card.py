"""A card that several worker processes share, and that knows what each request caused.

Four worker processes on one GPU each see only their own requests, but the card draws for
all of them. Two ways to build that here, both on :mod:`truecard` (ramps, ramp-down tails,
whole-mJ counter steps at jittered times), and neither looks at the ledger:

- :func:`run`: a worker that knows the whole schedule, so each process's card shows
  everybody's load while it meters only its own windows (test_workers_ledger);
- :class:`FileCard`: a card kept in a file: every request's job is appended (start, stop,
  watts) by the worker that serves it, and every worker's reader replays the file, so all
  of them read one card, for real servers (uvicorn, gunicorn) whose requests nobody
  schedules. :func:`caused` is the truth: each job's energy, tail included, in closed form
  from the file alone. :func:`server_command` starts such a server, four workers over the
  card (``workers_app``), for the test and the benchmark alike.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from truecard import Job, TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter

IDLE = 70.0


Plan = list[tuple[int, float, float, float]]  # (worker, start offset, seconds, watts)


def schedule(workers: int, per_worker: int, seed: int = 11, shape: str = "steady") -> Plan:
    """Who runs what, when: ``steady`` (0.2-0.6 s requests at random times over two
    seconds), ``short`` (50 ms requests back to back with 20-80 ms between, every worker at
    once), ``burst`` (every request 0.4 s long, all starting within 20 ms, from idle),
    ``late`` (``steady`` but for the last worker, which sends 50 ms requests from 1.6 s on,
    0.15 s apart: a worker started beside warm ones, as gunicorn recycles one)."""
    rng = random.Random(seed)
    if shape == "late":
        plan = schedule(workers - 1, per_worker, seed)
        return plan + [(workers - 1, 1.6 + 0.15 * i, 0.05, rng.uniform(60.0, 120.0))
                       for i in range(per_worker)]
    if shape == "short":
        plan: Plan = []
        for w in range(workers):
            t = 0.3 + rng.uniform(0.0, 0.05)
            for _ in range(per_worker):
                plan.append((w, t, 0.05, rng.uniform(60.0, 120.0)))
                t += 0.05 + rng.uniform(0.02, 0.08)
        return plan
    if shape == "burst":
        return [(w, 0.5 + rng.uniform(0.0, 0.02), 0.4, rng.uniform(60.0, 120.0))
                for w in range(workers) for _ in range(per_worker)]
    return [
        (w, rng.uniform(0.3, 2.3), rng.uniform(0.2, 0.6), rng.uniform(60.0, 120.0))
        for w in range(workers) for _ in range(per_worker)
    ]


def caused_by(plan: Plan, ran: Any, only: set[int] | None = None) -> float:
    """The truth: what the jobs of ``plan`` (of the workers in ``only``) caused, in closed form
    from the card's model and the times they ran (``ran``: each job's start and stop, as
    :func:`run` records them; a job that never started caused nothing)."""
    card = TrueCard()
    total = 0.0
    for k, (w, _, _, watts) in enumerate(plan):
        start, stop = ran[2 * k], ran[2 * k + 1]
        if (only is None or w in only) and start >= 0 and stop > start:
            total += Job(watts, start, stop).truth(card.ramp_up, card.tau)
    return total


class _Upstream(TrueReader):
    """The card every worker's requests load, as an inference server runs them: a job starts
    a few ms after its request's window opens (the request reaches the server) and stops just
    before it closes (the answer goes out when the work is done), whenever the worker gets
    there, however loaded the machine; a killed worker's jobs stop at its death (the server
    aborts the requests of a gateway whose connections dropped). Every process's copy reads
    the times from ``ran``, shared, so they all draw the same card."""

    def __init__(self, card: TrueCard, plan: Plan, ran: Any, killed: Any) -> None:
        super().__init__(card)
        self.plan, self.ran, self.killed = plan, ran, killed
        self.jobs: dict[int, Job] = {}

    def read(self) -> Any:
        who, at = (int(self.killed[0]), self.killed[1]) if self.killed is not None else (-1, 0.0)
        with self.card._lock:
            for k, (w, _, _, watts) in enumerate(self.plan):
                start, stop = self.ran[2 * k], self.ran[2 * k + 1]
                if start < 0:
                    continue
                job = self.jobs.get(k)
                if job is None:
                    job = self.jobs[k] = Job(watts, start)
                    self.card.jobs.append(job)
                if stop > 0:
                    job.stop = stop
                elif w == who and at > 0:
                    job.stop = max(job.start, at)
        return super().read()


def run(index: int, node_name: str, setting: str | bool | None, start: Any, workers: int,
        per_worker: int, out: Any, shape: str = "steady", killed: Any = None,
        ran: Any = None) -> None:
    """One worker: meters its part of the schedule on a card that draws for all of them.
    ``start`` is a shared value the parent sets once every worker is reading. ``setting``
    is the node's ``workers_dir``: None is the default (no setting at all). ``ran``: shared
    (start, stop) of every job, written by the worker that runs it; ``killed``: a shared
    (worker, time) the parent sets when it kills one. Puts on ``out`` (index, settled sum,
    measured, host charged, host workers, first-figure sum, windows with no figure, windows
    contended)."""
    os.environ.pop("GIUL_ASGI_LOAD_DIR", None)  # the deployment's shape: nothing set
    plan = schedule(workers, per_worker, shape=shape)
    rng = random.Random(1000 + index)
    card = TrueCard(idle_w=IDLE, seed=5)
    out.put(("ready", index))
    while start.value == 0.0:
        time.sleep(0.005)
    t_start = start.value
    card.t0 = t_start
    card._phase = 0.041  # every process's card steps at the same times
    reader = _Upstream(card, plan, ran, killed)
    reader.card_id = f"schedule:{node_name}"  # type: ignore[attr-defined]  # every process's one card
    if shape == "late" and index == workers - 1:  # it starts now, beside warm ones
        time.sleep(max(0.0, t_start + 1.5 - time.monotonic()))
    ledger = Ledger(Node(node_name, idle_w=IDLE, workers_dir=setting), reader)
    anyio.run(ledger.wait_ready, 5.0)  # as the middleware's startup does, before any request
    # This worker's opens and closes in time order (its windows may overlap).
    events = sorted([(t_start + o, 0, k) for k, (w, o, _, _) in enumerate(plan) if w == index]
                    + [(t_start + o + s, 1, k) for k, (w, o, s, _) in enumerate(plan) if w == index])
    meters: dict[int, Meter] = {}
    firsts: dict[int, Energy] = {}
    for at, kind, k in events:
        time.sleep(max(0.0, at - time.monotonic()))
        if kind == 0:
            meters[k] = Meter(ledger)
            meters[k].open()
            ran[2 * k] = time.monotonic() + rng.uniform(0.001, 0.008)
        else:
            ran[2 * k + 1] = max(ran[2 * k] + 0.001, time.monotonic() - rng.uniform(0.0, 0.002))
            meters[k].close()
            firsts[k] = meters[k].figure()
    deadline = time.monotonic() + 10.0  # a loaded machine settles late; never for ever
    while not all(m.settled_now for m in meters.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    figures = [m.figure() for m in meters.values()]
    charged = sum(f.joules or 0.0 for f in figures)
    # First figures against what their own requests caused, where a first figure was made
    # (the very first request of a fresh process may say unknown: the node knew nothing).
    made = [k for k, v in firsts.items() if v.joules is not None]
    first = (sum(firsts[k].joules or 0.0 for k in made), caused_by(
        [p if k in made else (p[0], p[1], p[2], 0.0) for k, p in enumerate(plan)], ran, {index}))
    missing = sum(1 for f in figures if f.joules is None)
    # Each first figure against its own settled one: numeric, and inside its uncertainty.
    settled = {k: m.figure() for k, m in meters.items()}
    inside = sum(1 for k in made if settled[k].joules is not None
                 and abs((settled[k].joules or 0.0) - (firsts[k].joules or 0.0))
                 <= (firsts[k].uncertainty_joules or 0.0))
    contended = sum(1 for f in figures if f.contended)
    # The end of the schedule is quiet for everybody: wait for every worker's last figures
    # to reach the table before reading the host's books.
    time.sleep(1.0)
    host = ledger.host_totals()
    ledger.stop(1.0)
    out.put((index, charged, ledger.totals().measured_j, host.charged_j, host.workers, first, missing,
             contended, (len(made), inside, len(firsts))))


class FileCard:
    """A card whose jobs live in an append-only file that every process reads.

    The file starts with the card's geometry (its start on the host's monotonic clock,
    the counter's phase, idle watts); then ``start``/``stop`` lines, one per job event, each
    written whole with one ``write`` on an ``O_APPEND`` descriptor.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        head = json.loads(self.path.read_text().splitlines()[0])
        self.card = TrueCard(idle_w=float(head["idle_w"]), seed=int(head["seed"]))
        self.card.t0 = float(head["t0"])
        self.card._phase = float(head["phase"])
        self._jobs: dict[str, Job] = {}
        self._offset = 0
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    @staticmethod
    def create(path: str | os.PathLike[str], idle_w: float = IDLE, seed: int = 5) -> Path:
        head = {"t0": time.monotonic(), "phase": 0.041, "idle_w": idle_w, "seed": seed}
        Path(path).write_text(json.dumps(head) + "\n")
        return Path(path)

    def start_job(self, watts: float) -> str:
        job = uuid.uuid4().hex
        os.write(self._fd, f"start {job} {time.monotonic()!r} {watts!r}\n".encode())
        return job

    def stop_job(self, job: str) -> None:
        os.write(self._fd, f"stop {job} {time.monotonic()!r}\n".encode())

    def refresh(self) -> None:
        """Replay the lines appended since the last look into the card."""
        with self._lock, self.path.open("rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
            end = chunk.rfind(b"\n") + 1
            self._offset += end
            with self.card._lock:
                for line in chunk[:end].decode().splitlines():
                    if self._offset == end and line.startswith("{"):
                        continue  # the head
                    apply(line, self._jobs, self.card.jobs)


def apply(line: str, jobs: dict[str, Job], into: list[Job]) -> None:
    parts = line.split()
    if parts[0] == "start":
        job = jobs[parts[1]] = Job(float(parts[3]), float(parts[2]))
        into.append(job)
    elif parts[0] == "stop" and parts[1] in jobs:
        jobs[parts[1]].stop = float(parts[2])


class FileCardReader(TrueReader):
    """Reads a :class:`FileCard` as NVML reads a real card (whole mJ, stepping every 100 ms)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.file = FileCard(path)
        super().__init__(self.file.card)
        #: Every worker reads this one card: the processes share it.
        self.card_id = f"file:{os.fspath(path)}"

    def read(self) -> Any:
        self.file.refresh()
        return super().read()


def jobs_of(path: str | os.PathLike[str]) -> dict[str, Job]:
    """Every job the card's file holds, by its id, as it ran."""
    jobs: dict[str, Job] = {}
    done: list[Job] = []
    for line in Path(path).read_text().splitlines()[1:]:
        apply(line, jobs, done)
    return jobs


def caused(path: str | os.PathLike[str]) -> tuple[float, int]:
    """The truth: the energy every finished job caused, tail included, and how many jobs."""
    card = TrueCard()
    finished = [j for j in jobs_of(path).values() if j.stop is not None]
    return sum(j.truth(card.ramp_up, card.tau) for j in finished), len(finished)


def server_command(kind: str, port: int) -> list[str]:
    """Four ``workers_app`` workers on 127.0.0.1:``port`` under uvicorn or gunicorn (run
    with the tests' folder as the working directory), nothing about energy set."""
    import sys

    if kind == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "workers_app:app", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "4", "--log-level", "warning"]
    return [sys.executable, "-m", "gunicorn", "workers_app:app", "-k", "uvicorn_worker.UvicornWorker",
            "-w", "4", "-b", f"127.0.0.1:{port}", "--log-level", "warning", "--graceful-timeout", "5"]


#: The node books' counters a worker answers with (:func:`books_worker`): every one of them
#: must never fall, from whichever worker answers.
COUNTERS = ("measured_j", "charged_j", "unattributed_j", "foreign_j", "estimated_j", "drawn_j",
            "idle_charged_j", "allocated_j", "idle_unattributed_j", "reads", "read_errors", "resets")


def books_worker(index: int, node_name: str, path: str, conn: Any, loads: int = 2) -> None:
    """One worker over the :class:`FileCard` at ``path``: ``loads`` threads keep windows open
    on it back to back (0.05-0.4 s, each loading the card while it runs), and the worker
    answers ``books`` on ``conn`` with the node books it would serve (/energy, /metrics),
    until ``stop``. Nothing set: the workers meet in the default place."""
    os.environ.pop("GIUL_ASGI_LOAD_DIR", None)
    card = FileCard(path)
    ledger = Ledger(Node(node_name, idle_w=IDLE, reader_factory=lambda _: FileCardReader(path)))
    ledger.ensure_started()
    done = threading.Event()

    def load(seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            meter = Meter(ledger)
            meter.open()
            job = card.start_job(rng.uniform(60.0, 120.0))
            time.sleep(rng.uniform(0.05, 0.4))
            card.stop_job(job)
            meter.close()
            time.sleep(rng.uniform(0.0, 0.02))

    threads = [threading.Thread(target=load, args=(100 * index + k,), daemon=True) for k in range(loads)]
    for thread in threads:
        thread.start()
    conn.send(("ready", os.getpid()))
    while (ask := conn.recv()) != "stop":
        del ask
        totals = ledger.host_totals()
        conn.send({**{name: float(getattr(totals, name)) for name in COUNTERS},
                   "workers": totals.workers, "windows_open": totals.windows_open,
                   "process": totals.process})
    done.set()
    ledger.stop(1.0)
