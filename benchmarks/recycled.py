"""First figures from workers that are always new: gunicorn ``--max-requests`` recycling.

A stranger's trial (benchmarks/results/stranger-2026-12-06b.md, finding 1-2) ran
``gunicorn -k uvicorn_worker.UvicornWorker -w 4 --max-requests 20`` over a node with the
simulated card and saw about half the first figures ``unknown`` and the numeric ones inside
their uncertainty of the settled figure only 78-88% of the time: every recycled worker learnt
its node from nothing. This runs that shape: an app whose only energy line is the README's
(``Node(..., reader="simulated")``, one route), gunicorn with 4 workers recycled every
``--max-requests`` requests, 150 requests on new connections, sixteen at a time, as the
trial's client sent them (four of 50 ms to one of 0.4 s, shuffled), then each request's
settled record by id. ``--max-requests 0`` is the control (4 workers, cold,
never recycled). ``--trees`` runs other checkouts' giul_asgi too, interleaved (an A/B).

    python benchmarks/recycled.py --runs 3
    python benchmarks/recycled.py --runs 3 --trees /path/to/before .
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import free_port  # noqa: E402

APP = textwrap.dedent("""
    import asyncio
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route as Path
    from giul_asgi import EnergyMiddleware, Node, Route

    async def work(request):
        await asyncio.sleep(float(request.query_params.get("seconds", "0.4")))
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Path("/work", work)])
    app.add_middleware(EnergyMiddleware, nodes=[Node("sim", idle_w=70.0, reader="simulated")],
                       routes=[Route("/work", node="sim")])
""")


def one_run(folder: Path, tree: Path, max_requests: int, lengths: list[float],
            at_once: int) -> dict[str, Any]:
    port = free_port()
    place = folder / f"place-{port}"
    place.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}
    env.update(GIUL_ASGI_LOAD_DIR=str(place), PYTHONPATH=str(folder) + os.pathsep + str(tree))
    line = [sys.executable, "-m", "gunicorn", "recycled_app:app", "-k", "uvicorn_worker.UvicornWorker",
            "-w", "4", "-b", f"127.0.0.1:{port}", "--log-level", "warning"]
    if max_requests:
        line += ["--max-requests", str(max_requests)]
    log = (folder / f"server-{port}.log").open("wb")
    proc = subprocess.Popen(line, env=env, cwd=folder, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(base + "/nothing", timeout=5)
                break
            except httpx.HTTPError:
                time.sleep(0.2)

        def ask(seconds: float) -> tuple[str, str, str] | None:
            try:
                with httpx.Client(base_url=base, timeout=30) as client:
                    r = client.get("/work", params={"seconds": seconds})
                h = r.headers
                return h["x-energy-joules"], h["x-energy-uncertainty"], h["x-energy-id"]
            except (httpx.HTTPError, KeyError):
                return None  # a recycling worker dropped it (the bare app drops as many)

        with ThreadPoolExecutor(at_once) as pool:
            answers = [a for a in pool.map(ask, lengths) if a is not None]
        time.sleep(2.0)
        counts: dict[str, Any] = {"answered": len(answers), "unknown": 0, "inside": 0, "outside": 0,
                                  "unsettled": 0, "widths": []}
        for joules, unc, id in answers:
            if joules == "unknown" or unc == "unknown":
                counts["unknown"] += 1
                if os.environ.get("RECYCLED_DEBUG"):
                    print("unknown", id, file=sys.stderr)
                continue
            if float(joules) > 0:
                counts["widths"].append(float(unc) / float(joules))
            settled = None
            for _ in range(6):  # any worker answers; a record written by a dead one too
                try:
                    record = httpx.get(f"{base}/energy/requests/{id}", timeout=10).json()["record"]
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
                if record.get("settled") and isinstance(record.get("joules"), float | int):
                    settled = float(record["joules"])
                    break
            if settled is None:
                counts["unsettled"] += 1
            elif abs(float(joules) - settled) <= float(unc):
                counts["inside"] += 1
            else:
                counts["outside"] += 1
        return counts
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--at-once", type=int, default=16)
    parser.add_argument("--max-requests", type=int, nargs="+", default=[20, 0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[0.4, 0.05, 0.05, 0.05, 0.05],
                        help="request lengths, in turn (default: the trial's four of 50 ms to one of 0.4 s)")
    parser.add_argument("--trees", type=Path, nargs="+", default=[ROOT], help="checkouts to run, interleaved")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"# First figures of recycled workers ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)\n")
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, Python "
          f"{platform.python_version()}, tree {head.stdout.strip()}. gunicorn -w 4, {args.requests} requests "
          f"({' '.join(f'{s:g}' for s in args.seconds)} s in turn, shuffled), {args.at_once} at a time, "
          "simulated card.\n")
    trees = {tree: _commit(tree) for tree in args.trees}
    print("| tree | --max-requests | run | answered | unknown | numeric inside | outside | not settled "
          "| first width, median |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "recycled_app.py").write_text(APP)
        for run in range(1, args.runs + 1):
            for tree, commit in trees.items():  # interleaved
                for max_requests in args.max_requests:
                    lengths = [args.seconds[i % len(args.seconds)] for i in range(args.requests)]
                    random.Random(run).shuffle(lengths)
                    c = one_run(folder, tree, max_requests, lengths, args.at_once)
                    numeric = c["inside"] + c["outside"]
                    share = f"{100 * c['inside'] / numeric:.0f}% ({c['inside']}/{numeric})" if numeric \
                        else "-"
                    width = f"{100 * statistics.median(c['widths']):.0f}%" if c["widths"] else "-"
                    print(f"| {commit} | {max_requests or 'none'} | {run} | {c['answered']} | {c['unknown']} "
                          f"| {share} | {c['outside']} | {c['unsettled']} | {width} |", flush=True)


def _commit(tree: Path) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return head.stdout.strip() or str(tree)


if __name__ == "__main__":
    main()
