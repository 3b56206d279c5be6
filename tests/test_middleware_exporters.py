"""The middleware feeds records, sinks and OpenTelemetry: every request, once, nothing lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from giul_asgi import EnergyMiddleware, Ledgers, Node, Tier
from giul_asgi.exporters.otel import otel_recorder
from giul_asgi.exporters.sink import JsonLinesSink

BODY = json.dumps({"usage": {"completion_tokens": 10}}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})


async def request(mw: Any, tracer: Any = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "query_string": b"", "root_path": ""}
    if tracer is None:
        await mw(scope, receive, send)
    else:
        with tracer.start_as_current_span("server"):
            await mw(scope, receive, send)
    return sent


async def lifespan(mw: Any, *messages: str) -> None:
    inbox = [{"type": m} for m in messages]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    await mw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)


@pytest.mark.anyio
async def test_sinks_get_every_record_and_lose_none_at_shutdown(tmp_path: Path) -> None:
    sink = JsonLinesSink(tmp_path / "energy.jsonl")
    mw = EnergyMiddleware(app, nodes=[Node("dark", reader="none")], tiers=[Tier("8b", 300.0)],
                          ledgers=Ledgers(), sinks=[sink])
    ids = []
    for _ in range(50):
        sent = await request(mw)
        ids.append(dict(sent[0]["headers"])[b"x-energy-id"].decode())
    await lifespan(mw, "lifespan.shutdown")  # flushes the sink
    lines = [json.loads(line) for line in (tmp_path / "energy.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(ids)  # each request once, none lost
    assert {(r["outcome"], r["status"]) for r in lines} == {("ok", 200)}
    assert mw.records.get(ids[0]) is not None and mw.records.get(ids[0]).method == "estimated"


@pytest.mark.anyio
async def test_the_request_span_carries_the_energy_and_metrics_count_it() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    recorder = otel_recorder(MeterProvider(metric_readers=[reader]))
    mw = EnergyMiddleware(app, nodes=[Node("dark", reader="none")], tiers=[Tier("8b", 300.0)],
                          ledgers=Ledgers(), otel=recorder)
    await request(mw, provider.get_tracer("test"))
    await anyio.sleep(0)
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert attrs["giul.energy.method"] == "estimated" and attrs["giul.energy.joules"] == 3.0
    assert attrs["gen_ai.usage.output_tokens"] == 10 and "gen_ai.usage.input_tokens" not in attrs
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"giul.requests", "giul.energy"} <= names
