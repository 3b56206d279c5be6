"""Several workers, no setting: what real servers charge for one card, side by side.

Issue 16 found ``uvicorn --workers 4`` over one card charging 3.67-3.8x what the card drew
unless an operator knew two settings. This runs the deployment's shape: a real server with
four workers (uvicorn ``--workers 4``, gunicorn with uvicorn workers), an app whose only
energy line is ``EnergyMiddleware(app, nodes=[...])``, nothing in the environment, over a
file-backed card that every worker's requests load and every worker's reader reads
(tests/workers_card.FileCard). Each request's truth is the energy its job caused, tail
included, from the card's file alone. ``GIUL_ASGI_LOAD_DIR=off`` is the control: every
worker on its own, as before sharing was the default.

Three loads (issue 20): ``300ms`` (0.15-0.5 s requests, six at a time), ``50ms`` (50 ms
requests, eight at a time: short requests were charged 1.21-1.35x), ``burst`` (32 requests of
0.4 s all at once, from idle: 1.31-2.06x).

Per run: charged / caused (the settled records of every request, fetched by id, over what
the requests caused), the share of id lookups answered (each id asked three times on new
connections, so by various workers), the node's books on /energy (charged_j, from whichever
worker answered) against the records' sum, and the workers /energy reports. Runs alternate
between configurations; the table gives medians and ranges over the repeats.

    python benchmarks/workers.py                 # 3 repeats of each, about ten minutes
    python benchmarks/workers.py --repeats 2 --shapes 50ms,burst
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(ROOT / "benchmarks"))

import workers_card  # type: ignore[import-not-found]  # noqa: E402  (tests/: the card and its truth)
from overhead import free_port  # noqa: E402

TARGET = (0.9, 1.1)


#: A load: (requests, at a time, (watts, seconds) of each from a seeded generator).
SHAPES: dict[str, tuple[int, int, Callable[[random.Random], tuple[float, float]]]] = {
    "300ms": (40, 6, lambda rng: (rng.uniform(60.0, 150.0), rng.uniform(0.15, 0.5))),
    "50ms": (80, 8, lambda rng: (rng.uniform(60.0, 150.0), 0.05)),
    "burst": (32, 32, lambda rng: (rng.uniform(60.0, 150.0), 0.4)),
}


@dataclass
class Run:
    config: str
    shape: str
    ratio: float  # settled records found by id / caused (nan if any id was not found)
    headers: float  # first figures (X-Energy-Joules) / caused
    found: float
    books: float | None
    workers_reported: int | None
    served_by: int
    contended: float  # share of requests flagged contended (nothing foreign runs here)


def label(kind: str, share: bool) -> str:
    return f"{kind}, {'no setting' if share else 'GIUL_ASGI_LOAD_DIR=off'}"


def get(base: str, path: str, **params: Any) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=30) as client:  # a new connection each time
        return client.get(path, params=params)


def run_once(kind: str, share: bool, shape: str, seed: int) -> Run:
    requests, concurrency, make = SHAPES[shape]
    with TemporaryDirectory() as tmp:
        path = workers_card.FileCard.create(Path(tmp) / "card.jsonl")
        node = f"gpu-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}
        if not share:
            env["GIUL_ASGI_LOAD_DIR"] = "off"
        env.update(WORKERS_CARD=str(path), WORKERS_NODE=node,
                   PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT / "benchmarks"), str(ROOT)]))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = (Path(tmp) / "server.log").open("wb")
        proc = subprocess.Popen(workers_card.server_command(kind, port), env=env, cwd=TESTS,
                                stdout=log, stderr=log)
        try:
            pids: set[int] = set()
            deadline = time.monotonic() + 60
            while len(pids) < 4 and time.monotonic() < deadline:
                try:
                    pids.add(int(get(base, "/work", watts=60.0, seconds=0.05).json()["pid"]))
                except httpx.HTTPError:
                    time.sleep(0.2)

            def books() -> float | None:
                ledger = (get(base, "/energy", window="all").json().get("nodes", {})
                          .get(node) or {}).get("ledger") or {}
                value = ledger.get("charged_j")
                return float(value) if isinstance(value, int | float) else None

            time.sleep(1.0)
            before, _ = workers_card.caused(path)
            books_before = books()
            rng = random.Random(seed)
            plan = [make(rng) for _ in range(requests)]
            time.sleep(1.5)  # from idle: every window of the last warm-up request has settled

            def one(p: tuple[float, float]) -> tuple[str, int, float]:
                r = get(base, "/work", watts=p[0], seconds=p[1])
                joules = r.headers.get("x-energy-joules", "")
                first = float(joules) if joules.replace(".", "", 1).isdigit() else 0.0
                return r.headers["x-energy-id"], int(r.json()["pid"]), first

            with ThreadPoolExecutor(concurrency) as pool:
                served = list(pool.map(one, plan))
            time.sleep(1.5)
            caused = workers_card.caused(path)[0] - before
            records: dict[str, dict[str, Any]] = {}
            asked = answered = 0
            for _ in range(3):
                for key, _pid, _first in served:
                    asked += 1
                    r = get(base, f"/energy/requests/{key}")
                    if r.status_code == 200:
                        answered += 1
                        records[key] = r.json()["record"]
            charged = sum(r["joules"] or 0.0 for r in records.values())
            headers = sum(first for _, _, first in served)
            books_after = books()
            booked = books_after - books_before if books_after is not None and books_before is not None \
                else None
            energy = get(base, "/energy", window="all").json()
            contended = sum(1 for r in records.values() if r.get("contended")) / max(1, len(records))
            return Run(label(kind, share), shape,
                       charged / caused if len(records) == len(served) else float("nan"),
                       headers / caused, answered / asked,
                       booked / charged if booked is not None and charged else None, energy.get("workers"),
                       len({pid for _, pid, _ in served}), contended)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="loads to run: " + ", ".join(SHAPES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    configs = [("uvicorn", True), ("gunicorn", True), ("uvicorn", False)]
    runs: list[Run] = []
    for repeat in range(args.repeats):  # interleaved: every configuration sees the same machine
        for shape in shapes:
            for kind, share in configs:
                run = run_once(kind, share, shape, seed=repeat)
                runs.append(run)
                print(f"# {run}", file=sys.stderr, flush=True)
    load = os.getloadavg()
    lines = [
        f"# Several workers, no setting ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.platform()}, load average {load[0]:.2f} at the end. Command: "
        f"`python benchmarks/workers.py --repeats {args.repeats} --shapes {args.shapes}`.",
        "",
        "Four workers over one file-backed card; medians (min-max) over the repeats. Loads: "
        + "; ".join(f"{name}: {n} requests, {c} at a time" for name, (n, c, _) in SHAPES.items()
                    if name in shapes) + ".",
        "",
        "| load | configuration | runs | charged / caused (settled records)"
        " | first figures (headers) / caused | contended | ids found by any worker"
        " | /energy node books / records | workers on /energy"
        " | workers that served |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in shapes:
        for kind, share in configs:
            mine = [r for r in runs if r.config == label(kind, share) and r.shape == shape]
            books = [r.books for r in mine if r.books is not None]
            reported = sorted({r.workers_reported for r in mine}, key=str)
            lines.append(
                f"| {shape} | {mine[0].config} | {len(mine)} | "
                f"{spread([r.ratio for r in mine if r.ratio == r.ratio], lambda v: f'{v:.3f}')} | "
                f"{spread([r.headers for r in mine], lambda v: f'{v:.3f}')} | "
                f"{spread([r.contended for r in mine], lambda v: f'{100 * v:.0f}%')} | "
                f"{spread([r.found for r in mine], lambda v: f'{100 * v:.0f}%')} | "
                f"{spread(books, lambda v: f'{v:.3f}')} | {', '.join(map(str, reported))} | "
                f"{spread([float(r.served_by) for r in mine], lambda v: f'{v:.0f}')} |")
    lines += [
        "",
        "Settled records are summed only where every id was found (else the column is `-`); "
        "the node books are the /energy ledger section's charged_j over the run, from whichever "
        "worker answered, against the records' sum.",
        "",
        "| target (issue 20) | load | ours, settled | ours, first |",
        "|---|---|---|---|",
    ]
    for shape in shapes:
        shared = [r for r in runs if "no setting" in r.config and r.shape == shape]
        settled = [r.ratio for r in shared if r.ratio == r.ratio]
        first = [r.headers for r in shared]
        ok = settled and first and all(TARGET[0] <= v <= TARGET[1] for v in [*settled, *first])
        lines.append(f"| charged / caused {TARGET[0]}-{TARGET[1]}, no setting | {shape} | "
                     f"{min(settled, default=float('nan')):.3f}-{max(settled, default=float('nan')):.3f} | "
                     f"{min(first):.3f}-{max(first):.3f} ({'met' if ok else 'MISSED'}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
