"""EnergyMiddleware: the ASGI plumbing that puts a meter around each request.

Pure ASGI (never ``BaseHTTPMiddleware``, which stops the clock at the headers and hides
mid-stream crashes). Per request it opens a window on the node's ledger, hands the handler
``current_meter()``, and on the way out:

- a complete body (one message, or a JSON body of known length in several): the window
  closes at its end, the ``X-Energy-*`` headers go on the response, and a JSON object gets
  an ``"energy"`` block with ``Content-Length`` fixed. Anything else passes byte for byte.
- a stream (``text/event-stream``, or any body sent in several messages): every chunk goes
  out when the app sends it. At the end the energy rides in the stream (see ``report``),
  in HTTP trailers when the client asked and the server offers them, and in the stats.

Nothing here reads a card or blocks: the ledger does that, once per node.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .config import Node, Route, Tier
from .energy import TOKEN_KINDS, Figure
from .ledger import Ledgers, default_ledgers
from .meter import Meter, _current
from .report import (
    SSEScanner,
    energy_event,
    energy_headers,
    energy_json,
    find_usage,
    is_usage_chunk,
    parse_object,
    splice_event,
    splice_object,
    stream_start_headers,
    usage_tokens,
)
from .routing import Decider, PathSet, Router, route_template
from .stats import EnergyStats

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
_HELD, _STREAM, _DONE = 0, 1, 2


class EnergyMiddleware:
    """Meters every HTTP request of ``app`` on the node its route runs on.

    With no ``nodes`` it meters one local node over every visible GPU (``unknown`` where
    there are none). With nodes and no ``routes``, the first node takes every request.
    ``decide(scope) -> (node, tier) | None`` routes anything patterns cannot; a handler can
    re-bind with ``current_meter().bind(node=..., tier=...)``.
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
        stats: EnergyStats | None = None,
        settle_timeout: float = 0.0,
    ) -> None:
        if token_kind not in TOKEN_KINDS:
            raise ValueError(f"token_kind must be one of {TOKEN_KINDS}, got {token_kind!r}")
        self.app = app
        node_list = list(nodes or ())
        if not node_list:
            node_list = [Node("local", gpus=())]  # every visible GPU; honest where none
        tier_list = list(tiers or ())
        if isinstance(default_tier, str):
            found = [t for t in tier_list if t.name == default_tier]
            if not found:
                raise ValueError(f"default_tier {default_tier!r} is not in tiers=[...]")
            default_tier = found[0]
        elif default_tier is None and len(tier_list) == 1:
            default_tier = tier_list[0]
        self.router = Router(
            node_list, tier_list, routes or (), default_node=node_list[0],
            default_tier=default_tier, decide=decide,
        )
        self.ledgers = ledgers if ledgers is not None else default_ledgers()
        self.stats = stats if stats is not None else EnergyStats()
        self.exclude = PathSet(exclude)
        self.energy_key = energy_key
        self.inject_json = inject_json
        self.max_body = max_body
        self.stream_event = stream_event
        self.usage_energy = usage_energy
        self.trailers = trailers
        self.token_kind = token_kind
        self.settle_timeout = settle_timeout
        self._catalog = self.router.catalog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if scope["path"] in self.exclude:  # the energy endpoint, metrics, health checks
            await self.app(scope, receive, send)
            return
        target = self.router.match(scope)
        node = target.node
        meter = Meter(
            self.ledgers.get(node) if node is not None else None, target.tier,
            route=target.label, token_kind=self.token_kind, ledgers=self.ledgers,
            catalog=self._catalog,
        )
        meter.open()
        exchange = _Exchange(self, scope, meter, send)

        async def receive_watch() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.disconnected = True
            return message

        token = _current.set(meter)
        try:
            await self.app(scope, receive_watch, exchange.send)
        except BaseException as exc:
            exchange.failed(exc)
            raise
        finally:
            _current.reset(token)
        if exchange.mode == _HELD and exchange.start is not None:
            # The app started a response and returned without a body: finish it empty.
            await exchange._finish_single(b"")
        exchange.returned()

    # -- lifecycle -------------------------------------------------------------------------
    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_startup() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
            return message

        async def send_shutdown(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.aclose()
            await send(message)

        await self.app(scope, receive_startup, send_shutdown)

    def start(self) -> None:
        """Start each node's reader on the running loop (lifespan startup does this)."""
        for node in self.router.nodes.values():
            self.ledgers.get(node).ensure_started()

    async def aclose(self) -> None:
        """Stop the readers and settle every figure (lifespan shutdown does this)."""
        for node in self.router.nodes.values():
            await self.ledgers.get(node).aclose()
        self.stats.fold(everything=True)


class _Exchange:
    """One request's response as it passes through: headers, body, stream, trailers.

    Defaults live on the class: one exchange is built per request, and most requests
    touch only a few of these fields.
    """

    mode = _HELD
    start: Message | None = None
    status: int | None = None
    disconnected = False
    complete = False
    recorded = False
    outcome = "ok"
    energy: Figure | None = None
    body_parts: list[bytes] | None = None
    buffered = 0
    scanner: SSEScanner | None = None
    held: bytes | None = None
    held_obj: Any = None  # the held usage event, as the scanner parsed it
    block: bytes | None = None  # the energy block, once written into the stream
    spliced = False
    our_trailers = False
    app_trailers = False
    sse = False
    ctype_json = False
    encoded = False
    content_length: int | None = None
    #: Where the app's one Content-Length header sits in its list (-1: none, or several).
    length_at = -1

    def __init__(self, mw: EnergyMiddleware, scope: Scope, meter: Meter, send: Send) -> None:
        self.mw = mw
        self.scope = scope
        self.meter = meter
        self.send_ = send

    # -- what the app sends ----------------------------------------------------------------
    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            mode = self.mode
            if mode == _HELD:
                if not message.get("more_body", False) and self.body_parts is None:
                    await self._finish_single(message.get("body", b""))  # the common case
                else:
                    await self._held_body(message)
            elif mode == _STREAM:
                scanner = self.scanner
                if message.get("more_body", False) and (
                    scanner is None
                    or (self.held is None and scanner.quiet(message.get("body", b"")))
                ):
                    await self.send_(message)  # a chunk with nothing to act on, as sent
                else:
                    await self._stream_body(message)
            else:
                await self.send_(message)
        elif kind == "http.response.start":
            self._read_start(message)
            if self.sse:
                await self._start_stream()
        elif kind == "http.response.trailers":
            if self.our_trailers and not message.get("more_trailers", False):
                message = {**message, "headers": [
                    *message.get("headers", []), *self._trailer_headers()
                ]}
            await self.send_(message)
        else:
            await self.send_(message)

    def _read_start(self, message: Message) -> None:
        self.start = message
        self.status = message.get("status")
        self.app_trailers = bool(message.get("trailers", False))
        lengths = 0
        for at, (key, value) in enumerate(message.get("headers", ())):
            name = key.lower()
            if name == b"content-type":
                ctype = value.split(b";", 1)[0].strip().lower()
                self.sse = ctype == b"text/event-stream"
                self.ctype_json = ctype == b"application/json" or ctype.endswith(b"+json")
            elif name == b"content-encoding":
                self.encoded = value.strip().lower() not in (b"", b"identity")
            elif name == b"content-length":
                lengths += 1
                self.length_at = at if lengths == 1 else -1
                try:
                    self.content_length = int(value)
                except ValueError:
                    self.content_length = None

    def _json_eligible(self, size: int) -> bool:
        return (
            self.mw.inject_json
            and self.ctype_json
            and not self.encoded
            and size <= self.mw.max_body
            and self.status not in _NO_BODY_STATUS
            and self.scope.get("method") != "HEAD"
        )

    async def _held_body(self, message: Message) -> None:
        """A body in parts (``send`` finishes a single-message body itself). A JSON body of
        announced length is gathered, within the limit; anything else becomes a stream."""
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.content_length is not None and self._json_eligible(self.content_length):
            if self.body_parts is None:
                self.body_parts = []
            self.body_parts.append(body)
            self.buffered += len(body)
            if self.buffered > self.content_length:
                await self._release_as_stream(message)
            elif not more:
                await self._finish_single(b"".join(self.body_parts))
            return
        await self._start_stream()
        await self._stream_body(message)

    async def _release_as_stream(self, message: Message) -> None:
        """The app sent more than it announced: stop gathering, pass everything through."""
        parts, self.body_parts = self.body_parts or [], None
        await self._start_stream()
        joined = b"".join(parts)
        await self._stream_body({
            "type": "http.response.body", "body": joined,
            "more_body": message.get("more_body", False),
        })

    async def _finish_single(self, body: bytes) -> None:
        """A complete body: close the window, add headers (and the JSON block), send."""
        obj = None
        if self._json_eligible(len(body)) and (
            self.content_length is None or self.content_length == len(body)
        ):
            obj = parse_object(body)
            if obj is not None and self.meter.token_count is None:
                self.meter.tokens(usage_tokens(find_usage(obj), self.mw.token_kind))
        energy = self._close_now() if self.mw.settle_timeout <= 0 else await self._close()
        start = self.start
        assert start is not None
        headers = list(start.get("headers", ()))
        if obj is not None:
            spliced = splice_object(body, obj, self.mw.energy_key, energy_json(energy))
            if spliced is not None:
                body = spliced
                length = (b"content-length", b"%d" % len(body))
                if self.length_at >= 0:
                    headers[self.length_at] = length  # in its place: the common case
                else:
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                    headers.append(length)
        headers += energy_headers(energy)
        self.mode = _DONE
        self.complete = True
        start["headers"] = headers  # as Starlette's own middleware do, in the app's message
        await self.send_(start)
        await self.send_({"type": "http.response.body", "body": body, "more_body": False})

    async def _start_stream(self) -> None:
        start = self.start
        assert start is not None
        self.mode = _STREAM
        mw = self.mw
        self.our_trailers = mw.trailers and self._client_wants_trailers()
        ledger = self.meter.ledger
        headers = list(start.get("headers", ()))
        headers += stream_start_headers(
            self.meter.node, self.meter.tier.name if self.meter.tier else None,
            ledger.provenance.backend if ledger is not None else "none",
            ledger.provenance.source if ledger is not None else "none",
            self.our_trailers,
        )
        if self.sse and not self.encoded:
            self.scanner = SSEScanner(mw.token_kind)
        message = {**start, "headers": headers}
        if self.our_trailers:
            message["trailers"] = True
        await self.send_(message)

    def _client_wants_trailers(self) -> bool:
        extensions = self.scope.get("extensions") or {}
        if "http.response.trailers" not in extensions:
            return False
        for key, value in self.scope.get("headers", ()):
            if key.lower() == b"te" and b"trailers" in value.lower():
                return True
        return False

    async def _stream_body(self, message: Message) -> None:
        body = message.get("body", b"")
        more = message.get("more_body", False)
        out = body
        if self.scanner is not None:
            out = await self._watch_events(body, more)
        if more:
            if out is body:
                await self.send_(message)
            elif out:
                await self.send_({"type": "http.response.body", "body": out, "more_body": True})
            return
        self.complete = True
        self.mode = _DONE
        if self.scanner is not None and self.scanner.tokens is not None:
            self._set_tokens(self.scanner.tokens)
        energy = await self._close()
        if self.scanner is not None and self.mw.stream_event:
            out += energy_event(energy, block=self.block)
        await self.send_({"type": "http.response.body", "body": out, "more_body": False})
        if self.our_trailers and not self.app_trailers:
            await self.send_({
                "type": "http.response.trailers", "headers": self._trailer_headers(),
                "more_trailers": False,
            })

    async def _watch_events(self, body: bytes, more: bool) -> bytes:
        """Pass the stream on, holding back only a final usage chunk until the stream says
        it is done, so the energy can ride in it (``chunk.energy`` for OpenAI clients)."""
        scanner = self.scanner
        assert scanner is not None
        was_done = scanner.done
        events = scanner.feed(body)
        out = body
        if self.held is not None:
            held, self.held = self.held, None
            held_obj, self.held_obj = self.held_obj, None
            done_now = scanner.done and not was_done
            if done_now or (not more and not body.strip()):
                out = await self._splice_usage(held, held_obj) + body
            else:
                out = held + body
        if not self.mw.usage_energy or self.spliced or not events:
            return out
        if scanner.done and not was_done:
            # Usage and [DONE] in one message: splice the usage event in place.
            for (raw, obj), (nxt, _) in itertools.pairwise(events):
                if is_usage_chunk(obj) and b"[DONE]" in nxt:
                    at = out.rfind(raw)
                    if at >= 0:
                        spliced = await self._splice_usage(raw, obj)
                        out = out[:at] + spliced + out[at + len(raw):]
                    break
        elif more and scanner.at_boundary and is_usage_chunk(events[-1][1]):
            raw = events[-1][0]
            if out.endswith(raw):
                self.held, self.held_obj = raw, events[-1][1]
                out = out[: len(out) - len(raw)]
        return out

    async def _splice_usage(self, raw: bytes, obj: Any) -> bytes:
        assert self.scanner is not None
        if self.scanner.tokens is not None:
            self._set_tokens(self.scanner.tokens)
        energy = await self._close()
        self.block = energy_json(energy)
        spliced = splice_event(raw, self.mw.energy_key, self.block, obj)
        if spliced is None:
            return raw
        self.spliced = True
        return spliced

    def _set_tokens(self, count: int) -> None:
        if self.meter.token_count is None:
            self.meter.tokens(count)

    def _trailer_headers(self) -> list[tuple[bytes, bytes]]:
        return energy_headers(self._close_now())

    # -- closing and recording -------------------------------------------------------------
    def _close_now(self) -> Figure:
        """The answer's one figure: the window is closed and graded once, and every later
        ask gets the same (a stream's usage chunk and its closing event tell the same)."""
        if self.energy is None:
            self._close_window()
            self.energy = self.meter.figure()
        return self.energy

    def _close_window(self) -> None:
        # By now the framework has matched a route: label the figure with its template.
        self.meter.route = route_template(self.scope) or self.meter.route
        self.meter.close()

    async def _close(self) -> Figure:
        """:meth:`_close_now`, first waiting (``settle_timeout`` at most) for the reading
        that settles the window."""
        meter = self.meter
        if self.energy is None and self.mw.settle_timeout > 0 and meter.ledger is not None:
            self._close_window()
            if meter.window is not None:
                await meter.ledger.wait_settled(meter.window, self.mw.settle_timeout)
        return self._close_now()

    def failed(self, exc: BaseException) -> None:
        name = type(exc).__name__
        if self.disconnected or isinstance(exc, OSError) or name == "ClientDisconnect":
            self.outcome = "disconnect"
        elif name in ("CancelledError", "Cancelled"):
            self.outcome = "cancelled"  # the server stopped the request (shutdown, timeout)
        else:
            self.outcome = "error"
            if self.mode == _HELD:  # nothing reached the client: the server answers 500
                self.status = 500
        self._record()

    def returned(self) -> None:
        """The app returned (its response finished, if it sent one in full)."""
        if not self.complete:
            self.outcome = "disconnect" if self.disconnected else "incomplete"
        self._record()

    def _record(self) -> None:
        if self.recorded:
            return
        self.recorded = True
        if not self.meter.closed:
            self._close_window()
        self.mw.stats.defer(self.meter.route or "<unmatched>", self.status, self.outcome, self.meter)
