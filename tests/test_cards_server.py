"""The card's books from real servers: the same from every worker, never falling, across a kill -9.

``uvicorn --workers 4`` over one card (:class:`workers_card.FileCard`), nothing set but a
metrics path. Under load, Prometheus scrapes on new connections (so various workers answer)
and reads with prometheus-client's own parser. Halfway, the worker that holds the card (the
one reading it for the others: the kernel's /proc/locks says which) is killed with -9; another
takes the card over, and uvicorn starts a new worker. Issue 20 saw
``giul_node_unattributed_joules_total`` fall in 36 of 47 scrapes, and the node books depend on
which worker answered.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import workers_card
from prometheus_client.parser import text_string_to_metric_families
from server import free_port
from test_workers_server import one_request

from giul_asgi.hostshare import resolve
from giul_asgi.hostshare.keys import folder_name

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
COUNTERS = ("giul_node_measured_joules", "giul_node_charged_joules", "giul_node_unattributed_joules",
            "giul_node_allocated_joules", "giul_node_drawn_joules", "giul_node_idle_unattributed_joules",
            "giul_node_foreign_joules", "giul_node_reads", "giul_node_reader_errors",
            "giul_node_counter_resets")


def scrape(base: str, node: str) -> dict[str, float]:
    with httpx.Client(base_url=base, timeout=30) as client:  # a new connection: any worker
        text = client.get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("node") == node:
                    found[family.name] = sample.value
    return found


def holder_of(card: Path) -> int | None:
    """Who holds the card's lock in the default place (the workers run with nothing set)."""
    saved = os.environ.pop("GIUL_ASGI_LOAD_DIR", None)
    try:
        root = resolve(None).path
    finally:
        if saved is not None:
            os.environ["GIUL_ASGI_LOAD_DIR"] = saved
    assert root is not None
    lock = root / "cards" / folder_name(f"card:file:{card}") / "lock"
    if not lock.exists():
        return None
    inode = os.stat(lock).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and fields[-3].endswith(f":{inode}"):
            return int(fields[4])
    return None


def test_node_counters_never_fall_from_any_worker_and_survive_the_holder_s_kill(tmp_path: Path) -> None:
    card = workers_card.FileCard.create(tmp_path / "card.jsonl")
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}  # nothing set
    env.update(WORKERS_CARD=str(card), WORKERS_NODE=node, WORKERS_METRICS="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT / "benchmarks"), str(ROOT)]))
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(workers_card.server_command("uvicorn", port), env=env, cwd=TESTS,
                                stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    failures: list[str] = []

    def load() -> None:
        while not stop.is_set():
            try:
                one_request(base, 90.0, 0.1)
            except httpx.HTTPError:
                pass  # the killed worker's connections
            except Exception as exc:
                failures.append(repr(exc))

    try:
        deadline = time.monotonic() + 60
        pids: set[int] = set()
        while len(pids) < 4:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"workers seen: {pids}\n{log_path.read_text()[-3000:]}"
            try:
                pids.add(one_request(base, 60.0, 0.05)[1])
            except httpx.HTTPError:
                time.sleep(0.2)
        threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        seen: list[dict[str, float]] = []
        killed = None
        for i in range(40):
            seen.append(scrape(base, node))
            if i == 15:
                killed = holder_of(card)
                assert killed is not None and killed in pids, (killed, pids)
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not failures, failures[:3]
        assert killed is not None
        for name in COUNTERS:
            values = [s[name] for s in seen if name in s]
            assert len(values) >= 30, (name, len(values))
            falls = [(a, b) for a, b in itertools.pairwise(values) if b < a]
            assert not falls, (name, falls[:3])
        measured = [s["giul_node_measured_joules"] for s in seen]
        assert measured[-1] > measured[16] > 0  # the card went on being read after the kill
        # Conservation, from whichever worker answered last.
        last = seen[-1]
        assert last["giul_node_charged_joules"] + last["giul_node_unattributed_joules"] <= \
            last["giul_node_measured_joules"] * 1.001 + 1.0
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
