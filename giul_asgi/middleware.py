"""EnergyMiddleware: the ASGI plumbing that puts a meter around each request.

Pure ASGI (never ``BaseHTTPMiddleware``, which stops the clock at the headers and hides
mid-stream crashes). Per request it opens a window on the node's ledger, hands the handler
``current_meter()``, and reads the app's ``http.response.start`` once into a :class:`Head`.
From the head it chooses a responder for the response's shape, as Starlette's
``GZipMiddleware`` does:

- :class:`JSONResponder`: a JSON body to inject. It is held (within ``max_body``), the
  window closes at its end, the ``X-Energy-*`` headers go on, the ``"energy"`` block goes in
  and ``Content-Length`` is fixed. What cannot be parsed or spliced passes byte for byte.
- :class:`SSEResponder`: an event stream. Every event goes out when complete; the energy
  rides in the stream (see :class:`~giul_asgi.report.SSESplicer`), in trailers when the
  client asked and the server offers them.
- :class:`PassThrough`: anything else (other streams, HEAD, 204/304, compressed bodies, a
  stream of announced length). Bytes untouched: a body in one message gets the figure in
  its headers, a stream gets where it runs at its start and the figure in trailers.

The outcome is recorded in one place, ``__call__``'s ``finally``: the first figure is kept by
its id, and the settled one goes to the records, the statistics and the sinks when it
settles. Nothing here reads a card or blocks: the ledger does that, once per node.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from .config import Node, Route, Tier
from .context import meter_var
from .energy import TOKEN_KINDS, Energy
from .errors import ConfigError, GiulError
from .exporters.sink import RecordSink
from .ledger import Ledgers, default_ledgers
from .meter import Meter
from .records import RecordStore
from .report import (
    SSESplicer,
    energy_headers,
    energy_json,
    find_usage,
    parse_object,
    splice_object,
    stream_start_headers,
    usage_tokens,
)
from .routing import Decider, PathSet, Router, route_template

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("giul_asgi.middleware")

DEFAULT_EXCLUDE: tuple[str, ...] = (
    "/energy", "/energy/*", "/metrics", "/health", "/healthz", "/livez", "/readyz", "/ping",
)
DEFAULT_MAX_BODY = 4 * 1024 * 1024
_NO_BODY_STATUS = frozenset({204, 205, 304})
#: Without lifespan the first request starts the readers; it waits this long at most.


class Stats(Protocol):
    """What the middleware feeds: one settled figure per request, with how it ended."""

    def record(self, energy: Energy, *, outcome: str, status: int | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Head:
    """The app's ``http.response.start``, read once."""

    message: Message
    status: int
    media_type: bytes  # lower-case, without parameters
    encoded: bool  # a Content-Encoding other than identity
    length: int | None  # the announced Content-Length (None: none, or not one number)
    length_at: int  # where the one Content-Length header sits (-1: none, or several)
    trailers: bool  # the app will send trailers itself

    @classmethod
    def read(cls, message: Message) -> Head:
        media_type, encoded, length, length_at, lengths = b"", False, None, -1, 0
        for at, (key, value) in enumerate(message.get("headers", ())):
            name = key.lower()
            if name == b"content-type":
                media_type = value.split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding":
                encoded = value.strip().lower() not in (b"", b"identity")
            elif name == b"content-length":
                lengths += 1
                try:
                    this = int(value)
                except ValueError:
                    this = -1
                if lengths == 1:
                    length, length_at = (this if this >= 0 else None), at
                elif this != length:
                    length = None
                if lengths > 1:
                    length_at = -1
        return cls(
            message, int(message.get("status", 200)), media_type, encoded, length, length_at,
            bool(message.get("trailers", False)),
        )

    @property
    def is_json(self) -> bool:
        return self.media_type == b"application/json" or self.media_type.endswith(b"+json")

    @property
    def is_sse(self) -> bool:
        return self.media_type == b"text/event-stream"


class OtelSpans(RecordSink, Protocol):
    """What the middleware asks of OpenTelemetry (``exporters.otel.otel_recorder()``)."""

    def current_span(self) -> Any | None: ...

    def annotate(self, span: Any | None, energy: Energy) -> None: ...


