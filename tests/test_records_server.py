"""Records by id under real servers: nothing answered is lost to ``kill -9``, and each server
answers for its own ids only.

Real uvicorn in subprocesses (``servers_app``: a simulated card, nothing about sharing set but
a place of the test's own). A worker is killed with -9 the moment it has answered: every id a
client got back must still answer 200 from ``/energy/requests/{id}``, whichever worker the
lookup reaches. Two single-process servers started by this one parent are two servers: each
answers its own ids and says of the other's why it has none.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from server import free_port, free_ports
from test_servers import command, environment, get, server, wait_up


def lookup(base: str, key: str) -> tuple[int, dict[str, Any]]:
    with httpx.Client(base_url=base, timeout=30) as client:  # a new connection: any worker
        response = client.get(f"/energy/requests/{key}")
        return response.status_code, response.json()


def test_every_id_answered_before_a_kill_9_is_found_afterwards(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    answered: list[tuple[str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()
    victim: dict[str, Any] = {}

    def load() -> None:
        while not stop.is_set():
            try:  # a new connection each time: the server spreads them over its workers
                with httpx.Client(base_url=base, timeout=30) as client:
                    response = client.get("/work", params={"seconds": "0.01"})
                pid = int(response.json()["pid"])
            except (httpx.HTTPError, ValueError, KeyError):
                continue  # its worker was killed under it: no id was given
            with lock:
                answered.append((response.headers["x-energy-id"], pid))
                if victim.get("armed") and pid == victim["pid"] and "killed" not in victim:
                    os.kill(pid, signal.SIGKILL)  # right after it answered
                    victim["killed"] = response.headers["x-energy-id"]

    with server(command("uvicorn", port, 4), environment(tmp_path / "place"), log) as proc:
        pids = wait_up(base, proc, log, workers=4)
        threads = [threading.Thread(target=load, daemon=True) for _ in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)  # under load: every worker has answered a few
        with lock:
            victim["pid"] = sorted(pids)[1]
            victim["armed"] = True
        deadline = time.monotonic() + 20
        while "killed" not in victim and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # and on, under load, without it
        stop.set()
        for thread in threads:
            thread.join(30)
        assert "killed" in victim, f"the victim {victim} never answered\n{log.read_text()[-2000:]}"
        by_victim = [key for key, pid in answered if pid == victim["pid"]]
        assert by_victim, "the killed worker had answered nothing"
        # Every id, asked until some worker answers it (a new connection each time): the
        # killed worker's among them, the last one it gave out first.
        missing: dict[str, Any] = {}
        keys = [victim["killed"], *[k for k, _ in answered if k != victim["killed"]]]
        deadline = time.monotonic() + 30
        for key in keys:
            while True:
                status, body = lookup(base, key)
                if status == 200:
                    missing.pop(key, None)
                    record = body["record"]
                    assert record["id"] == key
                    if key == victim["killed"] and not record["settled"]:
                        # Its worker died before the card reported it: the record says so
                        # (a stranger's trial saw `settled: false` for ever, unexplained).
                        gone = "never settled: the worker process that served it ended"
                        assert gone in record["error"], record
                    break
                missing[key] = body
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    assert not missing, (f"{len(missing)} of {len(keys)} answered ids are not found after the kill "
                         f"({len(by_victim)} answered by the killed worker): "
                         f"{list(missing.items())[:3]}")


def test_two_single_process_servers_from_one_parent_answer_their_own_ids_only(tmp_path: Path) -> None:
    env = environment(tmp_path / "place")
    ports = free_ports(2)
    log = tmp_path / "server.log"
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    with server(command("uvicorn", ports[0]), env, log) as a, \
            server(command("uvicorn", ports[1]), env, log) as b:
        wait_up(bases[0], a, log)
        wait_up(bases[1], b, log)
        ids = []
        for base in bases:
            with httpx.Client(base_url=base, timeout=30) as client:
                ids.append(client.get("/work").headers["x-energy-id"])
        get(bases[0], "/energy")  # both answered and filed their records by now
        for mine, theirs, base in ((ids[0], ids[1], bases[0]), (ids[1], ids[0], bases[1])):
            status, body = lookup(base, mine)
            assert status == 200 and body["record"]["id"] == mine, body
            status, body = lookup(base, theirs)
            assert status == 404, f"{base} answered the other server's id {theirs}: {body}"
            assert body["reason"].startswith("unknown id"), body
