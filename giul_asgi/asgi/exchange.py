"""One request as it passes through the middleware: its meter, how it went, its one figure.

The exchange is the request's state and nothing else. It wraps the app's ``receive`` (the
only place a client's disconnect shows: a server's ``send`` stays silent after one) and
``send`` (the first ``http.response.start`` chooses a responder, through the ``choose``
function it was given, built from the middleware's options; every later message goes to
that responder, or, for a stream's common chunk, through the lane the responder keeps). Its figure
is made once, when someone first needs it (a header, the JSON block, a trailer): the
headers, the block and the stream all tell the same one. What settles later goes to the
listeners through the meter, on the reader's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from ..energy import Energy
from ..meter import Meter
from ..wire.body import energy_json, usage_tokens
from ..wire.sse import EVENT_ENDS, Lane
from .routing import route_template

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("giul_asgi.middleware")

#: The ASGI message type of a response body (responders share it).
BODY = "http.response.body"


class Responder(Protocol):
    """What the exchange asks of the responder its ``choose`` built (responders.py)."""

    head: Any
    complete: bool
    #: The chunks it lets through untouched, where it streams (None: every message to it).
    lane: Lane | None

    async def start(self) -> None: ...

    def send(self, message: Message) -> Awaitable[None]: ...

    async def flush(self) -> None: ...


class Exchange:
    """One request: the app's messages in, the responder chosen from its start, the figure."""

    __slots__ = (
        "_block", "_closed", "_counted", "_labelled", "also", "answered", "choose", "disconnected",
        "downstream", "energy", "keep", "meter", "responder", "root_path", "route_app", "scope",
        "server_receive", "settle_timeout", "status",
    )

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, meter: Meter, *,
        choose: Callable[[Message, Exchange], Responder], settle_timeout: float, route_app: Any,
        keep: Callable[[Energy, bytes], None] | None = None,
        answered: Callable[[Meter, str, int | None], None] | None = None,
    ) -> None:
        self.scope = scope
        self.server_receive = receive
        self.downstream = send
        self.meter = meter
        self.choose = choose
        self.settle_timeout = settle_timeout
        self.route_app = route_app  # whose mounts a route label is found in
        self.root_path: str = scope.get("root_path", "")
        self.responder: Responder | None = None
        self.status: int | None = None
        self.disconnected = False
        self.energy: Energy | None = None
        #: Where the figure is kept by id, with its JSON, the moment it is made (before any
        #: of it goes out): a client that got the id finds it, whatever happens next.
        self.keep = keep
        #: Told once that the request was answered, and how (:meth:`answer`).
        self.answered = answered
        self._counted: str | None = None  # how it was counted (None: not yet, or nobody told)
        self._labelled = False
        self._block: bytes | None = None
        self._closed = False
        #: Headers the answer's start carries beside the figure's (its budget's remaining).
        self.also: tuple[tuple[bytes, bytes], ...] = ()

    # -- the app's side ----------------------------------------------------------------------
    async def receive(self) -> Message:
        message = await self.server_receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True  # the only sign of a disconnect (send() stays silent)
        return message

    def send(self, message: Message) -> Awaitable[None]:
        # A plain function handing on the awaitable. A stream's common chunk takes the
        # responder's lane here: Lane.passes and Lane.passed inlined, one C-level search and
        # no other frame of ours (measured 0.43-0.53 -> 0.38-0.40 us a chunk against a call
        # through to the responder). The search is rfind: on a 140-byte chat chunk 90 ns,
        # against find's 110, ``in``'s 200 and the regex's 170 (timeit, one run).
        responder = self.responder
        if responder is None:
            return self._first(message)
        lane = responder.lane
        if lane is not None and message.get("more_body", False):
            body = message.get("body", b"")
            needle = lane.needle
            if needle is None or (body.endswith(EVENT_ENDS) and body.rfind(needle) < 0):
                lane.tail = body if len(body) > 3 else lane.tail[-4:] + body  # a short one joins
                return self.downstream(message)
        if self._counted is None and not message.get("more_body", False) and message["type"] == BODY:
            self.answer("ok")  # before the server has the last byte: a worker killed after it
        return responder.send(message)

    async def _first(self, message: Message) -> None:
        if message["type"] != "http.response.start":
            await self.downstream(message)  # not ours to judge: the server will
            return
        self.responder = responder = self.choose(message, self)
        self.status = responder.head.status
        await responder.start()

    def answer(self, outcome: str) -> str:
        """Count the request answered, once: at its last message, before the server has it
        (a worker killed with -9 just after had lost the count: one answered request in about
        five runs of tests/test_servers.py), or as it ended otherwise. Returns the outcome
        counted (``outcome`` unless it was counted already)."""
        counted, answered = self._counted, self.answered
        if counted is not None or answered is None:
            return counted or outcome
        self._counted = outcome
        try:
            self._label()
            answered(self.meter, outcome, self.status)
        except Exception:  # a bug of ours costs the count, never the answer
            log.exception("giul-asgi could not count this request as answered")
        return outcome

    # -- the figure --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the window (once), labelled with the route the framework matched."""
        if self._closed:
            return
        self._closed = True
        try:
            self._label()
            self.meter.close()
        except Exception:  # a bug of ours must cost the figure, not the answer
            log.exception("giul-asgi could not close this request's window")

    def _label(self) -> None:
        """The meter's route (once): the one the framework matched, where it says."""
        if self._labelled:
            return
        self._labelled = True
        label = route_template(self.scope, self.root_path, self.route_app)
        if label is not None:
            self.meter.route = label

    def figure(self) -> Energy:
        """The answer's one figure: its headers, block and stream events all tell this."""
        if self.energy is None:
            try:
                self.close()
                energy = self.meter.figure()
            except Exception as exc:
                energy = self._unknown(exc)
            self._made(energy)
        assert self.energy is not None
        return self.energy

    async def finish(self) -> Energy:
        """:meth:`figure`, first waiting (``settle_timeout`` at most) for the reading that
        settles the window."""
        if self.energy is None and self.settle_timeout > 0:
            try:
                self.close()
                energy = await self.meter.settled(self.settle_timeout)
            except Exception as exc:
                energy = self._unknown(exc)
            if self.energy is None:
                self._made(energy)
        return self.figure()

    def _made(self, energy: Energy) -> None:
        """The figure is made: kept by id at once, with the block it will be written as."""
        self.energy = energy
        keep = self.keep
        if keep is not None:
            try:
                keep(energy, self.block())
            except Exception:  # a bug of ours must cost the record, not the answer
                log.exception("giul-asgi could not keep this request's record")

    def block(self) -> bytes:
        """The figure as the JSON block (written once)."""
        if self._block is None:
            self._block = energy_json(self.figure())
        return self._block

    def tokens(self, count: int | None, usage: Any = None) -> None:
        """The answer's token count (the options' kind) and, from its ``usage`` object, its
        prompt and completion tokens (what a phase split weighs)."""
        if count is not None and self.meter.token_count is None:
            self.meter.tokens(count)
        if usage is not None and self.meter.ledger.weighs_phases:  # read only where weighed
            self.meter.usage(usage_tokens(usage, "input"), usage_tokens(usage, "output"))

    def first_out(self) -> None:
        """A stream's first event went out: the end of its prefill (the meter marks it only
        where the node weighs phases). A bug of ours costs the mark, not the answer."""
        try:
            self.meter.first_out()
        except Exception:
            log.exception("giul-asgi could not mark this stream's first event")

    def _unknown(self, exc: Exception) -> Energy:
        log.exception("giul-asgi could not make this request's figure")
        meter = self.meter
        return Energy(
            joules=None, method="unknown", node=meter.node, route=meter.route,
            tier=meter.tier.name if meter.tier is not None else None,
            token_kind=meter.token_kind, error=f"internal error: {type(exc).__name__}: {exc}",
            id=meter.id, tenant=meter.tenant,
        )

    def release(self) -> None:
        """The request is over: let go of the responder, which points back here. Without
        the cycle the request's objects (the exchange, its responder and head, the figure,
        the app's send wrappers) go when the last reference does, not at the collector's
        next pass: see benchmarks/ledger_path.py's collections (the commit has them). A
        late message from the app finds no responder and passes as it is."""
        self.responder = None

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
        """The app raised. What it sent goes out as it would bare (a held start, a held
        chunk) before the exception propagates; nothing sent: the server answers 500."""
        name = type(exc).__name__
        if self.disconnected or name == "ClientDisconnect":
            outcome = "disconnect"
        elif name in ("CancelledError", "Cancelled"):
            outcome = "cancelled"  # the server stopped the request (shutdown, timeout)
        else:
            outcome = "error"  # OSError included: the app's, not the client's
        responder = self.responder
        if responder is None:
            if outcome == "error":
                self.status = 500  # nothing reached the client: the server answers 500
            return outcome
        try:
            await responder.flush()
        except Exception:  # the connection is gone: nothing to deliver
            log.debug("giul-asgi could not deliver what was held after the app raised")
        return outcome


__all__ = ["Exchange"]
