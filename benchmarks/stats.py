"""What the statistics cost: per record, in memory, and per /energy read; and the sketch A/B.

Records spread over 200 label keys (50 routes x 4 nodes, one tier each), joules lognormal
(5% unknown), drawn from a pool of 100,000 figures, on a simulated clock covering the same
5000 s (83 min: every ring full) at both sizes, so the two sizes differ only in how many
requests were recorded. Each size runs in fresh processes:

* record: four ways of feeding, interleaved lap by lap on statistics fed the same stream,
  medians of 20 laps: ``settled()`` batches of 10 and of 50 (what a reader thread hands
  over: one reading settles the windows that closed since the last), ``record()`` one at a
  time, and batches of 10 with a Prometheus scrape (``counters()``) every 15 simulated
  seconds, timed apart (a reader then folds the past steps, not the recording thread);
  ``loop`` is the batch-of-10 loop calling a listener that does nothing (the harness's own
  cost, included in the others);
* memory: one statistics fed in batches of 10: what it holds (keys, cells, bins, against
  the bound it states) and VmRSS growth;
* /energy: ``EnergyEndpoint.snapshot`` plus JSON per window: the first read (nothing
  merged yet: a fresh process, or a HostStats view merged from files), and the reads after
  (median of 5, one step of traffic recorded between reads, as a page refreshing).

The sketch A/B compares the ``ddsketch`` library's public API with the fixed log-bucket
histogram of giul_asgi.stats.sketch, and the bin computation inlined in ``Cell.add`` with a
call to ``sketch.bin_of`` per value, interleaved, medians of 7.

    python benchmarks/stats.py            # writes the table to stdout
    python benchmarks/stats.py --quick    # 1e4 and 1e5 records, fewer repeats
    python benchmarks/stats.py --against 998a4ec   # an earlier commit's statistics beside now's
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from giul_asgi.stats.cell import NJ, US
from giul_asgi.stats.sketch import JPT, SEC, bin_of

SPAN_S = 5000.0
POOL = 100_000
LAPS = 20
TARGET_RECORD_US = 2.0
TARGET_READ_MS = 50.0
SCRAPE_S = 15.0  # a Prometheus scrape (counters(), which folds the past steps) every 15 s


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def pool() -> list[Any]:
    from giul_asgi.energy import Energy
    from giul_asgi.listeners import Settled

    rng = random.Random(1)
    out = []
    for _ in range(POOL):
        key = rng.randrange(200)
        out.append(Settled(
            Energy(rng.lognormvariate(3, 1.2) if rng.random() > 0.05 else None, "measured",
                   node=f"gpu{key // 50}", tier=f"tier{key // 50}", route=f"/v1/route{key % 50}",
                   seconds=rng.uniform(0.05, 3), tokens=rng.randint(1, 800), contended=False),
            "ok", 200))
    return out


class Nothing:
    def settled(self, batch: Any) -> None:
        pass


def record_cost(n: int) -> dict[str, Any]:
    """Per-record microseconds of each way of feeding, interleaved lap by lap."""
    from giul_asgi.stats import EnergyStats

    figures = pool()
    clock = [1_800_000_000.0]
    now = lambda: clock[0]  # noqa: E731
    # way -> (statistics, batch size, seconds between scrapes: counters() folds, as a reader)
    ways: dict[str, tuple[Any, int, float | None]] = {
        "batch 10": (EnergyStats(clock=now), 10, None),
        "batch 50": (EnergyStats(clock=now), 50, None),
        "record()": (EnergyStats(clock=now), 1, None),
        "batch 10, scraped": (EnergyStats(clock=now), 10, SCRAPE_S),
        "loop": (Nothing(), 10, None),
    }
    laps: dict[str, list[float]] = {w: [] for w in ways}
    reads: list[float] = []  # ms a scrape
    chunk = n // LAPS
    start = clock[0]
    for lap in range(LAPS):
        for way, (stats, size, scrape_s) in ways.items():
            dt = SPAN_S / n * size
            clock[0] = start + lap * chunk * SPAN_S / n
            next_scrape = clock[0] + (scrape_s or math.inf)
            first = lap * chunk
            spent = 0.0
            if way == "record()":
                record = stats.record
                t0 = time.perf_counter()
                for i in range(first, first + chunk):
                    clock[0] += dt
                    s = figures[i % POOL]
                    record(s.energy, outcome=s.outcome, status=s.status)
                spent = time.perf_counter() - t0
            elif scrape_s is None:
                settled = stats.settled
                t0 = time.perf_counter()
                for i in range(first, first + chunk, size):
                    clock[0] += dt
                    k = i % POOL
                    settled(figures[k:k + size])
                spent = time.perf_counter() - t0
            else:
                settled = stats.settled
                for i in range(first, first + chunk, size):
                    clock[0] += dt
                    k = i % POOL
                    t0 = time.perf_counter()
                    settled(figures[k:k + size])
                    spent += time.perf_counter() - t0
                    if clock[0] >= next_scrape:
                        next_scrape += scrape_s
                        t0 = time.perf_counter()
                        stats.counters()
                        reads.append((time.perf_counter() - t0) * 1e3)
            laps[way].append(spent / chunk * 1e6)
    dropped = sum(s.dropped for s, _, _ in ways.values() if hasattr(s, "dropped"))
    return {"n": n, "us": {w: statistics.median(v) for w, v in laps.items()},
            "us_max": {w: max(v) for w, v in laps.items()}, "dropped": dropped,
            "scrape_ms": statistics.median(reads) if reads else math.nan,
            "scrape_max_ms": max(reads) if reads else math.nan,
            "scrapes_per_record": len(reads) / n}


def memory_and_reads(n: int) -> dict[str, Any]:
    """What one statistics holds after ``n`` records, and what /energy reads cost."""
    from giul_asgi.serve.endpoint import EnergyEndpoint, _dumps
    from giul_asgi.stats import EnergyStats

    figures = pool()
    before = rss_kib()
    clock = [1_800_000_000.0]
    stats = EnergyStats(clock=lambda: clock[0])
    dt = SPAN_S / n * 10
    for i in range(0, n, 10):
        clock[0] += dt
        k = i % POOL
        stats.settled(figures[k:k + 10])
    grown = rss_kib() - before
    size, bound = stats.size(), stats.bound()

    class Totals:
        def __init__(self, k: int) -> None:
            self.node, self.reads = f"gpu{k}", 10
            self.measured_j, self.charged_j, self.unattributed_j = 1e5, 9e4, 1e4

    class Ledger:
        def __init__(self, k: int) -> None:
            self.t = Totals(k)

        def totals(self) -> Totals:
            return self.t

    endpoint = EnergyEndpoint(stats=stats, ledgers=[Ledger(k) for k in range(4)])
    windows = ("1m", "15m", "1h", "all")

    def read(window: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        body = _dumps(endpoint.snapshot(window))
        return (time.perf_counter() - t0) * 1e3, len(body)

    # A reader thread keeps recording (batches of 10, a millisecond apart) while the first
    # reads run: how long one of its batches waited, at worst (the GIL's switch interval,
    # 5 ms, included).
    import threading

    waits: list[float] = []
    stop = threading.Event()

    def recording() -> None:
        k = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            stats.settled(figures[k:k + 10])
            waits.append((time.perf_counter() - t0) * 1e3)
            k = (k + 10) % POOL
            time.sleep(0.001)

    recorder = threading.Thread(target=recording)
    recorder.start()
    try:
        first = {w: read(w)[0] for w in windows}
    finally:
        stop.set()
        recorder.join()
    after: dict[str, list[float]] = {w: [] for w in windows}
    per_step = max(10, round(n / SPAN_S * stats.step_s))
    body = 0
    i = n
    for _ in range(5):
        for _ in range(0, per_step, 10):  # one step of traffic between reads
            clock[0] += dt
            k = i % POOL
            stats.settled(figures[k:k + 10])
            i += 10
        for w in windows:
            ms, body = read(w)
            after[w].append(ms)
    # A HostStats answers from a view merged from the workers' states: every read is a first.
    t0 = time.perf_counter()
    state = stats.state()
    text = json.dumps(state, separators=(",", ":"))
    state_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    view = stats.empty_like()
    view.merge_state(state)
    merge_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    _dumps(view.snapshot("15m"))
    view_ms = (time.perf_counter() - t0) * 1e3
    return {"n": n, "rss_mib": grown / 1024, "size": size, "bound": bound,
            "first_ms": first, "batch_wait_max_ms": max(waits, default=math.nan),
            "batches_during_first": len(waits),
            "after_ms": {w: statistics.median(v) for w, v in after.items()},
            "after_max_ms": {w: max(v) for w, v in after.items()}, "bytes": body,
            "state_bytes": len(text), "state_ms": state_ms,
            "merge_ms": merge_ms, "view_15m_ms": view_ms}


def sketch_ab(repeats: int) -> dict[str, Any]:
    """The ddsketch library (public API) against the log-bucket histogram, interleaved."""
    import tracemalloc

    from ddsketch import DDSketch

    from giul_asgi.stats.cell import Cell
    from giul_asgi.stats.sketch import J, bin_of, quantiles

    rng = random.Random(2)
    values = [rng.lognormvariate(3, 1.2) for _ in range(30_000)]
    triples = [(v, rng.randint(1, 800), rng.uniform(0.05, 3)) for v in values]

    def dd_add() -> float:
        sketch = DDSketch(0.01)
        add = sketch.add
        t0 = time.perf_counter()
        for v in values:
            add(v)
        return (time.perf_counter() - t0) / len(values) * 1e6

    def ours_add() -> float:
        bins: dict[int, int] = {}
        get = bins.get
        t0 = time.perf_counter()
        for v in values:
            k = bin_of(v)
            bins[k] = get(k, 0) + 1
        return (time.perf_counter() - t0) / len(values) * 1e6

    def dd_record() -> float:  # a record's three sketches, as a cell keeps them
        j, jpt, sec = DDSketch(0.01), DDSketch(0.01), DDSketch(0.01)
        t0 = time.perf_counter()
        for v, tok, s in triples:
            j.add(v)
            jpt.add(v / tok)
            sec.add(s)
        return (time.perf_counter() - t0) / len(triples) * 1e6

    def cell_record() -> float:
        cell = Cell()
        add = cell.add
        t0 = time.perf_counter()
        for v, tok, s in triples:
            add(v, tok, s, False)
        return (time.perf_counter() - t0) / len(triples) * 1e6

    def cell_record_calling() -> float:  # Cell.add with a call to bin_of per value
        cell = Cell()
        add = _add_calling_bin_of
        t0 = time.perf_counter()
        for v, tok, s in triples:
            add(cell, v, tok, s, False)
        return (time.perf_counter() - t0) / len(triples) * 1e6

    def merge(kind: str) -> float:
        parts = [values[i::100] for i in range(100)]  # 100 slots of 300 values
        if kind == "dd":
            sketches = []
            for part in parts:
                s = DDSketch(0.01)
                for v in part:
                    s.add(v)
                sketches.append(s)
            t0 = time.perf_counter()
            total = DDSketch(0.01)
            for s in sketches:
                total.merge(s)
        else:
            cells = []
            for part in parts:
                c = Cell()
                for v in part:
                    c.add(v, None, 1.0, False)
                cells.append(c)
            t0 = time.perf_counter()
            merged = Cell()
            for c in cells:
                merged.merge(c)
        return (time.perf_counter() - t0) / len(parts) * 1e6

    runs: dict[str, list[float]] = {k: [] for k in (
        "ddsketch add", "histogram add", "ddsketch 3 adds", "Cell.add", "Cell.add calling bin_of",
        "ddsketch merge", "Cell.merge")}
    for _ in range(repeats):
        runs["ddsketch add"].append(dd_add())
        runs["histogram add"].append(ours_add())
        runs["ddsketch 3 adds"].append(dd_record())
        runs["Cell.add"].append(cell_record())
        runs["Cell.add calling bin_of"].append(cell_record_calling())
        runs["ddsketch merge"].append(merge("dd"))
        runs["Cell.merge"].append(merge("ours"))

    def held(make: Any) -> float:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(100)]
        size = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
        tracemalloc.stop()
        return size

    few = values[:10]

    def dd_few() -> Any:
        s = DDSketch(0.01)
        for v in few:
            s.add(v)
        return s

    def ours_few() -> Any:
        bins: dict[int, int] = {}
        for v in few:
            k = bin_of(v)
            bins[k] = bins.get(k, 0) + 1
        return bins

    def cell_of(add: Any) -> Any:  # a slot of 100 records
        cell = Cell()
        for v, tok, sec in triples[:100]:
            add(cell, v, tok, sec, False)
        return cell

    cell_bytes = {"shared keys": held(lambda: cell_of(Cell.add)),
                  "own int keys": held(lambda: cell_of(_add_calling_bin_of))}

    exact = sorted(values)
    dd = DDSketch(0.01)
    bins: dict[int, int] = {}
    for v in values:
        dd.add(v)
        k = bin_of(v)
        bins[k] = bins.get(k, 0) + 1
    qs = (0.5, 0.9, 0.99)
    ours_q = quantiles(bins, J, qs)
    truth = [exact[round(q * (len(exact) - 1))] for q in qs]
    theirs = [float(dd.get_quantile_value(q) or math.nan) for q in qs]
    err = {"ddsketch": max(abs(v / t - 1) for v, t in zip(theirs, truth, strict=True)),
           "histogram": max(abs((v or math.nan) / t - 1) for v, t in zip(ours_q, truth, strict=True))}
    return {"us": {k: statistics.median(v) for k, v in runs.items()},
            "bytes_10_values": {"ddsketch": held(dd_few), "histogram": held(ours_few)},
            "cell_bytes": cell_bytes,
            "worst_quantile_error": err}


def _add_calling_bin_of(cell: Any, joules: float | None, tokens: int | None, seconds: float,
                        contended: bool | None) -> None:
    """Cell.add as it would read with one call to sketch.bin_of per value (the A/B's B)."""
    if not 0.0 <= seconds < math.inf:
        seconds = 0.0
    ks = SEC + bin_of(seconds if seconds > 1e-6 else 1e-6)
    if tokens is not None and not (isinstance(tokens, int) and tokens > 0):
        tokens = None
    bins = cell.bins
    if joules is not None and 0.0 < joules < math.inf:
        nj = int(joules * NJ + 0.5)
        kj = bin_of(joules)
        if tokens:
            kt = JPT + bin_of(joules / tokens)
            cell.tok_nj += nj
            cell.tok_tokens += tokens
            bins[kt] = bins.get(kt, 0) + 1
        cell.known += 1
        cell.nj += nj
        bins[kj] = bins.get(kj, 0) + 1
    if tokens:
        cell.tokens += tokens
    if contended is True:
        cell.contended += 1
    cell.requests += 1
    cell.us += int(seconds * US + 0.5)
    bins[ks] = bins.get(ks, 0) + 1


def against(kind: str, n: int) -> dict[str, Any]:
    """Today's package, or the single-module statistics of an earlier commit (``kind`` is the
    path of that module, written out of git), fed the same stream: record, RSS, 1h reads."""
    figures = pool()
    before = rss_kib()
    clock = [1_800_000_000.0]
    if kind == "now":
        from giul_asgi.stats import EnergyStats

        stats: Any = EnergyStats(clock=lambda: clock[0])
        dt = SPAN_S / n * 10
        t0 = time.perf_counter()
        for i in range(0, n, 10):
            clock[0] += dt
            k = i % POOL
            stats.settled(figures[k:k + 10])
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("giul_asgi.stats_then", kind)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        stats = module.EnergyStats(clock=lambda: clock[0])
        record = stats.record
        dt = SPAN_S / n
        t0 = time.perf_counter()
        for i in range(n):  # it records one at a time
            clock[0] += dt
            s = figures[i % POOL]
            record(s.energy, outcome=s.outcome, status=s.status)
    us = (time.perf_counter() - t0) / n * 1e6
    grown = (rss_kib() - before) / 1024
    t0 = time.perf_counter()
    stats.snapshot("1h")
    first = (time.perf_counter() - t0) * 1e3
    after = []
    for _ in range(5):
        t0 = time.perf_counter()
        stats.snapshot("1h")
        after.append((time.perf_counter() - t0) * 1e3)
    return {"us": us, "rss_mib": grown, "first_ms": first, "after_ms": statistics.median(after)}


def compare(rev: str) -> None:
    """``--against REV``: the statistics of commit REV (giul_asgi/stats.py there) beside now's."""
    import tempfile

    root = Path(__file__).parent.parent
    source = subprocess.run(["git", "show", f"{rev}:giul_asgi/stats.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    source = source.replace("from .errors import", "from giul_asgi.errors import")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    lines = [f"## Against {rev} (same stream; one process each; theirs one record() at a time, "
             "ours in batches of 10, unscraped)", "",
             "| records | | us a record | RSS growth MiB | first 1h read ms | later 1h reads ms |",
             "|---:|---|---:|---:|---:|---:|"]
    for n in (100_000, 1_000_000):
        for kind, name in ((f.name, rev), ("now", "now")):
            r = _run("--against-one", kind, str(n))
            lines.append(f"| {n:,} | {name} | {r['us']:.2f} | {r['rss_mib']:.1f} "
                         f"| {r['first_ms']:.1f} | {r['after_ms']:.1f} |")
    os.unlink(f.name)
    print("\n".join(lines))


def _run(*args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] in ("--record", "--memory"):
        n = int(sys.argv[2])
        print(json.dumps(record_cost(n) if sys.argv[1] == "--record" else memory_and_reads(n)))
        return
    if len(sys.argv) > 3 and sys.argv[1] == "--against-one":
        print(json.dumps(against(sys.argv[2], int(sys.argv[3]))))
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--against":
        compare(sys.argv[2])
        return
    quick = "--quick" in sys.argv
    sizes = (10_000, 100_000) if quick else (100_000, 1_000_000)
    load_before = os.getloadavg()
    started = datetime.now(UTC)
    records = [_run("--record", str(n)) for n in sizes]
    reads = [_run("--memory", str(n)) for n in sizes]
    ab = sketch_ab(3 if quick else 7)
    load_after = os.getloadavg()
    uname = " ".join(platform.uname())
    lines = [
        f"# benchmarks/stats.py, {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"`uname -a`: {uname}; `nproc`: {os.cpu_count()}; Python {platform.python_version()}. "
        f"Load average (1, 5, 15 min) {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f} before, {load_after[0]:.2f} {load_after[1]:.2f} "
        f"{load_after[2]:.2f} after: a shared machine.",
        "",
        f"200 label keys (50 routes x 4 nodes), {SPAN_S:.0f} s simulated at both sizes (every ring "
        "full); one fresh process per size and part.",
        "",
        "## Record: us a record (median of 20 interleaved laps; slowest lap in brackets)",
        "",
        f"Target: <= {TARGET_RECORD_US} us amortised at 1e6 records over 200 keys.",
        "",
        "| records | settled(), batches of 10 | batches of 50 | record(), one at a time "
        f"| batches of 10, scraped every {SCRAPE_S:.0f} s | loop alone (in the others) "
        "| scrape ms (slowest) | scrape's share a record | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        us, mx = r["us"], r["us_max"]
        cells = [f"{us[w]:.2f} ({mx[w]:.2f})"
                 for w in ("batch 10", "batch 50", "record()", "batch 10, scraped", "loop")]
        share = r["scrape_ms"] * 1e3 * r["scrapes_per_record"]
        lines.append(f"| {r['n']:,} | " + " | ".join(cells)
                     + f" | {r['scrape_ms']:.1f} ({r['scrape_max_ms']:.1f}) | {share:.2f} us "
                     f"| {r['dropped']} |")
    lines += [
        "",
        "Unscraped, the recording thread folds each key's past steps into the windows itself "
        "(once nobody has read for two of the widest slots); scraped, the reader does it, and "
        "its share is in the last columns.",
    ]
    lines += [
        "",
        "## Memory: what one statistics holds (batches of 10), against the bound it states",
        "",
        "| records | keys | cells | most cells a key | bins | most bins a cell | RSS growth MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in reads:
        s = m["size"]
        lines.append(f"| {m['n']:,} | {s['keys']} | {s['cells']:,} | {s['most_cells_a_key']} "
                     f"| {s['bins']:,} | {s['most_bins_a_cell']} | {m['rss_mib']:.1f} |")
    b = reads[0]["bound"]
    lines += [
        f"| bound | {b['keys']:,} (max_keys + 140) | keys x {b['most_cells_a_key']} "
        f"| {b['most_cells_a_key']} | cells x {b['most_bins_a_cell']:,} | {b['most_bins_a_cell']:,} | |",
        "",
        "## /energy: ms a read (snapshot + JSON)",
        "",
        f"Target: <= {TARGET_READ_MS:.0f} ms. First: nothing merged yet (a fresh process). After: "
        "median of 5 reads with a step of traffic between them (slowest in brackets). "
        "HostStats: a worker's state() and its JSON (what it writes every flush_s when it "
        "changed), then merging it into a fresh view and that view's first 15m read (what "
        "every /energy read of a HostStats does, per worker).",
        "",
        "| records | first 1m | first 15m | first 1h | first all | after 1m | after 15m "
        "| after 1h | after all | JSON bytes | HostStats: state + JSON ms | state bytes "
        "| merge + 15m ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in reads:
        f, a, ax = m["first_ms"], m["after_ms"], m["after_max_ms"]
        lines.append(
            f"| {m['n']:,} | " + " | ".join(f"{f[w]:.1f}" for w in ("1m", "15m", "1h", "all"))
            + " | " + " | ".join(f"{a[w]:.1f} ({ax[w]:.1f})" for w in ("1m", "15m", "1h", "all"))
            + f" | {m['bytes']:,} | {m['state_ms']:.0f} | {m['state_bytes']:,} "
            f"| {m['merge_ms']:.0f} + {m['view_15m_ms']:.0f} |")
    lines += ["", "While the first reads ran, a thread recording batches of 10 a millisecond apart "
              "waited at most " + ", ".join(
                  f"{m['batch_wait_max_ms']:.1f} ms ({m['batches_during_first']} batches, "
                  f"{m['n']:,} records)" for m in reads) + " for one batch (GIL included)."]
    us = ab["us"]
    lines += [
        "",
        "## Sketch A/B (interleaved, medians of 7)",
        "",
        "| | ddsketch 3.0 public API | log-bucket histogram (ours) |",
        "|---|---:|---:|",
        f"| us to add one value | {us['ddsketch add']:.3f} | {us['histogram add']:.3f} |",
        f"| us to count a record's three values | {us['ddsketch 3 adds']:.3f} (3 x DDSketch.add) "
        f"| {us['Cell.add']:.3f} (Cell.add, counters included) |",
        f"| us to merge a 300-value slot | {us['ddsketch merge']:.1f} | {us['Cell.merge']:.1f} "
        "(three sketches and the counters) |",
        f"| bytes held by a sketch of 10 values | {ab['bytes_10_values']['ddsketch']:,.0f} "
        f"| {ab['bytes_10_values']['histogram']:,.0f} |",
        f"| worst p50/p90/p99 error on 30,000 lognormal values | "
        f"{ab['worst_quantile_error']['ddsketch']:.2%} | {ab['worst_quantile_error']['histogram']:.2%} |",
        "",
        f"Bins inlined in Cell.add: {us['Cell.add']:.3f} us a record; calling sketch.bin_of per "
        f"value: {us['Cell.add calling bin_of']:.3f} us. A cell of 100 records keyed with the "
        f"shared bin ints (sketch.KEYS): {ab['cell_bytes']['shared keys']:,.0f} bytes; with an "
        f"int object of its own per bin: {ab['cell_bytes']['own int keys']:,.0f} bytes.",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
