"""Complete (non-streamed) responses: headers, the JSON energy block, and pass-through."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
from typing import Any

import httpx
import pytest
from apps import (
    RecordingStats,
    WedgedReader,
    body_of,
    busy_node,
    drive,
    fresh,
    header,
    settled_records,
    start_of,
)
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route as StarletteRoute
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient

from giul_asgi import EnergyMiddleware, Ledgers, Node, Route, Tier, current_meter
from giul_asgi.errors import ReaderUnavailable

pytestmark = pytest.mark.anyio

USAGE = {"prompt_tokens": 7, "completion_tokens": 40, "total_tokens": 47}


def raw_app(status: int, headers: list[tuple[bytes, bytes]], body: bytes, parts: int = 1) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if parts == 1:
            await send({"type": "http.response.body", "body": body})
            return
        step = max(1, len(body) // parts)
        chunks = [body[i:i + step] for i in range(0, len(body), step)]
        for i, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1})

    return app


def json_headers(body: bytes, ctype: bytes = b"application/json") -> list[tuple[bytes, bytes]]:
    return [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]


async def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


def make_fastapi(node: Node, **kwargs: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        payload = await request.json()
        meter = current_meter()
        assert meter is not None
        await asyncio.sleep(0.02)
        meter.mark("retrieve")
        await asyncio.sleep(0.03)
        return {"id": "cmpl-1", "model": payload.get("model"), "usage": USAGE}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict:
        return {"id": model_id}

    app.add_middleware(EnergyMiddleware, nodes=[node], tiers=[Tier("8b", 300.0)],
                       ledgers=Ledgers(), **kwargs)
    return app


async def test_fastapi_headers_and_energy_block() -> None:
    node, _card = busy_node()
    app = make_fastapi(node)
    async with await client_for(app) as client:
        await client.get("/v1/models/warm-up")  # the ledger has now seen the card's power
        await asyncio.sleep(0.05)
        r = await client.post("/v1/chat/completions", json={"model": "llama"})
    assert r.status_code == 200
    energy = r.json()["energy"]
    assert r.headers["x-energy-method"] == "simulated" == energy["method"]
    assert r.headers["x-energy-backend"] == "simulated" and r.headers["x-energy-source"] == "local"
    assert r.headers["x-energy-node"] == "sim" and r.headers["x-energy-tier"] == "8b"
    assert float(r.headers["x-energy-joules"]) == pytest.approx(energy["joules"], rel=1e-4)
    # The card draws 100 W above idle throughout, and this request is alone on it: it is
    # charged that, over its window, give or take the readings it only partly covers.
    expected = 100.0 * energy["seconds"]
    assert abs(energy["joules"] - expected) <= energy["uncertainty_joules"] + 0.5
    assert r.headers["x-energy-tokens"] == "40" and energy["tokens"] == 40
    assert float(r.headers["x-energy-joules-per-token"]) == pytest.approx(energy["joules"] / 40, rel=1e-4)
    assert r.headers["x-energy-settled"] in ("true", "false")
    assert float(r.headers["x-energy-uncertainty"]) >= 0
    assert energy["route"] == "/v1/chat/completions"
    assert set(energy["stages"]) == {"retrieve"}
    assert r.headers["content-length"] == str(len(r.content))
    assert r.json()["usage"] == USAGE  # the app's own data untouched


async def test_a_middleware_added_twice_meters_once_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stranger's app called add_middleware twice: every answer carried two sets of
    X-Energy-* headers with two ids and two figures. The outer one meters; the inner one
    passes the request and warns once."""
    node, _card = busy_node()
    app = make_fastapi(node)
    app.add_middleware(EnergyMiddleware, nodes=[node], tiers=[Tier("8b", 300.0)], ledgers=Ledgers())
    with caplog.at_level(logging.WARNING, logger="giul_asgi.middleware"):
        async with await client_for(app) as client:
            answers = [await client.post("/v1/chat/completions", json={"model": "llama"}) for _ in range(2)]
    for r in answers:
        assert r.status_code == 200
        assert len(r.headers.get_list("x-energy-id")) == 1 and len(r.headers.get_list("x-energy-joules")) == 1
        body = r.json()
        assert "energy" in body and body["usage"] == USAGE
        assert r.headers["content-length"] == str(len(r.content))
    said = [rec for rec in caplog.records if "twice" in rec.getMessage()]
    assert len(said) == 1 and "add it once" in said[0].getMessage()


