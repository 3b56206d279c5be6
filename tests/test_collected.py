"""Nothing the package starts outlives the object that started it, closed or collected.

A middleware built and dropped without its lifespan (a test's, a script's) left three
threads reading for ever: its node's reader and watchdog, and the statistics' writer. Its
statistics now stop when it is collected, and its ledgers when their registry is: a request's
meter waiting on its figure holds the registry until its window settles, and the middleware's
own look, half a second after its collection, found it held under load and gave up.
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
    metered = EnergyMiddleware(_app, [Node("dropped", reader="simulated", idle_w=60.0)], ledgers=Ledgers())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=metered), base_url="http://gw") as c:
        assert (await c.get("/x")).status_code == 200


#: The threads that stop what a collected middleware started (the node here is not named
#: "collected": its reader's threads, giul-reader-NODE, were taken for these and never checked).
_STOPPERS = ("giul-ledgers-collected", "giul-stats-collected")


def _ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("giul-") and t.is_alive()}


def test_a_middleware_dropped_without_its_lifespan_leaves_no_thread_behind() -> None:
    # By thread, not by name: an earlier test's thread still stopping may share a name with
    # one of these ("giul-records"), which then hid a leak and held the wait to its deadline.
    before = _ours()
    for _ in range(3):
        asyncio.run(_one())
    deadline = time.monotonic() + 30.0  # a loaded machine stops them late, never never
    while time.monotonic() < deadline:
        gc.collect()
        if not _left(before):
            break
        time.sleep(0.1)
    assert not _left(before), sorted(t.name for t in _left(before))


def _left(before: set[threading.Thread]) -> list[threading.Thread]:
    """Ours started since ``before`` and still running, but the stoppers a collected
    middleware starts (each ends once it has stopped what it stops)."""
    return [t for t in _ours() - before if t.name not in _STOPPERS]


def test_a_registry_held_past_its_middleware_stops_its_readers_once_let_go() -> None:
    ledgers = Ledgers()
    metered = EnergyMiddleware(_app, [Node("held", reader="simulated", idle_w=60.0)], ledgers=ledgers)

    async def one(app: EnergyMiddleware) -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            assert (await c.get("/x")).status_code == 200

    before = _ours()
    asyncio.run(one(metered))
    del metered
    gc.collect()
    time.sleep(1.0)  # held beyond the half second the middleware's collection once looked
    assert [t for t in _left(before) if t.name == "giul-reader-held"], "kept: its registry is held"
    del ledgers
    deadline = time.monotonic() + 30.0
    while _left(before) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert not _left(before), sorted(t.name for t in _left(before))
