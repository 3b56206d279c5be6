"""giul-agent: a GPU host's energy counters over HTTP, read-only, loopback by default.

A gateway usually runs on a CPU host in front of GPU servers; it cannot call NVML on a card
it is not beside. The agent runs on the GPU host and serves each GPU's cumulative energy
counter and instant power with the agent's own monotonic timestamps (schema
``giul-agent/1``, see ``docs/agent.md``), so a remote reader can place every reading at the
time it was taken, not at its arrival.

What keeps it cheap and safe:

- one card read is shared by every caller within ``cache_s``: callers that arrive while a
  read is in flight wait for that read, never start a second one, so many gateways polling
  cost the card one read per period;
- the read runs in one worker thread off the event loop, with a timeout: a wedged driver
  makes answers say so (per-GPU ``error``) and ``/healthz`` fail, never hangs the server,
  and never piles up stuck threads;
- GET only, request bodies refused, bounded concurrency (uvicorn's ``limit_concurrency``),
  an optional bearer token compared in constant time, 127.0.0.1 unless told otherwise; and
  nothing to write or control.

Endpoints: ``GET /readings`` (JSON), ``GET /healthz``, ``GET /metrics`` (Prometheus text).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ConfigError, ReaderUnavailable
from .readers.nvml import describe, load_nvml, open_gpus, read_gpu, shut_down
from .serve.access import Access, check_token, is_loopback

SCHEMA = "giul-agent/1"
DEFAULT_PORT = 9431
DEFAULT_CACHE_S = 0.05
DEFAULT_READ_TIMEOUT_S = 2.0
DEFAULT_MAX_CONCURRENCY = 64
TOKEN_ENV = "GIUL_AGENT_TOKEN"

GpuRecord = dict[str, Any]


class GpuSource(Protocol):
    """Where the agent's numbers come from: per-GPU records in the schema's shape."""

    #: True for a simulated card: its figures must never read as measured.
    simulated: bool

    @property
    def gpu_indices(self) -> tuple[int, ...]: ...

    def read_gpus(self) -> list[GpuRecord]: ...

    def close(self) -> None: ...


class NvmlSource:
    """Each GPU's counter (mJ -> J) and instant power, read through NVML, stamped as read."""

    simulated = False

    def __init__(
        self,
        gpus: Sequence[int] = (),
        *,
        nvml: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml = load_nvml(nvml)
        self.clock = clock
        indices, self._handles, self.probes = open_gpus(
            nvml, gpus,
            start_remedy="run the agent on a host with the NVIDIA driver loaded (check nvidia-smi)",
            index_remedy="fix --gpus (NVML indices; CUDA_VISIBLE_DEVICES does not renumber them)",
        )
        self._open = True
        self._indices = indices

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self._indices

    def read_gpus(self) -> list[GpuRecord]:
        out = []
        for probe, handle in zip(self.probes, self._handles, strict=True):
            reading = read_gpu(self._nvml, probe, handle)
            out.append({
                "index": probe.index, "uuid": probe.uuid, "name": probe.name, "t": self.clock(),
                "energy_j": reading.energy_j, "power_w": reading.power_w, "mig": probe.mig,
                "error": reading.error,
            })
        return out

    def close(self) -> None:
        if self._open:
            self._open = False
            shut_down(self._nvml)


@dataclass(slots=True)
class Snapshot:
    """One card read: its records, when it started, and whether it finished in time."""

    gpus: list[GpuRecord]
    started: float
    timed_out: bool = False


class SharedRead:
    """One read of the card at a time, shared by every caller within ``cache_s``.

    The read runs on one dedicated worker thread. A caller that finds a fresh snapshot
    takes it; one that finds a read in flight waits for that read (up to ``timeout_s``);
    only when neither is there does a caller start a read. A read that outlives the timeout
    keeps its thread (a C call cannot be interrupted) and no second read is started until
    it returns: callers get an error snapshot meanwhile.
    """

    def __init__(
        self,
        source: GpuSource,
        *,
        cache_s: float = DEFAULT_CACHE_S,
        timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.cache_s = cache_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.reads = 0
        self.read_errors = 0
        self.timeouts = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="giul-agent-read")
        self._inflight: asyncio.Future[Snapshot] | None = None
        self._latest: Snapshot | None = None

    def _read(self) -> Snapshot:
        started = self.clock()
        try:
            gpus = self.source.read_gpus()
        except Exception as exc:  # a source must not raise; if it does, that is its answer
            gpus = [self._error_record(i, describe(exc)) for i in self.source.gpu_indices]
        return Snapshot(gpus, started)

    def _error_record(self, index: int, error: str) -> GpuRecord:
        return {"index": index, "uuid": None, "name": None, "t": self.clock(),
                "energy_j": None, "power_w": None, "mig": None, "error": error}

    def _finished(self, future: asyncio.Future[Snapshot]) -> None:
        self._inflight = None
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            return
        snapshot = future.result()
        self.reads += 1
        self.read_errors += sum(1 for g in snapshot.gpus if g.get("error"))
        self._latest = snapshot

    async def get(self) -> Snapshot:
        latest = self._latest
        if latest is not None and self.clock() - latest.started < self.cache_s:
            return latest
        if self._inflight is None:
            loop = asyncio.get_running_loop()
            self._inflight = loop.run_in_executor(self._executor, self._read)
            self._inflight.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.shield(self._inflight), self.timeout_s)
        except TimeoutError:
            self.timeouts += 1
            error = f"card read still running after {self.timeout_s:g} s (driver busy or wedged)"
            return Snapshot([self._error_record(i, error) for i in self.source.gpu_indices],
                            self.clock(), timed_out=True)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class Guard:
    """Pure ASGI: GET/HEAD only, no request body, the bearer token where one is set.

    The token is checked when the guard is built and on each request by the rules ``/energy``
    shares (:mod:`giul_asgi.serve.access`); loopback is decided at bind time (``build_server``).
    """

    PUBLIC = frozenset({"/healthz"})

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.access = Access(token=token, loopback_when_open=False, realm="giul-agent")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if scope["method"] not in ("GET", "HEAD"):
            await _plain(send, 405, b"read-only: GET only\n", [(b"allow", b"GET, HEAD")])
            return
        length = headers.get(b"content-length", b"0")
        if b"transfer-encoding" in headers or length.strip() not in (b"", b"0"):
            await _plain(send, 413, b"no request body is accepted\n")
            return
        if scope["path"] not in self.PUBLIC:
            refusal = await self.access.refusal(scope)
            if refusal is not None:
                await _plain(send, refusal.status, f"{refusal.error}\n".encode(), list(refusal.headers))
                return
        await self.app(scope, receive, send)