async def test_route_label_is_the_template_never_the_raw_path() -> None:
    node, _ = busy_node()
    stats = RecordingStats()
    app = make_fastapi(node, stats=stats)
    async with await client_for(app) as client:
        # No lifespan here: the first request starts the reader. A window that closes before
        # the card's first reading waits for rates its node's windows teach; these must not.
        assert (await client.get("/nope/warm-up")).status_code == 404
        await asyncio.sleep(0.2)
        for name in ("llama-3", "mistral", "qwen"):
            r = await client.get(f"/v1/models/{name}")
            assert r.json()["energy"]["route"] == "/v1/models/{model_id}"
        r = await client.get("/nope/123")
        assert r.status_code == 404
    records = await settled_records(stats, 5)
    assert [r.energy.route for r in records].count("/v1/models/{model_id}") == 3
    assert {r.energy.route for r in records} == {"/v1/models/{model_id}", "<unmatched>"}


async def test_route_labels_through_a_mount_with_a_path_parameter() -> None:
    """``app.mount("/tenants/{tid}", sub)``: Starlette writes the raw prefix into root_path,
    so every tenant became a label (1025 buckets, then ``<other>`` swallowed the rest)."""
    node, _ = busy_node()
    stats = RecordingStats()
    sub = FastAPI()

    @sub.get("/items/{item_id}")
    async def item(item_id: str) -> dict:
        return {"id": item_id}

    app = FastAPI()
    app.mount("/tenants/{tid}", sub)
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=stats)
    async with await client_for(app) as client:
        for tenant in ("acme", "globex", "42"):
            r = await client.get(f"/tenants/{tenant}/items/7")
            assert r.status_code == 200
            assert r.json()["energy"]["route"] == "/tenants/{tid}/items/{item_id}"
    records = await settled_records(stats, 3)
    assert {r.energy.route for r in records} == {"/tenants/{tid}/items/{item_id}"}


def mounted_gateway(pattern: str) -> FastAPI:
    """An app whose sub-app at ``/api`` (a chat route and another) carries the middleware,
    metering ``pattern``."""
    node, _ = busy_node()
    sub = FastAPI()

    @sub.post("/v1/chat/completions")
    async def chat() -> dict:
        return {"choices": []}

    @sub.get("/other")
    async def other() -> dict:
        return {"other": True}

    sub.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(),
                       routes=[Route(pattern, node=node.name)])
    app = FastAPI()
    app.mount("/api", sub)
    return app


async def test_a_middleware_on_a_mounted_sub_app_routes_and_serves_its_own_paths() -> None:
    """A stranger's trial: the middleware on ``app.mount("/api", sub)`` with
    ``Route("/v1/chat/completions")`` metered nothing (the path it saw was
    ``/api/v1/chat/completions``), and ``/energy`` answered 404 at every path. Routes,
    ``/energy`` and ``exclude`` are the sub-app's own paths, as Starlette routes them."""
    async with await client_for(mounted_gateway("/v1/chat/completions")) as client:
        r = await client.post("/api/v1/chat/completions", json={})
        assert r.status_code == 200 and "x-energy-id" in r.headers, r.headers
        assert r.json()["energy"]["route"] == "/api/v1/chat/completions"
        r = await client.get("/api/other")
        assert "x-energy-id" not in r.headers and r.json() == {"other": True}
        r = await client.get("/api/energy")
        assert r.status_code == 200 and r.json()["schema"].startswith("giul-asgi/energy/")
        assert (await client.get("/api/energy/requests/nope")).status_code == 404
    # The pattern written with the mount's prefix (what worked before) still meters.
    async with await client_for(mounted_gateway("/api/v1/chat/completions")) as client:
        r = await client.post("/api/v1/chat/completions", json={})
        assert "x-energy-id" in r.headers


