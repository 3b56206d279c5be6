"""The apps and middleware stacks the overhead benchmark compares, built the same way."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

try:
    from orjson import loads
except ImportError:  # the bench extra installs it; the stdlib's will do
    from json import loads
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route as StarletteRoute

from giul_asgi import Node

#: An earlier commit's copy of ours, importable beside it under this name (``prepare_before``),
#: so that one run times both, interleaved: the "before" of an A/B.
BEFORE = "giul_asgi_before"
#: Where that copy lies (set by ``prepare_before``; servers started for it inherit it).
BEFORE_ENV = "GIUL_BENCH_BEFORE"

USAGE = {"prompt_tokens": 12, "completion_tokens": 48, "total_tokens": 60}
PAYLOAD = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "sim-8b",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "word " * 48}}],
    "usage": USAGE,
}
_COMPACT = (",", ":")  # as OpenAI-compatible servers write their chunks
CHUNK = b"data: " + json.dumps({
    "id": "c", "object": "chat.completion.chunk", "model": "sim-8b",
    "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}],
}, separators=_COMPACT).encode() + b"\n\n"


async def chat(request: Any) -> JSONResponse:
    return JSONResponse(PAYLOAD)


async def chat_after(request: Any) -> JSONResponse:
    """The same answer after ``us`` microseconds of waiting (an upstream's answer): a window
    of a millisecond or more gets a guessed first figure, as every LLM request's does, where
    one of microseconds says unknown (giul_asgi.ledger.prior.MIN_GUESS_S)."""
    await asyncio.sleep(int(request.path_params["us"]) / 1e6)
    return JSONResponse(PAYLOAD)


# The same stream as an OpenAI client with stream_options.include_usage gets it: every
# chunk says "usage": null, and a last chunk with no choices carries the usage.
NULL_USAGE_CHUNK = CHUNK[:-3] + b',"usage":null}\n\n'
USAGE_CHUNK = b"data: " + json.dumps({
    "id": "c", "object": "chat.completion.chunk", "model": "sim-8b", "choices": [],
    "usage": USAGE,
}, separators=_COMPACT).encode() + b"\n\n"


FINISH_CHUNK = CHUNK.replace(b'"delta":{"content":"word "},"finish_reason":null',
                             b'"delta":{},"finish_reason":"stop"')
NULL_USAGE_FINISH = FINISH_CHUNK[:-3] + b',"usage":null}\n\n'


async def _events(n: int, chunk: bytes = CHUNK, finish: bytes = FINISH_CHUNK,
                  last: bytes = b"") -> AsyncIterator[bytes]:
    for _ in range(n):
        yield chunk
    yield finish
    if last:
        yield last
    yield b"data: [DONE]\n\n"


def _chunks(request: Any) -> int:
    return int(request.path_params.get("n", 8))


async def stream(request: Any) -> StreamingResponse:
    """n content chunks, the finish chunk, [DONE]: a plain OpenAI stream."""
    return StreamingResponse(_events(_chunks(request)), media_type="text/event-stream")


async def stream_usage(request: Any) -> StreamingResponse:
    """The same with include_usage: "usage": null on every chunk, the usage in a last one."""
    return StreamingResponse(
        _events(_chunks(request), NULL_USAGE_CHUNK, NULL_USAGE_FINISH, USAGE_CHUNK),
        media_type="text/event-stream",
    )


class Passthrough:
    """The cheapest possible pure-ASGI middleware that wraps send."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def wrapped(message: Any) -> None:
            await send(message)

        await self.app(scope, receive, wrapped)


class StaticHeaders(Passthrough):
    """A pass-through that adds eleven fixed headers: what any middleware that answers
    with our eleven X-Energy-* headers pays the server, before computing anything."""

    HEADERS = tuple((f"x-energy-{i}".encode(), b"0.123456") for i in range(11))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, wrapped)


