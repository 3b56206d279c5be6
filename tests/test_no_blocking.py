"""No blocking call of ours on the event loop: at build, per request, at /energy, at shutdown.

Starlette builds the middleware stack on the loop at the first ASGI call (so our constructor
runs there), and the lifespan's shutdown runs ``aclose()`` there; Starlette's own suite runs
under blockbuster's guard, which fails any file or socket call made on a running loop. This
runs a real FastAPI app behind EnergyMiddleware (a simulated card, the records shared in a
place of the test's own) under that guard, counting only calls with a frame of ours on the
stack: built at the first request (httpx's ASGITransport: no lifespan) and through Starlette's
TestClient (lifespan startup and shutdown), JSON and streamed answers, ``/energy`` and
``/energy/requests/{id}``.

Beside blockbuster's own list, ``os.open``, ``posix_fallocate``, ``fsync``, ``chmod`` and
``truncate`` are caught. Two things the guard knows are allowed: a ``threading.Lock`` another
thread holds for a few microseconds (the ledger's, the records' ring) is not a blocking call,
and FastAPI's own first-call source lookup (``inspect.getsourcefile``) is FastAPI's, under
our frames.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from apps import busy_node

blockbuster = pytest.importorskip("blockbuster", reason="pip install blockbuster (the test extra)")


@contextmanager
def guard() -> Iterator[list[str]]:
    """blockbuster, active for calls that have a frame of giul_asgi on their stack; the
    blocking calls it caught (each also raised where it was made)."""
    caught: list[str] = []
    buster = blockbuster.BlockBuster(scanned_modules=["giul_asgi"])
    for name in ("os.open", "os.posix_fallocate", "os.fsync", "os.fchmod", "os.chmod", "os.truncate",
                 "os.ftruncate"):  # file calls blockbuster leaves alone: caught here too
        buster.functions[name] = blockbuster.BlockBusterFunction(None, name, scanned_modules=["giul_asgi"])
    for name in ("threading.Lock.acquire", "threading.Lock.acquire_lock"):
        buster.functions.pop(name, None)
    for name in ("os.stat", "os.path.abspath", "os.path.islink"):
        if name in buster.functions:
            buster.functions[name].can_block_in("fastapi/routing.py", "_extract_endpoint_context")
    original = blockbuster.BlockingError.__init__

    def said(self: Any, func: str) -> None:
        import traceback

        original(self, func)
        ours = [f for f in traceback.extract_stack() if "/giul_asgi/" in f.filename]
        caught.append(f"{func} at {ours[-1].filename}:{ours[-1].lineno} ({ours[-1].name})"
                      if ours else func)

    blockbuster.BlockingError.__init__ = said  # type: ignore[method-assign]
    buster.activate()
    try:
        yield caught
    finally:
        buster.deactivate()
        blockbuster.BlockingError.__init__ = original  # type: ignore[method-assign]


def app_with(place: Path, **kwargs: Any) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from giul_asgi import EnergyMiddleware, Ledgers
    from giul_asgi.records import RecordStore

    node, _ = busy_node()
    app = FastAPI()

    @app.get("/json")
    async def answer() -> dict[str, Any]:
        await asyncio.sleep(0.005)
        return {"ok": True}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def events() -> Any:
            for n in range(3):
                yield f"data: {n}\n\n".encode()
                await asyncio.sleep(0.002)

        return StreamingResponse(events(), media_type="text/event-stream")

    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), metrics_path="/metrics",
                       records=kwargs.pop("records", None) or RecordStore(share=place), **kwargs)
    return app


def energy_stats() -> Any:
    from giul_asgi.stats import EnergyStats

    return EnergyStats()


@pytest.mark.anyio
async def test_build_requests_energy_and_lookups_block_nothing_on_the_loop(tmp_path: Path) -> None:
    import httpx

    from giul_asgi.records import RecordStore

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    with guard() as caught:
        # Built here, on the running loop, as Starlette does at the first call (the store too).
        app = app_with(place, stats=energy_stats(), records=RecordStore(share=place))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            ids = []
            for path in ("/json", "/stream", "/json"):
                answer = await c.get(path)
                assert answer.status_code == 200, answer.text
                ids.append(answer.headers["x-energy-id"])
            for path in ("/energy", "/energy?window=all", "/metrics", "/energy/requests/nobody-1-1"):
                assert (await c.get(path)).status_code in (200, 404)
            for key in ids:
                assert (await c.get(f"/energy/requests/{key}")).status_code == 200
        from apps import find_middleware

        middleware = find_middleware(app)
        await middleware.aclose()  # the shutdown's work, on the loop
    assert not caught, caught
    assert middleware.records.shared  # and the records were shared all along


def test_a_lifespan_through_starlettes_test_client_blocks_nothing_on_the_loop(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from giul_asgi.records import RecordStore

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    with guard() as caught:
        app = app_with(place, stats=energy_stats(), records=RecordStore(share=place),
                       endpoint_guard=lambda scope: True)  # its client is not on loopback
        with warnings.catch_warnings():  # Starlette's TestClient prefers httpx2, and says so
            warnings.simplefilter("ignore")
            client = TestClient(app)
        with client:  # lifespan startup here, shutdown (aclose) at the end, on the portal's loop
            ids = [client.get(path).headers["x-energy-id"] for path in ("/json", "/stream")]
            assert client.get("/energy").status_code == 200
            assert all(client.get(f"/energy/requests/{key}").status_code == 200 for key in ids)
    assert not caught, caught


@pytest.mark.anyio
async def test_the_default_statistics_block_nothing_on_the_loop_either(tmp_path: Path) -> None:
    import httpx

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    with guard() as caught:
        app = app_with(place)  # HostStats, the default
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            for path in ("/json", "/energy"):
                await c.get(path)
    assert not caught, caught
