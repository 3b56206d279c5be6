"""The host's place and its tables: one directory per user, one table per card, rows per process
(real processes where liveness matters)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from giul_asgi.config import Node
from giul_asgi.errors import ConfigError
from giul_asgi.hostshare import log_unshared, resolve
from giul_asgi.hostshare import place as place_module
from giul_asgi.hostshare.journal import Journal
from giul_asgi.hostshare.rows import Rows, parse

# -- the place ------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """As deployed: nothing set (conftest gives the session a place of its own)."""
    monkeypatch.delenv("GIUL_ASGI_LOAD_DIR", raising=False)


def test_the_first_process_creates_a_private_directory_and_later_ones_join_it(tmp_path: Path) -> None:
    where = tmp_path / "giul-asgi-test"
    first = resolve(candidates=[where])
    assert first.shared and first.path == where
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    (where / "mark").write_text("x")
    assert resolve(candidates=[where]).path == where and (where / "mark").exists()


def test_a_directory_opened_to_others_is_made_private_again(tmp_path: Path) -> None:
    where = tmp_path / "open"
    where.mkdir(mode=0o777)
    os.chmod(where, 0o777)
    assert resolve(candidates=[where]).path == where
    assert stat.S_IMODE(where.stat().st_mode) == 0o700


def test_another_users_directory_is_refused_and_the_next_place_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs, mine = tmp_path / "theirs", tmp_path / "mine"
    theirs.mkdir(mode=0o700)
    owner = theirs.stat().st_uid
    with monkeypatch.context() as m:
        m.setattr(place_module.os, "getuid", lambda: owner + 1)  # we are someone else now
        found = resolve(candidates=[theirs, mine])
    assert found.path is None and "another user" in (found.reason or "")
    assert resolve(candidates=[theirs, mine]).path == theirs


def test_a_symbolic_link_or_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    blocker = tmp_path / "file"
    blocker.write_text("")
    found = resolve(candidates=[link, blocker, blocker / "below"])
    assert found.path is None
    assert "symbolic link" in (found.reason or "") and "not a directory" in (found.reason or "")


def test_the_default_is_shared_memory_then_the_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    places = place_module.default_candidates()
    assert places[0] == Path(f"/dev/shm/giul-asgi-{os.getuid()}")
    assert places[1] == Path("/run/user/1234/giul-asgi")
    assert places[2].name == f"giul-asgi-{os.getuid()}"


def test_one_setting_moves_or_disables_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", str(tmp_path / "env"))
    assert resolve().path == tmp_path / "env"
    assert resolve(tmp_path / "given").path == tmp_path / "given"  # the node's wins
    for off in ("off", "OFF", False):
        assert resolve(off).path is None and resolve(off).off
    monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", "off")
    assert resolve().path is None
    assert resolve(str(tmp_path / "given")).path == tmp_path / "given"


def test_a_bad_setting_fails_loudly_when_the_node_is_built() -> None:
    with pytest.raises(ConfigError, match="workers_dir"):
        Node("n", workers_dir=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="empty"):
        Node("n", workers_dir=" ")
    assert Node("n", workers_dir=False).workers_dir is False
    assert Node("n", workers_dir="off").workers_dir == "off"


def test_a_place_that_cannot_work_says_why_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(place_module, "_logged", set())  # as in a fresh process
    blocker = tmp_path / "file"
    blocker.write_text("")
    found = resolve(blocker / "sub")
    assert found.path is None and "cannot use" in (found.reason or "")
    with caplog.at_level(logging.INFO, logger="giul_asgi.hostshare"):
        log_unshared(found)
        log_unshared(found)
        log_unshared(resolve("off"))
    lines = [r for r in caplog.records if "per process" in r.getMessage()]
    assert len(lines) == 2 and lines[0].levelno == logging.WARNING and lines[1].levelno == logging.INFO


# -- rows, with real processes ------------------------------------------

@pytest.fixture
def ctx() -> Any:
    return mp.get_context("spawn")


def test_row_names(tmp_path: Path) -> None:
    assert parse("12-345-ab.json", ".json") == (12, "345")
    assert parse("12-x.json", ".json") == (12, None)
    for bad in ("abc-1.json", ".tmp-12-3.json", "12.json", "12-3.txt"):
        assert parse(bad, ".json") is None
    rows = Rows(tmp_path / "deep" / "folder")
    rows.write(b"one")
    rows.write(b"two")
    assert rows.path.read_bytes() == b"two" and [p.name for p in rows.folder.iterdir()] == [rows.name]


# -- records, journal ------------------------------------------------------------------------

def js(record: dict) -> bytes:
    return json.dumps(record).encode()


def test_a_journal_finds_another_writers_latest_line_and_forgets_old_ones(tmp_path: Path) -> None:
    now = [1000.0]
    theirs = Journal(tmp_path, max_lines=4, max_age_s=60.0, clock=lambda: now[0])
    mine = Journal(tmp_path, max_lines=4, max_age_s=60.0, clock=lambda: now[0])
    # another process: same folder, another row name
    theirs.rows.path = theirs.rows.path.with_name("1-1.jsonl")
    theirs.old = theirs.rows.path.with_name("1-1-old.jsonl")
    theirs.append([("a", js({"joules": 1.0})), ("b", js({"joules": 2.0}))])
    assert mine.find("a") == {"joules": 1.0} and mine.find("zz") is None
    theirs.append([("a", js({"joules": 1.5, "settled": True}))])
    assert mine.find("a") == {"joules": 1.5, "settled": True}
    theirs.append([("c", js({"joules": 3.0})), ("d\tbad", js({}))])  # 4 lines: a new generation
    theirs.append([("e", js({"joules": 5.0}))])
    assert {k: (mine.find(k) or {}).get("joules") for k in "abce"} == {"a": 1.5, "b": 2.0, "c": 3.0, "e": 5.0}
    theirs.append([(k, js({"joules": 0.0})) for k in "fgh"])  # and another: a and b are gone
    assert mine.find("a") is None and mine.find("h") == {"joules": 0.0}
    now[0] += 61.0
    assert mine.find("h") is None  # too old to answer
    with (tmp_path / "records" / "1-1.jsonl").open("ab") as fh:
        fh.write(b"i\t2000.0\t{half a li")  # being written: read next time
    assert mine.find("i") is None


def test_a_record_store_without_a_place_keeps_to_itself(tmp_path: Path) -> None:
    from giul_asgi.energy import Energy
    from giul_asgi.records import RecordStore

    store = RecordStore(share="off")
    assert not store.shared
    store.put(Energy(1.0, "measured", id="r1"))
    assert store.get("r1") is not None and store.get("r2") is None
    with pytest.raises(ConfigError):
        RecordStore(max_records=True)  # type: ignore[arg-type]


def keep_records(directory: str, ready: Any, stop: str) -> None:
    from giul_asgi.energy import Energy
    from giul_asgi.listeners import Settled
    from giul_asgi.records import RecordStore

    store = RecordStore(share=directory)
    stage = Energy(0.5, "measured", node="gpu0")
    store.put(Energy(1.0, "measured", node="gpu0", settled=False, id="first-only"))
    store.put(Energy(2.0, "measured", node="gpu0", settled=False, id="then-settled"))
    store.settled([Settled(Energy(2.5, "measured", node="gpu0", stages={"prefill": stage},
                                  id="then-settled"))])
    deadline = time.monotonic() + 30
    while store._queue and time.monotonic() < deadline:  # the writer thread's batch
        time.sleep(0.01)
    ready.set()
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_record_kept_by_one_process_is_found_by_another(ctx: Any, tmp_path: Path) -> None:
    from giul_asgi.records import RecordStore

    ready, stop = ctx.Event(), tmp_path / "stop"
    proc = ctx.Process(target=keep_records, args=(str(tmp_path), ready, str(stop)), daemon=True)
    proc.start()
    try:
        assert ready.wait(60)
        store = RecordStore(share=tmp_path)
        assert store.shared
        first = store.get("first-only")
        assert first is not None and first.joules == 1.0 and first.settled is False
        settled = store.get("then-settled")
        assert settled is not None and settled.joules == 2.5 and settled.settled is True
        assert settled.stages["prefill"].joules == 0.5
        assert store.get("nobody") is None and len(store) == 0  # found there, kept there
    finally:
        stop.touch()
        proc.join(10)
