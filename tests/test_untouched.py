"""Nothing touched that was not asked for (issue 21 item 3).

With routes declared, only they are metered; with none, every route is, except the
framework's own documents (/openapi.json, /docs, /redoc, static mounts) and health checks,
which are never touched. "Untouched" is checked the strict way: every ASGI message the
metered app sends is the bare app's, byte for byte, headers and body.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from apps import busy_node
from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from giul_asgi import EnergyMiddleware, Ledgers, Route

pytestmark = pytest.mark.anyio


def make_app(static: Path, **energy: Any) -> FastAPI:
    """The same FastAPI app every time; with ``energy``, the middleware added as users do."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        return {"id": "cmpl-1", "usage": {"completion_tokens": 3}}

    @app.get("/pid")
    async def pid() -> dict:
        return {"pid": os.getpid()}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True}

    app.mount("/static", StaticFiles(directory=static), name="static")
    app.mount("/assets", StaticFiles(directory=static), name="assets")  # a mount of any name
    if energy:
        node, _ = busy_node()
        app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), **energy)
    return app


async def call(app: Any, path: str, method: str = "GET") -> list[dict[str, Any]]:
    """Every message ``app`` sends for one request, as sent."""
    sent: list[dict[str, Any]] = []
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if asked:
            return {"type": "http.disconnect"}
        asked = True
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"gw"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return sent


@pytest.fixture
def static(tmp_path: Path) -> Path:
    (tmp_path / "app.js").write_text("console.log('hi')\n")
    return tmp_path


DOCUMENTS = ["/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/static/app.js",
             "/assets/app.js", "/healthz"]


@pytest.mark.parametrize("declared", [False, True], ids=["no-routes", "routes-declared"])
async def test_documents_and_health_checks_are_the_bare_apps_byte_for_byte(
    static: Path, declared: bool,
) -> None:
    routes = [Route("/v1/chat/completions")] if declared else None
    bare, metered = make_app(static), make_app(static, routes=routes)
    for path in DOCUMENTS:
        assert await call(metered, path) == await call(bare, path), path
    # ... while what is asked for is metered: the test can fail.
    answer = await call(metered, "/v1/chat/completions", "POST")
    assert any(k == b"x-energy-method" for k, _ in answer[0]["headers"])
    assert b'"energy"' in answer[-1]["body"]


async def test_with_routes_declared_an_undeclared_route_is_the_bare_apps(static: Path) -> None:
    bare = make_app(static)
    metered = make_app(static, routes=[Route("/v1/chat/completions")])
    assert await call(metered, "/pid") == await call(bare, "/pid")
    assert await call(metered, "/nope") == await call(bare, "/nope")  # a 404 too
    # With none declared every route is metered, /pid included (what "every route" means).
    everything = make_app(static)
    everything.add_middleware(EnergyMiddleware, nodes=[busy_node()[0]], ledgers=Ledgers())
    assert b'"energy"' in (await call(everything, "/pid"))[-1]["body"]


async def test_a_catch_all_route_asks_for_every_other_path(static: Path) -> None:
    app = make_app(static, routes=[Route("/v1/chat/completions"), Route("/*")])
    assert b'"energy"' in (await call(app, "/pid"))[-1]["body"]
    bare = make_app(static)
    assert await call(app, "/openapi.json") == await call(bare, "/openapi.json")  # still never


async def test_exclude_adds_to_what_is_never_touched(static: Path) -> None:
    bare = make_app(static)
    metered = make_app(static, exclude=["/pid"])
    assert await call(metered, "/pid") == await call(bare, "/pid")
    assert await call(metered, "/healthz") == await call(bare, "/healthz")  # the defaults stay
