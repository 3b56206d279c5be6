"""Several workers on one host with no setting: a real ``uvicorn --workers 4``; any worker
reports the host, and a dead worker is not counted as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server import free_port

from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.hostshare import ServerId, process_start
from giul_asgi.stats import EnergyStats, HostStats, clear_directory

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



def deployed_env() -> dict[str, str]:
    """The environment of a deployment that set nothing for us."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}


def wait_for(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path, limit: float = 40.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            value = check()
            if value:
                return value
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{what}: {log.read_text()[-2000:]}"
        time.sleep(0.2)


def fresh(base: str) -> httpx.Client:
    """A client that opens a new connection per request, so requests spread over workers."""
    return httpx.Client(base_url=base, limits=httpx.Limits(max_keepalive_connections=0), timeout=10)


def test_any_of_four_uvicorn_workers_reports_the_whole_host_with_no_setting(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(tmp_path), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "4", "--log-level", "warning"],
        env=deployed_env(), stdout=subprocess.DEVNULL, stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with fresh(base) as c:
            def four() -> bool:
                return all(c.get("/energy").json()["workers"] == 4 for _ in range(4))

            wait_for(four, "the four workers did not all start", proc, log_path)
            pids, total = set(), 0.0
            for i in range(200):
                joules = 1.0 + i * 0.25
                total += joules
                pids.add(c.get("/work", params={"j": joules}).text)
            assert len(pids) >= 2, "every request went to one worker: nothing merged"
            time.sleep(0.6)  # every worker has written its row (flush_s = 0.1)
            answers = [c.get("/energy", params={"window": "all"}).json() for _ in range(12)]
            metrics = [c.get("/metrics").text for _ in range(4)]
            for data in answers:
                assert data["totals"]["requests"] == 200 and data["shared"] is True
                assert data["totals"]["joules"]["sum"] == pytest.approx(total, rel=1e-6)
                assert data["routes"]["/work"]["tokens"] == 400 and data["workers"] == 4
            for text in metrics:
                requests = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                               if s.name == "giul_requests_total")
                assert requests == 200
            # A worker dies: it is not a worker any more (the page said "5 worker(s)" for 4),
            # and what it counted still counts while its server runs.
            os.kill(int(next(iter(pids))), signal.SIGKILL)
            time.sleep(1.0)
            after = [c.get("/energy", params={"window": "all"}).json() for _ in range(8)]
            for data in after:
                assert data["workers"] <= 4 and data["totals"]["requests"] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    # Another server on this host (here, this process) does not count that one's requests.
    other = HostStats(EnergyStats(), flush_s=60)
    try:
        assert other.view().snapshot("all")["totals"]["requests"] == 0
    finally:
        other.close()


def worker_server() -> ServerId:
    """A server of several processes (this one a worker of it, as under ``--workers``)."""
    return ServerId("ltest-workers", "a test's server", (os.getpid(), process_start(os.getpid())))


def test_a_worker_merges_rows_and_skips_a_damaged_one(tmp_path: Path) -> None:
    a = HostStats(EnergyStats(), tmp_path, flush_s=60, server=worker_server())
    b = HostStats(EnergyStats(), tmp_path, flush_s=60, server=worker_server())
    try:
        assert a.shared and a.rows is not None
        a.record(Energy(3.0, "measured", route="/a"), outcome="ok", status=200)
        b.record(Energy(4.0, "measured", route="/b"), outcome="ok", status=200)
        b.flush()
        folder = a.rows.folder
        # b's row as another live process wrote it (our parent's pid and start time): a
        # second middleware in this same process is not another worker, and is not merged.
        assert b.rows is not None
        other = os.getppid()
        b.rows.path.rename(folder / f"{other}-{process_start(other) or 'x'}.json")
        (folder / f"{other}-1-x.json").write_text("{not json")
        (folder / f"{other}-2-y.json").write_text(f'{{"server": "{a.server.key}", "state": {{}}}}')
        snap = a.snapshot("all")
        assert snap["totals"]["joules"]["sum"] == 7.0 and set(snap["routes"]) == {"/a", "/b"}
        assert snap["workers"] == 2
        # That process runs a second middleware (an app imported twice): one worker still, its
        # second row counted (a hostile review read workers: 3 for two processes).
        second = b.stats.empty_like()
        second.record(Energy(5.0, "measured", route="/c"), outcome="ok", status=200)
        (folder / f"{other}-{process_start(other) or 'x'}-2.json").write_text(
            json.dumps({"server": a.server.key, "state": second.state()}))
        snap = a.snapshot("all")
        assert snap["totals"]["joules"]["sum"] == 12.0 and snap["workers"] == 2 and a.workers() == 2
    finally:
        a.close()
        b.close()
    assert clear_directory(tmp_path) >= 2


def test_no_place_means_this_workers_statistics_and_no_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for where in (blocker / "sub", "off"):
        # the worker serves; its figures are its own
        stats = HostStats(EnergyStats(), where, server=worker_server())
        stats.record(Energy(2.0, "measured", route="/a"), outcome="ok", status=200)
        snap = stats.snapshot("all")
        assert not stats.shared and snap["workers"] == 1 and snap["shared"] is False
        assert snap["totals"]["requests"] == 1
        stats.close()
    with pytest.raises(ConfigError):
        HostStats(EnergyStats(), tmp_path, flush_s=0)


def test_a_process_of_its_own_keeps_its_statistics_in_memory(tmp_path: Path) -> None:
    """A single-process server is its whole server: its statistics are shared (the server's,
    one worker), nothing of them is written in the place, and a dead server's folder left
    there still goes at its start (a hostile review: it stayed). Where the place cannot be
    used, it says so, as any worker does."""
    place = tmp_path / "place"
    dead = place / "stats" / "l999.4000000-1"  # a server whose keeper is long gone
    dead.mkdir(parents=True, mode=0o700)
    place.chmod(0o700)
    (dead / "server.json").write_text("{}")
    stats = HostStats(EnergyStats(), place, flush_s=0.05)  # this test process: its own server
    try:
        assert stats.wait_ready(10) and stats.alone and stats.folder is None
        stats.answered("a-1-1", "/a", "gpu0", None, "ok", 200, None)
        stats.record(Energy(2.0, "measured", route="/a"), outcome="ok", status=200)
        stats.flush()
        snap = stats.snapshot("all")
        assert snap["shared"] is True and snap["shared_reason"] is None and snap["workers"] == 1
        assert snap["totals"]["requests"] == 1 and snap["server"].startswith("p")
    finally:
        stats.close()
    assert not dead.exists() and os.listdir(place / "stats") == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    unusable = HostStats(EnergyStats(), blocker / "sub")
    try:
        snap = unusable.snapshot("all")
        assert snap["shared"] is False and snap["shared_reason"] and not unusable.alone
    finally:
        unusable.close()
