"""What metering costs a realistic gateway: a FastAPI proxy in front of an OpenAI-shaped upstream.

The gateway proxies ``/v1/chat/completions`` to a local upstream with one shared
``httpx.AsyncClient``, passing a streamed answer through chunk by chunk as the upstream sends
it (so the SSE scanner sees the upstream's bytes, not whole events). It runs under uvicorn with
httptools and uvloop, one process per variant, load from wrk or autocannon
(benchmarks/loadgen.py), the upstream in a process of its own. Variants: two bare gateways (the
second is the noise control: how far two identical processes differ), ours on the simulated
reader (``giul-asgi``) and on the production path (``giul-asgi-nvml``: ``Node(reader="nvml")``
over benchmarks/fake_pynvml, every NVML call a ctypes call with the GIL released; a gateway
of one process, a server of its own; ``giul-asgi-nvml-workers``: the same as one worker of a
server of several, writing its statistics and records in the place for the others),
starlette-exporter and prometheus-fastapi-instrumentator (bench extra); with ``--before DIR``,
an earlier commit's package on the production path too (``giul-asgi-nvml-before``, from ``git
archive REV giul_asgi | tar -x -C DIR``). Every repeat starts fresh gateway processes, in turn,
interleaved.

Per variant: requests/s and the gateway process's CPU (user + system, every thread) per
request, and of it our reader thread's, for a JSON answer and for a 200-chunk stream;
medians of repeats, and each as a ratio to the first bare gateway measured beside it.

    python benchmarks/gateway.py [--quick] [--before DIR]        (wrk, or npm install -g autocannon)
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
from _apps import prepare_before
from overhead import _wait_port, free_port, measure, stop

UPSTREAM = """
import asyncio, json, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

