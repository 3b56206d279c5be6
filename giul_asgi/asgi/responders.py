"""How one response's messages pass, chosen once from its start, as Starlette's GZipResponder is.

The app's ``http.response.start`` is read once into a :class:`Head`; :func:`choose` picks a
responder for that shape and builds it from plain values (the request's exchange, the
server's ``send``, the settings it needs):

- :class:`JSONResponder`: a JSON body in one message, the one thing we hold. Its start
  waits for the body (within ``max_body``); then the window closes, the ``X-Energy-*``
  headers go on, the block goes in, and an existing Content-Length is corrected in place.
  A JSON body in several messages is a stream: its start and first part go out at once,
  and the rest passes as a :class:`PassThrough`'s does.
- :class:`SSEResponder`: an event stream. The start goes out at once; every chunk goes out
  as it comes (see :mod:`giul_asgi.wire.sse` for the one event that may wait).
- :class:`PassThrough`: everything else. The start goes out at once with where the request
  runs and its id; the figure rides in trailers where the client asked and the server
  offers them, and at ``/energy/requests/{id}``.

The figure's shape is the response's :class:`~giul_asgi.wire.formats.EnergyFormat`, chosen
once by :func:`choose` from the server's format and the request's ``Prefer`` and handed to
the JSON or SSE responder as a plain value, which asks it for the block and where the block
rides in a stream (``Preference-Applied`` goes out with the start where a client asked).

Whatever a responder holds, every message the app sends keeps its order relative to the
start: a ``pathsend``, ``zerocopysend`` or ``trailers`` message that comes before the body
releases the start first. No responder adds a Content-Length where the app had none, so
none lands beside a Transfer-Encoding or on a response with trailers.
"""

from __future__ import annotations

from collections.abc import Awaitable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..wire.body import (
    find_usage,
    parse_object,
    splice_object,
    splice_usage,
    usage_open,
    usage_tokens,
)
from ..wire.formats import Chosen, Formats
from ..wire.headers import energy_headers, stream_headers, with_vary
from ..wire.sse import CHAT, Lane, SSESplicer
from .exchange import BODY, Exchange, Send
from .options import Options

Message = MutableMapping[str, Any]
NO_BODY_STATUS = frozenset({204, 205, 304})


@dataclass(slots=True, eq=False)
class Head:
    """The app's ``http.response.start``, read once (and never changed: not frozen, which
    costs an ``object.__setattr__`` a field, 1.7 -> 0.2 us a response measured)."""

    message: Message
    status: int
    media_type: bytes  # lower-case, without parameters
    encoded: bool  # a Content-Encoding other than identity
    length: int | None  # the announced Content-Length (None: none, or not one number)
    length_at: int  # where the one Content-Length header sits (-1: none, or several)
    chunked: bool  # the app set a Transfer-Encoding itself
    trailers: bool  # the app will send trailers itself

    @classmethod
    def read(cls, message: Message) -> Head:
        media_type, encoded, chunked, length, length_at, lengths = b"", False, False, None, -1, 0
        for at, (key, value) in enumerate(message.get("headers", ())):
            name = key.lower()
            if name == b"content-type":
                media_type = value.split(b";", 1)[0].strip().lower()
            elif name == b"content-encoding":
                encoded = value.strip().lower() not in (b"", b"identity")
            elif name == b"transfer-encoding":
                chunked = True
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
            chunked, bool(message.get("trailers", False)),
        )

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.message.get("headers", ()))

    @property
    def is_json(self) -> bool:
        return self.media_type == b"application/json" or self.media_type.endswith(b"+json")

    @property
    def is_sse(self) -> bool:
        return self.media_type == b"text/event-stream"


def wants_trailers(scope: MutableMapping[str, Any]) -> bool:
    """The client sent ``TE: trailers`` and the server offers ``http.response.trailers``."""
    if "http.response.trailers" not in (scope.get("extensions") or {}):
        return False
    return any(
        key.lower() == b"te" and b"trailers" in value.lower()
        for key, value in scope.get("headers", ())
    )


