"""What restarts leave in the host's place: a server killed -9 and started again, round after round.

A hostile trial (benchmarks/results/hostile-2026-12-06b.md, N3) filled Docker's 64 MB
/dev/shm in 11 quick restarts of one server, and in 6 restarts of a container (a PID
namespace of its own), after which every server on the host charged its card per process.
This runs that shape: each round starts ``uvicorn workers_app:app --workers 4`` (the app of
tests/workers_app.py over a file card, nothing configured but the place), sends 8 requests,
kills the master and its workers with SIGKILL, and measures the place (files, bytes on disk,
server folders). ``--containers`` runs each round in a PID namespace of its own
(``unshare -p -f --mount-proc``: root only), as a restarted container does.

    python benchmarks/restarts.py                  # 13 rounds in the host's namespace
    python benchmarks/restarts.py --containers     # 13 rounds, each a container
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(ROOT / "benchmarks"))

import workers_card  # type: ignore[import-not-found]  # noqa: E402  (tests/: the file card)
from overhead import free_port  # noqa: E402


def used(place: Path) -> tuple[int, int]:
    """Files, and bytes they take on disk, under ``place``."""
    files = size = 0
    for here, _, names in os.walk(place):
        for name in names:
            try:
                info = os.lstat(os.path.join(here, name))
            except OSError:
                continue
            files += 1
            size += info.st_blocks * 512
    return files, size


def folders(place: Path, part: str) -> int:
    """Server folders under ``part`` (stats, records), in every namespace's folder."""
    return sum(1 for p in place.rglob(part) if p.is_dir() for q in p.iterdir() if q.is_dir())


def one_round(place: Path, card: Path, containers: bool) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}
    env.update(GIUL_ASGI_LOAD_DIR=str(place), WORKERS_CARD=str(card), WORKERS_NODE="gpu",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT / "benchmarks"), str(ROOT)]))
    line = [sys.executable, "-m", "uvicorn", "workers_app:app", "--workers", "4", "--port", str(port),
            "--log-level", "warning"]
    if containers:
        line = ["unshare", "-p", "-f", "--mount-proc", *line]
    proc = subprocess.Popen(line, env=env, cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        answered = 0
        while answered < 8 and time.monotonic() < deadline:
            try:
                with httpx.Client(base_url=base, timeout=30) as client:
                    client.get("/work", params={"watts": 100, "seconds": 0.2}).raise_for_status()
                answered += 1
            except httpx.HTTPError:
                time.sleep(0.2)
        time.sleep(1.5)  # the rows and rings written since
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--containers", action="store_true", help="each round in a PID namespace of its own")
    args = parser.parse_args()
    if args.containers and shutil.which("unshare") is None:
        sys.exit("--containers needs unshare(1), as root")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"# Restarts: {args.rounds} rounds of uvicorn --workers 4, kill -9, "
          f"{'each in a PID namespace of its own' if args.containers else 'in the host namespace'}\n")
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, tree {head.stdout.strip()}\n")
    print("| round | files | used (kB) | stats folders | records folders | namespace folders |")
    print("|---:|---:|---:|---:|---:|---:|")
    with TemporaryDirectory() as tmp:
        place = Path(tmp) / "place"
        place.mkdir(mode=0o700)
        card = workers_card.FileCard.create(Path(tmp) / f"card-{uuid.uuid4().hex[:6]}.jsonl")
        for n in range(1, args.rounds + 1):
            one_round(place, card, args.containers)
            files, size = used(place)
            spaces = sum(1 for p in place.iterdir() if p.name.startswith("pidns-"))
            print(f"| {n} | {files} | {size // 1024:,} | {folders(place, 'stats')} "
                  f"| {folders(place, 'records')} | {spaces} |", flush=True)


if __name__ == "__main__":
    main()
