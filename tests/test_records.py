"""Records by id across a server's processes: the ring, the journal, the store, their bounds.

The ring is written in place (no file I/O on the request path) and read whole or not at all;
the journal folds a dead process's ring and removes it, and a dead server's folder goes at
the next start; the store says why a record is gone, skips what makes no sense, and falls
back loudly, per process, where the place is full.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import multiprocessing as mp
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from giul_asgi.energy import Energy
from giul_asgi.hostshare.journal import FOLD, Journal, folder_name, sweep
from giul_asgi.hostshare.ring import HEAD_BYTES, Ring
from giul_asgi.hostshare.rows import process_start
from giul_asgi.hostshare.server import ServerId
from giul_asgi.listeners import Settled
from giul_asgi.meter import id_prefix
from giul_asgi.records import RecordStore, parse_record
from giul_asgi.wire.body import energy_json


def one_server(pid: int | None = None) -> ServerId:
    """One server for a test's processes (spawned children inherit no listener)."""
    pid = os.getpid() if pid is None else pid
    return ServerId("ltest", "the test's", (pid, process_start(pid)))


def ring(tmp_path: Path, name: str = "1-1-1.ring", capacity: int = 64 * 40) -> Ring:
    return Ring.create(tmp_path / f".tmp-{name}", tmp_path / name, capacity, 600.0)


def folder(place: Path) -> Path:
    return place / "records" / folder_name(one_server())


@pytest.fixture
def place(tmp_path: Path) -> Path:
    path = tmp_path / "place"
    path.mkdir(mode=0o700)
    return path


def energy(key: str, joules: float = 1.0, *, settled: bool = False) -> Energy:
    return Energy(joules, "measured", node="gpu0", backend="nvml_counter", source="local",
                  settled=settled, id=key)


# -- the ring ------------------------------------------------------------------------------------

def test_a_ring_is_read_by_another_mapping_whole_and_what_it_overwrote_is_said(tmp_path: Path) -> None:
    writer = ring(tmp_path)
    row = writer.row("a1-b2-")
    reader = Ring.open(tmp_path / "1-1-1.ring")
    cursor = 0
    seen: dict[int, bytes] = {}
    for i in range(1, 200):
        writer.append(f"a1-b2-{i:x}".encode(), b"x" * (i % 150), t=float(i), counter=i, row=row,
                      now=float(i) if i < 100 else 1e9)  # from 100 on, what goes is old
        if i % 5 == 0:
            entries, cursor, _ = reader.entries(cursor)
            seen.update({e.counter: e.data for e in entries})
    assert all(data == b"x" * (i % 150) for i, data in seen.items())
    assert len(seen) > 150  # read often enough, most entries were seen before they went
    entries, _, oldest = reader.entries(0)
    assert entries and entries[-1].counter == 199 and entries[0].at >= oldest
    (prefix,) = reader.prefixes()
    assert prefix.prefix == "a1-b2-" and prefix.high == 199
    assert prefix.dropped == entries[0].counter - 1  # everything before the oldest went...
    assert 0 < prefix.evicted < 100 <= prefix.dropped  # ...young (evicted) until 100, old after
    assert reader.read(entries[-1].at) == entries[-1] and reader.read(0) is None  # 0: overwritten


def test_a_damaged_entry_is_skipped_and_counted_and_what_follows_is_read(tmp_path: Path) -> None:
    writer = ring(tmp_path, capacity=64 * 100)
    row = writer.row("a1-b2-")
    for i in range(1, 6):
        writer.append(f"a1-b2-{i}".encode(), b'{"joules": 1}', t=1.0, counter=i, row=row, now=1.0)
    third = ring_entries(tmp_path)[2]
    writer.mm[HEAD_BYTES + third.at + 40] ^= 0xFF  # a flipped byte inside the third entry
    reader = Ring.open(tmp_path / "1-1-1.ring")
    entries, cursor, _ = reader.entries(0)
    assert [e.counter for e in entries] == [1, 2, 4, 5] and reader.damaged >= 1
    assert cursor == writer.written


def ring_entries(tmp_path: Path) -> list[Any]:
    return Ring.open(tmp_path / "1-1-1.ring").entries(0)[0]


