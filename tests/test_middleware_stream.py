"""Streamed answers, driven with raw scope/receive/send as a server would drive them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from apps import Message, body_of, busy_node, drive, fresh, header, start_of

from giul_asgi.report import sse_data

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


async def test_every_chunk_goes_out_when_the_app_sends_it() -> None:
    node, _ = busy_node()
    app_times: list[float] = []
    out_times: list[float] = []

    def on_send(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            out_times.append(time.perf_counter())

    pieces = [chunk("Hel"), chunk("lo"), chunk(None, "stop"), DONE]
    sent = await drive(fresh(stream_app(pieces, sent_at=app_times, delay=0.05), node),
                       on_send=on_send)
    assert len(out_times) >= len(pieces)
    for t_app, t_out in zip(app_times, out_times, strict=False):
        assert t_out - t_app < 0.01  # forwarded at once, not after the next chunk (50 ms)
    start = start_of(sent)
    assert header(start, b"x-energy-node") == b"sim"
    assert header(start, b"x-energy-joules") is None  # not known when a stream starts


async def test_energy_event_after_done_and_bytes_before_it_untouched() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), chunk("b"), chunk(None, "stop"), DONE]
    sent = await drive(fresh(stream_app(pieces), node))
    raw = body_of(sent)
    assert raw.startswith(b"".join(pieces))
    tail = raw[len(b"".join(pieces)):]
    assert tail.startswith(b"event: energy\ndata: ")
    energy = json.loads(sse_data(tail))
    assert energy["node"] == "sim" and energy["method"] == "simulated"
    assert energy["joules"] is not None and energy["seconds"] >= 0.07


async def test_usage_chunk_carries_the_energy_when_done_follows() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), chunk(None, "stop"), USAGE_CHUNK, DONE]
    sent = await drive(fresh(stream_app(pieces), node))
    parsed = events(body_of(sent))
    assert parsed[:2] == pieces[:2]
    usage_event = json.loads(sse_data(parsed[2]))
    assert usage_event["usage"] == USAGE and usage_event["choices"] == []
    assert usage_event["energy"]["tokens"] == 3 and usage_event["energy"]["node"] == "sim"
    assert parsed[3] == DONE
    assert parsed[4].startswith(b"event: energy")
    # One figure per answer: the usage chunk and the closing event tell the same.
    assert json.loads(sse_data(parsed[4])) == usage_event["energy"]


async def test_usage_and_done_in_one_message() -> None:
    node, _ = busy_node()
    pieces = [chunk("a"), USAGE_CHUNK + DONE]
    sent = await drive(fresh(stream_app(pieces), node))
    parsed = events(body_of(sent))
    assert "energy" in json.loads(sse_data(parsed[1]))
    assert parsed[2] == DONE


async def test_usage_not_followed_by_done_is_released_unchanged() -> None:
    node, _ = busy_node()
    pieces = [USAGE_CHUNK, chunk("late")]
    sent = await drive(fresh(stream_app(pieces), node))
    assert body_of(sent).startswith(USAGE_CHUNK + chunk("late"))


async def test_events_split_across_messages_still_count_tokens() -> None:
    node, _ = busy_node()
    whole = chunk("x") + USAGE_CHUNK + DONE
    pieces = [whole[i:i + 17] for i in range(0, len(whole), 17)]
    sent = await drive(fresh(stream_app(pieces, delay=0.001), node))
    raw = body_of(sent)
    assert raw.startswith(whole)  # no splice possible mid-event: the bytes are untouched
    assert json.loads(sse_data(raw[len(whole):]))["tokens"] == 3


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


async def test_app_trailers_are_kept_and_ours_added() -> None:
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
    names = [k for k, _ in trailers[0]["headers"]]
    assert names[0] == b"x-app" and b"x-energy-joules" in names


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

    mw = fresh(app, node)
    await drive(mw, disconnect_after=0.1)
    await asyncio.sleep(0.1)
    record = list(mw.stats)[-1]
    assert record.outcome == "disconnect" and record.status == 200
    assert record.energy.seconds >= 0.09


async def test_crash_mid_stream_is_reraised_and_recorded() -> None:
    node, _ = busy_node()
    mw = fresh(stream_app([chunk("a"), chunk("b"), chunk("c")], fail_after=2), node)
    sent: list[Message] = []
    with pytest.raises(RuntimeError, match="mid-stream"):
        await drive(mw, on_send=sent.append)
    assert body_of(sent) == chunk("a") + chunk("b")
    await asyncio.sleep(0.1)
    record = list(mw.stats)[-1]
    assert record.outcome == "error" and record.status == 200


async def test_stream_tokens_reach_the_stats_settled() -> None:
    node, _ = busy_node()
    mw = fresh(stream_app([chunk("a"), USAGE_CHUNK, DONE]), node)
    await drive(mw)
    await asyncio.sleep(0.15)
    record = list(mw.stats)[-1]
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
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers())
    with TestClient(app) as client:
        asked = client.get("/s", headers={"TE": "trailers"})
        plain = client.get("/s")
    trailers = dict(asked.extensions["http.response.trailers"])
    assert trailers[b"x-energy-node"] == b"sim"
    assert trailers[b"x-energy-method"] in (b"simulated", b"unknown")
    assert b"event: energy" in asked.content
    assert "http.response.trailers" not in plain.extensions