class EnergyMiddleware:
    """Meters every HTTP request of ``app`` on the node its route runs on.

    With no ``nodes`` it meters one local node over every visible GPU (``unknown`` where
    there are none). With nodes and no ``routes``, the first node takes every request.
    ``decide(scope) -> (node, tier) | None`` routes anything patterns cannot; a handler can
    re-bind with ``current_meter().bind(node=..., tier=...)``. Configuration is checked
    here, once: a bad one raises :class:`ConfigError` before the app serves anything.
    """

    def __init__(
        self,
        app: ASGIApp,
        nodes: Iterable[Node] | None = None,
        tiers: Iterable[Tier] | None = None,
        routes: Iterable[Route] | None = None,
        *,
        decide: Decider | None = None,
        default_tier: Tier | str | None = None,
        exclude: Iterable[str] = DEFAULT_EXCLUDE,
        energy_key: str = "energy",
        inject_json: bool = True,
        max_body: int = DEFAULT_MAX_BODY,
        stream_event: bool = True,
        usage_energy: bool = True,
        trailers: bool = True,
        token_kind: str = "output",
        ledgers: Ledgers | None = None,
        stats: Stats | None = None,
        settle_timeout: float = 0.0,
        startup_timeout: float = 0.5,
        energy_path: str | None = "/energy",
        metrics_path: str | None = None,
        endpoint_token: str | None = None,
        endpoint_guard: Callable[[Scope], bool] | None = None,
        records: RecordStore | None = None,
        sinks: Iterable[RecordSink] = (),
        otel: OtelSpans | None = None,
    ) -> None:
        if token_kind not in TOKEN_KINDS:
            raise ConfigError(
                f"token_kind must be one of {TOKEN_KINDS}, got {token_kind!r}",
                remedy="use output (generated tokens), input or total",
            )
        self.app = app
        node_list = list(nodes or ())
        if not node_list:
            node_list = [Node("local", gpus=())]  # every visible GPU; honest where none
        tier_list = list(tiers or ())
        if isinstance(default_tier, str):
            found = [t for t in tier_list if t.name == default_tier]
            if not found:
                raise ConfigError(
                    f"default_tier {default_tier!r} is not declared",
                    remedy="add it to tiers=[...] or name one that is",
                )
            default_tier = found[0]
        elif default_tier is None and len(tier_list) == 1:
            default_tier = tier_list[0]
        self.router = Router(
            node_list, tier_list, routes or (), default_node=node_list[0],
            default_tier=default_tier, decide=decide,
        )
        self.ledgers = ledgers if ledgers is not None else default_ledgers()
        self._stats = stats
        self.exclude = PathSet(exclude)
        self.energy_key = energy_key
        self.inject_json = inject_json
        self.max_body = max_body
        self.stream_event = stream_event
        self.usage_energy = usage_energy
        self.trailers = trailers
        self.token_kind = token_kind
        self.settle_timeout = settle_timeout
        self.startup_timeout = startup_timeout
        self.energy_path = energy_path
        self.metrics_path = metrics_path
        self._endpoint_token = endpoint_token
        self._endpoint_guard = endpoint_guard
        self._endpoint: ASGIApp | None = None
        self._endpoint_built = False
        #: Every figure by request id (first, then settled), for /energy/requests/{id}.
        self.records = records if records is not None else RecordStore()
        #: Called with every settled figure (JSON lines, a callback, OpenTelemetry metrics).
        self.sinks = list(sinks)
        #: Puts giul.energy.* on the request's recording span (OpenTelemetry, optional).
        self.otel = otel
        if otel is not None and otel not in self.sinks:
            self.sinks.append(otel)
        self._catalog = self.router.catalog()
        self._started = False  # the readers were started (lifespan, or the first request)
        self.startup_error: GiulError | None = None

    # -- the statistics and the /energy endpoint -------------------------------------------
    @property
    def stats(self) -> Stats | None:
        """Where settled figures go: the ``stats`` given, else ``giul_asgi.stats.EnergyStats``."""
        if self._stats is None:
            try:
                from .stats import EnergyStats
            except ImportError:  # pragma: no cover - the module is part of the package
                return None
            self._stats = cast(Stats, EnergyStats())
        return self._stats

    @property
    def endpoint(self) -> ASGIApp | None:
        """The app that serves ``energy_path`` and ``metrics_path`` (None: not installed)."""
        if not self._endpoint_built:
            self._endpoint_built = True
            try:
                endpoint_module = importlib.import_module(".endpoint", __package__)
            except ImportError:  # the endpoint is not part of this install
                return None
            self._endpoint = endpoint_module.EnergyEndpoint(
                stats=self.stats, ledgers=self.ledgers, path=self.energy_path,
                metrics_path=self.metrics_path, token=self._endpoint_token,
                guard=self._endpoint_guard, records=self.records,
            )
        return self._endpoint

    def _is_endpoint(self, path: str) -> bool:
        energy = self.energy_path
        if energy is not None and (path == energy or path.startswith(energy + "/")):
            return True
        return self.metrics_path is not None and path == self.metrics_path

    # -- a request ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        path = scope["path"]
        if self._is_endpoint(path):
            # Hook for the /energy endpoint: served by giul_asgi.endpoint where installed.
            endpoint = self.endpoint
            await (endpoint or self.app)(scope, receive, send)
            return
        if path in self.exclude:  # metrics, health checks
            await self.app(scope, receive, send)
            return
        if not self._started:
            await self._start_without_lifespan()
        target = self.router.match(scope)
        meter = Meter(
            self.ledgers.get(target.node), target.tier, route=target.label,
            token_kind=self.token_kind, ledgers=self.ledgers, catalog=self._catalog,
        )
        meter.open()
        exchange = Exchange(self, scope, meter, send, receive)
        span = self.otel.current_span() if self.otel is not None else None
        outcome = "incomplete"
        token = meter_var.set(meter)
        try:
            await self.app(scope, exchange.receive, exchange.send)
            outcome = await exchange.returned()
        except BaseException as exc:
            outcome = await exchange.failed(exc)
            raise
        finally:
            meter_var.reset(token)
            exchange.close()
            first = exchange.figure()
            self.records.put(first)
            if span is not None and self.otel is not None:
                self.otel.annotate(span, first)
            self._record(meter, outcome, exchange.status, first.settled)

    def _record(self, meter: Meter, outcome: str, status: int | None, first_settled: bool) -> None:
        """Once the figure settles: the statistics, the record by id, and every sink."""
        stats, records, sinks = self.stats, self.records, self.sinks

        def settled(energy: Energy) -> None:
            if not first_settled:  # the first figure, already kept, was not the settled one
                records.put(energy)
            if stats is not None:
                stats.record(energy, outcome=outcome, status=status)
            for sink in sinks:
                sink(energy, outcome=outcome, status=status)

        meter.on_settled(settled)

    def choose(self, head: Head, exchange: Exchange) -> Responder:
        """The responder for a response of this shape."""
        no_body = (
            head.status in _NO_BODY_STATUS or head.status < 200
            or exchange.scope.get("method") == "HEAD"
        )
        if no_body or head.encoded:
            return PassThrough(exchange, head)
        if head.is_sse:
            if head.length is None:
                return SSEResponder(exchange, head)
            return PassThrough(exchange, head)  # announced length: nothing may be appended
        if self.inject_json and head.is_json and (head.length or 0) <= self.max_body:
            return JSONResponder(exchange, head)
        return PassThrough(exchange, head)

    # -- lifecycle -------------------------------------------------------------------------
    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Start the readers at startup (a reader that cannot work fails the startup, with
        its remedy, so ``uvicorn app:app`` stops with it); stop them at shutdown."""
        answered = False

        async def receive_lifespan() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
            return message

        async def send_lifespan(message: Message) -> None:
            nonlocal answered
            kind = message["type"]
            if kind == "lifespan.startup.complete" and self.startup_error is not None:
                answered = True
                await send({"type": "lifespan.startup.failed", "message": self._failure()})
                return
            if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
                answered = True
            if kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.aclose()
            await send(message)

        try:
            await self.app(scope, receive_lifespan, send_lifespan)
        except BaseException:
            # An app without lifespan support raises here; our own failure still stops
            # the server rather than letting it serve figures that cannot be measured.
            if self.startup_error is not None and not answered:
                await send({"type": "lifespan.startup.failed", "message": self._failure()})
                return
            raise

    def _failure(self) -> str:
        error = self.startup_error
        assert error is not None
        text = f"giul-asgi: {error.message}"
        return f"{text}. {error.remedy}" if error.remedy else text

    async def start(self, timeout: float | None = None) -> None:
        """Start each node's reader and wait (``startup_timeout`` at most) until built.
        A reader asked for by name that cannot work is kept in :attr:`startup_error`."""
        self._started = True
        try:
            await self.ledgers.start(
                list(self.router.nodes.values()),
                timeout=self.startup_timeout if timeout is None else timeout,
            )
        except GiulError as exc:
            # Kept for lifespan (it fails the startup with it); the ledger has logged it.
            self.startup_error = exc

    async def _start_without_lifespan(self) -> None:
        # No lifespan (or a server that does not send it): the first request starts the
        # readers and does not wait for them (a wedged driver must not hold it); a failure
        # is logged once by the ledger and figures say unknown, never a 500 from us.
        if self._started:
            return
        self._started = True
        for node in self.router.nodes.values():
            self.ledgers.get(node).ensure_started()

    async def aclose(self) -> None:
        """Stop the readers and settle every figure, then flush the sinks (lifespan
        shutdown does this): no settled record is lost on a clean shutdown."""
        await self.ledgers.aclose(timeout=self.startup_timeout)
        for sink in self.sinks:
            await sink.aclose()


class Exchange:
    """One request as it passes through: the meter, the app's messages, the responder."""

    __slots__ = (
        "_app", "_block", "_closed", "disconnected", "downstream", "energy", "meter", "mw",
        "responder", "root_path", "scope", "status", "upstream",
    )

    def __init__(
        self, mw: EnergyMiddleware, scope: Scope, meter: Meter, send: Send, receive: Receive
    ) -> None:
        self.mw = mw
        self.scope = scope
        self.meter = meter
        self.downstream = send
        self.upstream = receive
        self.responder: Responder | None = None
        self.status: int | None = None
        self.disconnected = False
        self.energy: Energy | None = None
        self.root_path: str = scope.get("root_path", "")
        self._app = scope.get("app") or mw.app  # whose mounts a route label is found in
        self._block: bytes | None = None
        self._closed = False

    async def receive(self) -> Message:
        message = await self.upstream()
        if message["type"] == "http.disconnect":
            self.disconnected = True  # the only sign of a disconnect (send() stays silent)
        return message

    async def send(self, message: Message) -> None:
        responder = self.responder
        if responder is not None:
            await responder.send(message)
        elif message["type"] == "http.response.start":
            head = Head.read(message)
            self.status = head.status
            self.responder = responder = self.mw.choose(head, self)
            await responder.start()
        else:
            await self.downstream(message)

    # -- the figure --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the window (once), labelled with the route the framework matched."""
        if not self._closed:
            self._closed = True
            label = route_template(self.scope, self.root_path, self._app)
            if label is not None:
                self.meter.route = label
            self.meter.close()

    def figure(self) -> Energy:
        """The answer's one figure: its headers, block and stream events all tell this."""
        if self.energy is None:
            try:
                self.close()
                self.energy = self.meter.figure()
            except Exception as exc:  # a bug of ours must cost the figure, not the answer
                self.energy = self._unknown(exc)
        return self.energy

    async def finish(self) -> Energy:
        """:meth:`figure`, first waiting (``settle_timeout`` at most) for the reading that
        settles the window."""
        if self.energy is None and self.mw.settle_timeout > 0:
            try:
                self.close()
                self.energy = await self.meter.settled(self.mw.settle_timeout)
            except Exception as exc:
                self.energy = self._unknown(exc)
        return self.figure()

    def _unknown(self, exc: Exception) -> Energy:
        log.exception("giul-asgi could not make this request's figure")
        meter = self.meter
        return Energy(
            joules=None, method="unknown", node=meter.node, route=meter.route,
            tier=meter.tier.name if meter.tier is not None else None,
            token_kind=meter.token_kind, error=f"internal error: {type(exc).__name__}: {exc}",
            id=meter.id,
        )

    def block(self) -> bytes:
        """The figure as the JSON block (written once)."""
        if self._block is None:
            self._block = energy_json(self.figure())
        return self._block

    def tokens(self, count: int | None) -> None:
        if count is not None and self.meter.token_count is None:
            self.meter.tokens(count)

    def stream_headers(self, trailers: bool) -> list[tuple[bytes, bytes]]:
        meter = self.meter
        provenance = meter.provenance
        return stream_start_headers(
            meter.node, meter.tier.name if meter.tier is not None else None,
            provenance.backend, provenance.source, meter.id, trailers,
        )

    def client_wants_trailers(self) -> bool:
        if not self.mw.trailers:
            return False
        if "http.response.trailers" not in (self.scope.get("extensions") or {}):
            return False
        return any(
            key.lower() == b"te" and b"trailers" in value.lower()
            for key, value in self.scope.get("headers", ())
        )

    # -- how it ended ------------------------------------------------------------------------
    async def returned(self) -> str:
        """The app returned. A response it left unfinished keeps what it sent."""
        responder = self.responder
        if responder is not None and responder.complete:
            return "ok"
        if responder is not None:
            await responder.flush()
        return "disconnect" if self.disconnected else "incomplete"

    async def failed(self, exc: BaseException) -> str:
        """The app raised. What the client was already promised is delivered (a held
        chunk); a response not yet started is left to the server's 500."""
        name = type(exc).__name__
        if self.disconnected or name == "ClientDisconnect":
            outcome = "disconnect"
        elif name in ("CancelledError", "Cancelled"):
            outcome = "cancelled"  # the server stopped the request (shutdown, timeout)
        else:
            outcome = "error"  # OSError included: the app's, not the client's
        responder = self.responder
        if responder is None or not responder.started:
            if outcome == "error":
                self.status = 500  # nothing reached the client: the server answers 500
        else:
            with contextlib.suppress(Exception):  # the connection is gone: nothing to deliver
                await responder.flush()
        return outcome


