"""Never in a response's way: the eleven legal cases where the request path changed or broke
what the app sent (issue 15). Each test here failed on the request path before the rewrite
(9dfb011's parent); each drives the middleware with raw ASGI messages, as a server does.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any

import httpx
import pytest
from apps import body_of, busy_node, drive, header, start_of
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from giul_asgi import ConfigError, EnergyMiddleware, EnergyStats, Ledgers, Node

pytestmark = pytest.mark.anyio

JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]


def wrap(app: Any, **settings: Any) -> EnergyMiddleware:
    return EnergyMiddleware(app, nodes=[busy_node()[0]], ledgers=Ledgers(), **settings)


def kinds(sent: list[dict[str, Any]]) -> list[str]:
    return [m["type"].removeprefix("http.response.") for m in sent]


# 1 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("extension", ["pathsend", "zerocopysend"])
async def test_pathsend_and_zerocopysend_keep_their_place_after_the_start(extension: str) -> None:
    """A FileResponse under granian: [pathsend, start] became a 500 "Response not started"."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": f"http.response.{extension}", "path": "/tmp/x.json"})

    sent = await drive(wrap(app), extensions={f"http.response.{extension}": {}})
    assert kinds(sent) == ["start", extension]


# 2 -----------------------------------------------------------------------------------------
async def test_no_content_length_beside_the_apps_transfer_encoding() -> None:
    """uvicorn with httptools sent both headers (RFC 9112 forbids it); granian closed."""
    body = b'{"a": 1}'

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*JSON, (b"transfer-encoding", b"chunked")]})
        await send({"type": "http.response.body", "body": body})

    sent = await drive(wrap(app))
    assert header(start_of(sent), b"content-length") is None
    assert json.loads(body_of(sent))["a"] == 1


# 3 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("media", [b"application/x-ndjson", b"application/octet-stream", None,
                                   b"text/plain"])
