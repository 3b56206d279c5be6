"""One server is the listening socket its workers inherited, or a process of its own.

Real servers in subprocesses (``servers_app``): every worker of one ``uvicorn --workers`` or
gunicorn server names the same server; two single-process servers started by one parent, or
one restarted, are different servers; and each one's ``/energy`` counts its own requests on a
simulated card of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server import free_port, free_ports

from giul_asgi.hostshare.server import identify, listening_sockets, server_identity

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent



def command(kind: str, port: int, workers: int = 1, *extra: str) -> list[str]:
    if kind == "uvicorn":
        line = [sys.executable, "-m", "uvicorn", "servers_app:app", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning"]
        return line + (["--workers", str(workers)] if workers > 1 else []) + list(extra)
    return [sys.executable, "-m", "gunicorn", "servers_app:app", "-k", "uvicorn_worker.UvicornWorker",
            "-w", str(workers), "-b", f"127.0.0.1:{port}", "--log-level", "warning",
            "--graceful-timeout", "5", *extra]


def environment(place: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIUL_ASGI_")}
    env["GIUL_ASGI_LOAD_DIR"] = str(place)  # a place of the test's own (the default's shape)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT)])
    return env


@contextmanager
def server(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=TESTS, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def get(base: str, path: str, **params: Any) -> dict[str, Any]:
    with httpx.Client(base_url=base, timeout=30) as client:  # a new connection: any worker
        response = client.get(path, params=params)
        response.raise_for_status()
        return dict(response.json())


def wait_up(base: str, proc: subprocess.Popen[bytes], log: Path, workers: int = 1) -> dict[int, str]:
    """Every worker's server key (pid -> key), once ``workers`` of them answered."""
    deadline = time.monotonic() + 40
    seen: dict[int, str] = {}
    while len(seen) < workers:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"workers seen: {seen}\n{log.read_text()[-3000:]}"
        try:
            who = get(base, "/who")
            seen[int(who["pid"])] = str(who["key"])
        except httpx.HTTPError:
            time.sleep(0.2)
    return seen


def settled(base: str, expected: int) -> dict[str, Any]:
    """``/energy`` once it counts ``expected`` requests (figures settle a little late), or
    after a while, whatever it counts then."""
    deadline = time.monotonic() + 15
    while True:
        answer = get(base, "/energy", window="all")
        if answer["totals"]["requests"] >= expected or time.monotonic() > deadline:
            time.sleep(0.5)  # and nothing more comes
            return get(base, "/energy", window="all")
        time.sleep(0.2)


def test_this_process_is_a_server_of_its_own_until_it_inherits_a_listener() -> None:
    me = identify()
    assert me.key.startswith("p") and "own process" in me.how
    assert server_identity() == server_identity()
    with socket.socket() as s:  # a listener we bound ourselves: still our own server
        s.bind(("127.0.0.1", 0))
        s.listen()
        inode = os.fstat(s.fileno()).st_ino
        assert inode in listening_sockets()
        assert identify().key == me.key
    with socket.socket() as s:  # bound, not yet listening (uvicorn's master): a listener
        s.bind(("127.0.0.1", 0))
        assert os.fstat(s.fileno()).st_ino in listening_sockets()
    a, b = socket.socketpair()  # connected: never a listener
    with a, b, socket.socket() as unbound:
        assert not {os.fstat(x.fileno()).st_ino for x in (a, b, unbound)} & set(listening_sockets())


