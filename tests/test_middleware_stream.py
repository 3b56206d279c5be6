"""Streamed answers, driven with raw scope/receive/send as a server would drive them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from apps import (
    CountingPattern,
    Message,
    RecordingStats,
    body_of,
    busy_node,
    drive,
    fresh,
    header,
    settled_records,
    start_of,
)

from giul_asgi.wire import sse as sse_module
from giul_asgi.wire.sse import sse_data

pytestmark = pytest.mark.anyio

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE_CHUNK = b"data: " + json.dumps(
    {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": USAGE}
).encode() + b"\n\n"
DONE = b"data: [DONE]\n\n"


def stream_app(pieces: list[bytes], *, headers: Any = None, delay: float = 0.02,
               sent_at: list[float] | None = None, fail_after: int | None = None) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers or SSE})
        for i, piece in enumerate(pieces):
            if fail_after is not None and i == fail_after:
                raise RuntimeError("upstream closed mid-stream")
            if sent_at is not None:
                sent_at.append(time.perf_counter())
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


async def test_every_event_goes_out_before_the_app_sends_the_next() -> None:
    """Each chunk is forwarded while the app is still on it; only the chunk that carries
    the energy waits, and only until the next event ([DONE], sent at once)."""
    node, _ = busy_node()
    app_sent = 0
    forwarded_at: list[int] = []

    def on_send(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            forwarded_at.append(app_sent)

    pieces = [chunk("Hel"), chunk("lo"), chunk(None, "stop"), DONE]

    async def app(scope: dict, receive: Any, send: Any) -> None:
        nonlocal app_sent
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for piece in pieces:
            app_sent += 1
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent = await drive(fresh(app, node), on_send=on_send)
    assert forwarded_at[:3] == [1, 2, 4]  # the finish chunk went out with [DONE]
    start = start_of(sent)
    assert header(start, b"x-energy-node") == b"sim"
    assert header(start, b"x-energy-id") is not None
    assert header(start, b"x-energy-joules") is None  # not known when a stream starts


async def test_plain_stream_energy_on_the_finish_chunk_and_after_done() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), chunk("b"), chunk(None, "stop"), DONE]
    mw = fresh(stream_app(pieces), node, stream_event=True)
    await drive(mw)  # the ledger's first reading: a baseline, after which figures are known
    sent = await drive(mw)
    parsed = events(body_of(sent))
    assert parsed[:2] == pieces[:2]
    finish = json.loads(sse_data(parsed[2]))
    original = json.loads(sse_data(pieces[2]))
    assert {k: v for k, v in finish.items() if k != "energy"} == original  # untouched
    energy = finish["energy"]
    assert energy["node"] == "sim" and energy["method"] == "simulated"
    assert energy["joules"] is not None and energy["seconds"] >= 0.05
    assert energy["id"] == header(start_of(sent), b"x-energy-id").decode()  # type: ignore[union-attr]
    assert parsed[3] == DONE
    assert parsed[4].startswith(b"event: energy\ndata: ")
    assert json.loads(sse_data(parsed[4])) == energy  # one figure per answer


async def test_usage_chunk_carries_the_energy_when_done_follows() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), chunk(None, "stop"), USAGE_CHUNK, DONE]
    sent = await drive(fresh(stream_app(pieces), node, stream_event=True))
    parsed = events(body_of(sent))
    assert parsed[:2] == pieces[:2]  # the finish chunk released as sent: usage follows
    usage_event = json.loads(sse_data(parsed[2]))
    assert usage_event["usage"] == USAGE and usage_event["choices"] == []
    assert usage_event["energy"]["tokens"] == 3 and usage_event["energy"]["node"] == "sim"
    assert parsed[3] == DONE
    assert parsed[4].startswith(b"event: energy")
    assert json.loads(sse_data(parsed[4])) == usage_event["energy"]


async def test_usage_and_done_in_one_message() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), chunk(None, "stop") + USAGE_CHUNK + DONE]
    sent = await drive(fresh(stream_app(pieces), node))
    parsed = events(body_of(sent))
    assert "energy" not in json.loads(sse_data(parsed[1]))  # the usage chunk follows it
    assert "energy" in json.loads(sse_data(parsed[2]))
    assert parsed[3] == DONE


async def test_usage_not_followed_by_done_is_released_unchanged() -> None:
    node, _ = busy_node()
    pieces = [USAGE_CHUNK, chunk("late")]
    sent = await drive(fresh(stream_app(pieces), node))
    assert body_of(sent).startswith(USAGE_CHUNK + chunk("late"))


async def test_events_split_across_messages_still_carry_the_energy() -> None:
    """A proxy's upstream bytes do not arrive in whole events."""
    node, _ = busy_node()
    whole = chunk("x") + chunk(None, "stop") + USAGE_CHUNK + DONE
    pieces = [whole[i:i + 17] for i in range(0, len(whole), 17)]
    sent = await drive(fresh(stream_app(pieces, delay=0.001), node, stream_event=True))
    parsed = events(body_of(sent))
    assert parsed[0] == chunk("x") and parsed[1] == chunk(None, "stop")
    assert json.loads(sse_data(parsed[2]))["energy"]["tokens"] == 3
    assert parsed[3] == DONE and json.loads(sse_data(parsed[4]))["tokens"] == 3