async def test_a_stream_start_goes_out_before_its_first_chunk(media: bytes | None) -> None:
    """An app that sends its start, then works: headers at 1.00 s instead of 0.00 (Starlette's
    test_streaming_response_is_available_before_first_chunk deadlocked)."""
    started = asyncio.Event()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        headers = [(b"content-type", media)] if media else []
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await asyncio.wait_for(started.wait(), 2.0)  # the client must have the head by now
        await send({"type": "http.response.body", "body": b"{}\n", "more_body": True})
        await asyncio.wait_for(started.wait(), 2.0)
        await send({"type": "http.response.body", "body": b"{}\n"})

    def seen(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.set()

    sent = await drive(wrap(app), on_send=seen)
    assert kinds(sent)[0] == "start" and body_of(sent) == b"{}\n{}\n"


async def test_a_streamed_json_body_is_not_held_whole() -> None:
    """A streamed application/json answer: its first byte waited for its last."""
    first_out = asyncio.Event()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": b'{"a": [1', "more_body": True})
        await asyncio.wait_for(first_out.wait(), 2.0)
        await send({"type": "http.response.body", "body": b", 2]}"})

    def seen(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            first_out.set()

    sent = await drive(wrap(app), on_send=seen)
    assert body_of(sent) == b'{"a": [1, 2]}'


# 4 -----------------------------------------------------------------------------------------
async def test_trailers_keep_their_order_and_get_no_content_length() -> None:
    """Trailers went out ahead of the held start; a JSON response that declares trailers got
    a Content-Length, though HTTP/1.1 carries trailers only in chunked framing."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON,
                    "trailers": True})
        await send({"type": "http.response.body", "body": b'{"a": 1}'})
        await send({"type": "http.response.trailers", "headers": [(b"x-app", b"1")],
                    "more_trailers": False})

    sent = await drive(wrap(app), headers=[(b"te", b"trailers")],
                       extensions={"http.response.trailers": {}})
    assert kinds(sent) == ["start", "body", "trailers"]
    assert header(start_of(sent), b"content-length") is None
    assert sent[-1]["headers"] == [(b"x-app", b"1")]


async def test_trailers_before_the_body_follow_the_start() -> None:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON,
                    "trailers": True})
        await send({"type": "http.response.trailers", "headers": [], "more_trailers": False})

    sent = await drive(wrap(app))
    assert kinds(sent) == ["start", "trailers"]


# 5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2])
async def test_crlf_events_a_byte_or_two_at_a_time_still_carry_the_energy(size: int) -> None:
    """Event ends were missed: the whole stream went out at its end, with no energy."""
    finish = {"id": "c", "object": "chat.completion.chunk",
              "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    first = {**finish, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    stream = (b"data: " + json.dumps(first).encode() + b"\r\n\r\n"
              + b"data: " + json.dumps(finish).encode() + b"\r\n\r\ndata: [DONE]\r\n\r\n")
    pieces = [stream[i:i + size] for i in range(0, len(stream), size)]
    out_times: list[int] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for i, piece in enumerate(pieces):
            out_times.append(i)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    delivered: list[int] = []
    sent = await drive(wrap(app), on_send=lambda m: delivered.append(len(out_times)))
    out = body_of(sent)
    events = out.split(b"\r\n\r\n")
    assert events[0] == b"data: " + json.dumps(first).encode()  # the first event as sent
    assert json.loads(events[1].removeprefix(b"data: "))["energy"]["node"] == "sim"
    start, end = out.index(b',"energy":'), out.index(b"}\r\n\r\ndata: [DONE]")
    assert out[:start] + out[end:] == stream  # the block inserted, every other byte kept
    # The first event went out as soon as its blank line came, not at the stream's end.
    first_done = -(-(len(events[0]) + 4) // size)  # the pieces that complete it
    assert delivered[1] <= first_done + 1 < len(pieces) - 20


# 6 -----------------------------------------------------------------------------------------
async def test_a_pretty_printed_body_keeps_its_whitespace() -> None:
    """``3}\\n}\\n`` became ``3},"energy":{...}}\\n``: the app's bytes before the brace lost."""
    body = b'{\n  "a": {\n    "b": 3}\n}\n'

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": body})

    out = body_of(await drive(wrap(app)))
    assert out.startswith(b'{\n  "a": {\n    "b": 3},"energy":{') and out.endswith(b"}\n}\n")
    block = out[len(b'{\n  "a": {\n    "b": 3},"energy":'):-len(b"\n}\n")]
    assert out == b'{\n  "a": {\n    "b": 3},"energy":' + block + b"\n}\n"
    assert json.loads(out)["a"] == {"b": 3}


# 7 -----------------------------------------------------------------------------------------
async def test_a_mounted_app_is_labelled_once() -> None:
    """``Mount("/static", StaticFiles(...))`` was labelled ``/static/static/{path}``. A static
    mount is now never metered (issue 21: the framework's documents are never touched); the
    label rule holds for any app mounted whole, which is the same case for the router."""
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "a.json"), "w") as f:
        f.write('{"x": 1}')
    node, _ = busy_node()

    async def files(scope: dict, receive: Any, send: Any) -> None:  # an app mounted whole
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"x": 1}'})

    app = Starlette(routes=[Mount("/static", StaticFiles(directory=directory)), Mount("/files", files)])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/files/a.json")
        static = await c.get("/static/a.json")
    assert r.status_code == 200
    assert r.json()["energy"]["route"] == "/files/{path}"
    assert static.json() == {"x": 1} and "x-energy-method" not in static.headers