class Floor(Passthrough):
    """What any middleware that answers as ours does pays before it meters anything.

    Per JSON response it parses the body (orjson), formats five per-request numbers into
    eleven headers and a block of the same shape as ours, splices the block in and fixes
    Content-Length. No ledger, no routing, no statistics, no stream handling: a reference
    row for the cost of the output alone, not a usable middleware.
    """

    FIXED = (
        (b"x-energy-method", b"simulated"), (b"x-energy-backend", b"simulated"),
        (b"x-energy-source", b"local"), (b"x-energy-node", b"sim"), (b"x-energy-tier", b"8b"),
        (b"x-energy-settled", b"false"),
    )
    BLOCK = (
        b'{"joules":%s,"method":"simulated","backend":"simulated","source":"local",'
        b'"node":"sim","tier":"8b","route":"/v1/chat/completions","seconds":%s,'
        b'"idle_watts":70,"idle_known":true,"mean_watts":220,"tokens":%d,'
        b'"token_kind":"output","joules_per_token":%s,"concurrency":1,"split":"exclusive",'
        b'"uncertainty_joules":%s,"settled":false,"stages":{},"contended":null,"error":null}'
    )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        held: list[Any] = []

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                if (b"content-type", b"application/json") in message["headers"]:
                    held.append(message)  # the JSON answer: hold it for the block
                else:
                    await send(message)  # anything else (the stream) passes untouched
                return
            if not held:
                await send(message)
                return
            start = held.pop()
            body = message.get("body", b"")
            seconds = time.monotonic() - t0
            joules = 150.0 * seconds
            obj = loads(body)
            tokens = obj.get("usage", {}).get("completion_tokens", 0) or 1
            numbers = (b"%.6g" % joules, b"%.6g" % seconds, b"%.6g" % (joules / tokens),
                       b"%.6g" % (joules / 10))
            block = self.BLOCK % (numbers[0], numbers[1], tokens, numbers[2], numbers[3])
            body = body[:-1] + b',"energy":' + block + b"}"
            headers = [h for h in start["headers"] if h[0] != b"content-length"]
            headers.append((b"content-length", b"%d" % len(body)))
            headers += self.FIXED
            headers += [
                (b"x-energy-joules", numbers[0]), (b"x-energy-seconds", numbers[1]),
                (b"x-energy-tokens", b"%d" % tokens), (b"x-energy-joules-per-token", numbers[2]),
                (b"x-energy-uncertainty", numbers[3]),
            ]
            start["headers"] = headers
            await send(start)
            await send({**message, "body": body})

        await self.app(scope, receive, wrapped)


def sim_node(package: str = "giul_asgi") -> Node:
    """A busy simulated card, so every figure is a real (simulated) share; built from
    ``package`` (:data:`BEFORE`: an earlier commit's copy of ours, see ``prepare_before``)."""
    pkg = importlib.import_module(package)
    readers = importlib.import_module(f"{package}.readers.simulated")
    card = readers.SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
    card.start_job(150.0)
    node: Node = pkg.Node("sim", idle_w=70.0, reader_factory=lambda _n: readers.SimulatedReader(card))
    return node


def nvml_node(package: str = "giul_asgi", *, unshared: bool = False, name: str = "gpu") -> Node:
    """The production path: ``Node(reader="nvml")``, whose reader imports ``pynvml`` on its
    own thread and finds benchmarks/fake_pynvml there (every call a ctypes call into C with
    the GIL released, over a truth card drawing 150 W above its 70 W idle). One fake card a
    process: an earlier copy of ours reads the same one, from a table of its own."""
    import fake_pynvml

    pkg = importlib.import_module(package)
    if fake_pynvml.driver() is None:
        fake_pynvml.install([fake_pynvml.Gpu(fake_pynvml.busy_card())])
    if unshared:  # the same card, nothing shared with other processes: what sharing costs
        node: Node = pkg.Node("gpu-unshared", gpus=(0,), idle_w=70.0, reader="nvml", workers_dir=False)
    elif package == "giul_asgi":
        node = pkg.Node(name, gpus=(0,), idle_w=70.0, reader="nvml")
    else:
        node = pkg.Node("gpu-before", gpus=(0,), idle_w=70.0, reader="nvml",
                        workers_dir=tempfile.mkdtemp(prefix="giul-bench-"))
    return node


def prepare_before(source: str) -> str:
    """Copy ``source``'s ``giul_asgi`` (an earlier commit's, ``git archive``'d there) to a
    folder as :data:`BEFORE` and put that folder on the path; returns it. Its imports are
    relative, so the copy runs as it did, beside this checkout's package."""
    folder = tempfile.mkdtemp(prefix="giul-before-")
    shutil.copytree(os.path.join(source, "giul_asgi"), os.path.join(folder, BEFORE))
    os.environ[BEFORE_ENV] = folder
    before_on_path()
    return folder


def before_on_path() -> None:
    folder = os.environ.get(BEFORE_ENV)
    if folder is None:
        raise RuntimeError(f"no earlier copy to time: pass --before DIR (sets ${BEFORE_ENV})")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def worker_server() -> Any:
    """A server of several processes, as a worker of ``uvicorn --workers N`` finds its own (an
    inherited listener): its statistics and records are written in the place, for the others.
    This process alone is a server of its own, and keeps them in its memory."""
    from giul_asgi.hostshare.rows import process_start
    from giul_asgi.hostshare.server import ServerId

    pid = os.getpid()
    return ServerId(f"lbench{pid}", "the benchmark's workers", (pid, process_start(pid)))


