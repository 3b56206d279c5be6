"""What the middleware costs an app, beside its peers, measured side by side in one run.

(a) In process: microseconds per request, calling each ASGI stack directly (no server, no
    sockets), for a JSON answer and for SSE streams of 10, 100 and 1000 chunks, plain and
    with ``"usage": null`` on every chunk (what an ``include_usage`` client gets). Variants
    run interleaved, several repeats; "added" is over the bare app in the same repeat, and
    medians are reported. A stream's added cost is split by least squares over the three
    lengths into a fixed part and a part per chunk.
(a') The JSON answer, each variant in a fresh process of its own (no other variant's reader
    beside it): the comparison of (a) to quote.
(a'') The JSON answer after 2 ms of waiting (an upstream's), 16 in flight, each variant in a
    fresh process of its own: CPU per request. A window of a millisecond or more gets a
    guessed first figure, as every LLM request's does; (a) and (a')'s of microseconds say
    unknown at once, a cheaper path than production's (``--waited-only`` runs this alone).
(b) Through uvicorn (httptools, uvloop) on 127.0.0.1: the trivial JSON app's requests/s
    each stack keeps, as a ratio of the bare app's, and server CPU per request, under wrk
    or autocannon (benchmarks/loadgen.py) where one is installed. Streams through a server are
    ``benchmarks/gateway.py``'s (a realistic proxying gateway).

    python benchmarks/overhead.py            # both parts
    python benchmarks/overhead.py --quick    # fewer repeats, for a smoke run

Ours runs twice, with its ledger live on a busy card and the energy block injected into
every JSON body: ``giul-asgi`` on the simulated reader, ``giul-asgi-nvml`` on the production
path (``Node(reader="nvml")`` over benchmarks/fake_pynvml: every NVML call a ctypes call
into C with the GIL released, tens of microseconds). This process is a server of its own,
as a single-process uvicorn is: its statistics and records stay in its memory.
``giul-asgi-nvml-workers`` is the same as one worker of a server of several (``uvicorn
--workers N``), writing them in the place for the others; ``giul-asgi-nvml-unshared``
shares nothing, not even the card's table. ``floor`` writes the same output
(eleven per-request headers and a block) without metering anything: the lean reference.
``--before DIR`` adds ``giul-asgi-nvml-before``: an earlier commit's package (``git archive
REV giul_asgi | tar -x -C DIR``) on the same path, in the same run, interleaved.

Besides wall time, each measurement takes the whole process's CPU (every thread, so the
reader thread's share is in it) and our reader thread's own (schedstat) over its requests
and, for ours, until the reader has settled their last windows (its busy-pace reads until
then included: an upper bound on its share); after our variants the loop idles
``--tail`` seconds, uncounted, so their readers' busy linger never runs into the next
variant's measurement. (The reader's cost is per second while busy, not per request: a
batch counts what it did while the batch ran, as a server under steady load would.)

The breakdown says where our JSON request's time goes on each path, the reader thread's CPU
and the GIL hand-overs it causes (reads, driver calls, how late the reader had the GIL back
after each, the main thread's off-CPU time and switches), and how many counter reads the
node got while 5,000 JSON requests ran back to back; each variant's breakdown runs in a
fresh process of its own, its node the only one there.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import loadgen
from _apps import BUILDERS, PATHS, PAYLOAD, prepare_before
from threads import main_thread_times, named_thread_times, process_thread_cpu


def scope_for(path: str) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "extensions": {},
    }


async def run_requests(app: Any, path: str, n: int) -> float:
    """Seconds per request, for ``n`` sequential requests through ``app``."""
    message = {"type": "http.request", "body": b"", "more_body": False}
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        # The request once; then, as a server does, wait for a disconnect that never comes.
        # (StreamingResponse listens on receive() for the whole stream.)
        if receive.sent:  # type: ignore[attr-defined]
            await never.wait()
        receive.sent = True  # type: ignore[attr-defined]
        return message

    async def send(_m: Any) -> None:
        return None

    scope = scope_for(path)
    start = time.perf_counter()
    for _ in range(n):
        receive.sent = False  # type: ignore[attr-defined]
        await app(dict(scope), receive, send)
        # Let background work run (our ledger's reads and settling) as a server's loop
        # would between requests, so its cost lands inside the timed loop.
        await asyncio.sleep(0)
    return (time.perf_counter() - start) / n


#: Variants timed; the reference rows first, then the peers, then ours.
TIMED: tuple[str, ...] = (
    "bare", "passthrough", "floor", "starlette-exporter", "prometheus-fastapi-instrumentator",
    "giul-asgi", "giul-asgi-nvml", "giul-asgi-nvml-workers", "giul-asgi-nvml-unshared",
)
PEERS: tuple[str, ...] = ("starlette-exporter", "prometheus-fastapi-instrumentator")
OURS: tuple[str, ...] = ("giul-asgi", "giul-asgi-nvml", "giul-asgi-nvml-workers", "giul-asgi-nvml-unshared")
BEFORE = "giul-asgi-nvml-before"
#: Our variants' reader threads (the node each reads: Thread name giul-reader-NODE).
READERS: dict[str, str] = {
    "giul-asgi": "giul-reader-sim", "giul-asgi-nvml": "giul-reader-gpu",
    BEFORE: "giul-reader-gpu-before", "giul-asgi-nvml-unshared": "giul-reader-gpu-unshared",
    "giul-asgi-nvml-workers": "giul-reader-gpu-workers",
}
#: Seconds the loop idles after our variants' requests (uncounted): longer than the reader's
#: busy linger (0.5 s), so it never runs into the next variant's measurement.
TAIL_S = 0.8
LENGTHS: tuple[int, ...] = (10, 100, 1000)


def kinds() -> dict[str, tuple[str, int]]:
    """Each timed kind: its path and the number of requests per measurement."""
    out = {"json": (PATHS["json"], 1)}
    for name in ("stream", "usage"):
        for n in LENGTHS:
            out[f"{name}-{n}"] = (PATHS[name].replace("{n}", str(n)), n)
    return out


Results = dict[str, dict[str, list[float]]]


async def in_process(
    variants: tuple[str, ...], repeats: int, scale: int, tail: float = TAIL_S
) -> tuple[Results, Results, Results]:
    """Seconds per request (wall), process CPU seconds per request (every thread), and our
    reader thread's CPU seconds per request, per kind and variant, ``repeats`` interleaved
    measurements."""
    apps = {v: BUILDERS[v]() for v in variants}
    results: Results = {}
    cpu: Results = {}
    reader: Results = {}
    for kind, (path, chunks) in kinds().items():
        n = max(3, scale // (chunks + 10))
        for v in variants:  # warm each stack (route caches, ledgers started)
            await run_requests(apps[v], path, max(3, n // 4))
        await asyncio.sleep(tail)
        results[kind], cpu[kind], reader[kind] = {}, {}, {}
        for _ in range(repeats):
            for v in variants:
                name = READERS.get(v)
                reader0 = named_thread_times(name, exact=True) if name else None
                cpu0 = time.process_time()
                results[kind].setdefault(v, []).append(await run_requests(apps[v], path, n))
                if name and reader0 is not None:
                    # The reader settles the last windows after the requests: what that
                    # costs is theirs (the loop only waits meanwhile), its lingering reads
                    # once all have settled are not.
                    await until_settled(apps[v], tail)
                    used = named_thread_times(name, exact=True).cpu_s - reader0.cpu_s
                    reader[kind].setdefault(v, []).append(used / n)
                cpu[kind].setdefault(v, []).append((time.process_time() - cpu0) / n)
                if name:
                    await asyncio.sleep(tail)  # its linger, uncounted
    return results, cpu, reader


async def until_settled(app: Any, limit: float) -> None:
    """Wait (``limit`` seconds at most) until every window on ``app``'s ledgers has settled
    and its figure has reached the listeners (the tray, where there is one, and the settled
    windows waiting to be handed over, empty too: until 2026-12-06 this stopped at settled,
    and a busy run's last batches were handed over, by the reader, after its CPU was taken)."""
    deadline = time.monotonic() + limit
    layer = app.middleware_stack
    while not hasattr(layer, "ledgers"):
        layer = layer.app
    ledgers = list(layer.ledgers)
    while time.monotonic() < deadline and any(
        ledger.book.unsettled or ledger.book.windows.n or getattr(ledger, "_tray", None)
        or getattr(ledger, "_handing", None)
        for ledger in ledgers
    ):
        await asyncio.sleep(0.005)


async def alone_here(variant: str, n: int, tail: float = TAIL_S) -> tuple[float, float]:
    """In this process, ``variant`` alone: (wall, process CPU) seconds per JSON request over
    ``n`` requests, the CPU until ours has settled their last windows (as in_process counts)."""
    app = BUILDERS[variant]()
    path = PATHS["json"]
    await run_requests(app, path, max(3, n // 4))  # builds the stack, starts the reader
    await asyncio.sleep(tail)
    cpu0 = time.process_time()
    wall = await run_requests(app, path, n)
    if variant in READERS:
        await until_settled(app, tail)
    return wall, (time.process_time() - cpu0) / n


#: (a''): what an answer waits for (its upstream), and how many are in flight at once.
WAITED_S = 0.002
IN_FLIGHT = 16


async def waited_here(variant: str, n: int, tail: float = TAIL_S) -> float:
    """In this process, ``variant`` alone: process CPU seconds per JSON request over ``n``
    answered each after :data:`WAITED_S` (an upstream's wait), :data:`IN_FLIGHT` at a time,
    ours until their last windows settled. A window that long gets a guessed first figure,
    as every LLM request's does; one of microseconds (part (a), (a')) says unknown, and is
    cheaper (benchmarks/opcodes.py: 3,517 against 4,437 opcodes over the bare app on its path)."""
    app = BUILDERS[variant]()
    path = PATHS["json-after"].replace("{n}", str(round(WAITED_S * 1e6)))

    async def in_flight(total: int) -> None:
        await asyncio.gather(*(run_requests(app, path, total // IN_FLIGHT) for _ in range(IN_FLIGHT)))

    await in_flight(max(IN_FLIGHT * 4, n // 4))  # builds the stack, starts the reader, teaches it
    await asyncio.sleep(tail)
    cpu0 = time.process_time()
    await in_flight(n)
    if variant in READERS:
        await until_settled(app, tail)
    return (time.process_time() - cpu0) / (n // IN_FLIGHT * IN_FLIGHT)


def _turns(variants: tuple[str, ...], repeats: int) -> Iterator[str]:
    """Each variant ``repeats`` times, interleaved: the order turned each repeat."""
    for r in range(repeats):
        yield from variants if r % 2 == 0 else reversed(variants)


def waited(variants: tuple[str, ...], repeats: int, n: int) -> Results:
    """:func:`waited_here`'s CPU per request, each variant in a fresh process of its own,
    ``repeats`` times, interleaved (the order turned each repeat)."""
    cpu: Results = {"json": {}}
    for v in _turns(variants, repeats):
        cpu["json"].setdefault(v, []).append(in_a_child("--waited", v, n))
    return cpu


def alone(variants: tuple[str, ...], repeats: int, n: int) -> tuple[Results, Results]:
    """JSON wall and CPU seconds per request, each variant in a fresh process of its own (no
    other variant's reader beside it), ``repeats`` times, interleaved (the order turned each
    repeat). In part (a) every variant shares one process: our nodes' readers, idle between
    their turns, read beside the peers' requests, and a thread of ours waiting for the GIL
    costs the loop a futex wake at every poll of its selector (giul_asgi.ledger.poller), so
    the peers' figures there carry some of ours."""
    wall: Results = {"json": {}}
    cpu: Results = {"json": {}}
    for v in _turns(variants, repeats):
        w, c = in_a_child("--alone", v, n)
        wall["json"].setdefault(v, []).append(w)
        cpu["json"].setdefault(v, []).append(c)
    return wall, cpu


def fit(lengths: list[int], added: list[float]) -> tuple[float, float]:
    """(fixed us, us per chunk): least squares of added time against the chunk count."""
    mx, my = statistics.fmean(lengths), statistics.fmean(added)
    sxx = sum((x - mx) ** 2 for x in lengths)
    slope = sum((x - mx) * (y - my) for x, y in zip(lengths, added, strict=True)) / sxx
    return my - slope * mx, slope


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER = """
import sys, uvicorn
sys.path.insert(0, {bench!r})
from _apps import build
from threads import name_os_threads
name_os_threads()  # the reader thread found from outside, for its share of the CPU
uvicorn.run(build({variant!r}), host="127.0.0.1", port={port}, log_level="error",
            access_log=False, http="httptools", loop="uvloop")
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU the server process has used (Linux /proc), or nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_servers(code_for: dict[str, str]) -> dict[str, tuple[subprocess.Popen[bytes], int]]:
    """One uvicorn process per label (``code_for[label]`` formatted with its port), warmed."""
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for label, code in code_for.items():
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-c", code.format(port=port)],
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
            )
            servers[label] = (proc, port)
        for _proc, port in servers.values():
            _wait_port(port)
            loadgen.rps(f"http://127.0.0.1:{port}/v1/chat/completions", 1, 16)  # warm
    except BaseException:
        stop(proc for proc, _port in servers.values())
        raise
    return servers


def measure(proc: subprocess.Popen[bytes], url: str, seconds: int) -> tuple[float, float, float]:
    """(requests/s, server CPU microseconds per request, of which our reader thread's) for
    one run of the load against ``url`` (the reader's: nan where the server has none)."""
    before, reader0 = cpu_seconds(proc.pid), process_thread_cpu(proc.pid, "giul-reader")
    rps, served = loadgen.rps(url, seconds, 16)
    per = 1e6 / max(served, 1)
    reader = (process_thread_cpu(proc.pid, "giul-reader") - reader0) * per
    return rps, (cpu_seconds(proc.pid) - before) * per, reader


def through_uvicorn(
    variants: tuple[str, ...], repeats: int, seconds: int
) -> tuple[Results, Results, Results]:
    """Requests/s, server CPU microseconds per request, and our reader thread's, per kind
    and variant.

    Every repeat starts fresh server processes: a process can run 20% fast or slow for its
    whole life on these VMs (where it lands in memory and on the cores), so one process per
    variant for all repeats would bake that luck into the medians.
    """
    bench = str(Path(__file__).parent)
    code_for = {v: SERVER.format(bench=bench, variant=v, port="{port}") for v in variants}
    results: Results = {"json": {}}
    cpu: Results = {"json": {}}
    reader: Results = {"json": {}}
    for _ in range(repeats):
        servers = start_servers(code_for)
        try:
            for kind in ("json",):
                path = PATHS[kind]
                for v, (proc, port) in servers.items():
                    rps, us, reader_us = measure(proc, f"http://127.0.0.1:{port}{path}", seconds)
                    results[kind].setdefault(v, []).append(rps)
                    cpu[kind].setdefault(v, []).append(us)
                    reader[kind].setdefault(v, []).append(reader_us)
        finally:
            stop(proc for proc, _port in servers.values())
    return results, cpu, reader


def stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Stop servers as a terminal would (SIGINT), all at once; kill what will not stop."""
    procs = list(procs)
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_port(port: int) -> None:
    # 60 s: on the shared 2-core VM at a load of 20-40, six servers importing FastAPI, uvicorn
    # and ours at once took longer than 20 s to listen (gateway.py, 2026-12-02).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not start")


def added_medians(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Median over repeats of (variant - bare in the same repeat), in us."""
    out: dict[str, dict[str, float]] = {}
    for kind, by_variant in results.items():
        bare = by_variant["bare"]
        out[kind] = {
            v: statistics.median(x - b for x, b in zip(times, bare, strict=True)) * 1e6
            for v, times in by_variant.items()
        }
    return out


def timed(fn: Any, n: int) -> float:
    """Microseconds per call of ``fn``: the least of three runs of ``n`` calls."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


async def _parts(app: Any, path: str, n: int, package: str = "giul_asgi") -> list[tuple[str, float, str]]:
    """Each part of our JSON request timed alone, on the objects ``app`` uses, after the
    reader has settled what came before (so its work does not land in the part's time; the
    window's open and close, which makes work for it, last). Reaches into the middleware's
    parts (router, ledger, meter): where they have moved, a row says so and the rest of the
    breakdown (the reader's share, the hand-overs) still runs."""
    try:
        return await _timed_parts(app, path, n, package)
    except Exception as exc:
        return [("parts", float("nan"), f"not timed: {type(exc).__name__}: {exc}")]


async def _timed_parts(app: Any, path: str, n: int, package: str) -> list[tuple[str, float, str]]:
    import importlib

    EnergyMiddleware = importlib.import_module(package).EnergyMiddleware
    Settled = importlib.import_module(f"{package}.listeners").Settled
    Meter = importlib.import_module(f"{package}.meter").Meter
    wire = importlib.import_module(f"{package}.wire")
    energy_headers, energy_json = wire.energy_headers, wire.energy_json
    parse_object, splice_object = wire.parse_object, wire.splice_object

    rows: list[tuple[str, float, str]] = []

    async def row(name: str, what: str, make: Any, per: int = 1) -> None:
        await asyncio.sleep(TAIL_S)
        try:
            rows.append((name, timed(make(), max(1, n // per)) / per, what))
        except Exception as exc:  # the part moved: say so, time the rest
            rows.append((name, float("nan"), f"not timed: {type(exc).__name__}: {exc}"))

    layer = app.middleware_stack
    while not isinstance(layer, EnergyMiddleware):
        layer = layer.app
    mw = layer
    scope = scope_for(path)
    target = mw.router.match(scope)
    ledger = mw.ledgers.get(target.node)
    body = json.dumps(PAYLOAD).encode()
    meter = Meter(ledger, target.tier, route=target.label)
    meter.open()
    meter.close()
    window = meter.window
    energy = meter.figure()

    def output() -> None:
        obj = parse_object(body)
        assert obj is not None
        energy_headers(energy)
        splice_object(body, obj, "energy", energy_json(energy))

    batch = [Settled(energy, "ok", 200, time.time())] * 16
    await row("route match", "Router.match", lambda: lambda: mw.router.match(scope))
    await row("figure (grade a share)", "Meter._grade -> energy.grade",
              lambda: (lambda share: lambda: meter._grade(share, window))(ledger.share(window)))
    await row("output", "parse, 11 headers, the block, the splice", lambda: output)
    await row("statistics, a record", "EnergyStats.settled, batches of 16",
              lambda: lambda: mw.stats.settled(batch), 16)
    await row("records by id, a record", "RecordStore.settled, batches of 16",
              lambda: lambda: mw.records.settled(batch), 16)
    def open_close_share() -> None:
        window = ledger.open()
        ledger.close(window)
        ledger.share(window)

    await row("window open + close + share", "Ledger.open/close/share on the busy card (the "
              "book takes the close by the share at the latest)", lambda: open_close_share)
    return rows


def _ledger_reads(app: Any) -> int | None:
    """Readings the app's one ledger has taken (``Ledger.totals().reads``), or None."""
    try:
        layer = app.middleware_stack
        while not hasattr(layer, "ledgers"):
            layer = layer.app
        return sum(ledger.totals().reads for ledger in layer.ledgers)
    except Exception:
        return None


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def handoffs(
    app: Any, path: str, n: int, nvml: bool, period: float = 0.1
) -> list[tuple[str, str, str]]:
    """What ``n`` JSON requests back to back cost beyond the loop, per request: the reader
    thread's CPU and switches, the main thread's time off the CPU that was not run-queue
    wait (waiting for the GIL or the ledger's lock), and on the NVML path the driver's calls
    and how late the reader had the GIL back after each. Rows: (what, value, how)."""
    import fake_pynvml

    driver = fake_pynvml.driver() if nvml else None
    await asyncio.sleep(TAIL_S)
    if driver is not None:
        driver.stats.reset()
    calls0 = driver.calls() if driver is not None else {}
    reads0 = _ledger_reads(app)
    reader0, main0 = named_thread_times("giul-reader-"), main_thread_times()
    t0 = time.perf_counter()
    t0_ns = time.monotonic_ns()
    await run_requests(app, path, n)
    wall = time.perf_counter() - t0
    t1_ns = time.monotonic_ns()
    main1, reader1 = main_thread_times(), named_thread_times("giul-reader-")
    reads1 = _ledger_reads(app)
    reader, main = reader1 - reader0, main1 - main0
    reads = "n/a" if reads0 is None or reads1 is None else \
        f"{reads1 - reads0} ({(reads1 - reads0) / (wall / period):.1f} a {period * 1000:.0f} ms period)"
    rows = [
        ("requests back to back", f"{n} in {wall:.2f} s", "run_requests: one loop, asyncio.sleep(0) between"),
        ("readings the ledger took", reads, "Ledger.totals().reads; the poller asks for 10 a period"),
        ("reader thread CPU, us a request", f"{reader.cpu_s / n * 1e6:.2f}",
         "schedstat of giul-reader-* (every node's) over the requests"),
        ("reader thread CPU, % of a core", f"{reader.cpu_s / wall * 100:.2f}",
         "the same over the requests' wall time: what a busy node's reader costs a second"),
        ("reader thread switches, a request", f"{reader.voluntary / n:.2f} voluntary, "
         f"{reader.involuntary / n:.3f} involuntary", "/proc/self/task/TID/status"),
        ("main thread off CPU, not queued, us a request",
         f"{(main.wall_s - main.cpu_s - main.queued_s) / n * 1e6:.2f}",
         "wall - CPU - run-queue wait (schedstat) over the requests: waits for the GIL or a lock"),
        ("main thread run-queue wait, us a request", f"{main.queued_s / n * 1e6:.2f}",
         "schedstat: runnable, no core free (2 cores, shared)"),
        ("main thread switches, a request", f"{main.voluntary / n:.3f} voluntary, "
         f"{main.involuntary / n:.3f} involuntary", "/proc/self/task/TID/status"),
    ]
    if driver is not None:
        calls = {k: v - calls0.get(k, 0) for k, v in driver.calls().items()}
        starts = [s for s in driver.stats.starts_ns if t0_ns <= s <= t1_ns]
        lags = [lag / 1000 for s, lag in zip(driver.stats.starts_ns, driver.stats.lags_ns, strict=True)
                if t0_ns <= s <= t1_ns]
        gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(starts)]
        rows += [
            ("counter reads during the requests", f"{len(starts)} ({len(starts) / (wall / period):.1f} "
             f"a {period * 1000:.0f} ms period)", "the driver's reading calls begun in the span"),
            ("driver calls, a request", f"{sum(calls.values()) / n:.3f}",
             ", ".join(f"{k} {v}" for k, v in sorted(calls.items()))),
            ("time between reads, ms", f"p50 {_q(gaps, .5):.1f}, p90 {_q(gaps, .9):.1f}, "
             f"max {max(gaps, default=float('nan')):.1f}", "asked: 10 ms x U(0.5, 1.5)"),
            ("GIL back after a driver call, us", f"p50 {_q(lags, .5):.0f}, p90 {_q(lags, .9):.0f}, "
             f"max {max(lags, default=float('nan')):.0f}",
             "from the call's deadline to Python running again on the reader thread"),
        ]
    return rows


Parts = list[tuple[str, float, str]]
Rows = list[tuple[str, str, str]]


async def breakdown_here(variant: str, n: int) -> tuple[Parts, Rows]:
    """In this process: ``variant``'s parts timed alone, the reader thread's share and the
    GIL hand-overs of ``n`` requests, then of 5,000 back to back."""
    path = PATHS["json"]
    app = BUILDERS[variant]()
    await run_requests(app, path, 200)  # builds the stack, starts the reader
    await asyncio.sleep(0.3)
    parts = await _parts(app, path, n, "giul_asgi_before" if variant == BEFORE else "giul_asgi")
    nvml = variant in ("giul-asgi-nvml", BEFORE)
    return parts, await handoffs(app, path, n, nvml) + await handoffs(app, path, 5000, nvml)


def breakdown(variant: str, n: int) -> tuple[Parts, Rows]:
    """:func:`breakdown_here` in a fresh process, so no other node's reader runs beside it."""
    parts, rows = in_a_child("--breakdown", variant, n)
    return [tuple(p) for p in parts], [tuple(r) for r in rows]  # type: ignore[misc]


def in_a_child(flag: str, variant: str, n: int) -> Any:
    """This script run again in a fresh process with ``flag variant`` and ``n``: what its last
    line of output says (JSON)."""
    out = subprocess.run(
        [sys.executable, __file__, flag, variant, "--parts-n", str(n)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-server", action="store_true", help="skip part (b)")
    parser.add_argument("--tail", type=float, default=TAIL_S,
                        help="seconds the loop idles after our variants' requests (the reader's "
                             "work in it is counted)")
    parser.add_argument("--before", metavar="DIR",
                        help="a folder holding an earlier commit's giul_asgi: timed beside ours")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the breakdowns")
    parser.add_argument("--server-only", action="store_true", help="part (b) alone")
    parser.add_argument("--breakdown", help=argparse.SUPPRESS)
    parser.add_argument("--alone", help=argparse.SUPPRESS)
    parser.add_argument("--waited", help=argparse.SUPPRESS)
    parser.add_argument("--waited-only", action="store_true",
                        help="part (a'') alone: JSON answered after an upstream's wait")
    parser.add_argument("--no-alone", action="store_true",
                        help="skip the JSON timings with each variant in a process of its own")
    parser.add_argument("--parts-n", type=int, default=20000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.breakdown:
        print(json.dumps(asyncio.run(breakdown_here(args.breakdown, args.parts_n))))
        return
    if args.alone:  # (an earlier copy is found as the parent's prepare_before() left it)
        print(json.dumps(asyncio.run(alone_here(args.alone, args.parts_n))))
        return
    if args.waited:
        print(json.dumps(asyncio.run(waited_here(args.waited, args.parts_n))))
        return
    repeats, scale = (3, 3000) if args.quick else (9, 20000)
    variants, ours = TIMED, OURS
    if args.before:
        prepare_before(args.before)
        variants, ours = (*TIMED, BEFORE), (*OURS, BEFORE)

    from giul_asgi.wire import body

    parser_name = "orjson" if body._fast_loads is not None else "json (stdlib)"
    print(f"# overhead: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (nproc), "
          f"Python {platform.python_version()}, body parser {parser_name}")
    print(f"\n    python benchmarks/overhead.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"\nLoad average at start: {_load()}")
    if args.server_only:
        server_part(variants, ours, args.quick)
        print(f"\nLoad average at end: {_load()}")
        return
    if args.waited_only:
        waited_part(variants, ours, args.quick)
        print(f"\nLoad average at end: {_load()}")
        return
    print(f"\n## (a) in process, median of {repeats} interleaved repeats\n")
    results, cpu_results, reader_results = asyncio.run(in_process(variants, repeats, scale, args.tail))
    med = added_medians(results)
    cpu_med = added_medians(cpu_results)
    reader_med = {k: {v: statistics.median(x) * 1e6 for v, x in by.items()}
                  for k, by in reader_results.items()}
    print("Added us per request over the bare app (bare: its own us per request).\n")
    kind_names = list(kinds())
    print("| variant | " + " | ".join(kind_names) + " |")
    print("|---|" + "---:|" * len(kind_names))
    for v in variants:
        if v == "bare":
            cells = [f"({statistics.median(results[k]['bare']) * 1e6:.1f})" for k in kind_names]
        else:
            cells = [f"{med[k][v]:.1f}" for k in kind_names]
        print(f"| {v} | " + " | ".join(cells) + " |")
    print("\nStreams, least squares over 10/100/1000 chunks: fixed us + us per chunk added.\n")
    print("| variant | plain fixed us | plain us/chunk | usage-null fixed us "
          "| usage-null us/chunk | whole 1000-chunk stream added us |")
    print("|---|---:|---:|---:|---:|---:|")
    fits: dict[str, dict[str, tuple[float, float]]] = {}
    for v in variants[1:]:
        fits[v] = {}
        for name in ("stream", "usage"):
            fits[v][name] = fit(list(LENGTHS), [med[f"{name}-{n}"][v] for n in LENGTHS])
        (pf, pc), (uf, uc) = fits[v]["stream"], fits[v]["usage"]
        print(f"| {v} | {pf:.1f} | {pc:.3f} | {uf:.1f} | {uc:.3f} "
              f"| {med['stream-1000'][v]:.0f} / {med['usage-1000'][v]:.0f} |")
    print("\nProcess CPU (every thread: the reader's share included, and for ours until it has "
          "settled the last windows) added per request over the bare app, us.\n")
    print("| variant | " + " | ".join(kind_names) + " |")
    print("|---|" + "---:|" * len(kind_names))
    for v in variants:
        if v == "bare":
            cells = [f"({statistics.median(cpu_results[k]['bare']) * 1e6:.1f})" for k in kind_names]
        else:
            cells = [f"{cpu_med[k][v]:.1f}" for k in kind_names]
        print(f"| {v} | " + " | ".join(cells) + " |")
    print("\nOf which our reader thread's CPU (schedstat, over the requests and until their last "
          "windows settled), us per request.\n")
    print("| variant | " + " | ".join(kind_names) + " |")
    print("|---|" + "---:|" * len(kind_names))
    for v in ours:
        print(f"| {v} | " + " | ".join(f"{reader_med[k][v]:.1f}" for k in kind_names) + " |")
    cpu_fits = {v: {name: fit(list(LENGTHS), [cpu_med[f"{name}-{n}"][v] for n in LENGTHS])
                    for name in ("stream", "usage")} for v in variants[1:]}
    cheapest, cheapest_cpu = min(med["json"][p] for p in PEERS), min(cpu_med["json"][p] for p in PEERS)
    cheapest_fixed = min(min(fits[p]["stream"][0], fits[p]["usage"][0]) for p in PEERS)
    print()
    for v in ours:
        mine, mine_cpu = med["json"][v], cpu_med["json"][v]
        print(f"JSON, {v}: adds {mine:.1f} us wall, {mine_cpu:.1f} us CPU (reader "
              f"{reader_med['json'][v]:.1f}); the cheapest peer {cheapest:.1f} / {cheapest_cpu:.1f}: "
              f"ratio {mine / cheapest:.2f} wall, {mine_cpu / cheapest_cpu:.2f} CPU (target <= 1.0); "
              f"floor {med['json']['floor']:.1f} us.")
        for name in ("stream", "usage"):
            fixed, per = fits[v][name]
            whole, exporter = med[f"{name}-1000"][v], med[f"{name}-1000"]["starlette-exporter"]
            print(f"  {name}: {per:.3f} us a chunk wall, {cpu_fits[v][name][1]:.3f} CPU (target <= 0.25), "
                  f"fixed {fixed:.1f} us (target <= the cheapest peer's, {cheapest_fixed:.1f}), whole "
                  f"1000-chunk stream {whole:.0f} us vs starlette-exporter's {exporter:.0f}.")

    if not args.no_alone:
        alone_repeats, alone_n = (3, 3000) if args.quick else (repeats, 10000)
        a_wall, a_cpu = alone(variants, alone_repeats, alone_n)
        a_med, a_cpu_med = added_medians(a_wall)["json"], added_medians(a_cpu)["json"]
        print(f"\n## (a') JSON, each variant in a fresh process of its own, {alone_n} requests, "
              f"median of {alone_repeats} interleaved repeats\n")
        print("No other variant's reader runs beside it (see benchmarks/overhead.py's alone()).\n")
        print("| variant | added wall us | added CPU us (every thread) |")
        print("|---|---:|---:|")
        for v in variants:
            if v == "bare":
                print(f"| bare | ({statistics.median(a_wall['json']['bare']) * 1e6:.1f}) "
                      f"| ({statistics.median(a_cpu['json']['bare']) * 1e6:.1f}) |")
            else:
                print(f"| {v} | {a_med[v]:.1f} | {a_cpu_med[v]:.1f} |")
        alone_peer = min(a_med[p] for p in PEERS)
        alone_peer_cpu = min(a_cpu_med[p] for p in PEERS)
        print()
        for v in ours:
            print(f"JSON alone, {v}: adds {a_med[v]:.1f} us wall, {a_cpu_med[v]:.1f} us CPU; the "
                  f"cheapest peer {alone_peer:.1f} / {alone_peer_cpu:.1f}: ratio "
                  f"{a_med[v] / alone_peer:.2f} wall, {a_cpu_med[v] / alone_peer_cpu:.2f} CPU "
                  "(target <= 1.0).")

    if not args.no_alone:
        waited_part(variants, ours, args.quick)

    n_parts = 3000 if args.quick else 20000
    for variant in () if args.no_breakdown else ours:
        parts, rows = breakdown(variant, n_parts)
        print(f"\nWhere {variant}'s JSON request's time goes: each part timed alone (least of 3).\n")
        print("| part | us | what |")
        print("|---|---:|---|")
        for name, us, what in parts:
            print(f"| {name} | {us:.2f} | {what} |")
        print(f"\n{variant}: the reader thread's share and the hand-overs, {n_parts} requests, then "
              "5,000 (the second block).\n")
        print("| what | measured | how |")
        print("|---|---|---|")
        for what, value, how in rows:
            print(f"| {what} | {value} | {how} |")

    if args.no_server:
        print(f"\nLoad average at end: {_load()}")
        return
    server_part(variants, ours, args.quick)
    print(f"\nLoad average at end: {_load()}")


def server_part(variants: tuple[str, ...], ours: tuple[str, ...], quick: bool) -> None:
    """Part (b): the trivial JSON app through uvicorn, under the load generator."""
    if loadgen.tool() is None:
        print("\n(b) skipped: no load generator (apt-get install wrk, or npm install -g autocannon)")
        return
    seconds = 2 if quick else 3
    server_repeats = 2 if quick else 7
    print(f"\n## (b) trivial JSON app through uvicorn (httptools, uvloop) on 127.0.0.1, "
          f"{loadgen.describe(seconds)}, median of {server_repeats} interleaved repeats\n")
    print(f"Load average now: {_load()}\n")
    rps, cpu, reader = through_uvicorn(variants, server_repeats, seconds)
    print("Ratios are medians of the per-repeat ratios to the bare app measured next to it; "
          "CPU is the server process's user + system time per request served (every thread), "
          "the reader's its own thread's.\n")
    print("| variant | JSON req/s | vs bare | server CPU us/request | of which our reader's |")
    print("|---|---:|---:|---:|---:|")
    for v in variants:
        ratios = [x / b for x, b in zip(rps["json"][v], rps["json"]["bare"], strict=True)]
        mine = statistics.median(reader["json"][v]) if v in ours else float("nan")
        print(f"| {v} | {statistics.median(rps['json'][v]):.0f} | "
              f"{statistics.median(ratios):.2f} | {statistics.median(cpu['json'][v]):.0f} | "
              f"{'' if v not in ours else f'{mine:.1f}'} |")
    print("\nTarget: ours keeps at least the cheapest peer's share of the bare app's req/s.")


def waited_part(variants: tuple[str, ...], ours: tuple[str, ...], quick: bool) -> None:
    """Part (a''): JSON answered after an upstream's wait, :func:`waited`, printed."""
    repeats, n = (3, 1600) if quick else (7, 8000)
    cpu = waited(variants, repeats, n)
    med = added_medians(cpu)["json"]
    print(f"\n## (a'') JSON answered after {WAITED_S * 1e3:g} ms (an upstream's wait), {IN_FLIGHT} in "
          f"flight, each variant in a fresh process of its own, {n} requests, median of {repeats} "
          "interleaved repeats\n")
    print("Every window lasts long enough for a guessed first figure, as an LLM request's does: the "
          "production path.\n")
    print("| variant | added CPU us (every thread) |")
    print("|---|---:|")
    for v in variants:
        if v == "bare":
            print(f"| bare | ({statistics.median(cpu['json']['bare']) * 1e6:.1f}) |")
        else:
            print(f"| {v} | {med[v]:.1f} |")
    peer = min(med[p] for p in PEERS)
    print()
    for v in ours:
        print(f"JSON after a wait, {v}: adds {med[v]:.1f} us CPU; the cheapest peer {peer:.1f}: ratio "
              f"{med[v] / peer:.2f} (target <= 1.0).")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


if __name__ == "__main__":
    main()