# -- the store: reasons, odd content, a full place --------------------------------------------------

def test_a_missing_record_says_why(place: Path) -> None:
    now = [0.0]
    store = RecordStore(max_records=3, max_age_s=60, clock=lambda: now[0], share=place)
    assert store.shared and store.reason is None
    mine = [f"{id_prefix()}{i:x}" for i in range(1, 6)]
    for key in mine:
        store.put(energy(key))
    assert store.lookup(mine[0]).reason == "evicted: the store holds max_records (3)"
    assert store.lookup(mine[4]).energy is not None
    now[0] = 61.0
    assert store.lookup(mine[4]).reason == "expired after max_age_s (60 s)"
    assert (store.lookup(f"{id_prefix()}ff").reason or "").startswith("unknown id")
    assert (store.lookup("not-an-id").reason or "").startswith("unknown id")
    other = (store.lookup("7fff-1-1").reason or "")
    assert other.startswith("unknown id") and "another server" in other
    assert store.lookup("7fff-1-1").energy is None


def test_another_process_records_are_found_by_id_and_their_ends_explained(place: Path) -> None:
    now = [0.0]
    theirs = RecordStore(max_records=1000, max_age_s=60, clock=lambda: now[0], share=place,
                         server=one_server())
    mine = RecordStore(max_records=1000, max_age_s=60, clock=lambda: now[0], share=place,
                       server=one_server())
    assert theirs.shared and mine.shared
    theirs_key = f"{id_prefix()}abc"
    theirs.put(energy(theirs_key, 1.0))
    theirs.settled([Settled(energy(theirs_key, 1.5, settled=True))])
    # mine is another store of this process: its own memory has nothing, theirs's ring has it
    found = mine.lookup(theirs_key).energy
    assert found is not None and found.joules == 1.5 and found.settled
    now[0] = 61.0
    assert mine.lookup(theirs_key).reason == "expired after max_age_s (60 s)"
    theirs.close()
    mine.close()


def write_foreign(place: Path, records: list[tuple[str, bytes]], name: str = "99999-1-1.ring") -> None:
    """Another process's ring of this server, holding ``records`` as they are."""
    target = folder(place)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    other = Ring.create(target / f".tmp-{name}", target / name, 64 * 1024, 600.0)
    row = other.row("a1-b2-")
    for i, (key, data) in enumerate(records, 1):
        other.append(key.encode(), data, t=time.monotonic(), counter=i, row=row, now=time.monotonic())


