"""What a request costs uvicorn's process, without sockets or a load generator in the way.

``overhead.py`` (b) runs wrk against real uvicorn servers on the same two cores, so its
requests/s move with wrk's own share of the CPU and the kernel's socket work, 10-20% between
runs here. This script feeds raw HTTP/1.1 requests straight into uvicorn's own protocol
(``HttpToolsProtocol``, the httptools parser, uvloop) over a transport that swallows what
it writes, on 16 keep-alive connections at once as wrk -c16 does. The loop never idles, so
wall time per request is the server's CPU per request: parsing, the app and its middleware,
and uvicorn writing the response. What it cannot see is the kernel's send and receive.

Two tables:

1. uvicorn's own price of response headers: a raw ASGI app answering with 0, 11 and 22
   extra headers. uvicorn checks each header against two regular expressions, lower-cases
   it and joins it into the response, so eleven headers (ours) cost the server a fixed
   amount before any middleware has computed anything.
2. The variants of ``overhead.py`` (a Starlette app and its middleware) for the JSON answer
   and the SSE stream: microseconds per request, what each middleware adds, and the share
   of the bare app's requests/s that the server's CPU allows (bare / variant).

    python benchmarks/server_path.py             # ~1 minute
    python benchmarks/server_path.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _apps import BUILDERS, PATHS, VARIANTS
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

CONNECTIONS = 16
EXTRA_HEADERS = (0, 11, 22)


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: wrk\r\n\r\n".encode()


class _Sink(asyncio.Transport):
    """A connection whose peer reads everything at once: writes are counted, not sent."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.written = 0
        self.closing = False
        self.kept: bytearray | None = bytearray() if keep else None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        if self.kept is not None:
            self.kept += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Connection(HttpToolsProtocol):
    """uvicorn's protocol, telling the client when its response is complete."""

    done: asyncio.Future[None] | None = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


class Server:
    """One app behind uvicorn's protocol, as ``uvicorn --http httptools`` would serve it."""

    def __init__(self, app: Any) -> None:
        self.config = Config(app, http="httptools", lifespan="off", access_log=False,
                             log_level="warning")
        self.config.load()
        self.state = ServerState()

    async def _client(self, raw: bytes, n: int, sink: _Sink | None = None) -> None:
        loop = asyncio.get_running_loop()
        conn = _Connection(self.config, self.state, {}, loop)
        sink = sink if sink is not None else _Sink()
        conn.connection_made(sink)
        for _ in range(n):
            conn.done = loop.create_future()
            conn.data_received(raw)
            await conn.done
        conn.connection_lost(None)
        if not sink.written:
            raise RuntimeError("the server wrote nothing: is the path right?")

    async def answer(self, path: str) -> bytes:
        """The bytes uvicorn writes for one request to ``path`` (for the tests)."""
        sink = _Sink(keep=True)
        await self._client(request(path), 1, sink)
        return bytes(sink.kept or b"")

    async def per_request_us(self, path: str, n: int) -> float:
        """Wall microseconds per request, ``n`` requests on each of 16 connections."""
        raw = request(path)
        t0 = time.perf_counter()
        await asyncio.gather(*(self._client(raw, n) for _ in range(CONNECTIONS)))
        return (time.perf_counter() - t0) / (n * CONNECTIONS) * 1e6


def headers_app(extra: int) -> Callable[..., Any]:
    """A raw ASGI app answering a small JSON body with ``extra`` more headers."""
    body = b'{"ok":true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               *((b"x-energy-%d" % i, b"0.123456") for i in range(extra))]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def rounds(servers: dict[str, Server], path: str, n: int, repeats: int
                 ) -> dict[str, list[float]]:
    """Each server timed in turn, ``repeats`` times: the same machine for all of them."""
    for server in servers.values():
        await server.per_request_us(path, max(1, n // 4))  # warm: caches, the ledger's reader
    out: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(repeats):
        for name, server in servers.items():
            out[name].append(await server.per_request_us(path, n))
    return out


async def main_async(repeats: int, n: int) -> None:
    print(f"# server_path: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}\n")
    print(f"uvicorn's HttpToolsProtocol in process, {CONNECTIONS} keep-alive connections, "
          f"{n * CONNECTIONS} requests a round, {repeats} rounds interleaved; medians of "
          f"rounds (fastest round in brackets).\n")

    print("## 1. What uvicorn spends on response headers (raw ASGI app, small JSON body)\n")
    plain = {f"{k}": Server(headers_app(k)) for k in EXTRA_HEADERS}
    got = await rounds(plain, "/", n, repeats)
    base = statistics.median(got["0"])
    print("| extra headers | us per request | added | added per header |")
    print("|---:|---:|---:|---:|")
    for k in EXTRA_HEADERS:
        med = statistics.median(got[f"{k}"])
        per = f"{(med - base) / k:.2f}" if k else "-"
        print(f"| {k} | {med:.1f} ({min(got[f'{k}']):.1f}) | {med - base:.1f} | {per} |")

    for label, path in (("JSON answer", PATHS["json"]), ("SSE stream", PATHS["stream"])):
        print(f"\n## 2. {label} ({path}), Starlette app\n")
        servers = {v: Server(BUILDERS[v]()) for v in VARIANTS}
        got = await rounds(servers, path, n if label.startswith("JSON") else n // 2, repeats)
        bare = statistics.median(got["bare"])
        print("| variant | us per request | added | requests/s vs bare |")
        print("|---|---:|---:|---:|")
        for v in VARIANTS:
            med = statistics.median(got[v])
            # The share of bare's requests/s: a median of per-round ratios, each round
            # pairing the variant with the bare app timed next to it.
            share = statistics.median(b / x for b, x in zip(got["bare"], got[v], strict=True))
            print(f"| {v} | {med:.1f} ({min(got[v]):.1f}) | {med - bare:.1f} | {share:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    args = parser.parse_args()
    repeats, n = (3, 25) if args.quick else (9, 125)
    try:
        import uvloop
    except ImportError:  # the bench extra installs it; uvicorn falls back to asyncio too
        asyncio.run(main_async(repeats, n))
    else:
        uvloop.run(main_async(repeats, n))


if __name__ == "__main__":
    main()
