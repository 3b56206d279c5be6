"""The agent reader against a real giul-agent (uvicorn on 127.0.0.1), killed and restarted."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_nvml import FakeGpu, FakeNvml
from fixtures.agent_server import running_agent
from server import free_port

from giul_asgi.agent import NvmlSource
from giul_asgi.errors import ConfigError, ReaderUnavailable
from giul_asgi.readers.agent import AgentReader, ClockAlignment
from giul_asgi.readers.base import Reader, ReaderSpec
from giul_asgi.readers.registry import READERS

FIXTURES = Path(__file__).parent / "fixtures"


def test_sums_the_nodes_gpus_and_places_readings_at_their_own_time() -> None:
    nvml = FakeNvml([FakeGpu(energy_mj=1_000), FakeGpu(energy_mj=2_500), FakeGpu(energy_mj=9_000)])
    with running_agent(reader=NvmlSource(nvml=nvml), cache_s=0.0) as url:
        reader = AgentReader(ReaderSpec(gpus=(0, 1), url=url))
        before = time.monotonic()
        reading = reader.read()
        after = time.monotonic()
        reader.close()
    assert isinstance(reader, Reader)
    described = (reader.kind, reader.backend, reader.source, reader.method)
    assert described == ("counter", "agent", "remote", "measured")
    assert reading.ok and reading.joules == pytest.approx(3.5)
    assert before - 0.05 <= reading.t <= after
    assert reader.url.endswith("/readings")


def test_a_skewed_agent_clock_is_translated_to_ours() -> None:
    skewed = lambda: time.monotonic() + 5000.0  # noqa: E731 - the agent host's own clock
    with running_agent(reader=NvmlSource(nvml=FakeNvml(), clock=skewed), clock=skewed, cache_s=0.0) as url:
        reader = AgentReader(ReaderSpec(url=url + "/"))
        readings = [reader.read() for _ in range(5)]
        reader.close()
    assert reader.alignment.offset == pytest.approx(5000.0, abs=0.05)
    for r in readings:
        assert r.ok and abs(r.t - time.monotonic()) < 5.0


def test_the_registry_builds_it_and_a_simulated_agent_reads_as_simulated() -> None:
    source = NvmlSource(nvml=FakeNvml())
    source.simulated = True
    with running_agent(reader=source) as url:
        reader = READERS["agent"](ReaderSpec(url=url))
        assert reader.read().ok
        reader.close()
    assert reader.method == "simulated"


def test_expect_simulated_labels_from_the_start_and_refuses_a_real_card() -> None:
    with running_agent(reader=NvmlSource(nvml=FakeNvml())) as url:
        reader = AgentReader(ReaderSpec(url=url, options={"expect_simulated": True}))
        assert reader.method == "simulated"
        reading = reader.read()
        reader.close()
    assert reading.error is not None and "expects a simulated one" in reading.error
    with pytest.raises(ConfigError, match="'expect_simulated' must be true or false"):
        AgentReader(ReaderSpec(url=url, options={"expect_simulated": "yes"}))


def test_power_where_the_agent_gives_no_counter() -> None:
    with running_agent(reader=NvmlSource(nvml=FakeNvml([FakeGpu(counter=False, power_mw=200_000)]))) as url:
        reader = AgentReader(ReaderSpec(url=url))
        reading = reader.read()
        forced = AgentReader(ReaderSpec(url=url, options={"kind": "counter"}))
        gap = forced.read()
        reader.close()
        forced.close()
    assert reader.kind == "power" and reading.watts == pytest.approx(200.0)
    assert gap.error is not None and "energy_j" in gap.error


def test_token() -> None:
    with running_agent(reader=NvmlSource(nvml=FakeNvml()), token="tok-0123456789abcdef") as url:
        with pytest.raises(ReaderUnavailable, match="refused our token"):
            AgentReader(ReaderSpec(url=url))
        with pytest.raises(ReaderUnavailable, match="refused our token"):
            AgentReader(ReaderSpec(url=url, token="nope"))
        reader = AgentReader(ReaderSpec(url=url, token="tok-0123456789abcdef"))
        assert reader.read().ok
        reader.close()


@pytest.mark.parametrize(
    ("spec", "match"),
    [(ReaderSpec(), "needs a url"), (ReaderSpec(url="ftp://x/"), "http"),
     (ReaderSpec(url="http://127.0.0.1:1", options={"timeout": 1}), "unknown option 'timeout'"),
     (ReaderSpec(url="http://127.0.0.1:1", options={"timeout_s": -1}), "'timeout_s' must be > 0"),
     (ReaderSpec(url="http://127.0.0.1:1", options={"kind": "joules"}), "'kind' must be one of")],
)
def test_bad_configuration_names_the_key(spec: ReaderSpec, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AgentReader(spec)


def test_missing_gpu_index_is_an_error_reading() -> None:
    with running_agent(reader=NvmlSource(nvml=FakeNvml())) as url:
        reader = AgentReader(ReaderSpec(gpus=(3,), url=url))
        reading = reader.read()
        reader.close()
    assert reading.error is not None and "no GPU 3" in reading.error


class _Fixed(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    handler = type("H", (_Fixed,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("body", "match"),
    [(b"<html>", "not JSON"), (b'{"schema": "other/9"}', "does not speak"),
     (b'{"schema": "giul-agent/1", "now": "soon"}', "no valid 'now'"),
     (b'{"schema": "giul-agent/1", "now": 1.0, "gpus": 3}', "no gpus list"),
     (b'{"schema": "giul-agent/1", "now": 1.0, "gpus": [{"index": 0, "t": 1.0, "energy_j": null,'
      b' "error": "GPU is lost"}]}', "GPU is lost")],
)
def test_malformed_answers_are_error_readings(body: bytes, match: str) -> None:
    with serving(body) as url:
        reader = AgentReader(ReaderSpec(url=url, options={"kind": "counter"}))
        reading = reader.read()
        reader.close()
    assert reading.error is not None and match in reading.error



def _start_agent(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, str(FIXTURES / "fake_agent.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                return proc
        if proc.poll() is not None:
            raise RuntimeError(f"the agent process exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the agent process did not start")


def test_a_killed_agent_gives_gaps_backs_off_and_is_read_again_when_it_returns() -> None:
    port = free_port()
    proc = _start_agent(port)
    spec = ReaderSpec(url=f"http://127.0.0.1:{port}",
                      options={"timeout_s": 0.5, "backoff_s": 0.2, "backoff_max_s": 0.4})
    reader = AgentReader(spec)
    try:
        first = reader.read()
        assert first.ok and first.joules is not None and first.joules >= 10_000
        proc.kill()
        proc.wait(10)
        dead = reader.read()
        assert dead.error is not None and not dead.ok
        attempts = reader._poller.attempts
        backing_off = reader.read()  # inside the back-off: answered at once, no network
        assert backing_off.error is not None and "backing off" in backing_off.error
        assert reader._poller.attempts == attempts

        proc = _start_agent(port)
        deadline = time.monotonic() + 10
        again = reader.read()
        while not again.ok and time.monotonic() < deadline:
            time.sleep(0.05)
            again = reader.read()
        assert again.ok and again.joules is not None and again.t > first.t
    finally:
        reader.close()
        proc.kill()
        proc.wait(10)


def test_an_agent_down_at_start_is_not_fatal() -> None:
    reader = AgentReader(ReaderSpec(url=f"http://127.0.0.1:{free_port()}", options={"timeout_s": 0.5}))
    assert any("not reachable" in n for n in reader.notes)
    assert reader.read().error is not None
    reader.close()


def test_clock_alignment_keeps_the_shortest_round_trip_and_restarts_on_a_jump() -> None:
    align = ClockAlignment()
    align.update(10.0, 10.2, 110.1)  # rtt 0.2, offset 100.0
    align.update(11.0, 11.02, 111.02)  # rtt 0.02, offset 100.01: better, kept
    assert align.offset == pytest.approx(100.01) and align.rtt == pytest.approx(0.02)
    align.update(12.0, 12.5, 112.5)  # slow round trip: ignored
    assert align.offset == pytest.approx(100.01)
    align.update(13.0, 13.3, 5.15)  # agent rebooted: its clock restarted near zero
    assert align.resets == 1 and align.offset == pytest.approx(5.15 - 13.15)
    assert align.to_ours(6.0) == pytest.approx(6.0 - align.offset)