async def test_starlette_app_and_settled_figures() -> None:
    node, _ = busy_node()

    async def home(request: Any) -> JSONResponse:
        await asyncio.sleep(0.05)
        return JSONResponse({"ok": True})

    app = Starlette(routes=[StarletteRoute("/", home)])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), settle_timeout=0.5)
    async with await client_for(app) as client:
        await client.get("/")
        r = await client.get("/")
    assert r.headers["x-energy-settled"] == "true" and r.json()["energy"]["settled"] is True
    assert r.json()["ok"] is True


async def test_raw_asgi_app_via_constructor() -> None:
    node, _ = busy_node()
    body = json.dumps({"id": 1, "usage": USAGE}).encode()
    app = fresh(raw_app(200, json_headers(body), body), node)
    sent = await drive(app, path="/v1/x")
    out = json.loads(body_of(sent))
    assert out["id"] == 1 and out["energy"]["node"] == "sim"
    assert header(start_of(sent), b"content-length") == str(len(body_of(sent))).encode()


@pytest.mark.parametrize(
    ("status", "headers", "body", "method"),
    [
        (200, json_headers(b'{"a": 1,'), b'{"a": 1,', "GET"),  # invalid JSON
        (200, json_headers(b"[1, 2, 3]"), b"[1, 2, 3]", "GET"),  # an array
        (200, json_headers(b'"just a string"'), b'"just a string"', "GET"),
        (200, json_headers(b'{"x": "\xff\xfe"}'), b'{"x": "\xff\xfe"}', "GET"),  # not UTF-8
        (200, [(b"content-type", b"text/plain")], b"hello {}", "GET"),
        (200, json_headers(b'{"energy": "mine"}'), b'{"energy": "mine"}', "GET"),  # key taken
        (204, [], b"", "GET"),
        (304, [(b"content-type", b"application/json")], b"", "GET"),
        (200, json_headers(b'{"a": 1}'), b"", "HEAD"),
    ],
    ids=["invalid", "array", "string", "non-utf8", "text", "key-taken", "204", "304", "head"],
)
async def test_pass_through_byte_for_byte(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, method: str
) -> None:
    node, _ = busy_node()
    sent = await drive(fresh(raw_app(status, headers, body), node), method=method)
    assert body_of(sent) == body
    start = start_of(sent)
    assert start["status"] == status
    for key, value in headers:
        assert header(start, key) == value
    assert header(start, b"x-energy-node") == b"sim"  # headers only
    assert header(start, b"x-energy-id") is not None
    # A JSON body is held (one message), so its start carries the figure; any other start
    # goes out at once, before the figure exists: it rides in trailers and in the records.
    held = start.get("headers") and method != "HEAD" and status == 200 and header(
        start, b"content-type") == b"application/json"
    assert (header(start, b"x-energy-method") is not None) == bool(held)


async def test_gzip_body_passes_through_untouched() -> None:
    node, _ = busy_node()
    raw = gzip.compress(json.dumps({"usage": USAGE}).encode())
    headers = [*json_headers(raw), (b"content-encoding", b"gzip")]
    sent = await drive(fresh(raw_app(200, headers, raw), node))
    assert body_of(sent) == raw
    assert header(start_of(sent), b"x-energy-node") == b"sim"


async def test_oversized_body_passes_through_with_headers_only() -> None:
    node, _ = busy_node()
    body = json.dumps({"blob": "x" * 5000}).encode()
    app = fresh(raw_app(200, json_headers(body), body, parts=4), node, max_body=1000)
    sent = await drive(app)
    assert body_of(sent) == body
    assert header(start_of(sent), b"x-energy-node") == b"sim"