#: The server's format when nobody says otherwise: ours.
DEFAULT_FORMATS = Formats()


def choose(
    message: Message, exchange: Exchange, options: Options, formats: Formats = DEFAULT_FORMATS,
) -> Responder:
    """The responder for a response of this shape (``options`` and ``formats``, the server's
    format and those a client may prefer, bound by the middleware)."""
    head = Head.read(message)
    send = exchange.downstream
    if (
        head.status in NO_BODY_STATUS or head.status < 200 or head.encoded
        or exchange.scope.get("method") == "HEAD"
    ):
        return PassThrough(exchange, head, send, trailers=False)
    if head.is_json and (head.length or 0) <= options.max_body:
        return JSONResponder(exchange, head, send, options,
                             formats.for_request(exchange.scope.get("headers", ())))
    trailers = options.trailers and not head.trailers and wants_trailers(exchange.scope)
    if head.is_sse and head.length is None:
        return SSEResponder(exchange, head, send, options,
                            formats.for_request(exchange.scope.get("headers", ())), trailers=trailers)
    return PassThrough(exchange, head, send, trailers=trailers)


class Responder:
    """One response's messages on their way to the server."""

    __slots__ = (
        "applied", "complete", "downstream", "exchange", "head", "lane", "started", "trailers", "vary",
    )

    def __init__(self, exchange: Exchange, head: Head, downstream: Send, *, trailers: bool) -> None:
        self.exchange = exchange
        self.head = head
        self.downstream = downstream
        self.trailers = trailers  # we announce trailers and send the figure in them
        self.started = False  # the start went out
        self.complete = False  # the last body message went out
        #: ``Preference-Applied`` where the client's ``Prefer`` chose the figure's format.
        self.applied: tuple[tuple[bytes, bytes], ...] = ()
        #: The figure's shape could follow a ``Prefer``: the start says ``Vary: Prefer``.
        self.vary = False
        #: Where it streams, the chunks it lets through untouched: the exchange passes them on
        #: itself, without a call to ``send`` (None: every message comes to ``send``).
        self.lane: Lane | None = None

    async def start(self) -> None:
        """The app sent its start: it goes out now, with what is known before the end."""
        await self.send_start()

    def send(self, message: Message) -> Awaitable[None]:
        raise NotImplementedError

    async def flush(self) -> None:
        """Deliver what is held, unchanged, without ending the response (the app raised or
        returned early)."""
        if not self.started:
            await self.send_start()

    async def send_start(
        self, extra: list[tuple[bytes, bytes]] | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """The app's start (``headers``: its headers, corrected) with ours added: the
        figure's when known (``extra``), else where the request runs and its id."""
        message = dict(self.head.message)
        if extra is None:
            meter = self.exchange.meter
            provenance = meter.provenance
            extra = stream_headers(
                meter.node, meter.tier.name if meter.tier is not None else None,
                provenance.backend, provenance.source, meter.id, self.trailers,
                provenance.boundary, provenance.pue,
            )
            if self.trailers:
                message["trailers"] = True
        base = list(headers if headers is not None else message.get("headers", ()))
        if self.vary:  # the app's headers alone: ours never say Vary (252 -> 56 opcodes a JSON answer)
            with_vary(base, b"Prefer")
        message["headers"] = [*base, *extra, *self.applied, *self.exchange.also]
        self.started = True
        await self.downstream(message)

    async def end(self, message: Message) -> None:
        """The last body message, then our trailers when we announced them. Without
        trailers the figure is made (and kept by id) before the last byte goes."""
        self.complete = True
        if not self.trailers:
            self.exchange.figure()
        await self.downstream(message)
        if self.trailers:
            await self.downstream({
                "type": "http.response.trailers", "more_trailers": False,
                "headers": energy_headers(await self.exchange.finish()),
            })

    async def pass_other(self, message: Message) -> None:
        """A message that is not a body (the app's own trailers, left as they are; a
        pathsend; anything else) goes out in its order, after the start."""
        if not self.started:
            await self.send_start()
        kind = message["type"]
        if (kind == "http.response.trailers" and not message.get("more_trailers", False)) or kind in (
            "http.response.pathsend", "http.response.zerocopysend",
        ):
            self.complete = True
            if not self.trailers:
                self.exchange.figure()  # kept by id before the answer ends, as in end()
        await self.downstream(message)

    async def pass_body(self, message: Message) -> None:
        """A message of a body we leave as it is: it goes out, the last one ending the answer."""
        if message["type"] != BODY:
            await self.pass_other(message)
        elif self.head.trailers:  # the app's own trailers follow: the body does not end it
            await self.downstream(message)
        else:
            await self.end(message)


class PassThrough(Responder):
    """Bytes untouched; the start at once with where the request runs and its id; the
    figure in trailers where asked. Its chunks go by its lane."""

    __slots__ = ()

    def __init__(self, exchange: Exchange, head: Head, downstream: Send, *, trailers: bool) -> None:
        super().__init__(exchange, head, downstream, trailers=trailers)
        self.lane = Lane()

    def send(self, message: Message) -> Awaitable[None]:
        return self.pass_body(message)


class JSONResponder(Responder):
    """A JSON body in one message: held with its start, then sent with the figure in its
    headers and the block in it."""

    __slots__ = ("format", "held", "options", "streaming")

    def __init__(
        self, exchange: Exchange, head: Head, downstream: Send, options: Options,
        chosen: Chosen = DEFAULT_FORMATS.default,
    ) -> None:
        super().__init__(exchange, head, downstream, trailers=False)
        self.options = options
        self.format = chosen.format
        self.applied = chosen.applied
        self.held: bytes | None = None  # the whole announced body, sent with more_body
        self.vary = chosen.vary
        self.streaming = False  # the body came in several messages: the rest passes as it is

    async def start(self) -> None:
        """Held until the body says whether it comes whole."""

    def send(self, message: Message) -> Awaitable[None]:
        if self.streaming:
            return self.pass_body(message)
        if message["type"] == BODY:
            if not message.get("more_body", False):
                return self._whole(message.get("body", b"") if self.held is None else self.held)
            if self.held is None and len(message.get("body", b"")) == self.head.length:
                # Every announced byte is here; only the empty end can follow (as
                # BaseHTTPMiddleware sends it): nothing a client could read waits.
                return self._hold(message.get("body", b""))
        return self._stream(message)

    async def _hold(self, body: bytes) -> None:
        self.held = body

    async def _whole(self, body: bytes) -> None:
        head, options, exchange = self.head, self.options, self.exchange
        obj = None
        if options.inject_json and len(body) <= options.max_body and (
            head.length is None or head.length == len(body)
        ):
            obj = parse_object(body)
            if obj is not None:
                usage = find_usage(obj)
                exchange.tokens(usage_tokens(usage, options.token_kind), usage)
        energy = await exchange.finish()
        headers = head.headers
        if obj is not None:
            spliced = splice_object(body, obj, options.energy_key,
                                   self.format.block(energy, exchange.block()))
            if spliced is not None and options.energy_in_usage and usage_open(obj):
                spliced = splice_usage(spliced, self.format.usage(energy)) or spliced
            if spliced is not None:
                body = spliced
                if head.length_at >= 0:  # corrected in place, the common case
                    headers[head.length_at] = (b"content-length", b"%d" % len(body))
                elif not head.chunked and not head.trailers:  # several, or none: one, true
                    # (never beside a Transfer-Encoding, never on a response with trailers)
                    headers = [h for h in headers if h[0].lower() != b"content-length"]
                    headers.append((b"content-length", b"%d" % len(body)))
        await self.send_start(energy_headers(energy), headers)
        self.complete = not head.trailers
        await self.downstream({"type": BODY, "body": body, "more_body": False})

    async def _stream(self, message: Message) -> None:
        """Not one whole body (a stream, or a message that must not wait behind the start):
        the start goes out now, and the rest passes as a :class:`PassThrough`'s does."""
        if not self.started:
            self.trailers = (
                self.options.trailers and not self.head.trailers
                and wants_trailers(self.exchange.scope)
            )
            await self.send_start()
        self.streaming = True
        self.lane = Lane()
        if self.held is not None:
            held, self.held = self.held, None
            await self.downstream({"type": BODY, "body": held, "more_body": True})
        await self.pass_body(message)

    async def flush(self) -> None:
        await super().flush()
        if self.held is not None:
            held, self.held = self.held, None
            await self.downstream({"type": BODY, "body": held, "more_body": True})


class SSEResponder(Responder):
    """An event stream: the start at once, every chunk as it comes, the energy in the
    event that ends the answer."""

    __slots__ = ("event", "format", "in_usage", "splicer")

    def __init__(
        self, exchange: Exchange, head: Head, downstream: Send, options: Options,
        chosen: Chosen = DEFAULT_FORMATS.default, *, trailers: bool,
    ) -> None:
        super().__init__(exchange, head, downstream, trailers=trailers)
        self.format = chosen.format
        self.applied = chosen.applied
        self.event = options.stream_event
        # A stream says Vary: Prefer only where the client asked: no cache stores an event
        # stream to serve it again, and the app's own stream headers are what proxies and
        # its tests read (Starlette's GZip suite asserts an excluded stream has no Vary).
        self.vary = bool(chosen.applied)
        self.in_usage = options.energy_in_usage
        self.splicer = SSESplicer(
            key=options.energy_key, token_kind=options.token_kind, splice=options.usage_energy
        )
        # The common chunk (whole events that cannot end or carry the answer, or any chunk
        # of a stream that is not OpenAI-shaped) goes by the splicer's lane.
        self.lane = self.splicer

    def send(self, message: Message) -> Awaitable[None]:
        return self._rest(message)

    async def _rest(self, message: Message) -> None:
        if message["type"] != BODY:
            await self.pass_other(message)
            return
        splicer = self.splicer
        body = message.get("body", b"")
        undecided = splicer.kind is None
        out = splicer.feed(body)
        if undecided and splicer.kind == CHAT:  # its first event: a server sends it with the first token
            self.exchange.first_out()
        if splicer.waiting:  # [DONE] after the event that carries the energy
            inline, before = self.format.stream(await self._block())
            out += splicer.resume(inline, self._usage() if inline else None, before=before)
        if message.get("more_body", False):
            if out == body:
                await self.downstream(message)  # as the app sent it
            elif out:
                await self.downstream({"type": BODY, "body": out, "more_body": True})
            return
        inline, before = None, b""
        if splicer.holding or self.event:
            inline, before = self.format.stream(await self._block())
        out += splicer.close(inline, event=self.event, usage=self._usage() if inline else None,
                             before=before)
        if self.head.trailers:
            await self.downstream({"type": BODY, "body": out, "more_body": False})
        else:
            await self.end({"type": BODY, "body": out, "more_body": False})

    def _usage(self) -> bytes | None:
        return self.format.usage(self.exchange.figure()) if self.in_usage else None

    async def _block(self) -> bytes:
        exchange = self.exchange
        exchange.tokens(self.splicer.tokens, self.splicer.usage)
        energy = await exchange.finish()
        return self.format.block(energy, exchange.block())

    async def flush(self) -> None:
        held = self.splicer.flush()
        if held:
            await self.downstream({"type": BODY, "body": held, "more_body": True})


__all__ = ["Head", "JSONResponder", "PassThrough", "Responder", "SSEResponder", "choose"]
