"""Carbon: a node's grid intensity (fixed, a file, a URL) and what every figure emits.

The polled sources are exercised against a real HTTP server on 127.0.0.1 (uvicorn in a
thread) that answers as Electricity Maps' ``carbon-intensity/latest`` documents it, or fails
(HTTP 500, 401, 429, a timeout, garbage, a response held open), and recovers. Waits are on
conditions with wide deadlines, never on durations: the feed's own clock is a fake one the
tests move, so ages, expiry and back-off are exact.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from server import serve

from giul_asgi import EnergyMiddleware, Ledgers, Node, Tier
from giul_asgi.carbon import (
    MAX_G_PER_KWH,
    TOKEN_ENV,
    CarbonFeed,
    SourceError,
    UrlSource,
    parse,
    shown,
    token_for,
)
from giul_asgi.config import load_config
from giul_asgi.energy import Carbon, Energy
from giul_asgi.errors import ConfigError
from giul_asgi.exporters.otel import energy_attributes, otel_recorder
from giul_asgi.exporters.prometheus import EnergyCollector, prometheus_text
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.stats import EnergyStats

WAIT_S = 30.0  # a deadline for a condition, not a duration anything should take


class Wall:
    """A wall clock the test moves."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Provider:
    """A fake intensity provider: ``mode`` says how it answers the next requests."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.mode = "electricitymaps"
        self.g: Any = 302
        self.stamp = "2026-12-01T17:00:00.000Z"
        self.seen: list[dict[bytes, bytes]] = []
        self.release = threading.Event()
        self.held = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        self.seen.append(dict(scope["headers"]))
        mode, status, headers = self.mode, 200, [(b"content-type", b"application/json")]
        if mode == "hold":  # a response held open until the test releases it
            self.held.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            mode = "electricitymaps"
        if mode == "electricitymaps":  # the documented example, with our figure and time
            body = json.dumps({
                "zone": "DE", "carbonIntensity": self.g, "datetime": self.stamp,
                "updatedAt": self.stamp, "emissionFactorType": "lifecycle",
                "isEstimated": True, "estimationMethod": "TIME_SLICER_AVERAGE",
            }).encode()
        elif mode == "plain":
            body = json.dumps({"g_per_kwh": self.g, "signal": "marginal"}).encode()
        elif mode == "garbage":
            body, headers = b"<html>upstream proxy error</html>", [(b"content-type", b"text/html")]
        elif mode == "429":
            status, body, headers = 429, b'{"error":"rate"}', [*headers, (b"retry-after", b"120")]
        else:
            status, body = int(mode), b'{"error":"failed"}'
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def provider_server() -> Iterator[tuple[Provider, str]]:
    provider = Provider()
    with serve(provider) as url:
        yield provider, url
        provider.release.set()


@pytest.fixture
def provider(provider_server: tuple[Provider, str]) -> Iterator[tuple[Provider, str]]:
    p, url = provider_server
    p.reset()
    yield p, url + "/v3/carbon-intensity/latest?zone=DE"
    p.release.set()


def poll(feed: CarbonFeed) -> Carbon:
    """Start the poll that is due, wait for its answer, take it."""
    feed.tick()
    assert feed.wait(WAIT_S)
    return feed.tick()


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.01)


def grams(joules: float, pue: float, g: float) -> float:
    return joules * pue * g / 3.6e6


# -- configuration: every bad value fails once, at build, with a remedy ---------------------

@pytest.mark.parametrize(("keys", "says"), [
    ({"carbon_g_per_kwh": -1}, "carbon_g_per_kwh must be 0 to"),
    ({"carbon_g_per_kwh": math.nan}, "must be finite"),
    ({"carbon_g_per_kwh": math.inf}, "must be finite"),
    ({"carbon_g_per_kwh": "400"}, "must be a number"),
    ({"carbon_g_per_kwh": True}, "must be a number"),
    ({"carbon_g_per_kwh": 412_000}, "carbon_g_per_kwh must be 0 to"),  # g/MWh by mistake
    ({"carbon_g_per_kwh": 400, "pue": 0.9}, "pue must be 1 to"),
    ({"carbon_g_per_kwh": 400, "pue": 12}, "pue must be 1 to"),
    ({"carbon_g_per_kwh": 400, "pue": math.nan}, "must be finite"),
    ({"pue": 0.5}, "pue must be 1 to"),  # a PUE alone scales the joules: checked the same
    ({"carbon_g_per_kwh": 400, "carbon": "http://x/y"}, "not both"),
    ({"carbon": "ftp://host/carbon.json"}, "must be http(s)"),
    ({"carbon": "file:///run/carbon.json"}, "must be http(s)"),
    ({"carbon": "https://"}, "must be http(s)"),
    ({"carbon": ""}, "must be a URL or a file path"),
    ({"carbon": 42}, "must be a URL or a file path"),
    ({"carbon": "/no/such/directory/carbon.json"}, "its directory does not exist"),
    ({"carbon": "http://x/y", "carbon_token": ""}, "carbon_token must be a non-empty string"),
    ({"carbon_g_per_kwh": 400, "carbon_token": "t"}, "there is none"),
    ({"carbon": "carbon.json", "carbon_token": "t"}, "there is none"),
    ({"carbon": "http://x/y", "carbon_every_s": 0}, "carbon_every_s must be > 0"),
    ({"carbon": "http://x/y", "carbon_every_s": -5}, "carbon_every_s must be > 0"),
    ({"carbon": "http://x/y", "carbon_max_age_s": "6h"}, "must be a number"),
    ({"carbon": "http://x/y", "carbon_every_s": 600, "carbon_max_age_s": 60}, "shorter than"),
    ({"reader": "none", "carbon": "http://x/y"}, "reader='none' runs none"),
])
def test_bad_carbon_settings_fail_at_build(keys: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Node("gpu", **{"reader": "auto", **keys})
    assert says in str(caught.value)
    if "must be a number" not in says and "must be finite" not in says:  # the shared checks'
        assert caught.value.remedy


def test_good_carbon_settings_build_and_load_from_toml(tmp_path: Path) -> None:
    node = Node("gpu", reader="none", carbon_g_per_kwh=0, pue=1.2)  # a stated 0 is a figure
    assert node.carbon_g_per_kwh == 0.0 and node.pue == 1.2
    # a file that a job writes after startup is fine; its directory must exist
    later = Node("gpu", carbon=str(tmp_path / "later.json"))
    assert later.carbon == str(tmp_path / "later.json")
    assert Node("gpu", carbon=tmp_path / "p.json").carbon == str(tmp_path / "p.json")  # type: ignore[arg-type]
    assert "secret" not in repr(Node("gpu", carbon="https://h/x", carbon_token="secret"))
    toml = tmp_path / "giul.toml"
    toml.write_text(
        '[[node]]\nname = "a"\ncarbon = "https://api.electricitymap.org/v3/'
        'carbon-intensity/latest?zone=DE"\npue = 1.3\ncarbon_every_s = 600\n'
        '[[node]]\nname = "b"\nreader = "none"\ncarbon_g_per_kwh = 55\n')
    a, b = load_config(toml).nodes
    assert (a.pue, a.carbon_every_s, a.carbon_max_age_s) == (1.3, 600.0, 21600.0)
    assert b.carbon_g_per_kwh == 55.0 and b.pue is None
    toml.write_text('[[node]]\nname = "a"\nreader = "none"\npue = 0.5\ncarbon_g_per_kwh = 1\n')
    with pytest.raises(ConfigError, match="pue must be 1 to"):
        load_config(toml)


# -- reading answers ------------------------------------------------------------------------

def test_electricitymaps_answer_is_an_average_signal_as_of_its_datetime() -> None:
    body = json.dumps({"zone": "DE", "carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z",
                       "updatedAt": "2022-04-07T15:32:21.002Z", "emissionFactorType": "lifecycle",
                       "isEstimated": False}).encode()
    got = parse(body, where="em", default_source="url", default_as_of=0.0)
    assert (got.g_per_kwh, got.signal, got.source, got.zone, got.estimated) == (
        302.0, "average", "electricitymaps", "DE", False)
    assert got.as_of == datetime(2019, 5, 21, tzinfo=UTC).timestamp()


def test_plain_answers_say_their_signal_or_nothing() -> None:
    got = parse(b'{"g_per_kwh": 412.5, "signal": "marginal"}', where="f", default_source="file",
                default_as_of=123.0)
    assert (got.g_per_kwh, got.signal, got.source, got.as_of) == (412.5, "marginal", "file", 123.0)
    got = parse(b'{"g_per_kwh": 80, "datetime": "2026-12-01T10:00:00"}', where="u",
                default_source="url", default_as_of=0.0)
    assert got.signal is None and got.as_of == datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("body", "says"), [
    (b"<html>oops</html>", "did not answer JSON"),
    (b"\xff\xfe", "did not answer JSON"),
    (b"[302]", "not an object"),
    (b'{"intensity": 302}', "without carbonIntensity or g_per_kwh"),
    (b'{"carbonIntensity": null}', "not a number"),
    (b'{"carbonIntensity": "302"}', "not a number"),
    (b'{"g_per_kwh": true}', "not a number"),
    (b'{"g_per_kwh": -3}', "not an intensity"),
    (b'{"g_per_kwh": 1e9}', "not an intensity"),
    (b'{"g_per_kwh": NaN}', "not an intensity"),
    (b'{"g_per_kwh": 300, "signal": "hourly"}', "neither 'average' nor 'marginal'"),
    (b'{"g_per_kwh": 300, "datetime": "yesterday"}', "not ISO 8601"),
])
def test_bad_answers_are_failed_polls_with_a_remedy(body: bytes, says: str) -> None:
    with pytest.raises(SourceError) as caught:
        parse(body, where="src", default_source="url", default_as_of=0.0)
    assert says in caught.value.message and caught.value.remedy


def test_the_environment_token_goes_to_electricity_maps_only() -> None:
    env = {TOKEN_ENV: "from-env"}
    em = "https://api.electricitymap.org/v3/carbon-intensity/latest?zone=DE"
    assert token_for(em, None, env) == "from-env"
    assert token_for("https://api-access.electricitymaps.com/free-tier/x", None, env) == "from-env"
    assert token_for("http://127.0.0.1:9/latest", None, env) is None
    assert token_for("https://electricitymap.org.evil.example/x", None, env) is None
    assert token_for("http://127.0.0.1:9/latest", "mine", env) == "mine"
    assert shown("https://h/x?zone=DE&auth-token=abc") == "https://h/x?zone=DE&auth-token=%2A%2A%2A"


# -- a provider that works, fails, recovers -------------------------------------------------

def test_a_provider_answer_becomes_the_current_intensity_with_its_age(
        provider: tuple[Provider, str]) -> None:
    p, url = provider
    wall = Wall()
    p.stamp = iso(wall.t - 600)
    feed = CarbonFeed(url, pue=1.25, token="tok-123", every_s=300, node="gpu", clock=wall)
    try:
        assert feed.current.g_per_kwh is None and feed.current.source == "url"  # not read yet
        assert feed.status()["state"] == "starting" and "not read yet" in feed.status()["reason"]
        carbon = poll(feed)
        assert (carbon.g_per_kwh, carbon.pue, carbon.source, carbon.signal) == (
            302.0, 1.25, "electricitymaps", "average")
        assert carbon.age_s == pytest.approx(600.0)
        assert p.seen[-1][b"auth-token"] == b"tok-123"
        status = feed.status()
        assert status["state"] == "ok" and status["zone"] == "DE" and status["reason"] is None
        assert status["next_poll_in_s"] == pytest.approx(300.0)
        wall.t += 60  # no poll due: the value only ages
        assert feed.tick().age_s == pytest.approx(660.0) and len(p.seen) == 1
        joules = 123.4
        assert carbon.grams(joules) == pytest.approx(grams(joules, 1.25, 302.0), rel=1e-12)
    finally:
        feed.close()


@pytest.mark.parametrize("failure", ["500", "garbage", "401", "timeout"])
def test_a_failing_provider_keeps_the_last_value_labelled_then_expires_then_recovers(
        provider: tuple[Provider, str], failure: str, caplog: pytest.LogCaptureFixture) -> None:
    p, url = provider
    wall = Wall()
    p.stamp = iso(wall.t)
    feed = CarbonFeed(url, every_s=300, max_age_s=3600, timeout_s=WAIT_S, node="gpu", clock=wall)
    caplog.set_level(logging.INFO, logger="giul_asgi.carbon")
    try:
        assert poll(feed).g_per_kwh == 302.0
        p.mode = "hold" if failure == "timeout" else failure
        if failure == "timeout":  # a short timeout for the held answers only
            feed.source.close()
            feed.source = UrlSource(url, token=None, timeout_s=0.3, clock=wall)
        wall.t += 300
        carbon = poll(feed)
        status = feed.status()
        # the last known value, labelled with its age, and the failure said
        assert carbon.g_per_kwh == 302.0 and carbon.age_s == pytest.approx(300.0)
        assert status["state"] == "stale" and status["errors"] == 1
        expected = {"500": "HTTP 500", "garbage": "did not answer JSON", "401": "HTTP 401",
                    "timeout": "did not answer within 0.3 s"}[failure]
        assert expected in status["last_error"] and status["remedy"]
        if failure == "401":
            assert TOKEN_ENV in status["remedy"]
        assert sum("is failing" in r.message for r in caplog.records) == 1
        # past carbon_max_age_s: unknown, never the old value nor 0, and why
        while wall.t < 1_800_000_000.0 + 3600:
            wall.t += 600
            poll(feed)
        carbon = feed.tick()
        assert carbon.g_per_kwh is None and carbon.source == "electricitymaps"
        assert carbon.grams(500.0) is None and carbon.age_s is not None and carbon.age_s > 3600
        status = feed.status()
        assert status["state"] == "expired" and status["last_g_per_kwh"] == 302.0
        assert "past carbon_max_age_s" in status["reason"] and expected in status["reason"]
        assert sum("carbon figures are unknown" in r.message for r in caplog.records) == 1
        # the provider recovers: a fresh value, the failure forgotten
        feed.source.close()
        feed.source = UrlSource(url, token=None, timeout_s=WAIT_S, clock=wall)
        p.release.set()
        p.mode, p.g, p.stamp = "electricitymaps", 250, iso(wall.t)
        wall.t += 1200  # past any back-off
        carbon = poll(feed)
        assert carbon.g_per_kwh == 250.0 and carbon.age_s == pytest.approx(1200.0)
        assert feed.status()["state"] == "ok" and feed.status()["last_error"] is None
    finally:
        p.release.set()
        feed.wait(WAIT_S)
        feed.close()


def test_failures_back_off_doubling_and_a_retry_after_is_respected(
        provider: tuple[Provider, str]) -> None:
    p, url = provider
    wall = Wall()
    feed = CarbonFeed(url, every_s=300, clock=wall)
    try:
        p.mode = "500"
        delays = []
        for _ in range(9):
            poll(feed)
            delay = feed.status()["next_poll_in_s"]
            delays.append(delay)
            hits = len(p.seen)
            wall.t += delay / 2
            feed.tick()  # not due yet: nothing is fetched
            assert feed.wait(WAIT_S) and len(p.seen) == hits
            wall.t += delay / 2
        assert delays == [10, 20, 40, 80, 160, 320, 640, 1200, 1200]
        assert feed.status()["state"] == "failing" and feed.current.g_per_kwh is None
        p.mode = "429"
        poll(feed)
        assert feed.status()["next_poll_in_s"] == 1200 and "poll less often" in feed.status()["remedy"]
        p.mode, p.stamp = "electricitymaps", iso(wall.t)
        wall.t += 1200
        assert poll(feed).g_per_kwh == 302.0
        assert feed.status()["next_poll_in_s"] == 300
    finally:
        feed.close()


def test_a_slow_provider_never_holds_the_reader_thread(provider: tuple[Provider, str]) -> None:
    """The tick that starts a poll returns at once, and so does every tick while the
    provider holds its answer: the last value is served meanwhile."""
    p, url = provider
    wall = Wall()
    p.stamp = iso(wall.t)
    feed = CarbonFeed(url, every_s=300, timeout_s=WAIT_S, clock=wall)
    try:
        assert poll(feed).g_per_kwh == 302.0
        p.mode, p.g = "hold", 111
        wall.t += 300
        feed.tick()
        assert p.held.wait(WAIT_S)  # the provider holds the answer now
        for _ in range(5):
            assert feed.tick().g_per_kwh == 302.0  # returns, with the last value
        assert not feed.wait(0)  # still in flight, and said
        assert feed.status()["poll_in_flight_s"] == 0.0 and feed.status()["next_poll_in_s"] is None
        wall.t += 7
        assert feed.status()["poll_in_flight_s"] == 7.0
        p.release.set()
        assert feed.wait(WAIT_S)
        assert feed.tick().g_per_kwh == 111.0
    finally:
        p.release.set()
        feed.close()


def test_a_plain_url_source(provider: tuple[Provider, str]) -> None:
    p, url = provider
    p.mode, p.g = "plain", 45
    wall = Wall()
    feed = CarbonFeed(url, every_s=60, clock=wall)
    try:
        carbon = poll(feed)
        # no datetime in the answer: it is as old as the answer
        assert (carbon.g_per_kwh, carbon.source, carbon.signal, carbon.age_s) == (
            45.0, "url", "marginal", 0.0)
        assert b"auth-token" not in p.seen[-1]  # no token given, none sent
    finally:
        feed.close()


def test_an_unreachable_provider_is_a_failed_poll() -> None:
    wall = Wall()
    feed = CarbonFeed("http://127.0.0.1:9/latest", every_s=60, timeout_s=5, clock=wall)
    try:
        assert poll(feed).g_per_kwh is None
        status = feed.status()
        assert status["state"] == "failing" and "ConnectError" in status["last_error"]
        assert status["remedy"] and "no value yet" in status["reason"]
    finally:
        feed.close()


# -- a file on disk -------------------------------------------------------------------------

def test_a_file_source_follows_the_file_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "carbon.json"
    wall = Wall()
    feed = CarbonFeed(str(path), pue=1.1, every_s=60, max_age_s=3600, clock=wall)
    try:
        assert poll(feed).g_per_kwh is None  # not written yet: unknown, and said
        assert feed.status()["state"] == "failing" and "does not exist" in feed.status()["last_error"]
        path.write_text('{"g_per_kwh": 410, "signal": "average"}')
        os.utime(path, (wall.t - 30, wall.t - 30))
        wall.t += 60
        carbon = poll(feed)
        assert (carbon.g_per_kwh, carbon.source, carbon.signal) == (410.0, "file", "average")
        assert carbon.age_s == pytest.approx(90.0)  # its modification time is its time
        path.write_text('{"g_per_kwh": 95.5, "signal": "marginal"}')  # changed on disk
        os.utime(path, (wall.t, wall.t))
        wall.t += 60
        carbon = poll(feed)
        assert (carbon.g_per_kwh, carbon.signal, carbon.age_s) == (95.5, "marginal", pytest.approx(60.0))
        path.write_text("{truncated")  # a writer caught mid-write: the last value stays
        wall.t += 60
        assert poll(feed).g_per_kwh == 95.5 and feed.status()["state"] == "stale"
        path.unlink()
        wall.t += 3600  # the last value passes its age: unknown
        assert poll(feed).g_per_kwh is None and feed.status()["state"] == "expired"
    finally:
        feed.close()


# -- answers dated in the future, and providers that dribble (issue 20 item 7) -------------

def test_an_answer_a_little_ahead_of_our_clock_ages_from_when_it_came(
        provider: tuple[Provider, str], caplog: pytest.LogCaptureFixture) -> None:
    p, url = provider
    wall = Wall()
    p.stamp = iso(wall.t + 600)  # the provider's clock is 10 min ahead of ours
    feed = CarbonFeed(url, every_s=300, max_age_s=3600, clock=wall)
    caplog.set_level(logging.INFO, logger="giul_asgi.carbon")
    try:
        carbon = poll(feed)
        assert carbon.g_per_kwh == 302.0 and carbon.age_s == 0.0
        assert feed.status()["ahead_s"] == pytest.approx(600.0)
        assert any("ahead of this host's clock" in r.getMessage() for r in caplog.records)
        p.mode = "500"  # the provider fails from now on: the value must age out all the same
        wall.t += 1800
        assert poll(feed).age_s == pytest.approx(1800.0)  # not 1200: it ages from when it came
        while wall.t < 1_800_000_000.0 + 3600 + 1:
            wall.t += 600
            poll(feed)
        assert feed.tick().g_per_kwh is None and feed.status()["state"] == "expired"
    finally:
        feed.close()


def test_an_answer_dated_far_in_the_future_is_bad_data_and_said(
        provider: tuple[Provider, str], tmp_path: Path) -> None:
    p, url = provider
    wall = Wall()
    p.stamp = "2100-01-01T00:00:00Z"  # would be fresh for 73 years
    feed = CarbonFeed(url, every_s=300, clock=wall)
    try:
        assert poll(feed).g_per_kwh is None
        status = feed.status()
        assert status["state"] == "failing" and "ahead of this host's clock: bad data" in status["last_error"]
        assert "2100-01-01T00:00:00+00:00" in status["last_error"] and "timedatectl" in status["remedy"]
        p.stamp = iso(wall.t - 60)
        wall.t += 1200  # the next poll, past the back-off: a sane answer is taken
        assert poll(feed).g_per_kwh == 302.0 and feed.status()["ahead_s"] is None
    finally:
        feed.close()
    path = tmp_path / "carbon.json"  # a file whose modification time is far ahead
    path.write_text('{"g_per_kwh": 410}')
    os.utime(path, (wall.t + 86_400, wall.t + 86_400))
    from_file = CarbonFeed(str(path), every_s=60, clock=wall)
    try:
        assert poll(from_file).g_per_kwh is None
        assert "24 h ahead of this host's clock" in from_file.status()["last_error"]
    finally:
        from_file.close()


class Dribbler:
    """A provider that sends its status line, then its headers a byte every 50 ms, for
    ``DRIBBLE_S``: each read gets a byte, so no per-read timeout ever fires."""

    DRIBBLE_S = 15.0

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/latest"
        self.left = threading.Event()  # the client closed the connection while we dribbled
        self.finished = threading.Event()  # we dribbled all the headers
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        self.sock.settimeout(WAIT_S)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-slow: ")
                end = time.monotonic() + self.DRIBBLE_S
                while time.monotonic() < end and not self.stop.is_set():
                    conn.sendall(b"a")
                    time.sleep(0.05)
                body = b'{"g_per_kwh": 1}'
                conn.sendall(b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                self.finished.set()
            except OSError:
                self.left.set()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(WAIT_S)


def test_slow_headers_count_against_the_fetchs_budget() -> None:
    slow = Dribbler()
    try:
        source = UrlSource(slow.url, token=None, timeout_s=1.0, clock=Wall())
        with pytest.raises(SourceError, match="did not answer within 1 s"):
            source.fetch()
        assert not slow.finished.is_set()  # it gave up while the headers still came
        assert slow.left.wait(WAIT_S)  # and left: the connection is closed, not kept
    finally:
        slow.close()


# -- through the ledger and the meter: the record's numbers ---------------------------------

def test_a_static_intensity_grades_every_figure(ledgers: Ledgers) -> None:
    node = Node("dark", reader="none", carbon_g_per_kwh=420.0, pue=1.3)
    meter = Meter.for_node(node, Tier("8b", 300.0), ledgers=ledgers)
    meter.open()
    meter.mark("prefill")
    meter.close()
    energy = meter.figure(tokens=40)  # estimated from the hint: 12 J at the card, x the PUE
    assert energy.joules == pytest.approx(12.0 * 1.3) and energy.method == "estimated"
    assert energy.carbon_grams == pytest.approx(grams(12.0, 1.3, 420.0), rel=1e-12)
    assert (energy.carbon_g_per_kwh, energy.pue, energy.carbon_source, energy.carbon_signal,
            energy.carbon_age_s) == (420.0, 1.3, "static", None, None)
    assert energy.stages["prefill"].carbon_source == "static"
    assert ledgers.get(node).carbon_health["state"] == "static"
    # unknown joules: unknown grams, never 0, while the intensity is still said
    bare = Meter.for_node(node, ledgers=ledgers)
    bare.open()
    bare.close()
    unknown = bare.figure()
    assert unknown.joules is None and unknown.carbon_grams is None
    assert unknown.carbon_g_per_kwh == 420.0
    # a node without carbon says nothing about it
    plain = Meter.for_node(Node("plain", reader="none"), Tier("8b", 300.0), ledgers=ledgers)
    plain.open()
    plain.close()
    assert plain.figure(tokens=5).carbon_source is None


def test_the_reader_thread_polls_a_slow_provider_and_keeps_reading_the_card(
        provider: tuple[Provider, str]) -> None:
    """A simulated card read by its node's thread, a provider that holds its first answer:
    the card's reads go on without a failure, and once the answer comes every settled
    figure carries grams = joules x g/kWh / 3.6e6 (the joules include the node's PUE)."""
    p, url = provider
    p.mode, p.g, p.stamp = "hold", 380, iso(time.time())
    node = Node("sim", reader="simulated", idle_w=50.0, carbon=url, pue=1.4, carbon_every_s=0.2,
                workers_dir=False)
    ledger = Ledger(node)
    try:
        ledger.ensure_started()
        assert p.held.wait(WAIT_S)
        health = ledger.health
        assert health is not None
        until(lambda: health.reads > 0, "a first reading")
        reads = health.reads
        until(lambda: health.reads >= reads + 10, "10 more readings while the provider holds")
        assert health.errors == 0 and health.state == "ok"
        # no value yet (the poll is held, or timed out on a very slow machine): unknown
        assert ledger.carbon is not None and ledger.carbon.g_per_kwh is None
        p.release.set()
        until(lambda: ledger.carbon is not None and ledger.carbon.g_per_kwh == 380.0,
              "the held answer taken")
        meter = Meter(ledger, Tier("8b"))
        meter.open()
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            time.sleep(0.01)
        meter.close()
        energy = anyio.run(meter.settled, WAIT_S)
        assert energy.settled and energy.joules is not None and energy.method == "simulated"
        assert energy.carbon_grams == pytest.approx(grams(energy.joules, 1.0, 380.0), rel=1e-12)
        assert (energy.carbon_source, energy.carbon_signal, energy.pue) == ("electricitymaps", "average", 1.4)
        assert energy.carbon_age_s is not None and energy.carbon_age_s >= 0
        assert ledger.carbon_health["state"] == "ok"
    finally:
        p.release.set()
        ledger.stop(WAIT_S)


# -- where operators look: header, JSON, /energy, Prometheus, OpenTelemetry -----------------

BODY = json.dumps({"usage": {"completion_tokens": 10}}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})


