"""Nothing the package starts outlives the object that started it, closed or collected.

A middleware built and dropped without its lifespan (a test's, a script's) left three
threads reading for ever: its node's reader and watchdog, and the statistics' writer. Its
ledgers and statistics now stop when it is collected.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import httpx

from giul_asgi import EnergyMiddleware, Ledgers, Node


async def _app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


async def _one() -> None:
    metered = EnergyMiddleware(_app, [Node("collected", reader="simulated", idle_w=60.0)], ledgers=Ledgers())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=metered), base_url="http://gw") as c:
        assert (await c.get("/x")).status_code == 200


def _ours() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("giul-") and t.is_alive()]


def test_a_middleware_dropped_without_its_lifespan_leaves_no_thread_behind() -> None:
    before = set(_ours())
    for _ in range(3):
        asyncio.run(_one())
    deadline = time.monotonic() + 30.0  # a loaded machine stops them late, never never
    while time.monotonic() < deadline:
        gc.collect()
        left = [n for n in _ours() if n not in before or _ours().count(n) > 1]
        if not [n for n in left if not n.endswith("-collected")]:
            break
        time.sleep(0.1)
    assert not [n for n in _ours() if n not in before and not n.endswith("-collected")], _ours()
