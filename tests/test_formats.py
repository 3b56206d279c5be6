"""Every client's format: Neuralwatt's ``energy`` shape and its SSE comment before
``[DONE]``, for the whole server (``energy_format``) or per request (``Prefer``, RFC 7240),
read by the real ``openai`` client through a real uvicorn."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator

import httpx
import pytest
from apps import RecordingStats, body_of, busy_node, drive, fresh, header, openai_chat, start_of
from fastapi import FastAPI
from openai import OpenAI
from server import serve

from giul_asgi import EnergyMiddleware, Ledgers, Node
from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader
from giul_asgi.wire.formats import NEURALWATT, Formats, preferred
from giul_asgi.wire.sse import sse_data

MESSAGES = [{"role": "user", "content": "what did this cost"}]
SHAPE = {"energy_joules", "energy_kwh", "avg_power_watts", "duration_seconds", "attribution_method",
         "attribution_ratio"}


def test_the_neuralwatt_block_is_the_allocated_figure_in_their_shape() -> None:
    e = Energy(3.0, "measured", seconds=0.5, mean_watts=100.0, split="time", allocated_joules=20.0)
    block = json.loads(NEURALWATT.block(e))
    assert set(block) == SHAPE
    assert block["energy_joules"] == 20.0 and block["energy_kwh"] == pytest.approx(20.0 / 3.6e6)
    assert block["avg_power_watts"] == 100.0 and block["duration_seconds"] == 0.5
    assert block["attribution_method"] == "time" and block["attribution_ratio"] == pytest.approx(0.4)
    # Not measured: the method says so; unknown stays null, never 0.
    sim = json.loads(NEURALWATT.block(Energy(1.0, "simulated", seconds=0.1, mean_watts=5.0,
                                             split="exclusive", allocated_joules=9.0)))
    assert sim["attribution_method"] == "exclusive_simulated" and sim["attribution_ratio"] == 1.0
    unknown = json.loads(NEURALWATT.block(Energy(None, "unknown", seconds=0.2)))
    assert unknown["energy_joules"] is None and unknown["energy_kwh"] is None
    assert unknown["attribution_ratio"] is None and unknown["attribution_method"] == "exclusive_unknown"
    inline, comment = NEURALWATT.stream(b"{}")
    assert inline is None and comment == b": energy {}\n\n"


@pytest.mark.parametrize(("value", "wanted"), [
    (b"energy=neuralwatt", b"neuralwatt"),
    (b'respond-async, Energy="NeuralWatt"; strict', b"NeuralWatt"),
    (b"wait=5,energy=giul", b"giul"),
    (b"energy", None),
    (b"return=minimal", None),
])
def test_prefer_is_read_as_rfc_7240_writes_it(value: bytes, wanted: bytes | None) -> None:
    assert preferred(value, b"energy") == wanted


def test_a_preference_we_do_not_write_is_ignored_and_not_said_applied() -> None:
    formats = Formats(NEURALWATT)
    assert formats.for_request([(b"prefer", b"energy=html")]) is formats.default
    assert formats.for_request([]).format is NEURALWATT and formats.default.applied == ()
    chosen = formats.for_request([(b"accept", b"*/*"), (b"Prefer", b"energy=GIUL")])
    assert chosen.format.name == "giul" and chosen.applied == ((b"preference-applied", b"energy=giul"),)


@pytest.mark.parametrize(("value", "meant"), [("neuralwat", "neuralwatt"), ("Neuralwatt", "neuralwatt"),
                                              ("giu", "giul")])
def test_a_misspelt_format_fails_at_once_saying_the_one_meant(value: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean energy_format='{meant}'"):
        EnergyMiddleware(lambda *a: None, energy_format=value)
    with pytest.raises(ConfigError, match="is not one of giul, neuralwatt"):
        EnergyMiddleware(lambda *a: None, energy_format=3)


def json_app(body: bytes) -> object:
    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})  # type: ignore[operator]

    return app


def sse_app(events: list[bytes]) -> object:
    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"text/event-stream")]})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    return app


CHUNK = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"w"},' \
        b'"finish_reason":null}]}\n\n'
FINISH = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},' \
         b'"finish_reason":"stop"}]}\n\n'


@pytest.mark.anyio
async def test_the_server_format_and_a_clients_preference_both_shape_the_answer() -> None:
    node, _card = busy_node()
    mw = fresh(json_app(b'{"id": "x"}'), node, energy_format="neuralwatt")
    other = fresh(json_app(b'{"id": "x"}'), node)
    try:
        sent = await drive(mw)
        assert set(json.loads(body_of(sent))["energy"]) == SHAPE
        assert header(start_of(sent), b"preference-applied") is None  # nobody asked
        assert header(start_of(sent), b"x-energy-joules") is not None  # headers as always
        sent = await drive(mw, headers=[(b"prefer", b"energy=giul")])
        assert "method" in json.loads(body_of(sent))["energy"]
        assert header(start_of(sent), b"preference-applied") == b"energy=giul"
        sent = await drive(other, headers=[(b"prefer", b"energy=neuralwatt")])
        assert set(json.loads(body_of(sent))["energy"]) == SHAPE
        assert header(start_of(sent), b"preference-applied") == b"energy=neuralwatt"
    finally:
        await mw.aclose()
        await other.aclose()


@pytest.mark.anyio
async def test_a_neuralwatt_stream_carries_the_comment_just_before_done() -> None:
    node, _card = busy_node()
    mw = fresh(sse_app([CHUNK, CHUNK, FINISH, b"data: [DONE]\n\n"]), node)
    try:
        sent = await drive(mw, headers=[(b"prefer", b"energy=neuralwatt")])
        raw = body_of(sent)
        assert header(start_of(sent), b"preference-applied") == b"energy=neuralwatt"
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]" and events[-2].startswith(b": energy {")
        assert set(json.loads(events[-2][len(b": energy "):])) == SHAPE
        assert raw.replace(events[-2] + b"\n\n", b"") == CHUNK + CHUNK + FINISH + b"data: [DONE]\n\n"
        # A stream that ends without [DONE]: the comment closes it.
        bare = fresh(sse_app([CHUNK, FINISH]), node, energy_format="neuralwatt")
        try:
            events = [e for e in body_of(await drive(bare)).split(b"\n\n") if e]
            assert events[-1].startswith(b": energy {") and events[-2] == FINISH.rstrip()
        finally:
            await bare.aclose()
    finally:
        await mw.aclose()


def _app_with(headers: list[tuple[bytes, bytes]], body: bytes, media: bytes = b"application/json") -> object:
    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", media), *headers]})
        await send({"type": "http.response.body", "body": body})  # type: ignore[operator]

    return app


def _varies(message: dict) -> list[bytes]:
    return [v for k, v in message["headers"] if k.lower() == b"vary"]


@pytest.mark.anyio
@pytest.mark.parametrize("media", [b"application/json", b"text/event-stream"])
async def test_an_answer_whose_block_follows_prefer_says_vary_prefer(media: bytes) -> None:
    """RFC 9110 12.5.5: the block's shape depends on the request's ``Prefer``, so a cache
    must key on it: ``Vary: Prefer`` beside the app's own names, once; on a JSON answer asked
    or not, on a stream (which no cache serves again) only where the client asked."""
    node, _card = busy_node()
    body = b'{"id": "x"}' if media == b"application/json" else CHUNK + FINISH + b"data: [DONE]\n\n"
    cases = [
        ([], [b"Prefer"]),
        ([(b"vary", b"Accept-Encoding")], [b"Accept-Encoding, Prefer"]),
        ([(b"Vary", b"Origin"), (b"vary", b"accept")], [b"Origin", b"accept, Prefer"]),
        ([(b"vary", b"Accept, prefer")], [b"Accept, prefer"]),  # named already: not twice
        ([(b"vary", b"*")], [b"*"]),  # varies with everything already
    ]
    for app_headers, wanted in cases:
        mw = fresh(_app_with(app_headers, body, media), node)
        try:
            for asked in ([], [(b"prefer", b"energy=neuralwatt")]):
                sent = await drive(mw, headers=asked)
                if media == b"text/event-stream" and not asked:
                    # a stream nobody caches: the app's headers as it sent them
                    wanted_here = [v for k, v in app_headers if k.lower() == b"vary"]
                else:
                    wanted_here = wanted
                assert _varies(start_of(sent)) == wanted_here, (app_headers, asked)
        finally:
            await mw.aclose()


@pytest.mark.anyio
async def test_an_answer_whose_bytes_no_preference_changes_says_no_vary() -> None:
    node, _card = busy_node()
    mw = fresh(_app_with([], b"plain", b"text/plain"), node)
    try:
        sent = await drive(mw, headers=[(b"prefer", b"energy=neuralwatt")])
        assert _varies(start_of(sent)) == []
    finally:
        await mw.aclose()


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim-nw", idle_w=70.0, period_s=0.02,
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))
    app = FastAPI()
    app.add_route("/v1/chat/completions", openai_chat(card), methods=["POST"])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=RecordingStats(),
                       energy_format="neuralwatt", settle_timeout=0.5)
    with serve(app) as url:
        yield url


def test_the_openai_client_reads_the_neuralwatt_block(gateway: str) -> None:
    with OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
        completion = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        energy = (completion.model_extra or {})["energy"]
        assert set(energy) == SHAPE and energy["energy_joules"] > 0
        assert energy["energy_kwh"] == pytest.approx(energy["energy_joules"] / 3.6e6, rel=1e-6)
        assert energy["attribution_method"] == "exclusive_simulated"
        assert 0 < energy["attribution_ratio"] <= 1 and energy["duration_seconds"] > 0.03
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=4, extra_headers={"Prefer": "energy=giul"})
        assert raw.headers["preference-applied"] == "energy=giul"
        assert raw.parse().model_extra["energy"]["method"] == "simulated"  # type: ignore[index]


def test_the_openai_client_parses_a_neuralwatt_stream_that_raw_bytes_show_the_comment_in(
    gateway: str,
) -> None:
    with OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as client:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert len(text.split()) == 6  # the comment is skipped: the stream parses unchanged
    payload = {"model": "m", "messages": MESSAGES, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=payload) as response:
        raw = b"".join(response.iter_bytes())
    comment, done = raw.index(b"\n: energy {"), raw.index(b"data: [DONE]")
    assert comment < done and raw.rstrip().endswith(b"data: [DONE]")
    block = json.loads(raw[comment + len(b"\n: energy "):].split(b"\n", 1)[0])
    assert set(block) == SHAPE and block["energy_joules"] > 0
    assert all("energy" not in json.loads(sse_data(e)) for e in raw.split(b"\n\n")
               if e.startswith(b"data: {"))  # only the comment carries it


@pytest.fixture(scope="module")
def usage_gateway() -> Iterator[str]:
    """A neuralwatt gateway that also puts the energy in ``usage``."""
    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim-nwu", idle_w=70.0, period_s=0.02,
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))
    app = FastAPI()
    app.add_route("/v1/chat/completions", openai_chat(card), methods=["POST"])
    app.add_middleware(EnergyMiddleware, nodes=[node], ledgers=Ledgers(), stats=RecordingStats(),
                       energy_format="neuralwatt", energy_in_usage=True, settle_timeout=0.5)
    with serve(app) as url:
        yield url


def test_the_openai_clients_usage_says_the_neuralwatt_blocks_joules(usage_gateway: str) -> None:
    """With ``energy_in_usage`` the usage's ``energy_joules`` is the number the neuralwatt
    block says under that name (the allocated basis), never our dynamic joules beside it;
    our own format's usage keeps ours (asked for per request)."""
    with OpenAI(base_url=usage_gateway + "/v1", api_key="x", max_retries=0) as client:
        completion = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10)
        block = (completion.model_extra or {})["energy"]
        usage = (completion.usage.model_extra or {}) if completion.usage else {}
        assert set(block) == SHAPE
        assert usage["energy_joules"] == block["energy_joules"] and usage["energy_kwh"] == block["energy_kwh"]
        assert completion.usage is not None and completion.usage.completion_tokens == 10  # the rest as it was
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=4, extra_headers={"Prefer": "energy=giul"})
        ours = raw.parse()
        assert ours.usage is not None
        assert (ours.usage.model_extra or {})["energy_joules"] == (ours.model_extra or {})["energy"]["joules"]