@pytest.mark.anyio
async def test_carbon_goes_out_in_the_header_the_block_the_statistics_and_the_exporters(
        tmp_path: Path) -> None:
    green = Node("green", reader="none", carbon_g_per_kwh=400.0, pue=1.2)
    dark = Node("dark", reader="simulated", carbon=str(tmp_path / "never-written.json"),
                workers_dir=False)
    stats = EnergyStats()
    mw = EnergyMiddleware(app, nodes=[green, dark], tiers=[Tier("8b", 300.0)], ledgers=Ledgers(),
                          stats=stats, metrics_path="/metrics",
                          decide=lambda scope: ("dark" if scope["path"] == "/dark" else "green", None))
    transport = httpx.ASGITransport(app=mw, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        for _ in range(3):
            r = await client.post("/v1/chat")
        expected = grams(3.0, 1.2, 400.0)  # 10 tokens x 300 J/1k
        assert float(r.headers["x-energy-carbon-grams"]) == pytest.approx(expected, rel=1e-6)
        block = r.json()["energy"]
        assert block["carbon_grams"] == pytest.approx(expected, rel=1e-8)
        assert (block["carbon_g_per_kwh"], block["pue"], block["carbon_source"]) == (400.0, 1.2, "static")
        r = await client.post("/dark")  # intensity unknown: unknown, never 0
        assert r.headers["x-energy-carbon-grams"] == "unknown"
        assert r.json()["energy"]["carbon_grams"] is None
        assert r.json()["energy"]["carbon_source"] == "file"
        data = (await client.get("/energy", params={"window": "all"})).json()
        metrics = (await client.get("/metrics")).text
    assert data["schema"] == "giul-asgi/energy/3"
    assert data["nodes"]["green"]["carbon"] == {"known": 3, "grams": pytest.approx(3 * expected, rel=1e-6),
                                               "mean": pytest.approx(expected, rel=1e-6)}
    assert data["nodes"]["dark"]["carbon"] == {"known": 0, "grams": None, "mean": None}
    assert data["totals"]["carbon"]["known"] == 3
    assert data["tiers"]["8b"]["carbon"]["grams"] == pytest.approx(3 * expected, rel=1e-6)
    (route,) = [k for k, v in data["routes"].items() if v["carbon"]["known"]]
    assert data["nodes"]["green"]["ledger"]["carbon"]["state"] == "static"
    dark_carbon = data["nodes"]["dark"]["ledger"]["carbon"]
    assert dark_carbon["g_per_kwh"] is None and dark_carbon["source"] == "file"
    assert dark_carbon["reason"] and dark_carbon["state"] in ("starting", "failing")
    await mw.ledgers.aclose()
    lines = [line for line in metrics.splitlines() if line.startswith("giul_carbon_grams_total{")]
    assert len(lines) == 1 and 'node="green"' in lines[0] and f'route="{route}"' in lines[0]
    assert float(lines[0].rsplit(" ", 1)[1]) == pytest.approx(3 * expected, rel=1e-6)


def test_opentelemetry_carries_carbon_where_known_and_nothing_where_not() -> None:
    known = Energy(3.0, "measured", carbon_grams=0.0004, carbon_g_per_kwh=400.0, pue=1.2,
                   carbon_source="static")
    attrs = energy_attributes(known)
    assert attrs["giul.energy.carbon_grams"] == 0.0004
    assert attrs["giul.energy.carbon_g_per_kwh"] == 400.0
    assert attrs["giul.energy.carbon_source"] == "static"
    unknown = energy_attributes(Energy(3.0, "measured", carbon_source="url"))
    assert "giul.energy.carbon_grams" not in unknown and "giul.energy.carbon_g_per_kwh" not in unknown
    assert "giul.energy.carbon_grams" not in energy_attributes(Energy(3.0, "measured"))
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = otel_recorder()
    with tracer.get_tracer("t").start_as_current_span("s"):
        recorder.annotate(recorder.current_span(), known)
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {})["giul.energy.carbon_grams"] == 0.0004