def test_a_worker_of_a_pid_1_master_keeps_its_master_as_the_servers_keeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container's `CMD uvicorn --workers 4` makes the master pid 1: every worker's parent
    is pid 1, which systemd's socket activation also is. Each worker was its own keeper, and
    the records split by worker (a hostile trial: 12 of 48 lookups answered, a killed
    worker's ids all lost). Where pid 1 holds the listener, it is the keeper."""
    from giul_asgi.hostshare import server as server_module

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        inode = os.fstat(s.fileno()).st_ino
        monkeypatch.setattr(server_module.os, "getppid", lambda: 1)
        monkeypatch.setattr(server_module, "_socket_inodes", lambda pid: {inode} if pid == 1 else set())
        master = identify()
        assert master.key == f"l{inode}" and master.keeper[0] == 1
        # systemd's socket activation, pid 1 not to be looked in: the process keeps itself
        monkeypatch.setattr(server_module, "_socket_inodes", lambda pid: None)
        activated = identify()
        assert activated.key == f"l{inode}" and activated.keeper[0] == os.getpid()


def test_no_proc_is_a_process_of_its_own(tmp_path: Path) -> None:
    assert identify(str(tmp_path / "missing")).key.startswith("p")


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_every_worker_of_one_server_names_the_same_listener(kind: str, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    with server(command(kind, port, 3), environment(tmp_path / "place"), log) as proc:
        keys = wait_up(f"http://127.0.0.1:{port}", proc, log, workers=3)
    assert len(set(keys.values())) == 1, keys
    assert next(iter(keys.values())).startswith("l"), keys


def test_two_single_process_servers_from_one_parent_and_a_restart_are_three_servers(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path / "place")
    ports = free_ports(2)
    log = tmp_path / "server.log"
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    with server(command("uvicorn", ports[0]), env, log) as a, \
            server(command("uvicorn", ports[1]), env, log) as b:
        key_a = wait_up(bases[0], a, log)
        key_b = wait_up(bases[1], b, log)
        for _ in range(7):
            get(bases[0], "/work")
        for _ in range(3):
            get(bases[1], "/work")
        counted = [settled(base, n) for base, n in zip(bases, (7, 3), strict=True)]
    assert set(key_a.values()).isdisjoint(key_b.values())
    assert [c["totals"]["requests"] for c in counted] == [7, 3], counted
    assert [c["workers"] for c in counted] == [1, 1]
    # Nor do they share a simulated card of one name: each server's is its own (one card per
    # name on the host found a stranger's fresh server at five processes and another's energy).
    assert [c["nodes"]["gpu"]["ledger"]["workers"] for c in counted] == [1, 1], \
        [c["nodes"]["gpu"]["ledger"] for c in counted]
    place = tmp_path / "place"
    with server(command("uvicorn", ports[0]), env, log) as again:  # the same parent, restarted
        key_again = wait_up(bases[0], again, log)
        get(bases[0], "/work")
        counted_again = settled(bases[0], 1)
        # a server of one process keeps its statistics and records in its memory: nothing of
        # them in the place, where nobody would read it
        left = {part: os.listdir(place / part) if (place / part).exists() else []
                for part in ("stats", "records")}
    assert set(key_again.values()).isdisjoint(key_a.values())
    assert counted_again["totals"]["requests"] == 1, counted_again
    assert counted_again["shared"] is True and counted_again["records_shared"] is True, counted_again
    assert left == {"stats": [], "records": []}, left


@contextmanager
def under_load(base: str, clients: int) -> Iterator[dict[str, int]]:
    """``clients`` threads of :func:`load` for a ``with`` block; the counts, as they go."""
    stop, lock = threading.Event(), threading.Lock()
    counts = {"answered": 0, "failed": 0}
    threads = [threading.Thread(target=load, args=(base, stop, counts, lock)) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield counts
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def load(base: str, stop: threading.Event, counts: dict[str, int], lock: threading.Lock) -> None:
    """Requests on new connections until ``stop``: answered (200) and failed ones counted."""
    while not stop.is_set():
        try:
            with httpx.Client(base_url=base, timeout=30) as client:
                ok = client.get("/work", params={"seconds": 0.01}).status_code == 200
        except httpx.HTTPError:
            ok = False
        with lock:
            counts["answered" if ok else "failed"] += 1


def totals_once_still(base: str, floor: int, limit: float = 30.0) -> list[int]:
    """``totals.requests`` from several workers, polled until every answer reaches
    ``floor`` and stays; the answers of the last poll."""
    deadline = time.monotonic() + limit
    last: list[int] = []
    while time.monotonic() < deadline:
        try:
            last = [get(base, "/energy", window="all")["totals"]["requests"] for _ in range(6)]
            if min(last) >= floor:
                time.sleep(1.0)
                return [get(base, "/energy", window="all")["totals"]["requests"] for _ in range(6)]
        except httpx.HTTPError:  # gunicorn --max-requests drops a connection its worker took as it left
            pass
        time.sleep(0.3)
    return last


def test_a_worker_killed_under_load_loses_no_answered_request(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with server(command("uvicorn", port, 4), environment(tmp_path / "place"), log) as proc:
        pids = list(wait_up(base, proc, log, workers=4))
        with under_load(base, 6) as counts:
            deadline = time.monotonic() + 20
            while counts["answered"] < 300 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(pids[0], signal.SIGKILL)  # while its requests are answered and settling
            time.sleep(1.5)
        answered, failed = counts["answered"], counts["failed"]
        seen = totals_once_still(base, answered)
    assert answered > 100
    assert len(seen) == 6, seen
    assert all(answered <= n <= answered + failed + 6 for n in seen), (answered, failed, seen)


def scraped_requests(base: str) -> float:
    """``giul_requests_total`` summed over its series, from ``/metrics``."""
    with httpx.Client(base_url=base, timeout=30) as client:
        text = client.get("/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "giul_requests_total")


def stats_files(place: Path) -> list[str]:
    """Every file under the place's ``stats/``, whatever the layout."""
    root = place / "stats"
    return [str(f.relative_to(root)) for f in root.rglob("*") if not f.is_dir()]


def test_gunicorn_churn_keeps_the_files_bounded_and_the_counters_never_go_down(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    place = tmp_path / "place"
    log = tmp_path / "server.log"
    cmd = command("gunicorn", port, 2, "--max-requests", "30")
    with server(cmd, environment(place), log) as proc:
        wait_up(base, proc, log, workers=2)
        polls: list[int] = []
        scrapes: list[float] = []
        most_files = 0
        with under_load(base, 3) as counts:
            deadline = time.monotonic() + 25
            while counts["answered"] < 300 and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):  # a worker recycled under it
                    polls.append(get(base, "/energy", window="all")["totals"]["requests"])
                    scrapes.append(scraped_requests(base))
                most_files = max(most_files, len(stats_files(place)))
                time.sleep(0.05)
        answered = counts["answered"]
        final = totals_once_still(base, answered)
        time.sleep(2.5)  # the last recycled workers are folded
        settled_files = stats_files(place)
    assert answered >= 120, counts  # four lifetimes of a worker at least
    assert polls == sorted(polls), polls
    assert scrapes == sorted(scrapes), scrapes
    assert len(final) == 6 and all(n >= answered for n in final), (answered, final)
    # two files a live worker (row, tail), the dead row, server.json, tenants, the lock;
    # and for a moment the workers that died since the last fold
    assert most_files <= 2 * 2 + 4 + 2 * 4, most_files
    assert len(settled_files) <= 2 * 2 + 4, settled_files


def test_two_orphaned_single_process_servers_count_their_own(tmp_path: Path) -> None:
    """Started in the background by a shell that exits (as supervisord, an entrypoint or
    systemd leave them: their parent is PID 1 or a subreaper, the same for both)."""
    env = environment(tmp_path / "place")
    ports = free_ports(2)
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    log = tmp_path / "server.log"
    pids = []
    for port in ports:
        line = " ".join(command("uvicorn", port))
        done = subprocess.run(["sh", "-c", f"{line} >>{log} 2>&1 & echo $!"], env=env, cwd=TESTS,
                              capture_output=True, text=True, check=True, timeout=30)
        pids.append(int(done.stdout.strip()))
    try:
        parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                   for pid in pids}
        assert len(parents) == 1 and os.getpid() not in parents, parents  # one parent, not us
        keys = []
        for base in bases:
            deadline = time.monotonic() + 40
            while True:
                try:
                    keys.append(get(base, "/who")["key"])
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.2)
        for _ in range(5):
            get(bases[0], "/work")
        get(bases[1], "/work")
        counted = [settled(base, n)["totals"]["requests"] for base, n in zip(bases, (5, 1), strict=True)]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert keys[0] != keys[1]
    assert counted == [5, 1], counted


def test_the_simulated_card_is_one_card_for_every_worker_and_its_books_never_fall(tmp_path: Path) -> None:
    """``reader="simulated"``, the README's way to try it without a GPU, made one card per
    worker: /energy's ledger said each answering worker's own books (``workers: 1``), and
    ``measured_j`` went 487.7 -> 1107.3 -> 487.7 between polls (a stranger's trial). The
    simulated card is now one per node, run by whichever worker holds it and loaded by every
    worker's windows, as a GPU is."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with server(command("uvicorn", port, 3), environment(tmp_path / "place"), log) as proc:
        wait_up(base, proc, log, workers=3)
        books: list[tuple[float, int]] = []
        with under_load(base, 3) as counts:
            deadline = time.monotonic() + 30
            while len(books) < 20 and time.monotonic() < deadline:
                ledger = get(base, "/energy", window="all")["nodes"]["gpu"]["ledger"]
                books.append((ledger["measured_j"], ledger["workers"]))
                time.sleep(0.1)
    measured = [m for m, _ in books]
    assert len(books) == 20 and counts["answered"] > 20, (books, counts)
    assert all(w == 3 for _, w in books[5:]), books  # every worker at the card's table
    assert measured == sorted(measured), books
