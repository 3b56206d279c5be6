"""Apps and helpers the middleware tests share: a busy simulated node, raw ASGI drivers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NamedTuple

from giul_asgi import EnergyMiddleware, Ledgers, Node
from giul_asgi.energy import Energy
from giul_asgi.listeners import Settled
from giul_asgi.readers import Reading
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader
from giul_asgi.stats import EnergyStats

Message = dict[str, Any]


def busy_node(name: str = "sim", load_w: float = 100.0, period: float = 0.02) -> tuple[Node, SimulatedCard]:
    """A simulated card drawing ``load_w`` above its 60 W floor, on the real clock."""
    card = SimulatedCard(idle_w=60.0, cap_w=700.0, counter_period=period)
    card.start_job(load_w)
    node = Node(
        name, idle_w=60.0, period_s=period,
        reader_factory=lambda _n: SimulatedReader(card, period=period),
    )
    return node, card


class WedgedReader:
    """A counter whose driver answers the baseline read, then hangs until ``release``."""

    backend, source, method, kind, period, blocking = (
        "nvml_counter", "local", "measured", "counter", 0.02, True
    )
    clock = staticmethod(time.monotonic)

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.calls = 0

    def read(self) -> Reading:
        self.calls += 1
        if self.calls > 1:
            self.release.wait(5.0)
        return Reading(t=time.monotonic(), joules=float(self.calls))

    def close(self) -> None:
        return None


def find_middleware(app: Any) -> EnergyMiddleware:
    """The EnergyMiddleware instance inside a built Starlette/FastAPI stack."""
    layer = getattr(app, "middleware_stack", None) or app
    while not isinstance(layer, EnergyMiddleware):
        layer = layer.app
    return layer


async def drive(
    app: Callable[..., Awaitable[None]],
    *,
    path: str = "/",
    method: str = "GET",
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    extensions: dict[str, Any] | None = None,
    disconnect_after: float | None = None,
    on_send: Callable[[Message], None] | None = None,
) -> list[Message]:
    """Call an ASGI app with raw scope/receive/send, as a server would; return what it sent."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": method, "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": headers or [], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
        "extensions": extensions or {},
    }
    sent: list[Message] = []
    request_sent = False
    gone = asyncio.Event()

    async def receive() -> Message:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_after is not None:
            await asyncio.sleep(disconnect_after)
            gone.set()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if gone.is_set():
            return  # as uvicorn does after a disconnect: silently
        sent.append(message)
        if on_send is not None:
            on_send(message)

    await app(scope, receive, send)
    return sent


def body_of(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def start_of(sent: list[Message]) -> Message:
    return next(m for m in sent if m["type"] == "http.response.start")


def header(message: Message, name: bytes) -> bytes | None:
    for key, value in message.get("headers", []):
        if key.lower() == name:
            return value
    return None


class Record(NamedTuple):
    energy: Energy
    outcome: str
    status: int | None


class RecordingStats(EnergyStats):
    """Statistics that also keep each settled figure, as a list: what the middleware told
    the statistics, in the order the figures settled."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Record] = []
        self.lock = threading.Lock()

    def settled(self, batch: Sequence[Settled]) -> None:
        super().settled(batch)
        with self.lock:  # settled figures arrive from the ledger's reader thread
            self.kept.extend(Record(s.energy, s.outcome, s.status) for s in batch)

    def __iter__(self) -> Iterator[Record]:
        with self.lock:
            return iter(list(self.kept))

    def __len__(self) -> int:
        return len(self.kept)


async def settled_records(stats: RecordingStats, n: int = 1, timeout: float = 12.0) -> list[Record]:
    """Wait (at most ``timeout``) until ``n`` figures have settled into ``stats``. A fresh
    app's first request (no lifespan: it starts the reader) may close before the card's first
    reading, and then waits up to 10 s for a rate its node's windows teach."""
    deadline = time.monotonic() + timeout
    while len(stats) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return list(stats)


def fresh(app: Any, *nodes: Node, **kwargs: Any) -> EnergyMiddleware:
    """Wrap a raw ASGI app with its own ledgers and recording statistics, so tests never
    share a card."""
    kwargs.setdefault("stats", RecordingStats())
    return EnergyMiddleware(app, nodes=list(nodes), ledgers=Ledgers(), **kwargs)


def openai_chat(card: SimulatedCard, *, token_seconds: float = 0.004, load_w: float = 120.0) -> Any:
    """A ``/v1/chat/completions`` handler shaped as OpenAI's (compact JSON, a chunk with
    ``finish_reason``, the usage chunk with ``include_usage``, ``data: [DONE]``), which
    loads the simulated card while it generates."""
    import json

    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    async def chat(request: Request) -> Response:
        payload = await request.json()
        n = int(payload.get("max_tokens") or 16)
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        base = {"id": "chatcmpl-sim", "created": 0, "model": payload.get("model", "sim")}
        if not payload.get("stream"):
            job = card.start_job(load_w)
            try:
                await asyncio.sleep(n * token_seconds)
            finally:
                card.stop_job(job)
            return JSONResponse({**base, "object": "chat.completion", "choices": [{
                "index": 0, "finish_reason": "length",
                "message": {"role": "assistant", "content": " ".join(["w"] * n)},
            }], "usage": usage})
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        extra = {"usage": None} if include_usage else {}

        def event(choices: list[Any], **more: Any) -> bytes:
            obj = {**base, "object": "chat.completion.chunk", "choices": choices, **extra, **more}
            return b"data: " + dumps(obj) + b"\n\n"

        async def tokens() -> Any:
            job = card.start_job(load_w)
            try:
                for _ in range(n):
                    await asyncio.sleep(token_seconds)
                    yield event([{"index": 0, "delta": {"content": "w "}, "finish_reason": None}])
                yield event([{"index": 0, "delta": {}, "finish_reason": "length"}])
                if include_usage:
                    yield event([], usage=usage)
                yield b"data: [DONE]\n\n"
            finally:
                card.stop_job(job)

        return StreamingResponse(tokens(), media_type="text/event-stream")

    return chat


class CountingPattern:
    """A compiled pattern that counts the bytes it is asked to search (linear-work tests)."""

    def __init__(self, pattern: Any) -> None:
        self.pattern = pattern
        self.scanned = 0

    def finditer(self, data: bytes, *args: Any) -> Any:
        self.scanned += len(data)
        return self.pattern.finditer(data, *args)

    def search(self, data: bytes, *args: Any) -> Any:
        self.scanned += len(data)
        return self.pattern.search(data, *args)
