"""The overhead benchmark compares like with like: every stack serves the same answers.

Peers that need the bench extra (starlette-exporter, OpenTelemetry) are skipped when it is
not installed; the rest run here, so a benchmark row never times a broken stack.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from _apps import PAYLOAD, VARIANTS, build

pytestmark = pytest.mark.anyio

NEEDS = {
    "starlette-exporter": "starlette_exporter", "opentelemetry": "opentelemetry.instrumentation.asgi",
    "prometheus-fastapi-instrumentator": "prometheus_fastapi_instrumentator",
}
ENERGY_HEADERS = {
    "x-energy-joules", "x-energy-method", "x-energy-backend", "x-energy-source",
    "x-energy-node", "x-energy-tier", "x-energy-seconds", "x-energy-tokens",
    "x-energy-joules-per-token", "x-energy-uncertainty", "x-energy-settled",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("variant", VARIANTS)
async def test_every_stack_serves_the_same_answers(variant: str) -> None:
    if variant in NEEDS and not _installed(NEEDS[variant]):
        pytest.skip(f"{variant} needs the bench extra")
    app = build(variant)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b") as c:
        answer = await c.get("/v1/chat/completions")
        stream = await c.get("/v1/stream/8")
        usage_stream = await c.get("/v1/stream-usage/8")
    assert answer.status_code == 200 and stream.status_code == 200
    body = answer.json()
    energy = body.pop("energy", None)
    assert body == json.loads(json.dumps(PAYLOAD))
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert stream.text.count("data: ") >= 9 and "data: [DONE]" in stream.text

    writes_energy = variant in ("floor", "giul-asgi", "giul-asgi-headers")
    assert (set(answer.headers) >= ENERGY_HEADERS) is writes_energy
    assert (energy is not None) is (variant in ("floor", "giul-asgi"))
    if energy is not None:
        assert energy["tokens"] == PAYLOAD["usage"]["completion_tokens"]  # type: ignore[index]
        assert answer.headers["x-energy-tokens"] == "48"

    # The include_usage stream: its usage chunk, and in ours the energy riding in it.
    events = [e for e in usage_stream.text.split("\n\n") if e.startswith("data: {")]
    assert len(events) == 10 and all('"usage":null' in e for e in events[:9])
    last = json.loads(events[-1][len("data: "):])
    assert last["usage"] == PAYLOAD["usage"]
    assert ("energy" in last) is variant.startswith("giul-asgi")
    if "energy" in last:
        assert last["energy"]["tokens"] == 48


async def test_server_path_drives_uvicorns_own_protocol() -> None:
    """server_path.py times what uvicorn writes: whole responses, our headers among them."""
    pytest.importorskip("httptools")
    from server_path import Server, headers_app

    wire = await Server(build("giul-asgi")).answer("/v1/chat/completions")
    head, _, body = wire.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    names = {line.split(b":", 1)[0].decode() for line in lines[1:]}
    assert names >= ENERGY_HEADERS
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    assert length == len(body) and json.loads(body)["energy"]["tokens"] == 48

    plain = await Server(headers_app(11)).answer("/")
    assert plain.count(b"\r\nx-energy-") == 11
    assert await Server(headers_app(0)).per_request_us("/", 3) > 0
