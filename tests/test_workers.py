"""Several workers on one host: a real ``uvicorn --workers 4``; any worker reports the host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.stats import ENV, EnergyStats, HostStats, clear_directory

APP = textwrap.dedent('''
    import os
    from urllib.parse import parse_qs
    from giul_asgi.serve.endpoint import EnergyEndpoint
    from giul_asgi.energy import Energy
    from giul_asgi.stats import HostStats

    stats = HostStats(flush_s=0.1)
    endpoint = EnergyEndpoint(stats=stats, ledgers=[], metrics_path="/metrics")

    async def app(scope, receive, send):
        if scope["type"] == "lifespan" or endpoint.handles(scope["path"]):
            await endpoint(scope, receive, send)
            return
        joules = float(parse_qs(scope["query_string"].decode())["j"][0])
        stats.record(Energy(joules, "measured", node="gpu0", tier="8b", route="/work", tokens=2),
                     outcome="ok", status=200)
        body = str(os.getpid()).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_any_of_four_uvicorn_workers_reports_the_whole_host(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    shared = tmp_path / "stats"
    shared.mkdir()
    port = free_port()
    env = {**os.environ, ENV: str(shared)}
    log = (tmp_path / "uvicorn.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(tmp_path), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "4", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while len(list(shared.glob("*.json"))) < 4:
            assert proc.poll() is None, (tmp_path / "uvicorn.log").read_text()
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        pids, total = set(), 0.0
        with httpx.Client(base_url=base, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            for i in range(200):
                joules = 1.0 + i * 0.25
                total += joules
                pids.add(c.get("/work", params={"j": joules}).text)
            assert len(pids) >= 2, "every request went to one worker: nothing merged"
            time.sleep(0.6)  # every worker has written its file (flush_s = 0.1)
            answers = [c.get("/energy", params={"window": "all"}).json() for _ in range(12)]
            metrics = [c.get("/metrics").text for _ in range(4)]
        for data in answers:
            assert data["totals"]["requests"] == 200
            assert data["totals"]["joules"]["sum"] == pytest.approx(total, rel=1e-6)
            assert data["routes"]["/work"]["tokens"] == 400 and data["workers"] == 4
        for text in metrics:
            requests = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                           if s.name == "giul_requests_total")
            assert requests == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    # Dead workers' files stay: their totals still count for a later reader.
    reader = HostStats(EnergyStats(), shared, flush_s=60)
    try:
        assert reader.view().snapshot("all")["totals"]["requests"] == 200
    finally:
        reader.close()
    assert clear_directory(shared) == 5


def test_a_worker_merges_files_and_skips_a_damaged_one(tmp_path: Path) -> None:
    a = HostStats(EnergyStats(), tmp_path, flush_s=60)
    b = HostStats(EnergyStats(), tmp_path, flush_s=60)
    try:
        a.record(Energy(3.0, "measured", route="/a"), outcome="ok", status=200)
        b.record(Energy(4.0, "measured", route="/b"), outcome="ok", status=200)
        b.flush()
        (tmp_path / "giul-stats-999-1.json").write_text("{not json")
        (tmp_path / "giul-stats-998-1.json").write_text('{"schema": "other"}')
        snap = a.snapshot("all")
        assert snap["totals"]["joules"]["sum"] == 7.0 and set(snap["routes"]) == {"/a", "/b"}
    finally:
        a.close()
        b.close()


def test_the_directory_must_be_given_and_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ConfigError, match=ENV):
        HostStats(EnergyStats())
    with pytest.raises(ConfigError, match="not a directory"):
        HostStats(EnergyStats(), tmp_path / "missing")
    with pytest.raises(ConfigError):
        HostStats(EnergyStats(), tmp_path, flush_s=0)