class Responder:
    """How one response's messages pass; built from its :class:`Head` by ``choose``."""

    def __init__(self, exchange: Exchange, head: Head) -> None:
        self.exchange = exchange
        self.head = head
        self.downstream = exchange.downstream
        self.started = False  # the start message went out
        self.complete = False  # the last body message went out
        self.trailers = False  # we announced trailers

    async def start(self) -> None:
        """The app sent its start (the default holds it until the body decides)."""

    async def send(self, message: Message) -> None:
        raise NotImplementedError

    async def flush(self) -> None:
        """Deliver what is held, unchanged, without ending the response."""

    async def send_start(self, headers: list[tuple[bytes, bytes]], trailers: bool) -> None:
        message = {**self.head.message, "headers": headers}
        if trailers:
            message["trailers"] = True
        self.started = True
        self.trailers = trailers
        await self.downstream(message)

    async def start_stream(self) -> None:
        """The start, with what is known before the end (where it runs), and trailers when
        the client asked and the server offers them."""
        ours = self.exchange.client_wants_trailers()
        await self.send_start(
            [*self.head.message.get("headers", ()), *self.exchange.stream_headers(ours)], ours
        )

    async def send_whole(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """A complete body and its start, with the figure in the headers."""
        await self.send_start([*headers, *energy_headers(self.exchange.figure())], False)
        self.complete = True
        await self.downstream({"type": "http.response.body", "body": body, "more_body": False})

    async def end_stream(self, body: bytes) -> None:
        self.complete = True
        await self.downstream({"type": "http.response.body", "body": body, "more_body": False})
        if self.trailers and not self.head.trailers:
            await self.downstream({
                "type": "http.response.trailers", "more_trailers": False,
                "headers": energy_headers(await self.exchange.finish()),
            })

    async def pass_trailers(self, message: Message) -> None:
        if self.trailers and not message.get("more_trailers", False):
            message = {**message, "headers": [
                *message.get("headers", ()), *energy_headers(await self.exchange.finish())
            ]}
        await self.downstream(message)


class PassThrough(Responder):
    """Bytes untouched. A body in one message: the figure in its headers. A body in
    several: the start goes out with the first, the figure in trailers where asked."""

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            more = message.get("more_body", False)
            if not self.started:
                if not more:
                    await self.exchange.finish()
                    await self.send_whole(
                        message.get("body", b""), list(self.head.message.get("headers", ()))
                    )
                    return
                await self.start_stream()
            if more:
                await self.downstream(message)
            else:
                await self.exchange.finish()
                await self.end_stream(message.get("body", b""))
        elif kind == "http.response.trailers":
            await self.pass_trailers(message)
        else:
            await self.downstream(message)

    async def flush(self) -> None:
        if not self.started:
            await self.send_start(list(self.head.message.get("headers", ())), False)


class JSONResponder(Responder):
    """A JSON body held whole (within its announced length and ``max_body``), then sent
    with the ``"energy"`` block in it and its length fixed."""

    def __init__(self, exchange: Exchange, head: Head) -> None:
        super().__init__(exchange, head)
        self.parts: list[bytes] = []
        self.size = 0
        mw = exchange.mw
        self.limit = min(head.length, mw.max_body) if head.length is not None else mw.max_body

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind != "http.response.body":
            if kind == "http.response.trailers":
                await self.pass_trailers(message)
            else:
                await self.downstream(message)
            return
        body = message.get("body", b"")
        if message.get("more_body", False):
            self.parts.append(body)
            self.size += len(body)
            if self.size > self.limit:
                await self._release(more=True)
            return
        if self.parts:
            self.parts.append(body)
            self.size += len(body)
            if self.size > self.limit:
                await self._release(more=False)
                return
            body = b"".join(self.parts)
        await self._finish(body)

    async def _finish(self, body: bytes) -> None:
        head = self.head
        exchange = self.exchange
        obj = parse_object(body) if head.length is None or head.length == len(body) else None
        if obj is not None:
            exchange.tokens(usage_tokens(find_usage(obj), exchange.mw.token_kind))
        await exchange.finish()
        headers = list(head.message.get("headers", ()))
        if obj is not None:
            spliced = splice_object(body, obj, exchange.mw.energy_key, exchange.block())
            if spliced is not None:
                body = spliced
                length = (b"content-length", b"%d" % len(body))
                if head.length_at >= 0:
                    headers[head.length_at] = length  # in its place: the common case
                else:
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                    headers.append(length)
        await self.send_whole(body, headers)

    async def _release(self, *, more: bool) -> None:
        """More than the limit (or than announced): pass everything through as a stream."""
        parts, self.parts = self.parts, []
        stream = PassThrough(self.exchange, self.head)
        self.exchange.responder = stream
        await stream.start_stream()
        await stream.send({
            "type": "http.response.body", "body": b"".join(parts), "more_body": more,
        })

    async def flush(self) -> None:
        if not self.started:
            await self.send_start(list(self.head.message.get("headers", ())), False)
        if self.parts:
            parts, self.parts = self.parts, []
            await self.downstream({
                "type": "http.response.body", "body": b"".join(parts), "more_body": True,
            })


class SSEResponder(Responder):
    """An event stream: the start at once, each event as it completes, the energy in the
    event that ends the answer (see :class:`~giul_asgi.report.SSESplicer`)."""

    def __init__(self, exchange: Exchange, head: Head) -> None:
        super().__init__(exchange, head)
        mw = exchange.mw
        self.splicer = SSESplicer(
            key=mw.energy_key, token_kind=mw.token_kind, splice=mw.usage_energy
        )

    async def start(self) -> None:
        await self.start_stream()

    async def send(self, message: Message) -> None:
        if message["type"] != "http.response.body":
            if message["type"] == "http.response.trailers":
                await self.pass_trailers(message)
            else:
                await self.downstream(message)
            return
        splicer = self.splicer
        body = message.get("body", b"")
        out = splicer.feed(body)
        if splicer.waiting:  # [DONE] after the event that carries the energy
            out += splicer.resume(await self._block())
        if message.get("more_body", False):
            if out is body:
                await self.downstream(message)  # as the app sent it: the common chunk
            elif out:
                await self.downstream(
                    {"type": "http.response.body", "body": out, "more_body": True}
                )
            return
        block = await self._block()
        await self.end_stream(out + splicer.close(block, event=self.exchange.mw.stream_event))

    async def _block(self) -> bytes:
        exchange = self.exchange
        exchange.tokens(self.splicer.tokens)
        await exchange.finish()
        return exchange.block()

    async def flush(self) -> None:
        held = self.splicer.flush()
        if held:
            await self.downstream({"type": "http.response.body", "body": held, "more_body": True})
