"""What the middleware costs a gateway, beside its peers, measured side by side in one run.

(a) In-process: microseconds per request, calling each ASGI stack directly (no server,
    no sockets), for a JSON endpoint and two streamed (SSE) ones: plain chunks, and
    chunks as a client with ``stream_options.include_usage`` gets them (``"usage": null``
    on each, the usage in a last chunk, where ours puts the energy). Variants run
    interleaved, several repeats, medians reported; "added" is over the bare app in the
    same repeat.
(b) Through uvicorn on 127.0.0.1: requests/s each stack keeps, as a ratio of the bare
    app's, with wrk as the load generator (Debian package ``wrk``) when it is installed.

    python benchmarks/overhead.py            # both parts
    python benchmarks/overhead.py --quick    # fewer repeats, for a smoke run

Our variant runs with its ledger live on a busy simulated card and the energy block
injected into every JSON body, as the issue asks; ``giul-asgi-headers`` is the same with
``inject_json=False``, to show what the block costs. ``floor`` writes the same output
(eleven per-request headers and a block of the same shape) without metering anything:
what any middleware that answers like ours pays before it measures. The JSON parser is orjson when it is
installed (``giul-asgi[fast]``), else the standard library's; the header says which.
"""

from __future__ import annotations

import argparse
import asyncio
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
from _apps import BUILDERS, PATHS, VARIANTS


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


async def in_process(repeats: int, n: int) -> dict[str, dict[str, list[float]]]:
    apps = {v: BUILDERS[v]() for v in VARIANTS}
    results: dict[str, dict[str, list[float]]] = {kind: {} for kind in PATHS}
    for kind, path in PATHS.items():
        for v in VARIANTS:  # warm each stack (route caches, ledgers started)
            await run_requests(apps[v], path, 200)
        for _ in range(repeats):
            for v in VARIANTS:
                results[kind].setdefault(v, []).append(await run_requests(apps[v], path, n))
    return results


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
    code_for = {v: SERVER.format(bench=bench, variant=v, port="{port}") for v in VARIANTS}
    results: dict[str, dict[str, list[float]]] = {"json": {}, "stream": {}}
    cpu: dict[str, dict[str, list[float]]] = {"json": {}, "stream": {}}
    for _ in range(repeats):
        servers = start_servers(code_for)
        try:
            for kind in ("json", "stream"):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-server", action="store_true", help="skip part (b)")
    args = parser.parse_args()
    repeats, n = (3, 500) if args.quick else (9, 2000)

    from giul_asgi import report

    parser_name = "orjson" if report._fast_loads is not None else "json (stdlib)"
    print(f"# overhead: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, body parser {parser_name}")
    print(f"\n## (a) in-process, us per request (median of {repeats} interleaved repeats of {n})\n")
    results = asyncio.run(in_process(repeats, n))
    print("| variant | JSON us | JSON added us | stream us | stream added us "
          "| stream with usage us | added us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med: dict[str, dict[str, float]] = {}
    for kind in ("json", "stream", "usage"):
        bare = results[kind]["bare"]
        med[kind] = {}
        for v in VARIANTS:
            added = [x - b for x, b in zip(results[kind][v], bare, strict=True)]
            med[kind][v] = statistics.median(added) * 1e6
    for v in VARIANTS:
        cells = []
        for kind in ("json", "stream", "usage"):
            cells += [f"{statistics.median(results[kind][v]) * 1e6:.1f}", f"{med[kind][v]:.1f}"]
        print(f"| {v} | " + " | ".join(cells) + " |")
    peers = [med["json"][p] for p in ("starlette-exporter", "opentelemetry")]
    ours = med["json"]["giul-asgi"]
    print(f"\nJSON: ours adds {ours:.1f} us; cheapest peer adds {min(peers):.1f} us; "
          f"ratio {ours / min(peers):.2f} (target: < 10 us and < 0.5). The floor (output "
          f"only, no metering) adds {med['json']['floor']:.1f} us.")

    if args.no_server:
        return
    if shutil.which("wrk") is None:
        print("\n(b) skipped: wrk is not installed (apt-get install wrk)")
        return
    seconds = 2 if args.quick else 3
    server_repeats = 2 if args.quick else 7
    print(f"\n## (b) through uvicorn (httptools, uvloop) on 127.0.0.1, wrk -t1 -c16 "
          f"{seconds}s, median of {server_repeats} interleaved repeats\n")
    rps, cpu = through_uvicorn(server_repeats, seconds)
    print("Ratios are medians of the per-repeat ratios to the bare app measured next to it; "
          "CPU is the server process's user + system time per request served.\n")
    print("| variant | JSON req/s | JSON vs bare | JSON server CPU us | stream req/s "
          "| stream vs bare | stream server CPU us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for v in VARIANTS:
        row = [v]
        for kind in ("json", "stream"):
            ratios = [x / b for x, b in zip(rps[kind][v], rps[kind]["bare"], strict=True)]
            row += [f"{statistics.median(rps[kind][v]):.0f}", f"{statistics.median(ratios):.2f}",
                    f"{statistics.median(cpu[kind][v]):.0f}"]
        print("| " + " | ".join(row) + " |")
    print("\nTarget: giul-asgi keeps >= 0.90 of the bare app's JSON requests/s.")
    print("Reference rows: passthrough wraps send and nothing more; static-headers adds eleven "
          "fixed headers; floor adds our output (eleven per-request headers, the block) "
          "without metering.")


if __name__ == "__main__":
    main()
