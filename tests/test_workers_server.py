"""The deployment's shape: ``uvicorn --workers 4`` and gunicorn with uvicorn workers over one card,
nothing set but ``EnergyMiddleware(app, nodes=[...])``.

The card is :class:`workers_card.FileCard`: every worker's requests load it, every worker's
reader reads it, and what each request caused comes from its file alone, never from the
ledger. Four workers must charge it once (not 3.7x, as before they shared by default), and
every record must be found by id whichever worker answers the lookup.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import workers_card
from server import free_port

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent



def one_request(base: str, watts: float, seconds: float) -> tuple[str, int]:
    with httpx.Client(base_url=base, timeout=30) as client:  # a connection of its own
        response = client.get("/work", params={"watts": watts, "seconds": seconds})
        response.raise_for_status()
        return response.headers["x-energy-id"], int(response.json()["pid"])


def lookup(base: str, key: str) -> dict[str, Any] | None:
    with httpx.Client(base_url=base, timeout=30) as client:
        response = client.get(f"/energy/requests/{key}")
        return response.json()["record"] if response.status_code == 200 else None


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_four_workers_charge_the_card_once_and_any_worker_finds_any_record(
    kind: str, tmp_path: Path,
) -> None:
    if kind == "gunicorn" and shutil.which("gunicorn") is None and not _importable("gunicorn"):
        pytest.skip("gunicorn is not installed (pip install -e '.[test]')")
    path = workers_card.FileCard.create(tmp_path / "card.jsonl")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}  # nothing set
    env.update(WORKERS_CARD=str(path), WORKERS_NODE=f"gpu-{uuid.uuid4().hex[:8]}",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT / "benchmarks"), str(ROOT)]))
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(workers_card.server_command(kind, port), env=env, cwd=TESTS,
                                stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        pids: set[int] = set()
        while len(pids) < 4:  # every worker answers, and has read the card
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"workers seen: {pids}\n{log_path.read_text()[-3000:]}"
            try:
                pids.add(one_request(base, 60.0, 0.05)[1])
            except httpx.HTTPError:
                time.sleep(0.2)
        time.sleep(1.0)  # quiet: the warm-up requests settle
        truth_before, jobs_before = workers_card.caused(path)
        rng = random.Random(7)
        plan = [(rng.uniform(60.0, 150.0), rng.uniform(0.15, 0.5)) for _ in range(40)]
        with ThreadPoolExecutor(6) as pool:  # six at a time: every worker has windows open
            served = list(pool.map(lambda p: one_request(base, *p), plan))
        time.sleep(1.5)  # the card reports the last windows and their tails; figures settle
        truth, jobs = workers_card.caused(path)
        assert jobs - jobs_before == len(plan)
        served_by = {pid for _, pid in served}
        assert len(served_by) >= 2, "one worker served every request: nothing was shared"
        keys = [k for k, _ in served]
        # Wait (bounded) until every figure has settled somewhere: a worker with no window
        # open reads its card about once a second, so the last ones settle a little late.
        deadline = time.monotonic() + 15
        waiting = set(keys)
        while waiting and time.monotonic() < deadline:
            with ThreadPoolExecutor(4) as pool:
                found = dict(zip(waiting, pool.map(lambda k: lookup(base, k), waiting), strict=True))
            waiting = {k for k, record in found.items() if record is None or not record["settled"]}
            time.sleep(0.2)
        assert not waiting, f"{len(waiting)} of {len(keys)} records never found settled"
        # Then every id, three times, on new connections: whichever worker answers finds it
        # (a store per worker would miss three lookups in four).
        records: dict[str, dict[str, Any]] = {}
        misses = 0
        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                for key, record in zip(keys, pool.map(lambda k: lookup(base, k), keys), strict=True):
                    if record is None:
                        misses += 1
                    else:
                        records[key] = record
        assert misses == 0, f"{misses} of {3 * len(keys)} lookups missed"
        charged = sum(r["joules"] or 0.0 for r in records.values())
        caused = truth - truth_before
        print(f"{kind}: charged {charged:.1f} J, caused {caused:.1f} J, ratio {charged / caused:.3f}, "
              f"served by {len(served_by)} workers")
        assert all(r["settled"] for r in records.values())
        assert 0.9 < charged / caused < 1.1, (charged, caused, kind)
        # And /energy, whichever worker answers, counts the host's requests (each worker
        # writes its statistics for the others within a second or so of settling them).
        deadline = time.monotonic() + 20
        while True:
            answers = [httpx.get(base + "/energy", params={"window": "all"}, timeout=10.0).json()
                       for _ in range(8)]  # a new connection each: various workers answer
            counted = [a["totals"]["requests"] for a in answers]
            if all(a.get("workers") == 4 and n >= len(plan) for a, n in zip(answers, counted, strict=True)):
                break
            assert time.monotonic() < deadline, (counted, [a.get("workers") for a in answers])
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