async def _plain(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _metrics_text(snapshot: Snapshot, shared: SharedRead, host: str) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _SnapshotCollector(Collector):
        def collect(self) -> Iterator[Any]:
            energy = CounterMetricFamily(
                "giul_agent_gpu_energy_joules", "GPU energy counter since driver load (J).",
                labels=["gpu", "uuid", "host"])
            power = GaugeMetricFamily("giul_agent_gpu_power_watts", "GPU instant power (W).",
                                      labels=["gpu", "uuid", "host"])
            up = GaugeMetricFamily("giul_agent_gpu_up", "1 when the GPU's last read succeeded.",
                                   labels=["gpu", "uuid", "host"])
            for g in snapshot.gpus:
                labels = [str(g["index"]), g.get("uuid") or "", host]
                if g.get("energy_j") is not None:
                    energy.add_metric(labels, g["energy_j"])
                if g.get("power_w") is not None:
                    power.add_metric(labels, g["power_w"])
                up.add_metric(labels, 0.0 if g.get("error") else 1.0)
            yield energy
            yield power
            yield up
            yield CounterMetricFamily("giul_agent_reads", "Card reads made (shared by callers).",
                                      value=shared.reads)
            yield CounterMetricFamily("giul_agent_read_timeouts", "Callers answered while a read hung.",
                                      value=shared.timeouts)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector())
    return generate_latest(registry)