ANSWER = json.dumps({{"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
    "choices": [{{"index": 0, "message": {{"role": "assistant", "content": "hi " * 40}},
                 "finish_reason": "stop"}}],
    "usage": {{"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52}}}}).encode()

def chunk(i, finish=None):
    delta = {{}} if finish else {{"content": "tok%d " % i}}
    return ("data: " + json.dumps({{"id": "chatcmpl-1", "object": "chat.completion.chunk",
        "model": "m", "choices": [{{"index": 0, "delta": delta, "finish_reason": finish}}]}},
        separators=(",", ":")) + "\\n\\n").encode()

CHUNKS = [chunk(i) for i in range(200)] + [chunk(200, "stop"), b"data: [DONE]\\n\\n"]

async def chat(request):
    return Response(ANSWER, media_type="application/json")

async def stream(request):
    async def body():
        for c in CHUNKS:
            yield c
    return StreamingResponse(body(), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/chat/completions", chat), Route("/v1/stream", stream)])
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="error", access_log=False,
            http="httptools", loop="uvloop")
"""

GATEWAY = """
import contextlib, sys, httpx, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
sys.path.insert(0, {bench!r})
UP = "http://127.0.0.1:{upstream}"

@contextlib.asynccontextmanager
async def lifespan(app):
    app.state.client = httpx.AsyncClient(base_url=UP, timeout=30.0,
                                         limits=httpx.Limits(max_connections=64))
    yield
    await app.state.client.aclose()

app = FastAPI(lifespan=lifespan)

@app.get("/v1/chat/completions")
async def chat(request: Request):
    r = await request.app.state.client.get("/v1/chat/completions")
    return Response(r.content, status_code=r.status_code,
                    media_type=r.headers.get("content-type"))

@app.get("/v1/stream")
async def stream(request: Request):
    client = request.app.state.client
    upstream = await client.send(client.build_request("GET", "/v1/stream"), stream=True)
    async def body():
        try:
            async for piece in upstream.aiter_raw():
                yield piece
        finally:
            await upstream.aclose()
    return StreamingResponse(body(), media_type=upstream.headers.get("content-type"))

{middleware}
from threads import name_os_threads
name_os_threads()  # the reader thread found from outside, for its share of the CPU
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="error", access_log=False,
            http="httptools", loop="uvloop")
"""

MIDDLEWARE = {
    "bare": "",
    "bare-2": "",
    "giul-asgi": (
        "from _apps import our_middleware\n"
        "m = our_middleware()\n"
        "app.add_middleware(m.cls, *m.args, **m.kwargs)"
    ),
    "giul-asgi-nvml": (
        "from _apps import our_middleware\n"
        "m = our_middleware(nvml=True)\n"
        "app.add_middleware(m.cls, *m.args, **m.kwargs)"
    ),
    # The same gateway as one worker of a server of several (uvicorn --workers N): its
    # statistics and records written in the place for the other workers. (A gateway of one
    # process, as above, is a server of its own and keeps them in its memory.)
    "giul-asgi-nvml-workers": (
        "from _apps import our_middleware\n"
        "m = our_middleware(worker=True)\n"
        "app.add_middleware(m.cls, *m.args, **m.kwargs)"
    ),
    "giul-asgi-nvml-before": (
        "from _apps import BEFORE, before_on_path, our_middleware\n"
        "before_on_path()\n"
        "m = our_middleware(BEFORE, nvml=True)\n"
        "app.add_middleware(m.cls, *m.args, **m.kwargs)"
    ),
    "starlette-exporter": (
        "from starlette_exporter import PrometheusMiddleware\n"
        "app.add_middleware(PrometheusMiddleware, app_name='gw', group_paths=True)"
    ),
    "prometheus-fastapi-instrumentator": (
        "from prometheus_client import CollectorRegistry\n"
        "from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware\n"
        "app.add_middleware(PrometheusInstrumentatorMiddleware, registry=CollectorRegistry())"
    ),
}
PATHS = {"json": "/v1/chat/completions", "stream-200": "/v1/stream"}


def available(before: bool) -> list[str]:
    import importlib.util

    out = []
    for name in MIDDLEWARE:
        if name == "giul-asgi-nvml-before" and not before:
            continue
        module = {"starlette-exporter": "starlette_exporter",
                  "prometheus-fastapi-instrumentator": "prometheus_fastapi_instrumentator"}.get(name)
        if module is None or importlib.util.find_spec(module) is not None:
            out.append(name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--before", metavar="DIR",
                        help="a folder holding an earlier commit's giul_asgi: timed beside ours")
    args = parser.parse_args()
    if args.before:
        prepare_before(args.before)
    repeats, seconds = (3, 2) if args.quick else (7, 3)
    load_start = os.getloadavg()
    bench = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM.format(port=up_port)], env=env)
    variants = available(bool(args.before))
    rps: dict[str, dict[str, list[float]]] = {k: {v: [] for v in variants} for k in PATHS}
    cpu: dict[str, dict[str, list[float]]] = {k: {v: [] for v in variants} for k in PATHS}
    reader: dict[str, dict[str, list[float]]] = {k: {v: [] for v in variants} for k in PATHS}
    ratio: dict[str, dict[str, list[float]]] = {k: {v: [] for v in variants} for k in PATHS}
    try:
        _wait_port(up_port)
        for _ in range(repeats):
            procs = {}
            try:
                for v in variants:
                    port = free_port()
                    code = GATEWAY.format(bench=bench, upstream=up_port, port=port,
                                          middleware=MIDDLEWARE[v])
                    procs[v] = (subprocess.Popen([sys.executable, "-c", code], env=env), port)
                for proc, port in procs.values():
                    _wait_port(port)
                    for path in PATHS.values():
                        measure(proc, f"http://127.0.0.1:{port}{path}", 1)  # warm
                for kind, path in PATHS.items():
                    for v, (proc, port) in procs.items():
                        r, us, reader_us = measure(proc, f"http://127.0.0.1:{port}{path}", seconds)
                        rps[kind][v].append(r)
                        cpu[kind][v].append(us)
                        reader[kind][v].append(reader_us)
                    for v in variants:
                        ratio[kind][v].append(rps[kind][v][-1] / rps[kind]["bare"][-1])
            finally:
                stop(p for p, _ in procs.values())
    finally:
        stop([upstream])
    print(f"# gateway.py: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}"
          f"{' --quick' if args.quick else ''}\n")
    print(f"    python benchmarks/gateway.py {shlex.join(sys.argv[1:])}".rstrip() + "\n")
    print("Load average at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f} (1, 5, 15 min)\n".format(
        *load_start, *os.getloadavg()))
    print(f"FastAPI proxy, one shared httpx.AsyncClient, to a local upstream (separate process); "
          f"uvicorn httptools + uvloop; {loadgen.describe(seconds)}; medians of {repeats} repeats, "
          f"fresh processes each.\n")
    print("| variant | JSON req/s | vs bare | JSON CPU us/req | added | reader us/req "
          "| 200-chunk streams/s | vs bare | stream CPU us | added | reader us/stream |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base_json = statistics.median(cpu["json"]["bare"])
    base_stream = statistics.median(cpu["stream-200"]["bare"])
    added: dict[str, tuple[float, float]] = {}
    for v in variants:
        j, s = statistics.median(cpu["json"][v]), statistics.median(cpu["stream-200"][v])
        added[v] = (j - base_json, s - base_stream)
        rj, rs = (statistics.median(reader[k][v]) for k in PATHS)
        mine = v.startswith("giul-asgi")
        print(f"| {v} | {statistics.median(rps['json'][v]):.0f} | {statistics.median(ratio['json'][v]):.2f} "
              f"| {j:.0f} | {j - base_json:+.0f} | {f'{rj:.0f}' if mine else ''} "
              f"| {statistics.median(rps['stream-200'][v]):.0f} "
              f"| {statistics.median(ratio['stream-200'][v]):.2f} | {s:.0f} | {s - base_stream:+.0f} "
              f"| {f'{rs:.0f}' if mine else ''} |")
    peers = [v for v in ("starlette-exporter", "prometheus-fastapi-instrumentator") if v in added]
    if peers and "bare-2" in added:
        noise = tuple(abs(x) for x in added["bare-2"])
        for i, kind in enumerate(("JSON", "stream")):
            best = min(added[p][i] for p in peers)
            for v in (v for v in variants if v.startswith("giul-asgi")):
                print(f"\n{kind}, {v}: CPU added {added[v][i]:+.0f} us; the cheapest peer's "
                      f"{best:+.0f} + the noise control's {noise[i]:.0f} = {best + noise[i]:+.0f} "
                      f"(target: at most that).", end="")
        print()
    print("\nTargets (issue 22): CPU added per JSON request and per stream at most the cheapest "
          "peer's plus the noise control's spread (bare-2 against bare).")


if __name__ == "__main__":
    main()
