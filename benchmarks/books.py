"""One server's statistics in files: what a request costs to keep, and what /energy costs to read.

Issue 20 measured ``/energy`` at 0.58 s with 100 dead workers' rows and 6.5 s with 1,000 (they
were never removed), and answered requests lost at a kill. Now each request is written in
place (stats/tail.py) and a dead worker is folded once into its server's dead row
(stats/folder.py). This measures, in process, on the host's place (``/dev/shm``):

- **per record**: what :meth:`HostStats.answered` (on the request's path) and the settled
  figure's tail entry (on the reader thread) add, against ``GIUL_ASGI_LOAD_DIR=off``;
- **/energy against recycled workers**: ``HostStats.snapshot("all")`` (what /energy's JSON
  is made from) with N dead workers (0, 10, 100), each having counted ``records / N`` of
  the records over 20 routes x 5 tenants: first while they are not folded yet (the first
  answer after they died), then once folded (every answer after). The dead workers' files
  are made by this process and given a pid that runs nowhere, as a recycled worker leaves
  them.

    python benchmarks/books.py                         # records 1e4 and 1e5
    python benchmarks/books.py --records 10000,100000,1000000 --out benchmarks/results/x.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from giul_asgi.energy import Energy  # noqa: E402
from giul_asgi.hostshare.server import ServerId  # noqa: E402
from giul_asgi.listeners import Settled  # noqa: E402
from giul_asgi.stats import EnergyStats, HostStats  # noqa: E402
from giul_asgi.stats.tail import SUFFIX  # noqa: E402

NOWHERE = 4_194_000  # pids from here down run nowhere (checked)


def place() -> Path:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    where = Path(tempfile.mkdtemp(prefix="giul-books-", dir=base))
    where.chmod(0o700)
    return where


def figures(n: int, offset: int = 0) -> list[Settled]:
    return [Settled(Energy(0.5 + (i % 97) * 0.1, "measured", route=f"/r{i % 20}", node="gpu",
                           tier="8b", tenant=f"tenant-{i % 5}", tokens=10 + i % 50, seconds=0.05,
                           id=f"b-{offset + i:x}"), "ok", 200)
            for i in range(n)]


def per_record(n: int = 1000, rounds: int = 10) -> dict[str, tuple[float, float, float]]:
    """Microseconds a record: (answered, settled in batches of 10, the row that follows
    each ``n`` records, per record), medians over ``rounds``, shared and off."""
    out = {}
    for label, where in (("off", "off"), ("shared", str(place()))):
        stats = HostStats(EnergyStats(), where, flush_s=3600)
        answered, settled, rows = [], [], []
        for r in range(rounds):
            batch = figures(n, offset=r * n)
            t0 = time.perf_counter()
            for s in batch:
                e = s.energy
                stats.answered(e.id, e.route, e.node, e.tier, "ok", 200, e.tenant)
            t1 = time.perf_counter()
            for i in range(0, n, 10):
                stats.settled(batch[i:i + 10])
            t2 = time.perf_counter()
            stats.flush()
            t3 = time.perf_counter()
            answered.append((t1 - t0) / n * 1e6)
            settled.append((t2 - t1) / n * 1e6)
            rows.append((t3 - t2) / n * 1e6)
        stats.close()
        out[label] = (statistics.median(answered), statistics.median(settled), statistics.median(rows))
    return out


def dead_workers(where: Path, key: str, workers: int, records: int) -> None:
    """``workers`` dead workers of server ``key`` that counted ``records`` in all: their rows
    and tails as they left them (half of each one's records after its last row, at most a
    thousand: what a busy worker settles between two rows)."""
    pids = iter(p for p in range(NOWHERE, NOWHERE - 10_000, -1) if not _runs(p))
    per = records // workers
    left = []
    for w in range(workers):
        stats = HostStats(EnergyStats(), where, flush_s=3600, area=256 * 1024,
                          server=ServerId(key, "bench", (1, None)))
        done = figures(per, offset=w * per)
        cut = per - min(per // 2, 1000)  # what a worker settles in about a second goes in its tail
        stats.settled(done[:cut])
        stats.flush()
        stats.settled(done[cut:])
        assert stats.folder is not None
        stats._stop.set()
        stats._due.set()
        left.append((stats.folder.rows.path, stats.folder.tail))
        stats.folder = None  # as if killed: nothing more written
    for row, tail in left:  # all at once, as if they died together: none folded yet
        tail.close(remove=False)
        name = f"{next(pids)}-1-0"
        row.rename(row.with_name(name + ".json"))
        tail.path.rename(tail.path.with_name(name + SUFFIX))


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def energy_time(workers: int, records: int, repeats: int) -> tuple[float, float, int, int]:
    """ms of ``snapshot("all")`` (median): unfolded, folded; requests counted; files."""
    where = place()
    key = f"bench-{os.getpid()}-{workers}-{records}"
    reader = HostStats(EnergyStats(), where, flush_s=3600,
                       server=ServerId(key, "bench", (os.getpid(), None)))
    if workers:
        dead_workers(where, key, workers, records)
    else:
        reader.settled(figures(records))
    assert reader.folder is not None
    t0 = time.perf_counter()
    counted = reader.snapshot("all")["totals"]["requests"]
    first = (time.perf_counter() - t0) * 1e3
    reader.flush()  # folds the dead
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        again = reader.snapshot("all")["totals"]["requests"]
        times.append((time.perf_counter() - t0) * 1e3)
    assert again == counted == records, (again, counted, records)
    files = len(os.listdir(reader.folder.folder))
    reader.close()
    return first, statistics.median(times), counted, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", default="10000,100000")
    parser.add_argument("--workers", default="0,10,100")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"# One server's statistics in files ({datetime.now(UTC):%Y-%m-%d})", "",
             f"Machine: {platform.node() or 'vm'}, {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}, {platform.platform()}. "
             f"Load average at start: {os.getloadavg()[0]:.2f}. "
             f"Command: `python benchmarks/books.py {' '.join(sys.argv[1:])}`.", ""]
    cost = per_record()
    lines += ["Per record, microseconds (medians of 10 rounds of 1,000 records; settled in batches "
              "of 10; then the row, as every flush_s or when the tail is half full):", "",
              "| place | answered (request path) | settled (reader thread) | the row, a record |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {a:.2f} | {s:.2f} | {w:.2f} |" for k, (a, s, w) in cost.items()]
    lines += ["", "`/energy` (`HostStats.snapshot(\"all\")`), ms: the first answer after the workers died "
              "(their files not folded yet), then the median of the answers after the fold:", "",
              "| records | dead workers | first answer | after the fold | requests counted | files left |",
              "|---|---|---|---|---|---|"]
    for records in (int(x) for x in args.records.split(",")):
        for workers in (int(x) for x in args.workers.split(",")):
            first, folded, counted, files = energy_time(workers, records, args.repeats)
            lines.append(f"| {records:,} | {workers} | {first:.1f} | {folded:.1f} | {counted:,} | {files} |")
            print(lines[-1], flush=True)
    lines.append(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