async def test_json_in_several_parts_is_a_stream_passed_as_sent() -> None:
    """A JSON body in several messages is streamed: held whole, its first byte waited for
    its last (issue 15, defect 3). Its start and parts now go out as they come."""
    node, _ = busy_node()
    body = json.dumps({"id": "x" * 300, "usage": USAGE}).encode()
    sent = await drive(fresh(raw_app(200, json_headers(body), body, parts=5), node))
    assert body_of(sent) == body
    assert [m["type"] for m in sent][:2] == ["http.response.start", "http.response.body"]
    assert header(start_of(sent), b"x-energy-id") is not None


async def test_a_whole_body_sent_with_more_body_is_still_spliced() -> None:
    """BaseHTTPMiddleware re-sends a JSON body as ``(body, more_body=True)`` then an empty
    end: every announced byte is in the first message, so nothing waits by holding it."""
    node, _ = busy_node()
    body = json.dumps({"usage": USAGE}).encode()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": json_headers(body)})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent = await drive(fresh(app, node))
    out = body_of(sent)
    assert json.loads(out)["energy"]["tokens"] == 40
    assert header(start_of(sent), b"content-length") == str(len(out)).encode()


async def test_app_sending_more_than_its_content_length_is_not_swallowed() -> None:
    node, _ = busy_node()
    body = b'{"a": "' + b"y" * 100 + b'"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"20")]
    sent = await drive(fresh(raw_app(200, headers, body, parts=4), node))
    assert body_of(sent) == body


@pytest.mark.parametrize(
    "headers",
    [
        [(b"Content-Length", b"LEN"), (b"content-type", b"application/json"), (b"x-app", b"1")],
        [(b"content-type", b"application/json"), (b"content-length", b"LEN"),
         (b"content-length", b"LEN")],
        [(b"content-type", b"application/json")],
    ],
    ids=["mixed-case, first", "twice", "absent"],
)
async def test_spliced_body_has_one_true_content_length(headers: list) -> None:
    node, _ = busy_node()
    body = json.dumps({"usage": USAGE}).encode()
    headers = [(k, str(len(body)).encode() if v == b"LEN" else v) for k, v in headers]
    sent = await drive(fresh(raw_app(200, headers, body), node))
    out = body_of(sent)
    assert json.loads(out)["energy"]["tokens"] == 40
    lengths = [v for k, v in start_of(sent)["headers"] if k.lower() == b"content-length"]
    assert lengths == [str(len(out)).encode()]
    # The app's other headers are all there, in the app's order, before ours.
    others = [h for h in start_of(sent)["headers"] if h[0].lower() != b"content-length"]
    theirs = [h for h in headers if h[0].lower() != b"content-length"]
    assert others[: len(theirs)] == theirs


async def test_energy_key_and_switch_off() -> None:
    node, _ = busy_node()
    body = b'{"a": 1}'
    sent = await drive(fresh(raw_app(200, json_headers(body), body), node, energy_key="x_energy"))
    assert "x_energy" in json.loads(body_of(sent))
    sent = await drive(fresh(raw_app(200, json_headers(body), body), node, inject_json=False))
    assert body_of(sent) == body


async def test_empty_object_and_whitespace_are_spliced_correctly() -> None:
    node, _ = busy_node()
    for body in (b"{}", b'  {"a": [1, {"b": 2}]}  \n'):
        sent = await drive(fresh(raw_app(200, json_headers(body), body), node))
        out = json.loads(body_of(sent))
        assert "energy" in out


async def test_unknown_is_never_zero_without_a_gpu() -> None:
    """No arguments: one local node over the visible GPUs; here there are none."""

    async def endpoint(request: Any) -> JSONResponse:
        return JSONResponse({"usage": USAGE})

    app = Starlette(routes=[StarletteRoute("/", endpoint)])
    app.add_middleware(EnergyMiddleware, ledgers=Ledgers())
    async with await client_for(app) as client:
        # Without lifespan the first request starts the reader and does not wait for it:
        # its figure says the reader is starting; the next ones say why there is none.
        for _ in range(200):
            r = await client.get("/")
            assert r.headers["x-energy-joules"] == "unknown"
            assert r.headers["x-energy-method"] == "unknown"
            assert r.headers["x-energy-backend"] == "none"
            assert r.json()["energy"]["joules"] is None
            if "NVML" in (r.json()["energy"]["error"] or ""):
                break
            await asyncio.sleep(0.01)
    assert "NVML" in (r.json()["energy"]["error"] or "")


