"""End to end: a FastAPI gateway with ``app.add_middleware(EnergyMiddleware)`` under a real
uvicorn on 127.0.0.1, read by the real ``openai`` client, as a new user would."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from apps import RecordingStats, find_middleware, openai_chat
from fastapi import FastAPI
from openai import OpenAI
from server import serve

from giul_asgi import EnergyMiddleware, Ledgers, Node, Route, Tier
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader
from giul_asgi.wire.sse import sse_data

MESSAGES = [{"role": "user", "content": "what did this cost"}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, FastAPI]]:
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim-h100", idle_w=70.0, period_s=0.02,
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))
    app = FastAPI()
    app.add_route("/v1/chat/completions", openai_chat(card), methods=["POST"])
    app.add_middleware(
        EnergyMiddleware, nodes=[node], tiers=[Tier("8b", 300.0)],
        routes=[Route("/v1/chat/completions", node="sim-h100", tier="8b")], ledgers=Ledgers(),
        stats=RecordingStats(),
        settle_timeout=0.5,  # settled figures in the answers: these tests check their values
    )
    with serve(app) as url:
        yield url, app


@pytest.fixture
def client(gateway: tuple[str, FastAPI]) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway[0] + "/v1", api_key="not-needed", max_retries=0) as client:
        yield client


def test_openai_client_reads_headers_and_energy_block(client: OpenAI) -> None:
    client.chat.completions.create(model="sim-8b", messages=MESSAGES, max_tokens=8)  # warm
    raw = client.chat.completions.with_raw_response.create(
        model="sim-8b", messages=MESSAGES, max_tokens=20
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 20
    energy = completion.model_extra["energy"]  # type: ignore[index]
    assert raw.headers["x-energy-method"] == "simulated" == energy["method"]
    assert raw.headers["x-energy-node"] == "sim-h100" and raw.headers["x-energy-tier"] == "8b"
    assert raw.headers["x-energy-tokens"] == "20" and energy["tokens"] == 20
    joules = float(raw.headers["x-energy-joules"])
    assert joules == pytest.approx(energy["joules"], rel=1e-4)
    assert raw.headers["x-energy-settled"] == "true" and energy["settled"] is True
    assert joules == pytest.approx(120.0 * 0.08, rel=0.6)  # 120 W for ~80 ms
    assert energy["route"] == "/v1/chat/completions"


def test_streamed_chat_with_usage_carries_energy_in_its_last_chunk(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="sim-8b", messages=MESSAGES, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, energy = "", None, None
    for chunk in stream:  # the usual loop, unchanged
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
            energy = (chunk.model_extra or {}).get("energy")
    assert len(text.split()) == 12
    assert usage is not None and usage.completion_tokens == 12
    assert energy is not None and energy["tokens"] == 12 and energy["method"] == "simulated"
    assert energy["joules"] is not None and energy["seconds"] > 0.04 and energy["settled"]


def test_streamed_chat_without_usage_loops_unchanged_and_finds_the_energy(client: OpenAI) -> None:
    """The plain loop stops at [DONE]: the closing ``event: energy`` comes after it, so the
    figure rides on the chunk that carries ``finish_reason``."""
    stream = client.chat.completions.create(
        model="sim-8b", messages=MESSAGES, max_tokens=6, stream=True
    )
    text, energy, finish = "", None, None
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""  # would break on an empty choices list
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
            energy = (chunk.model_extra or {}).get("energy")
    assert len(text.split()) == 6 and finish is not None
    assert energy is not None and energy["method"] == "simulated" and energy["node"] == "sim-h100"
    assert energy["joules"] is not None and energy["seconds"] > 0.02


@pytest.mark.anyio
async def test_async_openai_loop_finds_the_energy(gateway: tuple[str, FastAPI]) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=gateway[0] + "/v1", api_key="not-needed", max_retries=0)
    try:
        for options in (None, {"include_usage": True}):
            extra = {"stream_options": options} if options else {}
            stream = await client.chat.completions.create(
                model="sim-8b", messages=MESSAGES, max_tokens=4, stream=True, **extra  # type: ignore[arg-type]
            )
            found = [
                (chunk.model_extra or {})["energy"] async for chunk in stream
                if "energy" in (chunk.model_extra or {})
            ]
            assert len(found) == 1 and found[0]["joules"] is not None
    finally:
        await client.close()


def test_stream_headers_through_with_raw_response(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="sim-8b", messages=MESSAGES, max_tokens=4, stream=True
    )
    assert raw.headers["x-energy-node"] == "sim-h100"
    assert raw.headers["x-energy-backend"] == "simulated"
    for _ in raw.parse():
        pass


def test_raw_sse_client_finds_the_energy_in_the_finish_chunk(gateway: tuple[str, FastAPI]) -> None:
    """No closing ``event: energy`` unless the operator asks (a consumer counting events
    would see one more than the app sent): a raw reader finds it where the openai loop does."""
    url, _app = gateway
    payload = {"model": "m", "messages": MESSAGES, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=payload) as response:
        raw = b"".join(response.iter_bytes())
    events = [e for e in raw.split(b"\n\n") if e]
    done = events.index(b"data: [DONE]")
    assert done == len(events) - 1  # nothing after [DONE]
    energy = json.loads(sse_data(events[done - 1]))["energy"]
    assert energy["node"] == "sim-h100" and energy["joules"] is not None and energy["settled"]


def test_stats_see_every_request_settled(gateway: tuple[str, FastAPI], client: OpenAI) -> None:
    stats = find_middleware(gateway[1]).stats
    assert isinstance(stats, RecordingStats)
    before = len(stats)
    client.chat.completions.create(model="sim-8b", messages=MESSAGES, max_tokens=3)
    deadline = time.monotonic() + 2
    while len(stats) <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    record = list(stats)[-1]
    assert record.outcome == "ok" and record.status == 200 and record.energy.settled
    assert record.energy.route == "/v1/chat/completions"


@pytest.fixture(scope="module")
def usage_gateway() -> Iterator[str]:
    """The same gateway with ``energy_in_usage=True``: the energy inside ``usage``."""
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim-u", idle_w=70.0, period_s=0.02,
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))
    app = FastAPI()
    app.add_route("/v1/chat/completions", openai_chat(card), methods=["POST"])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=RecordingStats(),
                       energy_in_usage=True)
    with serve(app) as url:
        yield url


def test_energy_in_usage_reaches_the_openai_clients_usage(usage_gateway: str) -> None:
    """Tools that log ``usage`` as it is (spend logs, observability callbacks) capture the
    energy with no change of theirs: the real client keeps it in ``usage.model_extra``."""
    with OpenAI(base_url=usage_gateway + "/v1", api_key="x", max_retries=0) as client:
        completion = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8)
        assert completion.usage is not None and completion.usage.completion_tokens == 8
        extra = completion.usage.model_extra or {}
        energy = (completion.model_extra or {})["energy"]
        assert extra["energy_joules"] == energy["joules"]  # the same figure, null if unknown
        assert "carbon_grams" not in extra  # no carbon configured on this node
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=5, stream=True,
            stream_options={"include_usage": True},
        )
        found = [chunk.usage.model_extra for chunk in stream if chunk.usage is not None]
    assert len(found) == 1 and found[0] is not None and "energy_joules" in found[0]


def test_energy_in_usage_never_overwrites_the_apps_own() -> None:
    from giul_asgi.wire.body import splice_usage, usage_open

    body = b'{"usage": {"energy_joules": 7}}'
    assert not usage_open(json.loads(body))
    assert splice_usage(b'{"a": {"usage": {"x": 1}}}', b'"energy_joules":1') is None  # nested
    note = b'{"note": "\\"usage\\": {}", "usage": {"t": 3}\n}'
    assert splice_usage(note, b'"energy_joules":1') == (
        b'{"note": "\\"usage\\": {}", "usage": {"t": 3,"energy_joules":1}\n}'
    )
