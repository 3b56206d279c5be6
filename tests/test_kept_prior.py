"""A node's prior kept in the place for the server's next worker: the file, what is refused
in it, and real gunicorn workers recycled by ``--max-requests`` that start from it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
from test_servers import command, environment, server, wait_up

from giul_asgi.hostshare.priors import MOST_BYTES, PRIORS, KeptPrior, prior_name
from giul_asgi.hostshare.server import ServerId

STATE = {"schema": "giul-asgi/prior/1", "settled": 3}


def kept_by_another(kept: KeptPrior, state: object) -> None:
    """What an earlier worker of the server wrote (another process: this one's is not read)."""
    kept.path.write_text(json.dumps({"by": "1-2", "prior": state}))


def one_server(keeper: tuple[int, str | None] | None = None) -> ServerId:
    return ServerId("ltest", "a test's server", keeper or (os.getpid(), None))


def test_a_kept_prior_is_read_back_by_the_next_worker_and_is_its_node_s_alone(tmp_path: Path) -> None:
    name = prior_name("gpu", 70.0, 0.1, (0,), "simulated")
    kept = KeptPrior(tmp_path, one_server(), name)
    assert kept.load() is None
    kept.save(STATE)
    # a process's own later ledgers start from nothing (tests, an app built twice), as before
    assert kept.load() is None and json.loads(kept.path.read_text())["prior"] == STATE
    kept_by_another(kept, STATE)
    assert KeptPrior(tmp_path, one_server(), name).load() == STATE
    assert kept.path.parent == tmp_path / PRIORS / one_server().folder
    # a node changed between two starts (another idle floor) never starts from the old one's
    other = prior_name("gpu", 80.0, 0.1, (0,), "simulated")
    assert other != name and KeptPrior(tmp_path, one_server(), other).load() is None
    assert prior_name("a/../b c", 1).startswith("a_.._b_c-")


def test_what_is_planted_or_odd_in_the_file_is_not_read(tmp_path: Path) -> None:
    kept = KeptPrior(tmp_path, one_server(), "gpu.json")
    target = tmp_path / "elsewhere.json"
    planted = json.dumps({"by": "1-2", "prior": STATE})
    target.write_text(planted)
    kept.path.symlink_to(target)
    assert kept.load() is None  # a link is never followed
    kept.save(STATE)  # replaced atomically: the link itself goes, its target stays
    assert not kept.path.is_symlink() and target.read_text() == planted
    for odd in ('{"by": "1-2", "prior": {"settled": NaN}}', "[]", '{"by": "1-2"}', "nonsense"):
        kept.path.write_text(odd)
        assert kept.load() is None, odd
    kept.path.write_bytes(b" " * (MOST_BYTES + 1))
    assert kept.load() is None
    kept.save({"bad": float("nan")})  # never raises, never writes a NaN
    assert kept.path.read_bytes() == b" " * (MOST_BYTES + 1)


def test_a_dead_server_s_kept_priors_go_with_the_next_start(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    KeptPrior(tmp_path, one_server((dead.pid, None)), "gpu.json").save(STATE)
    KeptPrior(tmp_path, one_server(), "gpu.json")
    assert os.listdir(tmp_path / PRIORS) == [one_server().folder]


def test_gunicorn_s_recycled_worker_answers_its_first_short_request_from_the_kept_prior(
    tmp_path: Path,
) -> None:
    """One worker, recycled every 8 requests: a new worker's first 50 ms request was unknown
    (nothing learnt, no host rate for an in-process card); now it is a figure, and each new
    worker says it started from the prior the last one kept."""
    from server import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    firsts: dict[str, str] = {}
    line = command("gunicorn", port, 1, "--max-requests", "8", "--log-level", "info")
    with server(line, environment(tmp_path / "place"), log) as proc:
        wait_up(base, proc, log)
        for _ in range(24):
            for _ in range(50):
                try:
                    with httpx.Client(base_url=base, timeout=30) as client:
                        answer = client.get("/work", params={"seconds": 0.05})
                    break
                except httpx.HTTPError:  # the worker being replaced
                    time.sleep(0.1)
            worker, n = answer.headers["x-energy-id"].rsplit("-", 1)
            if n == "1":
                firsts[worker] = answer.headers["x-energy-joules"]
            time.sleep(0.15)
    assert len(firsts) >= 3, (firsts, log.read_text()[-2000:])
    later = list(firsts.values())[1:]
    assert all(joules != "unknown" for joules in later), firsts
    # each later worker started from what the one before it kept (the one simulated card's
    # spans teach a new worker the host's rate too: the figure alone does not show the prior)
    restored = log.read_text().count("starts from what this server's earlier workers learnt")
    assert restored >= len(firsts) - 1, (restored, firsts, log.read_text()[-2000:])