def _batches(
    seed: int, rounds: int, size: int, steps: int, idle_steps: int, watts: float,
) -> tuple[list[Energy], list[Energy]]:
    """``rounds`` batches of ``size`` alike requests of ``steps`` reads of 10 ms each, after
    ``idle_steps`` reads of idle, on the truth card (a counter stepping every 100 ms, its
    ramps; a virtual clock): each request's first figure and, once all settled, its settled one."""
    from truecard import TrueCard, TrueReader

    from giul_asgi import Meter
    from giul_asgi.ledger import Ledger
    from giul_asgi.readers.simulated import VirtualClock

    clock = VirtualClock()
    card = TrueCard(idle_w=70.0, clock=clock, seed=seed)
    reader = TrueReader(card)
    ledger = Ledger(Node("batches", idle_w=70.0), reader, poll=False)

    def read(n: int) -> None:
        for _ in range(n):
            clock.now += 0.01
            ledger.ingest(reader.read())

    firsts: list[Energy] = []
    meters: list[Meter] = []
    for _ in range(rounds):
        read(idle_steps)
        batch = []
        for _ in range(size):
            meter = Meter(ledger)
            meter.open()
            batch.append((meter, card.start_job(watts)))
        read(steps)
        for meter, job in batch:
            card.stop_job(job)
            meter.close()
            firsts.append(meter.figure())
            meters.append(meter)
    read(100)
    return firsts, [m.figure() for m in meters]