async def test_estimates_are_labelled() -> None:
    node = Node("dark", reader="none")
    body = json.dumps({"usage": USAGE}).encode()
    app = fresh(raw_app(200, json_headers(body), body), node, tiers=[Tier("70b", 4100.0)])
    sent = await drive(app)
    start = start_of(sent)
    assert header(start, b"x-energy-method") == b"estimated"
    assert header(start, b"x-energy-joules") == b"164"  # 40 tokens x 4.1 J
    assert header(start, b"x-energy-backend") == b"none"
    assert header(start, b"x-energy-uncertainty") == b"unknown"


async def test_header_values_are_sanitised() -> None:
    node = Node("evil\r\nSet-Cookie: x=1", reader="none")
    body = b"{}"
    sent = await drive(fresh(raw_app(200, json_headers(body), body), node,
                             tiers=[Tier("t\x00\x7f\n")]))
    for key, value in start_of(sent)["headers"]:
        assert b"\r" not in value and b"\n" not in value and b"\x00" not in value, key
    assert header(start_of(sent), b"x-energy-node") == b"evil__Set-Cookie: x=1"


@pytest.mark.parametrize(
    ("kind", "usage", "expected"),
    [
        ("output", {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}, 9),
        ("input", {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}, 5),
        ("total", {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}, 14),
        ("output", {"input_tokens": 3, "output_tokens": 11}, 11),  # Responses API
        ("total", {"input_tokens": 3, "output_tokens": 11}, 14),
    ],
)
async def test_token_counts_from_usage(kind: str, usage: dict, expected: int) -> None:
    node = Node("n", reader="none")
    body = json.dumps({"usage": usage}).encode()
    sent = await drive(fresh(raw_app(200, json_headers(body), body), node, token_kind=kind))
    energy = json.loads(body_of(sent))["energy"]
    assert energy["tokens"] == expected and energy["token_kind"] == kind


async def test_responses_api_usage_inside_response_object() -> None:
    node = Node("n", reader="none")
    body = json.dumps({"response": {"usage": {"input_tokens": 2, "output_tokens": 8}}}).encode()
    sent = await drive(fresh(raw_app(200, json_headers(body), body), node))
    assert json.loads(body_of(sent))["energy"]["tokens"] == 8


async def test_handler_binds_by_model_and_sets_tokens() -> None:
    small, _ = busy_node("a100-small", load_w=50.0)
    big, _ = busy_node("h100-big", load_w=300.0)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        payload = await request.json()
        meter = current_meter()
        assert meter is not None
        if payload["model"] == "llama-70b":
            meter.bind(node="h100-big", tier="70b")
        meter.tokens(123)
        await asyncio.sleep(0.03)
        return {"ok": True}

    app.add_middleware(
        EnergyMiddleware, nodes=[small, big], tiers=[Tier("8b", 300.0), Tier("70b", 4100.0)],
        routes=[Route("/v1/*", node="a100-small", tier="8b")], ledgers=Ledgers(),
    )
    async with await client_for(app) as client:
        r_big = await client.post("/v1/chat/completions", json={"model": "llama-70b"})
        r_small = await client.post("/v1/chat/completions", json={"model": "llama-8b"})
    assert (r_big.headers["x-energy-node"], r_big.headers["x-energy-tier"]) == ("h100-big", "70b")
    assert (r_small.headers["x-energy-node"], r_small.headers["x-energy-tier"]) == ("a100-small", "8b")
    assert r_big.headers["x-energy-tokens"] == "123"


