"""giul-agent served by real uvicorn on 127.0.0.1, read with real httpx and prometheus' parser."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml
from fixtures.agent_server import running_agent
from prometheus_client.parser import text_string_to_metric_families

from giul_asgi.agent import SCHEMA, NvmlSource, build_server, main
from giul_asgi.errors import ConfigError, ReaderUnavailable


class CountingSource:
    """A source that counts its reads and can be made slow or stuck."""

    simulated = False

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.reads = 0
        self.release = threading.Event()
        self.release.set()

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return (0,)

    def read_gpus(self) -> list[dict[str, Any]]:
        self.reads += 1
        self.release.wait(30)
        time.sleep(self.delay_s)
        return [{"index": 0, "uuid": "GPU-x", "name": "x", "t": time.monotonic(),
                 "energy_j": float(self.reads), "power_w": 100.0, "mig": False, "error": None}]

    def close(self) -> None:
        pass


def test_readings_follow_the_schema() -> None:
    gpus = [FakeGpu(energy_mj=1_234_567, power_mw=250_500), FakeGpu(counter=False, mig=True, uuid="GPU-b")]
    with running_agent(reader=NvmlSource(nvml=FakeNvml(gpus)), cache_s=0.0) as url:
        before = time.monotonic()
        body = httpx.get(f"{url}/readings").json()
        after = time.monotonic()
    assert body["schema"] == SCHEMA and body["simulated"] is False and isinstance(body["host"], str)
    assert before <= body["now"] <= after  # same host, same monotonic clock
    first, second = body["gpus"]
    assert first["uuid"].startswith("GPU-fake-0000")
    assert first == {"index": 0, "uuid": first["uuid"], "name": "NVIDIA H100 80GB HBM3",
                     "t": first["t"], "energy_j": 1234.567, "power_w": 250.5, "mig": False, "error": None}
    assert second["energy_j"] is None and second["power_w"] == 100.0 and second["mig"] is True
    assert second["uuid"] == "GPU-b"


def test_a_failing_gpu_is_an_error_in_its_record_not_a_failed_answer() -> None:
    gpu = FakeGpu(energy_mj=5)
    with running_agent(reader=NvmlSource(nvml=FakeNvml([gpu])), cache_s=0.0) as url:
        gpu.fail = NVML_ERROR_GPU_IS_LOST
        record = httpx.get(f"{url}/readings").json()["gpus"][0]
        health = httpx.get(f"{url}/healthz")
    assert record["energy_j"] is None and "GPU is lost" in record["error"]
    assert health.status_code == 503 and health.json() == {"ok": False, "gpus": 1}


def test_token_is_required_where_set_and_healthz_stays_open() -> None:
    with running_agent(reader=CountingSource(), token="s3cret-0123456789") as url:
        assert httpx.get(f"{url}/readings").status_code == 401
        assert httpx.get(f"{url}/readings", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "s3cret-0123456789"}).status_code == 401
        ok = httpx.get(f"{url}/readings", headers={"Authorization": "Bearer s3cret-0123456789"})
        assert ok.status_code == 200 and ok.json()["gpus"][0]["energy_j"] >= 1
        assert httpx.get(f"{url}/healthz").json() == {"ok": True, "gpus": 1}


def test_read_only_no_bodies_no_unknown_paths() -> None:
    with running_agent(reader=CountingSource()) as url:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            response = httpx.request(method, f"{url}/readings")
            assert response.status_code == 405 and "GET" in response.headers["allow"]
        assert httpx.request("GET", f"{url}/readings", content=b"x" * 10).status_code == 413
        assert httpx.get(f"{url}/admin").status_code == 404
        assert httpx.head(f"{url}/readings").status_code == 200


def test_concurrent_callers_share_one_card_read() -> None:
    source = CountingSource(delay_s=0.2)
    with running_agent(reader=source, cache_s=1.0) as url, httpx.Client() as client, \
            ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(lambda _: client.get(f"{url}/readings").json(), range(16)))
    assert source.reads == 1
    assert {b["gpus"][0]["energy_j"] for b in bodies} == {1.0}


def test_a_new_read_after_the_cache_period() -> None:
    source = CountingSource()
    with running_agent(reader=source, cache_s=0.0) as url:
        values = [httpx.get(f"{url}/readings").json()["gpus"][0]["energy_j"] for _ in range(3)]
    assert values == [1.0, 2.0, 3.0] and source.reads == 3


def test_a_wedged_read_answers_errors_and_never_starts_a_second_read() -> None:
    source = CountingSource()
    source.release.clear()  # the first read hangs inside the "driver"
    with running_agent(reader=source, cache_s=0.0, read_timeout_s=0.1) as url:
        answers = [httpx.get(f"{url}/readings").json() for _ in range(3)]
        health = httpx.get(f"{url}/healthz")
        assert source.reads == 1
        source.release.set()
        deadline = time.monotonic() + 5
        while httpx.get(f"{url}/healthz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert httpx.get(f"{url}/healthz").status_code == 200
    for body in answers:
        record = body["gpus"][0]
        assert record["energy_j"] is None and "still running" in record["error"]
    assert health.status_code == 503


def test_metrics_are_prometheus_text() -> None:
    nvml = FakeNvml([FakeGpu(energy_mj=2_000, power_mw=300_000, uuid="GPU-m")])
    with running_agent(reader=NvmlSource(nvml=nvml)) as url:
        text = httpx.get(f"{url}/metrics").text
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["giul_agent_gpu_energy_joules_total"].value == 2.0
    assert samples["giul_agent_gpu_energy_joules_total"].labels["uuid"] == "GPU-m"
    assert samples["giul_agent_gpu_power_watts"].value == 300.0
    assert samples["giul_agent_reads_total"].value >= 1


def test_open_bind_needs_a_token_and_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="without a token"):
        build_server(host="0.0.0.0", reader=CountingSource())
    with pytest.raises(ConfigError, match="cache_s"):
        build_server(reader=CountingSource(), cache_s=-1)
    build_server(host="0.0.0.0", reader=CountingSource(), token="t0123456789abcdef")  # a token makes it fine


def test_nvml_source_reports_what_is_missing() -> None:
    with pytest.raises(ReaderUnavailable, match="GPU index 4"):
        NvmlSource((4,), nvml=FakeNvml())
    with pytest.raises(ReaderUnavailable, match="NVML would not start"):
        NvmlSource(nvml=FakeNvml(init_error=999))
    record = NvmlSource(nvml=FakeNvml([FakeGpu(counter=False, instant=False)])).read_gpus()[0]
    assert record["energy_j"] is None and record["power_w"] is None and "neither" in record["error"]


def test_main_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpus", "zero"]) == 2
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["--token-file", str(empty)]) == 2
    assert main(["--host", "10.1.2.3"]) == 2
    err = capsys.readouterr().err
    assert "--gpus" in err and "empty" in err and "without a token" in err