@pytest.mark.anyio
async def test_records_that_make_no_sense_are_skipped_said_once_and_never_a_500(
    place: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    from giul_asgi.serve.endpoint import EnergyEndpoint
    from giul_asgi.stats import EnergyStats

    good = energy_json(energy("a1-b2-1", 2.0))
    odd = {
        "a1-b2-2": good.replace(b'"joules":2', b'"joules":NaN'),
        "a1-b2-3": good.replace(b'"joules":2', b'"joules":Infinity'),
        "a1-b2-4": good.replace(b'"joules":2', b'"joules":"2"'),
        "a1-b2-5": good.replace(b'"seconds":0', b'"seconds":"soon"'),
        "a1-b2-6": good[: len(good) // 2],
        "a1-b2-7": b"[1, 2]",
        "a1-b2-8": good.replace(b'"settled":false', b'"settled":"no"'),
        "a1-b2-9": good.replace(b'"stages":{}', b'"stages":{"x":{"joules":-Infinity}}'),
    }
    write_foreign(place, [("a1-b2-1", good), *odd.items()])
    store = RecordStore(share=place, server=one_server())
    app = EnergyEndpoint(stats=EnergyStats(), ledgers=[], records=store)
    caplog.set_level(logging.WARNING, logger="giul_asgi.records")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        ok = await c.get("/energy/requests/a1-b2-1")
        assert ok.status_code == 200 and ok.json()["record"]["joules"] == 2.0
        for _ in range(2):
            for key in odd:
                answer = await c.get(f"/energy/requests/{key}")
                assert answer.status_code == 404, (key, answer.text)
                assert "makes no sense" in answer.json()["reason"], answer.json()
    said = [r for r in caplog.records if "makes no sense" in r.getMessage()]
    assert 1 <= len(said) <= len(odd)  # once per kind of nonsense, not once per lookup
    assert len({r.getMessage() for r in said}) == len(said)


def test_nonsense_is_told_from_a_record() -> None:
    good = energy_json(energy("k", 2.0))
    assert parse_record(good)[0] is not None
    for bad in (b"{", b"null", b'{"joules": NaN}', b'{"joules": 1e999}', b'{"tokens": 1.5}',
                b'{"method": "guessed"}', b'{"idle_known": 1}'):
        record, why = parse_record(bad)
        assert record is None and why, bad
    assert math.isfinite(parse_record(b'{"joules": 1, "method": "measured"}')[0].joules)  # type: ignore[union-attr]


def make_record_unshared(place: str, key_file: str) -> None:
    """Another worker of the server whose place is full (posix_fallocate: ENOSPC)."""
    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    os.posix_fallocate = full
    store = RecordStore(share=place, server=one_server(os.getppid()))
    assert not store.shared
    key = f"{id_prefix()}1"
    store.put(energy(key))
    Path(key_file).write_text(key)


def test_a_planted_link_is_refused_with_the_remedy_for_a_link_not_for_room(
    place: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    """A hostile trial planted ``records`` as a link: refused, but the line said "free space
    in the place", which does nothing for a link."""
    caplog.set_level(logging.WARNING, logger="giul_asgi.records")
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (place / "records").symlink_to(victim)
    store = RecordStore(share=place, server=one_server())
    assert not store.shared
    said = [r.getMessage() for r in caplog.records if "alone" in r.getMessage()]
    assert len(said) == 1, said
    assert "symbolic link" in said[0] and f"remove {place / 'records'}" in said[0], said[0]
    assert "free space" not in said[0]
    assert not list(victim.iterdir())


def test_a_full_place_is_a_loud_per_process_fallback_said_in_every_lookup(
    place: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.records")

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "posix_fallocate", full)
        store = RecordStore(share=place, server=one_server())
        assert not store.shared
    assert store.reason is not None and "No space left on device" in store.reason
    said = [r for r in caplog.records if "alone" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "No space left" in said[0].getMessage() and "shm-size" in said[0].getMessage()
    key = f"{id_prefix()}1"
    store.put(energy(key))
    assert store.get(key) is not None  # its own records, still
    # Another worker of the same server, whose place is full, answers a request: this one
    # (with room) says why it cannot find that worker's record.
    key_file = tmp_path / "key"
    proc = mp.get_context("spawn").Process(target=make_record_unshared, args=(str(place), str(key_file)))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    shared = RecordStore(share=place, server=one_server())
    assert shared.shared
    reason = shared.lookup(key_file.read_text()).reason or ""
    assert reason.startswith("its process's journal was not shared: cannot make") and "No space" in reason


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "64k") -> Iterator[bool]:
    path.mkdir(mode=0o700)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        done = False
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


def test_a_real_full_tmpfs_is_the_same_loud_fallback(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "tiny") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (not root)")
        store = RecordStore(share=tmp_path / "tiny", server=one_server())
        assert not store.shared and "No space left" in (store.reason or "")
        store.put(energy(f"{id_prefix()}1"))
        assert store.get(f"{id_prefix()}1") is not None


# -- two stores in one process -----------------------------------------------------------------------

async def hello(scope: Any, receive: Any, send: Any) -> None:
    """A plain JSON app, metered by the tests' middlewares."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


@pytest.mark.anyio
async def test_two_middlewares_in_one_process_never_share_a_file(
    place: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from apps import busy_node, drive, fresh

    caplog.set_level(logging.WARNING, logger="giul_asgi")

    node, _ = busy_node()
    stores = [RecordStore(max_records=4, share=place, server=one_server()) for _ in range(2)]
    apps = [fresh(hello, node, records=store) for store in stores]
    ids: list[list[str]] = [[], []]
    # Far past max_records (the old journal rotated here, under the other), and within what
    # the fold ring (one store's 64 KiB) holds of both stores' records once both closed: at
    # 30 of each, with each real request's settled figure, store 0's were overwritten there
    # by store 1's when the settlements came first (1 run in 10 beside a CPU burner).
    for _ in range(12):
        for n, app in enumerate(apps):
            sent = await drive(app)
            ids[n].append(dict(sent[0]["headers"])[b"x-energy-id"].decode())
    for i in range(12):  # and settled figures, one store then the other
        for n, store in enumerate(stores):
            store.settled([Settled(energy(f"{id_prefix()}{0x10000 + 2 * i + n:x}", settled=True))])
    for app in apps:
        await app.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert all(s.shared and s.write_errors == 0 for s in stores)
    rings = {s.journal.ring.path for s in stores if s.journal is not None}
    assert len(rings) == 2 and len({p.parent for p in rings}) == 1
    # each finds the other's latest (its own memory holds its last 4)
    found = [stores[0].lookup(ids[1][-1]), stores[1].lookup(ids[0][-1])]
    assert all(f.energy is not None for f in found), ([f.reason for f in found], caplog.text)


# -- bounded: the dead folded, dead servers swept --------------------------------------------------

def one_worker(place: str, n: int, first: int) -> None:
    store = RecordStore(share=place, server=one_server(os.getppid()))
    assert store.shared
    for i in range(first, first + n):
        store.put(energy(f"{id_prefix()}{i:x}", float(i)))
    Path(place, f"ids-{os.getpid()}").write_text(json.dumps([f"{id_prefix()}{i:x}" for i in
                                                             range(first, first + n)]))


def test_dead_workers_rings_are_folded_and_removed_and_their_records_still_found(place: Path) -> None:
    ctx = mp.get_context("spawn")
    live = RecordStore(share=place, server=one_server())
    assert live.shared and live.journal is not None
    lifetimes = 12
    for life in range(lifetimes):  # workers recycled one after another (gunicorn --max-requests)
        proc = ctx.Process(target=one_worker, args=(str(place), 5, 1 + 5 * life))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        if life % 4 == 3:
            live.journal.census()
    live.journal.census()
    names = sorted(p.name for p in folder(place).iterdir())
    assert names == sorted([FOLD, "fold.lock", live.journal.rows.name]), names
    ids = [key for f in place.glob("ids-*") for key in json.loads(f.read_text())]
    assert len(ids) == 5 * lifetimes
    found = [live.get(key) for key in ids]
    assert all(f is not None for f in found)
    assert sorted(f.joules for f in found if f is not None) == [float(i) for i in range(1, 61)]


def test_a_fold_refused_for_a_planted_lock_link_says_to_remove_it(
    place: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    """A hostile trial planted the records folder's ``fold.lock`` as a link: refused, but the
    line ("records ... cannot be kept bounded: ... a symbolic link, refused") had no remedy."""
    caplog.set_level(logging.WARNING, logger="giul_asgi.records")
    live = RecordStore(share=place, server=one_server())
    assert live.shared and live.journal is not None
    proc = mp.get_context("spawn").Process(target=one_worker, args=(str(place), 3, 1))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    lock = folder(place) / "fold.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(tmp_path / "victim")
    assert live.journal.census() == 0
    said = [r.getMessage() for r in caplog.records if "cannot be kept bounded" in r.getMessage()]
    assert len(said) == 1, said
    assert "symbolic link" in said[0] and f"remove {lock}" in said[0], said[0]
    assert not (tmp_path / "victim").exists()


def test_a_dead_servers_folder_goes_at_the_next_start_a_live_ones_stays(place: Path) -> None:
    records = place / "records"
    records.mkdir(mode=0o700)
    dead = records / "l123.999999-1"  # a keeper that is gone
    dead.mkdir(mode=0o700)
    (dead / "999999-1-1.ring").write_bytes(b"x")
    (dead / "fold.ring").write_bytes(b"x")
    alive = records / folder_name(one_server())
    alive.mkdir(mode=0o700)
    (alive / "999999-1-1.ring").write_bytes(b"x")
    old = records / "999999-1.jsonl"  # an earlier version's journal of a dead process
    old.write_bytes(b"x")
    orphan = records / "l124.999999-1"  # its master is gone, a worker (this process) is not
    orphan.mkdir(mode=0o700)
    (orphan / f"{os.getpid()}-{process_start(os.getpid())}-1.ring").write_bytes(b"x")
    assert sweep(place) == 3
    assert sorted(p.name for p in records.iterdir()) == sorted([alive.name, orphan.name])
    store = RecordStore(share=place)  # a start sweeps too (here: nothing more to sweep)
    assert store.shared and not dead.exists()


def test_a_journal_bound_is_what_its_docstring_says(place: Path) -> None:
    journal = Journal(place, one_server(), max_age_s=600.0, capacity=64 * 1024, tag="t")
    assert journal.ring.path.stat().st_size == HEAD_BYTES + 64 * 1024
    for i in range(1, 2000):  # far past what it holds: the file does not grow
        journal.append(f"{id_prefix()}{i:x}", b"y" * 500, id_prefix(), i)
    assert journal.ring.path.stat().st_size == HEAD_BYTES + 64 * 1024


def test_a_closed_or_collected_store_folds_its_ring_and_its_records_are_still_found(place: Path) -> None:
    import gc

    survivor = RecordStore(share=place, server=one_server())
    closed = RecordStore(share=place, server=one_server())
    dropped = RecordStore(share=place, server=one_server())
    assert survivor.shared and closed.shared and dropped.shared
    keys = [f"{id_prefix()}{0xc105e:x}", f"{id_prefix()}{0xd20b:x}"]
    closed.put(energy(keys[0], 3.0))
    dropped.put(energy(keys[1], 4.0))
    rings = [s.journal.ring.path for s in (closed, dropped) if s.journal is not None]
    closed.close()  # lifespan shutdown: no file touched here, the store's thread folds
    del dropped  # a middleware nobody closed, collected
    gc.collect()
    deadline = time.monotonic() + 30
    while any(p.exists() for p in rings) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.exists() for p in rings)
    assert sorted(p.name for p in folder(place).iterdir()) == sorted(
        [FOLD, "fold.lock", survivor.journal.rows.name])  # type: ignore[union-attr]
    assert [survivor.get(k).joules for k in keys] == [3.0, 4.0]  # type: ignore[union-attr]


def test_energy_says_whether_records_are_shared_and_why_not(tmp_path: Path) -> None:
    """A full place fails the records' ring apart from the statistics: /energy says so."""
    import asyncio

    import httpx

    from giul_asgi import EnergyMiddleware, Ledgers, Node
    from giul_asgi.records import RecordStore

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> dict[str, Any]:
        metered = EnergyMiddleware(app, [Node("sim", reader="none")], ledgers=Ledgers(),
                                   records=RecordStore(share="off"))
        transport = httpx.ASGITransport(app=metered)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return (await client.get("/energy")).json()

    data = asyncio.run(main())
    assert data["records_shared"] is False and data["records_reason"], data


def test_a_record_its_ring_overwrote_says_the_rings_bound_and_how_to_keep_more(place: Path) -> None:
    # A hostile trial: on Docker's 64 MB /dev/shm a worker's ring holds ~700 records, seconds of
    # a busy server's, and the 404 blamed max_records (10,000), which no store was near.
    journal = Journal(place, one_server(), max_age_s=600.0, capacity=64 * 1024, tag="t")
    for i in range(1, 2000):
        journal.append(f"{id_prefix()}{i:x}", b"y" * 500, id_prefix(), i)
    from giul_asgi.meter import split_id

    other = Journal(place, one_server(), max_age_s=600.0, capacity=64 * 1024, tag="u")  # a worker
    assert other.find(f"{id_prefix()}1") is None  # overwritten long ago
    parts = split_id(f"{id_prefix()}1")
    assert parts is not None
    why = other.why(*parts)
    other.close()
    journal.close()
    assert why.startswith("evicted: its process's journal (0.062 MiB") and "--shm-size" in why, why


@pytest.mark.parametrize("tail", ["0", "1f", "ffffffffffffffff", "10000000000000000", "", "x1", "1-2",
                                  "+1", "1_0", " 1", "0x1f", "g"])
def test_an_evicted_ids_counter_is_what_the_general_parse_says(tail: str) -> None:
    """The request path's quick counter of an evicted id agrees with ``split_id`` on ours,
    odd tails included, and is 0 for another process's id."""
    from giul_asgi.meter import split_id
    from giul_asgi.records import _counter

    key = id_prefix() + tail
    parts = split_id(key)
    assert _counter(key) == (parts[1] if parts is not None and parts[0] == id_prefix() else 0)
    assert _counter("1a2b-3c4d-" + (tail or "0")) == 0


@pytest.mark.parametrize("share", [True, False])
def test_a_record_reads_back_here_as_any_other_worker_reads_it(place: Path, share: bool) -> None:
    """Records are kept as their JSON (the answer's block, the ring's copy), not as Energy
    objects a full collection walks: read back here, a record is what another worker reads,
    shared or not, first figure or settled; a whole float stays a float."""
    store = RecordStore(share=place if share else False, server=one_server())
    assert store.shared is share  # waits for the ring (made on the store's own thread)
    key = f"{id_prefix()}{1:x}"
    first = Energy(5.0, "estimated", node="gpu0", backend="nvml_counter", source="local", id=key,
                   seconds=0.123456789123, carbon_g_per_kwh=400.0, tenant="t\u00e9", tokens=7)
    store.put(first, energy_json(first))
    got = store.lookup(key).energy
    assert got is not None and got == parse_record(energy_json(first))[0]
    assert type(got.joules) is float and got.joules == 5.0 and got.seconds == 0.123456789
    assert type(got.carbon_g_per_kwh) is float and got.tokens == 7 and got.tenant == "t\u00e9"
    settled = Energy(5.5, "measured", node="gpu0", backend="nvml_counter", source="local", id=key,
                     seconds=0.25, settled=True, stages={"prefill": Energy(1.0, "measured", id=None)})
    store.settled([Settled(settled, "ok", 200, 0.0)])
    got = store.lookup(key).energy
    assert got is not None and got.settled and got == parse_record(energy_json(settled))[0]
    assert type(got.joules) is float and got.stages["prefill"].joules == 1.0
    if share:  # and another worker of the server finds the same
        other = RecordStore(share=place, server=one_server())
        assert other.lookup(key).energy == got


@pytest.mark.anyio
async def test_a_process_of_its_own_keeps_every_record_in_memory_and_writes_no_file(
    place: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A single-process server is its whole server: no other process will look a record
    up, so no ring is made; two middlewares of the process still find each other's records
    (in memory), and an id of another process is another server's."""
    from apps import busy_node, drive, fresh

    caplog.set_level(logging.WARNING, logger="giul_asgi")

    dead = place / "records" / "l999.4000000-1"  # a dead server's folder: it still goes
    dead.mkdir(parents=True, mode=0o700)
    (dead / "4000001-1.ring").write_bytes(b"")
    node, _ = busy_node()
    alone = ServerId("p1-1", "own process 1-1", (os.getpid(), process_start(os.getpid())))
    assert alone.alone and not one_server().alone
    stores = [RecordStore(max_records=50, share=place, server=alone) for _ in range(2)]
    apps = [fresh(hello, node, records=store) for store in stores]
    ids = []
    for app in apps:
        sent = await drive(app)
        ids.append(dict(sent[0]["headers"])[b"x-energy-id"].decode())
    for app in apps:
        await app.aclose()
    assert all(s.shared and s.reason is None and s.journal is None for s in stores)
    assert not dead.exists() and not list((place / "records").iterdir())
    assert stores[0].lookup(ids[1]).energy is not None and stores[1].lookup(ids[0]).energy is not None
    foreign = stores[0].lookup("7fff-1-1")
    assert foreign.energy is None and (foreign.reason or "").startswith("unknown id: another server")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_sharing_off_says_so_for_a_process_of_its_own_too(
    place: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hostile review: with GIUL_ASGI_LOAD_DIR=off a single process said records_shared
    # false and shared true. Off is off, for the statistics and the records alike.
    from giul_asgi.stats import EnergyStats, HostStats

    monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", "off")
    store = RecordStore()
    stats = HostStats(EnergyStats())
    try:
        assert not store.shared and store.reason and not stats.shared and stats.shared_reason
    finally:
        stats.close()
        store.close()