def make_app(
    source: GpuSource,
    *,
    token: str | None = None,
    cache_s: float = DEFAULT_CACHE_S,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    host_name: str | None = None,
) -> ASGIApp:
    """The agent as an ASGI app (``serve`` runs it under uvicorn)."""
    shared = SharedRead(source, cache_s=cache_s, timeout_s=read_timeout_s, clock=clock)
    host = host_name or socket.gethostname()

    async def readings(request: Request) -> Response:
        snapshot = await shared.get()
        body = {"schema": SCHEMA, "host": host, "simulated": bool(source.simulated),
                "now": clock(), "gpus": snapshot.gpus}
        return Response(json.dumps(body, allow_nan=False), media_type="application/json",
                        headers={"cache-control": "no-store"})

    async def healthz(request: Request) -> Response:
        snapshot = await shared.get()
        ok = not snapshot.timed_out and any(not g.get("error") for g in snapshot.gpus)
        return JSONResponse({"ok": ok, "gpus": len(snapshot.gpus)}, status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        snapshot = await shared.get()
        return Response(_metrics_text(snapshot, shared, host), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            shared.close()

    app = Starlette(
        routes=[Route("/readings", readings, methods=["GET"]),
                Route("/healthz", healthz, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"])],
        lifespan=lifespan,
    )
    app.state.shared = shared
    guarded = Guard(app, token)
    guarded.shared = shared  # type: ignore[attr-defined]
    return guarded


def build_server(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    gpus: Sequence[int] = (),
    cache_s: float = DEFAULT_CACHE_S,
    reader: GpuSource | None = None,
    *,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    allow_open: bool = False,
    nvml: Any | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """A ready ``uvicorn.Server`` for the agent (``serve`` runs it; tests run it in a thread)."""
    import uvicorn

    token = check_token(token)
    if not is_loopback(host) and token is None and not allow_open:
        raise ConfigError(
            f"giul-agent would serve {host} without a token",
            remedy="give a token (--token-file or $GIUL_AGENT_TOKEN), bind 127.0.0.1 behind a "
            "proxy, or pass --insecure-no-token on a trusted network",
        )
    if cache_s < 0 or read_timeout_s <= 0 or max_concurrency < 1:
        raise ConfigError("cache_s must be >= 0, read_timeout_s > 0 and max_concurrency >= 1")
    source = reader if reader is not None else NvmlSource(gpus, nvml=nvml, clock=clock)
    app = make_app(source, token=token, cache_s=cache_s, read_timeout_s=read_timeout_s, clock=clock)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
        limit_concurrency=max_concurrency, timeout_keep_alive=5, server_header=False,
        h11_max_incomplete_event_size=16 * 1024, loop="asyncio", http="h11",
    )
    return uvicorn.Server(config)


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    gpus: Sequence[int] = (),
    cache_s: float = DEFAULT_CACHE_S,
    reader: GpuSource | None = None,
    **kwargs: Any,
) -> None:
    """Run the agent until interrupted (blocking)."""
    server = build_server(host, port, token, gpus, cache_s, reader, **kwargs)
    try:
        server.run()
    finally:
        shared = getattr(getattr(server.config, "app", None), "shared", None)
        if shared is not None:
            shared.source.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``giul-asgi agent`` options."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; anything else needs a token)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--gpus", default="", help="NVML indices to serve, e.g. 0,1 (default: all)")
    parser.add_argument("--token-file", default=None,
                        help=f"file holding the bearer token (or set ${TOKEN_ENV})")
    parser.add_argument("--cache-ms", type=float, default=DEFAULT_CACHE_S * 1000,
                        help="share one card read among callers within this many ms (default 50)")
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                        help="seconds a card read may take before answers say the driver hangs")
    parser.add_argument("--max-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY,
                        help="connections served at once; more get 503")
    parser.add_argument("--insecure-no-token", action="store_true",
                        help="allow a non-loopback bind without a token")


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
        if not token:
            raise ConfigError(f"token file {args.token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def _gpus(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--gpus must be NVML indices like 0,1, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    """Run the agent from parsed ``add_arguments`` options; returns an exit status."""
    try:
        serve(args.host, args.port, _token(args), _gpus(args.gpus), args.cache_ms / 1000.0,
              read_timeout_s=args.read_timeout, max_concurrency=args.max_concurrency,
              allow_open=args.insecure_no_token)
    except (ConfigError, ReaderUnavailable, OSError) as exc:
        print(f"giul-agent: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="giul-asgi agent", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
