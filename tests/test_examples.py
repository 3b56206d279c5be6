"""The examples run as written."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio


async def test_gateway_example_routes_by_model() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from examples.gateway import app
    finally:
        sys.path.remove(str(ROOT))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        body = {"model": "llama-70b", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}
        r = await client.post("/v1/chat/completions", json=body)
        assert r.headers["x-energy-node"] == "h100-big" and r.headers["x-energy-tier"] == "70b"
        assert r.json()["energy"]["tokens"] == 4
        body["model"] = "llama-8b"
        r = await client.post("/v1/chat/completions", json=body)
        assert r.headers["x-energy-node"] == "l4-small"


def test_meter_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(ROOT / "examples" / "meter_local.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "async:" in out and "sync:" in out and "simulated" in out
