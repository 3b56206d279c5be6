"""What the middleware costs an app, beside its peers, measured side by side in one run.

(a) In process: microseconds per request, calling each ASGI stack directly (no server, no
    sockets), for a JSON answer and for SSE streams of 10, 100 and 1000 chunks, plain and
    with ``"usage": null`` on every chunk (what an ``include_usage`` client gets). Variants
    run interleaved, several repeats; "added" is over the bare app in the same repeat, and
    medians are reported. A stream's added cost is split by least squares over the three
    lengths into a fixed part and a part per chunk.
(b) Through uvicorn (httptools, uvloop) on 127.0.0.1: the trivial JSON app's requests/s
    each stack keeps, as a ratio of the bare app's, and server CPU per request, with wrk
    (Debian package ``wrk``) when installed. Streams through a server are
    ``benchmarks/gateway.py``'s (a realistic proxying gateway).

    python benchmarks/overhead.py            # both parts
    python benchmarks/overhead.py --quick    # fewer repeats, for a smoke run

Our variant runs with its ledger live on a busy simulated card and the energy block
injected into every JSON body; ``floor`` writes the same output (eleven per-request
headers and a block) without metering anything: the ``lean`` reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _apps import BUILDERS, PATHS, PAYLOAD


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
    "giul-asgi",
)
PEERS: tuple[str, ...] = ("starlette-exporter", "prometheus-fastapi-instrumentator")
LENGTHS: tuple[int, ...] = (10, 100, 1000)


def kinds() -> dict[str, tuple[str, int]]:
    """Each timed kind: its path and the number of requests per measurement."""
    out = {"json": (PATHS["json"], 1)}
    for name in ("stream", "usage"):
        for n in LENGTHS:
            out[f"{name}-{n}"] = (PATHS[name].replace("{n}", str(n)), n)
    return out


async def in_process(repeats: int, scale: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per request, per kind and variant, ``repeats`` interleaved measurements."""
    apps = {v: BUILDERS[v]() for v in TIMED}
    results: dict[str, dict[str, list[float]]] = {}
    for kind, (path, chunks) in kinds().items():
        n = max(3, scale // (chunks + 10))
        for v in TIMED:  # warm each stack (route caches, ledgers started)
            await run_requests(apps[v], path, max(3, n // 4))
        results[kind] = {}
        for _ in range(repeats):
            for v in TIMED:
                results[kind].setdefault(v, []).append(await run_requests(apps[v], path, n))
    return results


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
uvicorn.run(build({variant!r}), host="127.0.0.1", port={port}, log_level="error",
            access_log=False, http="httptools", loop="uvloop")
"""


def wrk_rps(url: str, seconds: int, connections: int) -> tuple[float, int]:
    """(requests/s, requests served) from one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url],
        capture_output=True, text=True, check=True,
    ).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if not rate or not count:
        raise RuntimeError(f"wrk said: {out}")
    return float(rate.group(1)), int(count.group(1))


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
            wrk_rps(f"http://127.0.0.1:{port}/v1/chat/completions", 1, 16)  # warm
    except BaseException:
        stop(proc for proc, _port in servers.values())
        raise
    return servers


def measure(proc: subprocess.Popen[bytes], url: str, seconds: int) -> tuple[float, float]:
    """(requests/s, server CPU microseconds per request) for one wrk run against ``url``."""
    before = cpu_seconds(proc.pid)
    rps, served = wrk_rps(url, seconds, 16)
    return rps, (cpu_seconds(proc.pid) - before) / max(served, 1) * 1e6


def through_uvicorn(
    repeats: int, seconds: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """Requests/s, and server CPU microseconds per request, per kind and variant.

    Every repeat starts fresh server processes: a process can run 20% fast or slow for its
    whole life on these VMs (where it lands in memory and on the cores), so one process per
    variant for all repeats would bake that luck into the medians.
    """
    bench = str(Path(__file__).parent)
    code_for = {v: SERVER.format(bench=bench, variant=v, port="{port}") for v in TIMED}
    results: dict[str, dict[str, list[float]]] = {"json": {}}
    cpu: dict[str, dict[str, list[float]]] = {"json": {}}
    for _ in range(repeats):
        servers = start_servers(code_for)
        try:
            for kind in ("json",):
                path = PATHS[kind]
                for v, (proc, port) in servers.items():
                    rps, us = measure(proc, f"http://127.0.0.1:{port}{path}", seconds)
                    results[kind].setdefault(v, []).append(rps)
                    cpu[kind].setdefault(v, []).append(us)
        finally:
            stop(proc for proc, _port in servers.values())
    return results, cpu


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
    deadline = time.monotonic() + 20
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


def _thread_cpu(prefix: str) -> float:
    """CPU seconds the threads whose names start with ``prefix`` have used (Linux
    /proc/.../schedstat, in ns), or nan."""
    import threading

    total, found = 0.0, False
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread.native_id is not None:
            try:
                stat = Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text()
            except OSError:
                continue
            total += int(stat.split()[0]) / 1e9
            found = True
    return total if found else float("nan")


def timed(fn: Any, n: int) -> float:
    """Microseconds per call of ``fn``: the least of three runs of ``n`` calls."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


async def breakdown(n: int) -> list[tuple[str, float, str]]:
    """Where our JSON request's microseconds go: each part timed alone on the same objects
    the benchmark's app uses (its busy simulated card), and the reader thread's CPU per
    request while the app serves ``n`` JSON requests."""
    from giul_asgi import EnergyMiddleware
    from giul_asgi.listeners import Settled
    from giul_asgi.meter import Meter
    from giul_asgi.wire import energy_headers, energy_json, parse_object, splice_object

    app = BUILDERS["giul-asgi"]()
    path = PATHS["json"]
    await run_requests(app, path, 200)  # builds the stack, starts the reader
    layer = app.middleware_stack
    while not isinstance(layer, EnergyMiddleware):
        layer = layer.app
    mw = layer
    scope = scope_for(path)
    target = mw.router.match(scope)
    ledger = mw.ledgers.get(target.node)
    body = json.dumps(PAYLOAD).encode()

    def open_close() -> None:
        ledger.close(ledger.open())

    meter = Meter(ledger, target.tier, route=target.label)
    meter.open()
    meter.close()
    window = meter.window
    assert window is not None
    share = ledger.share(window)
    energy = meter.figure()

    def output() -> None:
        obj = parse_object(body)
        assert obj is not None
        energy_headers(energy)
        splice_object(body, obj, "energy", energy_json(energy))

    batch = [Settled(energy, "ok", 200, time.time())] * 16
    rows = [
        ("route match", timed(lambda: mw.router.match(scope), n), "Router.match"),
        ("window open + close", timed(open_close, n), "Ledger.open/close on the busy card"),
        ("figure (grade a share)", timed(lambda: meter._grade(share, window), n),
         "Meter._grade -> energy.grade"),
        ("output", timed(output, n), "parse, 11 headers, the block, the splice"),
        ("statistics, a record", timed(lambda: mw.stats.settled(batch), n // 16) / 16,
         "EnergyStats.settled, batches of 16"),
        ("records by id, a record", timed(lambda: mw.records.settled(batch), n // 16) / 16,
         "RecordStore.settled, batches of 16"),
    ]
    await asyncio.sleep(0.5)
    reader = "giul-"  # the node's reader thread, and any sink's writer
    before, start = _thread_cpu(reader), time.perf_counter()
    await run_requests(app, path, n)
    await asyncio.sleep(0.3)  # the last windows settle
    after = _thread_cpu(reader)
    rows.append(("reader thread, a request", (after - before) / n * 1e6,
                 f"its CPU while serving {n} requests in {time.perf_counter() - start:.1f} s "
                 "(reads, settling, grading, every listener)"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-server", action="store_true", help="skip part (b)")
    args = parser.parse_args()
    repeats, scale = (3, 3000) if args.quick else (9, 20000)

    from giul_asgi.wire import body

    parser_name = "orjson" if body._fast_loads is not None else "json (stdlib)"
    print(f"# overhead: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, body parser {parser_name}")
    print(f"\n## (a) in process, median of {repeats} interleaved repeats\n")
    results = asyncio.run(in_process(repeats, scale))
    med = added_medians(results)
    print("Added us per request over the bare app (bare: its own us per request).\n")
    kind_names = list(kinds())
    print("| variant | " + " | ".join(kind_names) + " |")
    print("|---|" + "---:|" * len(kind_names))
    for v in TIMED:
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
    for v in TIMED[1:]:
        fits[v] = {}
        for name in ("stream", "usage"):
            fits[v][name] = fit(list(LENGTHS), [med[f"{name}-{n}"][v] for n in LENGTHS])
        (pf, pc), (uf, uc) = fits[v]["stream"], fits[v]["usage"]
        print(f"| {v} | {pf:.1f} | {pc:.3f} | {uf:.1f} | {uc:.3f} "
              f"| {med['stream-1000'][v]:.0f} / {med['usage-1000'][v]:.0f} |")
    ours, cheapest = med["json"]["giul-asgi"], min(med["json"][p] for p in PEERS)
    print(f"\nJSON: ours adds {ours:.1f} us; the cheapest peer {cheapest:.1f} us: ratio "
          f"{ours / cheapest:.2f} (target <= 0.6); floor {med['json']['floor']:.1f} us.")
    cheapest_fixed = min(min(fits[p]["stream"][0], fits[p]["usage"][0]) for p in PEERS)
    for name in ("stream", "usage"):
        fixed, per = fits["giul-asgi"][name]
        whole, exporter = med[f"{name}-1000"]["giul-asgi"], med[f"{name}-1000"]["starlette-exporter"]
        print(f"{name}: ours {per:.3f} us a chunk (target <= 0.4), fixed {fixed:.1f} us "
              f"(target <= the cheapest peer's, {cheapest_fixed:.1f}), whole 1000-chunk stream "
              f"{whole:.0f} us vs starlette-exporter's {exporter:.0f} (target: below).")

    print("\nWhere our JSON request's time goes: each part timed alone (least of 3), and the "
          "reader thread's CPU per request.\n")
    print("| part | us | what |")
    print("|---|---:|---|")
    for name, us, what in asyncio.run(breakdown(3000 if args.quick else 20000)):
        print(f"| {name} | {us:.2f} | {what} |")

    if args.no_server:
        return
    if shutil.which("wrk") is None:
        print("\n(b) skipped: wrk is not installed (apt-get install wrk)")
        return
    seconds = 2 if args.quick else 3
    server_repeats = 2 if args.quick else 7
    print(f"\n## (b) trivial JSON app through uvicorn (httptools, uvloop) on 127.0.0.1, "
          f"wrk -t1 -c16 {seconds}s, median of {server_repeats} interleaved repeats\n")
    rps, cpu = through_uvicorn(server_repeats, seconds)
    print("Ratios are medians of the per-repeat ratios to the bare app measured next to it; "
          "CPU is the server process's user + system time per request served.\n")
    print("| variant | JSON req/s | vs bare | server CPU us/request |")
    print("|---|---:|---:|---:|")
    for v in TIMED:
        ratios = [x / b for x, b in zip(rps["json"][v], rps["json"]["bare"], strict=True)]
        print(f"| {v} | {statistics.median(rps['json'][v]):.0f} | "
              f"{statistics.median(ratios):.2f} | {statistics.median(cpu['json'][v]):.0f} |")
    print("\nTarget: ours keeps at least the cheapest peer's share of the bare app's req/s.")


if __name__ == "__main__":
    main()