def our_middleware(package: str = "giul_asgi", *, nvml: bool = False, unshared: bool = False,
                   worker: bool = False, **options: Any) -> Middleware:
    """Our middleware as every benchmark runs it: its ledger live on the busy card, the
    simulated one or (``nvml``) the NVML reader over fake_pynvml. ``unshared``: the NVML
    node, its statistics and records kept in this process alone (``workers_dir=False``).
    ``worker``: the NVML node as one worker of a server of several (:func:`worker_server`);
    otherwise this process is a server of its own, as a single-process uvicorn is."""
    pkg = importlib.import_module(package)
    if unshared:
        records = importlib.import_module(f"{package}.records").RecordStore(share=False)
        options = {"stats": pkg.EnergyStats(), "records": records, **options}
    if worker:  # what each worker of a server of several pays: written in the place
        server = worker_server()
        records = importlib.import_module(f"{package}.records").RecordStore(server=server)
        stats = importlib.import_module(f"{package}.stats").HostStats(server=server)
        options = {"stats": stats, "records": records, **options}
        node = nvml_node(package, name="gpu-workers")
    else:
        node = nvml_node(package, unshared=unshared) if nvml or unshared else sim_node(package)
    return Middleware(pkg.EnergyMiddleware, nodes=[node],
                      tiers=[pkg.Tier("8b", 300.0)], ledgers=pkg.Ledgers(), **options)


#: The benchmark's endpoints by kind: the JSON answer, the plain stream, the stream with
#: usage (``{n}``: the number of content chunks).
PATHS: dict[str, str] = {
    "json": "/v1/chat/completions", "stream": "/v1/stream/{n}", "usage": "/v1/stream-usage/{n}",
    "json-after": "/v1/chat/completions-after/{n}",
}


def bench_app(middleware: list[Middleware]) -> Starlette:
    """The benchmark's app (a JSON chat answer, and SSE streams without and with usage)
    behind ``middleware``."""
    return Starlette(
        routes=[StarletteRoute(PATHS["json"], chat, methods=["GET", "POST"]),
                StarletteRoute(PATHS["stream"], stream),
                StarletteRoute(PATHS["usage"], stream_usage),
                StarletteRoute(PATHS["json-after"].replace("{n}", "{us:int}"), chat_after)],
        middleware=middleware,
    )


def build(variant: str) -> Starlette:
    middleware: list[Middleware] = []
    if variant == "passthrough":
        middleware = [Middleware(Passthrough)]
    elif variant == "static-headers":
        middleware = [Middleware(StaticHeaders)]
    elif variant == "floor":
        middleware = [Middleware(Floor)]
    elif variant == "starlette-exporter":
        from starlette_exporter import PrometheusMiddleware

        middleware = [Middleware(PrometheusMiddleware, app_name=f"bench_{id(middleware)}",
                                 group_paths=True)]
    elif variant == "prometheus-fastapi-instrumentator":
        from prometheus_client import CollectorRegistry
        from prometheus_fastapi_instrumentator.middleware import (
            PrometheusInstrumentatorMiddleware,
        )

        middleware = [Middleware(PrometheusInstrumentatorMiddleware, registry=CollectorRegistry())]
    elif variant == "opentelemetry":
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.sdk.trace import TracerProvider

        middleware = [Middleware(OpenTelemetryMiddleware, tracer_provider=TracerProvider())]
    elif variant == "giul-asgi":
        middleware = [our_middleware()]
    elif variant == "giul-asgi-nvml":  # the production path: the NVML reader over fake_pynvml
        middleware = [our_middleware(nvml=True)]
    elif variant == "giul-asgi-nvml-unshared":  # the same, sharing nothing between processes
        middleware = [our_middleware(unshared=True)]
    elif variant == "giul-asgi-nvml-workers":  # the same as one worker of a server of several
        middleware = [our_middleware(worker=True)]
    elif variant in ("giul-asgi-before", "giul-asgi-nvml-before"):  # an earlier copy of ours
        before_on_path()
        middleware = [our_middleware(BEFORE, nvml=variant == "giul-asgi-nvml-before")]
    elif variant == "giul-asgi-headers":  # the same, without the JSON energy block
        middleware = [our_middleware(inject_json=False)]
    elif variant != "bare":
        raise ValueError(variant)
    return bench_app(middleware)


VARIANTS: tuple[str, ...] = (
    "bare", "passthrough", "static-headers", "floor", "starlette-exporter",
    "prometheus-fastapi-instrumentator", "opentelemetry", "giul-asgi", "giul-asgi-nvml",
    "giul-asgi-nvml-unshared", "giul-asgi-nvml-workers", "giul-asgi-headers",
)
#: An earlier commit's copy of ours (``prepare_before`` first).
BEFORE_VARIANTS: tuple[str, ...] = ("giul-asgi-before", "giul-asgi-nvml-before")
BUILDERS: dict[str, Callable[[], Starlette]] = {
    v: (lambda v=v: build(v)) for v in (*VARIANTS, *BEFORE_VARIANTS)
}
