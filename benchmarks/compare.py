"""Our overhead against an earlier commit of ours, side by side in one run.

A change to the request path is judged by this, not by comparing result files from
different runs: these machines drift by 10-50% between runs, but two builds timed in
turn see the same machine. The earlier commit's package is extracted with ``git archive``
under another name (its imports are relative) and both are timed around the same app, in
process and through uvicorn, exactly as ``overhead.py`` times its variants.

    python benchmarks/compare.py 5ff3086           # this tree against commit 5ff3086
    python benchmarks/compare.py 5ff3086 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _apps import PATHS, bench_app, our_middleware
from overhead import measure, run_requests, start_servers, stop
from starlette.applications import Starlette

ROOT = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path) -> str:
    """The package at ``rev``, importable from ``into`` as ``giul_asgi_<rev>``."""
    name = "giul_asgi_" + "".join(c if c.isalnum() else "_" for c in rev)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "giul_asgi"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "giul_asgi").rename(into / name)
    return name


def build(package: str | None) -> Starlette:
    """The overhead benchmark's app, bare or behind ``package``'s EnergyMiddleware with its
    ledger live on a busy simulated card, the energy block injected."""
    return bench_app([] if package is None else [our_middleware(package)])


SERVER = """
import sys, uvicorn
sys.path[:0] = [{bench!r}, {extra!r}]
from compare import build
uvicorn.run(build({package!r}), host="127.0.0.1", port={port}, log_level="error",
            access_log=False, http="httptools", loop="uvloop")
"""


async def child(package: str, repeats: int, n: int) -> dict[str, float]:
    """In this process only: the bare app and ``package``'s, timed in turn; the median
    microseconds added per request for JSON, the stream, and the stream with usage."""
    bare, ours = build(None), build(package)
    out: dict[str, float] = {}
    for kind, path in PATHS.items():
        for app in (bare, ours):
            await run_requests(app, path, 200)
        added = []
        for _ in range(repeats):
            a = await run_requests(ours, path, n)
            b = await run_requests(bare, path, n)
            added.append((a - b) * 1e6)
        out[kind] = statistics.median(added)
    return out


def in_process(variants: dict[str, str | None], extra: Path, rounds: int, repeats: int, n: int,
               ) -> dict[str, dict[str, list[float]]]:
    """Each build in a process of its own (so neither pays for the other's objects, nor its
    garbage collections), the builds taking turns, ``rounds`` times."""
    out: dict[str, dict[str, list[float]]] = {kind: {} for kind in PATHS}
    for _ in range(rounds):
        for label, pkg in variants.items():
            if pkg is None:
                continue
            result = subprocess.run(
                [sys.executable, __file__, "--child", pkg, "--extra", str(extra),
                 "--repeats", str(repeats), "-n", str(n)],
                check=True, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            ).stdout
            for kind, value in json.loads(result).items():
                out[kind].setdefault(label, []).append(value)
    return out


def through_uvicorn(variants: dict[str, str | None], extra: Path, repeats: int, seconds: int,
                    ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """JSON requests/s as a ratio to the bare app's, and server CPU us per request; fresh
    server processes every repeat, as in ``overhead.py``."""
    code_for = {
        label: SERVER.format(bench=str(Path(__file__).parent), extra=str(extra), package=pkg,
                             port="{port}")
        for label, pkg in variants.items()
    }
    ratios: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(repeats):
        servers = start_servers(code_for)
        try:
            rps: dict[str, float] = {}
            for label, (proc, port) in servers.items():
                rps[label], us = measure(proc, f"http://127.0.0.1:{port}/v1/chat/completions",
                                         seconds)
                cpu.setdefault(label, []).append(us)
        finally:
            stop(proc for proc, _port in servers.values())
        for label, value in rps.items():
            ratios.setdefault(label, []).append(value / rps["bare"])
    return ratios, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", help="the earlier commit (what git rev-parse takes)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, help="in-process rounds (default 5; --quick 2)")
    parser.add_argument("--no-server", action="store_true", help="skip the uvicorn part")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--extra", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=2000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.extra)
        print(json.dumps(asyncio.run(child(args.child, args.repeats, args.n))))
        return
    if not args.rev:
        parser.error("give the earlier commit to compare against")
    rounds, repeats, n = (2, 3, 500) if args.quick else (5, 5, 2000)
    rounds = args.rounds or rounds
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "giul_asgi"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        extra = Path(tmp)
        package = extract(args.rev, extra)
        sys.path.insert(0, str(extra))
        variants: dict[str, str | None] = {
            "bare": None, f"giul-asgi at {args.rev}": package,
            f"giul-asgi at {head}{' + changes' if dirty else ''}": "giul_asgi",
        }
        print(f"# compare: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
        print(f"## in-process, us added per request over the bare app (each build in its own "
              f"process, the builds in turn; median of {rounds} rounds, each the median of "
              f"{repeats} interleaved repeats of {n})\n")
        added = in_process(variants, extra, rounds, repeats, n)
        print("| build | JSON added us | fastest round | stream added us | fastest round "
              "| stream with usage added us | fastest round | JSON rounds |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for label in list(variants)[1:]:
            cells = []
            for kind in ("json", "stream", "usage"):
                values = added[kind][label]
                cells += [f"{statistics.median(values):.1f}", f"{min(values):.1f}"]
            rounds_text = ", ".join(f"{x:.1f}" for x in added["json"][label])
            print(f"| {label} | " + " | ".join(cells) + f" | {rounds_text} |")
        print("\nA slow spell of the VM only ever adds time: the fastest round is the build's "
              "cost with the least interference, the median what a round usually saw.")
        if args.no_server:
            return
        if shutil.which("wrk") is None:
            print("\n(through uvicorn skipped: wrk is not installed)")
            return
        seconds, server_repeats = (2, 2) if args.quick else (3, 7)
        print(f"\n## through uvicorn, JSON, wrk -t1 -c16 {seconds}s, median of {server_repeats} "
              "interleaved repeats\n")
        ratios, cpu = through_uvicorn(variants, extra, server_repeats, seconds)
        print("| build | req/s vs bare | server CPU us per request |")
        print("|---|---:|---:|")
        for label in variants:
            print(f"| {label} | {statistics.median(ratios[label]):.2f} | "
                  f"{statistics.median(cpu[label]):.0f} |")


if __name__ == "__main__":
    main()