async def test_decide_callable_routes_what_patterns_cannot() -> None:
    a, _ = busy_node("a")
    b, _ = busy_node("b")

    def decide(scope: dict) -> tuple[str, None] | None:
        return ("b", None) if dict(scope["headers"]).get(b"x-pool") == b"b" else None

    body = b"{}"
    app = EnergyMiddleware(raw_app(200, json_headers(body), body), nodes=[a, b],
                           decide=decide, ledgers=Ledgers())
    sent = await drive(app, headers=[(b"x-pool", b"b")])
    assert header(start_of(sent), b"x-energy-node") == b"b"
    sent = await drive(app)
    assert header(start_of(sent), b"x-energy-node") == b"a"


async def test_excluded_paths_and_other_scopes_pass_untouched() -> None:
    node, _ = busy_node()
    calls: list[str] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        calls.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    mw = fresh(app, node)
    for path in ("/metrics", "/healthz", "/readyz"):
        sent = await drive(mw, path=path)
        assert start_of(sent)["headers"] == [] and body_of(sent) == b"ok"
    # With energy_path=None the app keeps /energy; with a metrics_path, that path goes to
    # the endpoint where it is installed (never metered either way).
    mw = fresh(app, node, energy_path=None)
    sent = await drive(mw, path="/energy")
    assert start_of(sent)["headers"] == [] and body_of(sent) == b"ok"

    async def ws_receive() -> dict:
        return {"type": "websocket.connect"}

    async def ws_send(message: dict) -> None:
        return None

    await mw({"type": "websocket", "path": "/ws", "headers": []}, ws_receive, ws_send)
    assert calls.count("websocket") == 1


async def test_app_exception_is_reraised_and_recorded() -> None:
    node, _ = busy_node()

    async def boom(request: Any) -> Response:
        raise RuntimeError("upstream died")

    stats = RecordingStats()
    app = Starlette(routes=[StarletteRoute("/boom", boom)])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=stats)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.get("/boom")
    assert r.status_code == 500  # Starlette's error page, not ours
    record = (await settled_records(stats))[-1]
    assert record.outcome == "error" and record.status == 500 and record.energy.route == "/boom"

    raw_stats = RecordingStats()
    raw = fresh(_raising_app, node, stats=raw_stats)
    with pytest.raises(KeyError, match="exact"):
        await drive(raw)
    assert (await settled_records(raw_stats))[-1].outcome == "error"


@pytest.mark.parametrize(
    "error", [TimeoutError("upstream slow"), FileNotFoundError("model.bin"),
              ConnectionRefusedError("upstream down")],
    ids=["timeout", "file-not-found", "connection-refused"],
)
async def test_os_errors_from_the_app_are_errors_not_disconnects(error: OSError) -> None:
    """The server answers 500: these used to be recorded as client disconnects, no status."""
    node, _ = busy_node()
    stats = RecordingStats()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise error

    with pytest.raises(type(error)):
        await drive(fresh(app, node, stats=stats))
    record = (await settled_records(stats))[-1]
    assert record.outcome == "error" and record.status == 500


async def _raising_app(scope: dict, receive: Any, send: Any) -> None:
    raise KeyError("exact")


async def test_behaves_inside_a_stack_with_base_http_middleware() -> None:
    node, _ = busy_node()

    class Tagger(BaseHTTPMiddleware):
        async def dispatch(self, request: Any, call_next: Any) -> Response:
            response = await call_next(request)
            response.headers["x-tag"] = "1"
            return response

    async def home(request: Any) -> JSONResponse:
        return JSONResponse({"ok": True, "usage": USAGE})

    app = Starlette(routes=[StarletteRoute("/", home)], middleware=[Middleware(Tagger)])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers())
    async with await client_for(app) as client:
        r = await client.get("/")
    assert r.headers["x-tag"] == "1" and r.json()["energy"]["tokens"] == 40