# 8 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "value"),
    [("settle_timeout", "0.5"), ("endpoint_token", "short"), ("endpoint_guard", "x"),
     ("metrics_path", "metrics/"), ("energy_path", "energy"), ("max_body", -1),
     ("startup_timeout", -5), ("energy_key", ""), ("settle_timeout", float("nan")),
     ("max_body", True), ("inject_json", "yes"), ("token_kind", "words"),
     ("exclude", "/health"), ("metrics_path", "/energy/metrics"), ("decide", 3),
     ("no_such_setting", 1)],
)
def test_a_bad_setting_fails_when_the_middleware_is_built(setting: str, value: Any) -> None:
    """These were never checked: a 500 on every metered request, /energy raising on its first
    GET and then falling through to the app, or a feature silently off."""
    with pytest.raises(ConfigError) as caught:
        EnergyMiddleware(lambda *a: None, nodes=[Node("n", reader="none")], ledgers=Ledgers(),
                         **{setting: value})
    assert caught.value.remedy  # it says what to do


def test_a_misspelt_token_kind_says_which_was_meant() -> None:
    # A stranger's trial: token_kind="outputs" said the allowed values only, unlike the others.
    with pytest.raises(ConfigError) as caught:
        EnergyMiddleware(lambda *a: None, nodes=[Node("n", reader="none")], ledgers=Ledgers(),
                         token_kind="outputs")
    assert "did you mean token_kind='output'?" in str(caught.value.remedy)


# 10 ----------------------------------------------------------------------------------------
async def test_an_apps_own_event_stream_gets_nothing_added() -> None:
    """Every event stream got a closing ``event: energy``: consumers that count events, resume
    from Last-Event-ID or parse every data line saw one more than the app sent."""
    events = [b"id: 1\nevent: tick\ndata: {\"n\": 1}\n\n", b"id: 2\nevent: tick\ndata: {\"n\": 2}\n\n",
              b'data: {"finish_reason": "stop"}\n\n']

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sent = await drive(wrap(app))
    assert body_of(sent) == b"".join(events)
    assert header(start_of(sent), b"x-energy-id") is not None  # its figure is kept by id


# 11 ----------------------------------------------------------------------------------------
async def test_a_start_sent_before_the_app_raises_reaches_the_client() -> None:
    """Bare, the client gets the app's status; the held start never went out and the server
    answered 500."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": JSON})
        raise RuntimeError("upstream went away")

    sent: list[dict[str, Any]] = []
    with pytest.raises(RuntimeError):
        await drive(wrap(app), on_send=sent.append)
    assert kinds(sent) == ["start"] and sent[0]["status"] == 503


class AnsweringStats(EnergyStats):
    """Statistics that keep answers in place (as a server of several workers' do): each
    ``answered`` call, with how the request ended."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[tuple[str | None, str, int | None]] = []

    def answered(self, id: str | None, route: str | None, node: str | None, tier: str | None,
                 outcome: str, status: int | None, tenant: str | None) -> None:
        self.answers.append((route, outcome, status))


@pytest.mark.parametrize("media", [JSON, SSE])
async def test_an_answer_is_counted_before_its_last_message_reaches_the_server(
    media: list[tuple[bytes, bytes]],
) -> None:
    """A worker killed with -9 under load lost one answered request in about one run of five
    of tests/test_servers.py (374 answered, 373 counted by every worker): the answer was
    counted after the app returned, so a kill after the server had the last byte and before
    the count lost it. Now it is counted before the last message goes to the server, and once."""
    stats = AnsweringStats()
    counted_at_last: list[int] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": media})
        if media is SSE:
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        else:
            await send({"type": "http.response.body", "body": b'{"a": 1}'})

    def on_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            counted_at_last.append(len(stats.answers))

    sent = await drive(wrap(app, stats=stats), on_send=on_send)
    assert kinds(sent)[-1] == "body"
    assert counted_at_last == [1]
    assert [(outcome, status) for _, outcome, status in stats.answers] == [("ok", 201)]


async def test_an_answer_the_app_left_unfinished_is_counted_once_as_it_ended() -> None:
    stats = AnsweringStats()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

    await drive(wrap(app, stats=stats))
    assert [outcome for _, outcome, _ in stats.answers] == ["incomplete"]