def test_a_first_figure_says_the_cards_draw_and_its_share_of_it_before_any_reading_covers_it() -> None:
    # Four requests at a time of 50 ms: most close before a reading reports their time. Their
    # first figures said the mean draw of the part reported, a ramp's start, or nothing: a
    # stranger's Neuralwatt client read 74 W and a share of 1 for three requests sharing a
    # 446 W card, and null for 7 requests in 20.
    firsts, settled = _batches(3, rounds=40, size=4, steps=5, idle_steps=0, watts=150.0)
    firsts, settled = firsts[8:], settled[8:]
    known = [e for e in firsts if e.joules is not None]
    assert len(known) >= 0.9 * len(firsts)
    assert all(e.mean_watts is not None for e in known)
    ratios = [json.loads(NEURALWATT.block(e))["attribution_ratio"] for e in known]
    assert 0.15 <= statistics.median(ratios) <= 0.45, ratios[:8]  # four alike: about a quarter
    against = [f.mean_watts / s.mean_watts for f, s in zip(firsts, settled, strict=True)
               if f.mean_watts and s.mean_watts]
    assert 0.6 <= statistics.median(against) <= 1.6, sorted(against)[::8]


def test_a_burst_from_idle_never_makes_a_first_figure_draw_more_than_the_card_did() -> None:
    # Twelve alike at once from idle, 120 ms each (a hostile trial's burst): a first figure's
    # unreported part priced at its charge times those in flight read 2,400-20,000 W on a
    # 700 W card. Bounded by what the card was read drawing, it stays within it.
    firsts, settled = _batches(5, rounds=4, size=12, steps=12, idle_steps=100, watts=40.0)
    most = max(e.mean_watts or 0.0 for e in settled)
    assert most > 70.0
    drawn = [e.mean_watts for e in firsts if e.mean_watts is not None]
    assert drawn and max(drawn) <= 1.1 * most, (max(drawn), most)