def test_statistics_sum_grams_where_known_and_prometheus_counts_them() -> None:
    stats = EnergyStats()
    for i in range(10):
        carbon = None if i % 3 == 0 else 0.001 * i
        stats.record(Energy(1.0 + i, "measured", node="n", tier="t", route="/r", carbon_grams=carbon),
                     outcome="ok", status=200)
    stats.record(Energy(None, "unknown", node="n", tier="t", route="/r"), outcome="ok", status=200)
    exact = sum(0.001 * i for i in range(10) if i % 3)
    snap = stats.snapshot("all")
    assert snap["totals"]["carbon"]["known"] == 6
    assert snap["totals"]["carbon"]["grams"] == pytest.approx(exact, rel=1e-9)
    ((labels, total),) = stats.carbon_counters().items()  # one label set: the same labels
    assert labels[:4] == ("/r", "n", "t", "measured") and total == pytest.approx(exact, rel=1e-12)
    merged = EnergyStats()
    merged.merge_state(stats.state())
    merged.merge_state(stats.state())  # another worker with the same figures
    assert merged.snapshot("all")["totals"]["carbon"]["grams"] == pytest.approx(2 * exact, rel=1e-9)
    text = prometheus_text(EnergyCollector(stats)).decode()
    assert "# TYPE giul_carbon_grams_total counter" in text
    (line,) = [line for line in text.splitlines() if line.startswith("giul_carbon_grams_total")]
    assert 'method="measured",node="n",route="/r"' in line and 'tier="t"' in line
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(exact, rel=1e-12)
    # the same labels as the energy counter
    (energy_line,) = [x for x in text.splitlines()
                      if x.startswith("giul_energy_joules_total") and 'method="measured"' in x]
    assert energy_line.split("}")[0] == line.split("}")[0].replace("giul_carbon_grams", "giul_energy_joules")


def test_intensity_bound_is_the_same_for_settings_and_sources() -> None:
    Node("ok", reader="none", carbon_g_per_kwh=MAX_G_PER_KWH)
    with pytest.raises(SourceError):
        parse(json.dumps({"g_per_kwh": MAX_G_PER_KWH * 1.01}).encode(), where="x",
              default_source="url", default_as_of=0.0)


def test_a_polled_source_that_no_reader_thread_polls_says_so(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{"g_per_kwh": 300}')
    ledger = Ledger(Node("cold", reader="simulated", carbon=str(tmp_path / "c.json"), workers_dir=False))
    health = ledger.carbon_health
    assert health is not None and health["g_per_kwh"] is None and "not polled" in health["reason"]
    assert ledger.carbon is not None and ledger.carbon.grams(10.0) is None
    assert Ledger(Node("none", reader="none")).carbon_health is None