async def test_options_switch_stream_energy_off() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), USAGE_CHUNK, DONE]
    sent = await drive(fresh(stream_app(pieces), node, stream_event=False, usage_energy=False))
    assert body_of(sent) == b"".join(pieces)


async def test_trailers_when_the_client_asks_and_the_server_offers() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), DONE]
    sent = await drive(
        fresh(stream_app(pieces), node), headers=[(b"te", b"trailers")],
        extensions={"http.response.trailers": {}},
    )
    start = start_of(sent)
    assert start["trailers"] is True
    assert b"x-energy-joules" in (header(start, b"trailer") or b"")
    last = sent[-1]
    assert last["type"] == "http.response.trailers" and last["more_trailers"] is False
    names = {k for k, _ in last["headers"]}
    assert {b"x-energy-joules", b"x-energy-method", b"x-energy-settled"} <= names
    body_messages = [m for m in sent if m["type"] == "http.response.body"]
    assert body_messages[-1]["more_body"] is False


@pytest.mark.parametrize(
    ("headers", "extensions"),
    [([], {"http.response.trailers": {}}), ([(b"te", b"trailers")], {})],
    ids=["client-did-not-ask", "server-cannot"],
)
async def test_no_trailers_otherwise(headers: list, extensions: dict) -> None:
    node, _ = busy_node()
    sent = await drive(fresh(stream_app([chunk("a"), DONE]), node), headers=headers,
                       extensions=extensions)
    assert all(m["type"] != "http.response.trailers" for m in sent)
    assert "trailers" not in start_of(sent)