def test_lifespan_starts_and_stops_the_readers() -> None:
    node, _ = busy_node()

    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    async def ws(websocket: Any) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    app = Starlette(routes=[StarletteRoute("/", home), WebSocketRoute("/ws", ws)])
    ledgers = Ledgers()
    stats = RecordingStats()
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=ledgers, stats=stats)
    with TestClient(app) as client:
        ledger = ledgers.get(node)
        assert ledger.reader is not None  # built at lifespan startup, before any request
        assert client.get("/").headers["x-energy-node"] == "sim"
        with client.websocket_connect("/ws") as socket:
            assert socket.receive_text() == "hello"
    assert len(stats) == 1 and all(record.energy.settled for record in stats)


def _unavailable(node: Node) -> Any:
    raise ReaderUnavailable("no NVML driver on this host", remedy="install the NVIDIA driver")


def _failing_app() -> Starlette:
    async def home(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Starlette(routes=[StarletteRoute("/", home)])
    node = Node("gpu", reader_factory=_unavailable)
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=RecordingStats())
    return app


def test_a_reader_that_cannot_work_stops_uvicorn_at_startup() -> None:
    """Under uvicorn's default ``--lifespan auto`` this used to read "ASGI 'lifespan'
    protocol appears unsupported", then a 500 on every request."""
    import uvicorn

    config = uvicorn.Config(_failing_app(), host="127.0.0.1", port=0, log_level="critical")
    server = uvicorn.Server(config)
    with pytest.raises(SystemExit) as stopped:
        server.run()
    assert stopped.value.code == 3 and not server.started  # uvicorn's STARTUP_FAILURE


async def test_startup_failure_is_sent_with_its_remedy() -> None:
    app = _failing_app()
    sent: list[dict] = []
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict:
        return inbox.pop(0) if inbox else await asyncio.Event().wait()  # type: ignore[func-returns-value]

    async def send(message: dict) -> None:
        sent.append(message)

    with contextlib.suppress(Exception):
        await asyncio.wait_for(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send), 2)
    failed = [m for m in sent if m["type"] == "lifespan.startup.failed"]
    assert failed and "no NVML driver" in failed[0]["message"]
    assert "install the NVIDIA driver" in failed[0]["message"]
    assert not [m for m in sent if m["type"] == "lifespan.startup.complete"]


async def test_without_lifespan_a_failed_reader_is_logged_once_and_never_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _failing_app()
    with caplog.at_level(logging.ERROR):
        async with await client_for(app) as client:  # httpx's transport sends no lifespan
            for _ in range(3):
                r = await client.get("/")
                assert r.status_code == 200 and r.text == "hi"
                assert "x-energy-id" in r.headers  # a text start goes out at once: no figure
            for _ in range(200):  # the reader is built on its own thread: its failure follows
                if [r for r in caplog.records if "NVML" in r.getMessage()]:
                    break
                await asyncio.sleep(0.01)
            for _ in range(3):
                r = await client.get("/")
                assert r.status_code == 200 and r.text == "hi"
    assert len([r for r in caplog.records if "NVML" in r.getMessage()]) == 1


async def test_a_hung_reader_never_delays_a_response() -> None:
    """The driver wedges after the baseline read: answers keep their pace, figures say so."""
    import threading
    import time

    release = threading.Event()
    node = Node("wedged", idle_w=0.0, reader_factory=lambda _n: WedgedReader(release))  # type: ignore[arg-type,return-value]
    ledgers = Ledgers()
    ledgers.get(node).read_timeout = 0.05
    body = b'{"ok": true}'
    app = EnergyMiddleware(raw_app(200, json_headers(body), body), nodes=[node], ledgers=ledgers)
    try:
        for _ in range(5):
            started = time.perf_counter()
            sent = await drive(app)
            assert time.perf_counter() - started < 0.05
            assert header(start_of(sent), b"x-energy-settled") == b"false"
            await asyncio.sleep(0.03)
        assert ledgers.get(node).totals().read_errors >= 1
    finally:
        release.set()
        await ledgers.aclose()