async def test_app_trailers_are_kept_as_they_are() -> None:
    """An app that declares and sends its own trailers gets them delivered as it sent them
    (Starlette's test_capture_trailers): our figure is at /energy/requests/{id}."""
    node, _ = busy_node()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE, "trailers": True})
        await send({"type": "http.response.body", "body": chunk("a"), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await send({"type": "http.response.trailers", "headers": [(b"x-app", b"1")],
                    "more_trailers": False})

    sent = await drive(fresh(app, node), headers=[(b"te", b"trailers")],
                       extensions={"http.response.trailers": {}})
    trailers = [m for m in sent if m["type"] == "http.response.trailers"]
    assert len(trailers) == 1
    assert trailers[0]["headers"] == [(b"x-app", b"1")]


async def test_plain_chunked_stream_passes_untouched_with_trailers() -> None:
    node, _ = busy_node()
    pieces = [b"line 1\n", b"line 2\n", b"line 3\n"]
    app = stream_app(pieces, headers=[(b"content-type", b"text/plain")])
    sent = await drive(fresh(app, node), headers=[(b"te", b"trailers")],
                       extensions={"http.response.trailers": {}})
    assert body_of(sent) == b"".join(pieces)
    assert sent[-1]["type"] == "http.response.trailers"


async def test_compressed_event_stream_is_not_touched() -> None:
    node, _ = busy_node()
    pieces = [b"\x1f\x8b\x08\x00 not really gzip", b"more"]
    app = stream_app(pieces, headers=[*SSE, (b"content-encoding", b"gzip")])
    sent = await drive(fresh(app, node))
    assert body_of(sent) == b"".join(pieces)


async def test_client_disconnect_is_recorded() -> None:
    """An sse-starlette-like app: watches receive() and stops without a final message."""
    node, _ = busy_node()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        stop = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            stop.set()

        watcher = asyncio.ensure_future(watch())
        while not stop.is_set():
            await send({"type": "http.response.body", "body": chunk("tick"), "more_body": True})
            await asyncio.sleep(0.01)
        watcher.cancel()

    stats = RecordingStats()
    await drive(fresh(app, node, stats=stats), disconnect_after=0.1)
    record = (await settled_records(stats))[-1]
    assert record.outcome == "disconnect" and record.status == 200
    assert record.energy.seconds >= 0.09


async def test_crash_mid_stream_is_reraised_and_recorded() -> None:
    node, _ = busy_node()
    stats = RecordingStats()
    mw = fresh(stream_app([chunk("a"), chunk("b"), chunk("c")], fail_after=2), node, stats=stats)
    sent: list[Message] = []
    with pytest.raises(RuntimeError, match="mid-stream"):
        await drive(mw, on_send=sent.append)
    assert body_of(sent) == chunk("a") + chunk("b")
    record = (await settled_records(stats))[-1]
    assert record.outcome == "error" and record.status == 200


async def test_stream_tokens_reach_the_stats_settled() -> None:
    node, _ = busy_node()
    stats = RecordingStats()
    await drive(fresh(stream_app([chunk("a"), chunk(None, "stop"), USAGE_CHUNK, DONE]), node,
                      stats=stats))
    record = (await settled_records(stats))[-1]
    assert record.outcome == "ok" and record.energy.tokens == 3 and record.energy.settled


def test_trailers_through_starlettes_test_client() -> None:
    """A client that asks for trailers, through Starlette's own TestClient (which offers
    the ``http.response.trailers`` extension and collects them)."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route as StarletteRoute
    from starlette.testclient import TestClient

    from giul_asgi import EnergyMiddleware, Ledgers

    node, _ = busy_node()

    async def events() -> Any:
        for piece in (chunk("a"), chunk("b"), DONE):
            yield piece

    async def endpoint(request: Any) -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[StarletteRoute("/s", endpoint)])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stream_event=True)
    with TestClient(app) as client:
        asked = client.get("/s", headers={"TE": "trailers"})
        plain = client.get("/s")
    trailers = dict(asked.extensions["http.response.trailers"])
    assert trailers[b"x-energy-node"] == b"sim"
    assert trailers[b"x-energy-method"] in (b"simulated", b"unknown")
    assert b"event: energy" in asked.content
    assert "http.response.trailers" not in plain.extensions


# -- hostile but fair responses: each of these broke a correct answer before -------------
def one_message_app(body: bytes, headers: list[tuple[bytes, bytes]], status: int = 200) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


async def test_an_sse_body_of_announced_length_is_not_lengthened() -> None:
    """Starlette's Response(content, media_type="text/event-stream") sets Content-Length:
    the closing event used to go past it (the client saw a truncated body)."""
    node, _ = busy_node()
    body = chunk("a") + chunk(None, "stop") + DONE
    headers = [*SSE, (b"content-length", str(len(body)).encode())]
    sent = await drive(fresh(one_message_app(body, headers), node))
    assert body_of(sent) == body
    assert header(start_of(sent), b"content-length") == str(len(body)).encode()
    assert header(start_of(sent), b"x-energy-node") == b"sim"


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
async def test_nothing_is_appended_where_there_is_no_body(method: str, status: int) -> None:
    node, _ = busy_node()
    sent = await drive(fresh(one_message_app(b"", SSE, status), node), method=method)
    assert body_of(sent) == b""
    assert start_of(sent)["status"] == status
    assert header(start_of(sent), b"x-energy-id") is not None  # where its figure is kept


async def test_a_last_event_without_its_blank_line_gets_nothing_glued_on() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), b"data: last"]
    sent = await drive(fresh(stream_app(pieces), node, stream_event=True))
    assert body_of(sent) == b"".join(pieces)  # not b"data: lastevent: energy ..."


async def test_a_held_usage_chunk_is_delivered_when_the_app_raises() -> None:
    """Without the middleware the client receives the usage chunk; it must with it too."""
    node, _ = busy_node()
    sent: list[Message] = []
    app = stream_app([chunk("a"), chunk(None, "stop"), USAGE_CHUNK, chunk("never")],
                     fail_after=3, delay=0.001)
    with pytest.raises(RuntimeError, match="mid-stream"):
        await drive(fresh(app, node), on_send=sent.append)
    assert body_of(sent) == chunk("a") + chunk(None, "stop") + USAGE_CHUNK
    assert all(m.get("more_body", True) for m in sent if m["type"] == "http.response.body")


async def test_a_held_chunk_is_delivered_when_the_app_returns_without_ending() -> None:
    node, _ = busy_node()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for piece in (chunk("a"), chunk(None, "stop")):
            await send({"type": "http.response.body", "body": piece, "more_body": True})

    sent = await drive(fresh(app, node))
    assert body_of(sent) == chunk("a") + chunk(None, "stop")


async def test_an_event_that_never_ends_costs_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8000 lines of 100 bytes and no blank line: the scanner rescanned its partial buffer
    on every chunk (about 24 s of CPU; concurrent requests waited 22.6 s behind it)."""
    node, _ = busy_node()
    counting = CountingPattern(sse_module._TERMINATOR)
    monkeypatch.setattr(sse_module, "_TERMINATOR", counting)
    lines = [b"data: " + b"x" * 92 + b"\r\n" for _ in range(8000)]
    sent = await drive(fresh(stream_app(lines, delay=0), node))
    stream = b"".join(lines)
    assert body_of(sent) == stream
    assert counting.scanned <= 2 * len(stream)


async def test_a_deeply_nested_usage_event_passes_byte_for_byte() -> None:
    """A RecursionError in the parser used to cut the stream (the app's correct 200)."""
    node, _ = busy_node()
    deep = (b'data: {"choices":[],"usage":{"completion_tokens":1,"x":'
            + b"[" * 100_000 + b"]" * 100_000 + b"}}\n\n")
    sent = await drive(fresh(stream_app([chunk("a"), deep, DONE], delay=0), node,
                             stream_event=True))
    raw = body_of(sent)
    assert raw.startswith(chunk("a") + deep + DONE)
    assert raw[len(chunk("a") + deep + DONE):].startswith(b"event: energy")
