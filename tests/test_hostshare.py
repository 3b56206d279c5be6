"""The host's place and its tables: one directory per user, one table per card, rows per process
(real processes where liveness matters)."""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing as mp
import os
import pwd
import re
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from giul_asgi.config import Node
from giul_asgi.errors import ConfigError
from giul_asgi.hostshare import log_unshared, resolve
from giul_asgi.hostshare import place as place_module
from giul_asgi.hostshare.place import make_dir, open_file
from giul_asgi.hostshare.rows import Rows, parse, process_start

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


def test_a_default_directory_opened_to_others_is_made_private_again(tmp_path: Path) -> None:
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


def test_a_read_only_place_is_refused_with_a_remedy_that_can_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A private directory of ours on a read-only mount: chmod 700 (the remedy a hostile
    trial got) cannot help; the remedy says to mount it read-write or to give another."""
    place = tmp_path / "ro"
    place.mkdir(mode=0o700)
    real_access = os.access
    monkeypatch.setattr(place_module.os, "access",
                        lambda p, mode: False if Path(p) == place else real_access(p, mode))
    flags = os.statvfs(tmp_path).f_flag | os.ST_RDONLY
    monkeypatch.setattr(place_module.os, "statvfs", lambda p: type("V", (), {"f_flag": flags})())
    found = resolve(str(place))
    assert found.path is None and "read-only file system" in (found.reason or "")
    assert "mount it read-write" in (found.remedy or "") and "chmod" not in (found.remedy or "")


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


def test_the_environment_s_spellings_of_no_turn_sharing_off_and_a_relative_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stranger's trial: GIUL_ASGI_LOAD_DIR=false (or 0, no, offf) silently made ./false/
    {records,stats} in the server's working directory, and /energy said shared: true."""
    monkeypatch.chdir(tmp_path)
    for off in ("false", "0", "No", "none", " OFF "):
        monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", off)
        place = resolve()
        assert place.path is None and place.off, off
    for near in ("offf", "giul", "./x"):
        monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", near)
        place = resolve()
        assert place.path is None and not place.off, near
        assert place.reason is not None and "not an absolute path" in place.reason
        assert place.remedy is not None and "mkdir -m 700 /" in place.remedy
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="not an absolute path"):
        Node("n", workers_dir="giul")
    # The middleware's build refuses them (test_startup: under a real uvicorn).
    from giul_asgi.hostshare import place

    for value, meant in (("offf", "did you mean GIUL_ASGI_LOAD_DIR=off?"), ("./x", "give an absolute")):
        with pytest.raises(ConfigError, match=re.escape(meant)):
            place.check_environment({"GIUL_ASGI_LOAD_DIR": value})
    for fine in ("", "off", " No ", str(tmp_path)):
        place.check_environment({"GIUL_ASGI_LOAD_DIR": fine})


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


# -- the place is private: what is not is refused, with the remedy (issue 20 item 5) ----------

def _nobody() -> int:
    """The uid of a user who is not us (tests run as root here: we can chown to them)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory or file to another user (chown)")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_explicit_directory_others_may_write_is_refused_not_chmodded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(place_module, "_logged", set())  # as in a fresh process
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    found = resolve(open_dir)
    assert found.path is None and "others may write in it (mode 0777)" in (found.reason or "")
    assert found.remedy == (f"give it a directory of its own (mkdir -m 700 {open_dir}/giul-asgi; "
                            f"GIUL_ASGI_LOAD_DIR={open_dir}/giul-asgi), or chmod 700 {open_dir} "
                            "if nothing else uses it")
    assert _mode(open_dir) == 0o777  # the operator's directory: never chmod-ed behind their back
    readable = tmp_path / "readable"
    readable.mkdir(mode=0o755)
    os.chmod(readable, 0o755)
    found = resolve(str(readable))
    assert "others may read it (mode 0755)" in (found.reason or "")
    remedy = found.remedy or ""
    assert remedy.startswith("give it a directory of its own") and f"chmod 700 {readable}" in remedy
    assert _mode(readable) == 0o755
    with caplog.at_level(logging.INFO, logger="giul_asgi.hostshare"):
        log_unshared(resolve(open_dir))
    line = next(r for r in caplog.records if "per process" in r.getMessage())
    assert line.levelno == logging.WARNING
    assert f"cannot use {open_dir}" in line.getMessage() and f"chmod 700 {open_dir}" in line.getMessage()
    os.chmod(open_dir, 0o700)  # the remedy works
    assert resolve(open_dir).path == open_dir


@pytest.mark.parametrize("shared", [tempfile.gettempdir(), "/dev/shm"])
def test_the_system_temp_dir_or_shared_memory_itself_is_refused_with_a_subdirectory_remedy(
    shared: str,
) -> None:
    if not os.path.isdir(shared):
        pytest.skip(f"{shared} does not exist here")
    before = _mode(Path(shared))
    found = resolve(shared)
    assert found.path is None and "a directory every user may write in" in (found.reason or "")
    assert found.remedy is not None and f"mkdir -m 700 {shared}/giul-asgi" in found.remedy
    assert f"GIUL_ASGI_LOAD_DIR={shared}/giul-asgi" in found.remedy
    assert _mode(Path(shared)) == before


def test_another_users_directory_is_refused_explicit_or_default(tmp_path: Path) -> None:
    nobody = _nobody()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, nobody, nobody)
    found = resolve(theirs)
    assert found.path is None and f"belongs to another user (uid {nobody}" in (found.reason or "")
    assert found.remedy is not None and "mkdir -m 700" in found.remedy
    mine = tmp_path / "mine"
    default = resolve(candidates=[theirs, mine])
    assert default.path == mine  # a squatted default: the next one, said in a warning


def test_a_default_place_opened_by_hand_is_made_private_again_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(place_module, "_logged", set())
    where = tmp_path / "giul-asgi-default"
    where.mkdir()
    os.chmod(where, 0o777)
    with caplog.at_level(logging.WARNING, logger="giul_asgi.hostshare"):
        assert resolve(candidates=[where]).path == where
    assert _mode(where) == 0o700
    assert any("made private again" in r.getMessage() for r in caplog.records)


def test_a_symlinked_place_is_refused_explicit_or_default(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    found = resolve(link)
    assert found.path is None and "symbolic link" in (found.reason or "")
    assert "not a link" in (found.remedy or "")
    assert resolve(candidates=[link]).path is None


def test_a_place_under_a_directory_others_may_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    # Others could rename our private directory away and put theirs (or a link) in its place.
    lax = tmp_path / "lax"
    lax.mkdir()
    os.chmod(lax, 0o777)
    found = resolve(lax / "giul")
    assert found.path is None and "without the sticky bit" in (found.reason or "")
    assert f"chmod go-w {lax}" in (found.remedy or "")
    assert not (lax / "giul").exists()  # refused before anything was made in it
    os.chmod(lax, 0o1777)  # sticky, as /tmp: others cannot rename what is ours
    assert resolve(lax / "giul").path == lax / "giul" and _mode(lax / "giul") == 0o700


def test_a_place_made_for_the_operator_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)  # a umask that would leave the owner unable to write
    try:
        made = resolve(tmp_path / "a" / "b" / "giul")
    finally:
        os.umask(old)
    assert made.path == tmp_path / "a" / "b" / "giul" and _mode(made.path) == 0o700


def test_a_subfolder_of_another_user_or_a_link_is_refused_at_every_level(tmp_path: Path) -> None:
    nobody = _nobody()
    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    (place / "stats").mkdir(mode=0o700)
    os.chown(place / "stats", nobody, nobody)
    with pytest.raises(PermissionError, match="another user"):
        Rows(place / "stats")
    (place / "cards").mkdir(mode=0o700)
    os.chown(place / "cards", nobody, nobody)  # the folder above a card's: checked too
    with pytest.raises(PermissionError, match="another user"):
        Rows(place / "cards" / "uuid-GPU-1")
    with pytest.raises(PermissionError, match="another user"):
        make_dir(place / "cards" / "uuid-GPU-2", root=place)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (place / "records").symlink_to(elsewhere)
    with pytest.raises(NotADirectoryError, match="symbolic link"):
        Rows(place / "records")
    assert not list(elsewhere.iterdir())


def test_a_subfolder_opened_by_hand_is_private_again_only_inside_a_private_folder(tmp_path: Path) -> None:
    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    (place / "stats").mkdir()
    os.chmod(place / "stats", 0o777)
    make_dir(place / "stats")
    assert _mode(place / "stats") == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    (shared / "stats").mkdir()
    os.chmod(shared / "stats", 0o755)
    with pytest.raises(PermissionError, match="chmod 700"):
        make_dir(shared / "stats")  # outside a private folder: the operator's to fix
    assert _mode(shared / "stats") == 0o755


def test_open_file_refuses_a_link_a_fifo_a_hard_link_and_another_users_file(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    link = tmp_path / "row.json"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symbolic link") as caught:
        open_file(link, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert caught.value.errno == errno.ELOOP
    hard = tmp_path / "hard.json"
    os.link(target, hard)
    with pytest.raises(PermissionError, match="hard link"):
        open_file(hard, os.O_WRONLY | os.O_TRUNC)
    assert target.read_bytes() == b"keep me"  # refused before anything was truncated
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | int] = []
    opener = threading.Thread(target=lambda: outcome.append(_try(lambda: open_file(fifo, os.O_RDONLY))),
                              daemon=True)
    opener.start()
    opener.join(10)
    assert not opener.is_alive(), "opening a planted FIFO blocked"
    assert isinstance(outcome[0], PermissionError) and "not a regular file" in str(outcome[0])
    fd = open_file(tmp_path / "mine.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        assert os.get_blocking(fd) and os.get_inheritable(fd) is False
        assert _mode(tmp_path / "mine.json") == 0o600
    finally:
        os.close(fd)


def _try(call: Any) -> BaseException | int:
    try:
        fd = call()
    except BaseException as exc:
        return exc
    os.close(fd)
    return fd


def test_open_file_never_truncates_another_users_file(tmp_path: Path) -> None:
    nobody = _nobody()
    theirs = tmp_path / "records.jsonl"
    theirs.write_bytes(b"their lines\n")
    os.chown(theirs, nobody, nobody)
    with pytest.raises(PermissionError, match=f"another user \\(uid {nobody}\\)"):
        open_file(theirs, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    assert theirs.read_bytes() == b"their lines\n"


def test_a_row_planted_by_another_user_is_never_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    nobody = _nobody()
    me = Rows(tmp_path / "stats")
    planted = me.folder / f"{os.getppid()}-{process_start(os.getppid())}-x.json"  # a live pid
    planted.write_text(json.dumps({"t": time.monotonic(), "integral": 1000.0, "open": 1}))
    os.chown(planted, nobody, nobody)
    link = me.folder / f"{os.getpid()}-{process_start(os.getpid())}-link.json"
    link.symlink_to(planted)
    with caplog.at_level(logging.WARNING, logger="giul_asgi.hostshare"):
        assert me.others() == []
    assert any("never read" in r.getMessage() for r in caplog.records)
    me.close()


def test_a_seat_planted_by_another_user_at_a_card_s_table_is_never_counted(tmp_path: Path) -> None:
    from giul_asgi.hostshare.cards import SEAT_BYTES, CardTable, SeatBooks

    nobody = _nobody()
    me = CardTable(tmp_path, "card:x", "n")
    try:
        assert me.try_hold()
        planted = me.folder / f"p-{os.getppid()}-{process_start(os.getppid())}-9"  # a live pid
        planted.write_bytes((me.folder / me.name).read_bytes()[:SEAT_BYTES])
        os.chown(planted, nobody, nobody)
        other = CardTable(tmp_path, "card:x", "n")
        other.publish_books(SeatBooks(0.0, 99_999.0, 0.0, 0.0, 0.0, 1))
        os.chown(me.folder / other.name, nobody, nobody)  # its seat, now another user's
        me.look(force=True)
        host = me.host(SeatBooks(0.0, 1.0, 0.0, 0.0, 0.0, 0))
        assert host.charged_j == 1.0 and host.workers == 1
        other.close()
    finally:
        me.close()


def test_a_row_is_written_through_a_temporary_file_of_ours_and_a_planted_link_is_replaced(
    tmp_path: Path,
) -> None:
    rows = Rows(tmp_path / "stats")
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    rows.path.symlink_to(target)  # a link where our row goes
    rows.write(b"row")
    assert target.read_bytes() == b"keep me" and not rows.path.is_symlink()
    assert rows.path.read_bytes() == b"row" and _mode(rows.path) == 0o600
    assert [p.name for p in rows.folder.iterdir()] == [rows.name]  # no temporary file left


def test_stale_temporary_files_of_killed_writers_are_removed(tmp_path: Path, ctx: Any) -> None:
    rows = Rows(tmp_path / "stats")
    dead = ctx.Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join(30)
    assert dead.pid is not None
    killed = rows.folder / f".tmp-{dead.pid}-1-abcd1234"  # a writer killed between its two steps
    killed.write_bytes(b"half")
    old = rows.folder / ".tmp-k3j4h5"  # an unnamed one (mkstemp's), an hour old
    old.write_bytes(b"old")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    live = rows.folder / f".tmp-{rows.name.removesuffix('.json')}-beef0000"  # ours, being written
    live.write_bytes(b"now")
    young = rows.folder / ".tmp-q9w8e7"  # an unnamed one, just made: maybe a live writer's
    young.write_bytes(b"young")
    assert rows.remove_dead(0.0) == 0
    assert sorted(p.name for p in rows.folder.iterdir()) == sorted([live.name, young.name])
    again = Rows(tmp_path / "stats")  # a fresh start removes them too
    os.utime(young, (time.time() - 3600, time.time() - 3600))
    assert again.remove_stale_tmp() == 1 and live.exists()


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

def test_a_record_store_without_a_place_keeps_to_itself(tmp_path: Path) -> None:
    from giul_asgi.energy import Energy
    from giul_asgi.records import RecordStore

    store = RecordStore(share="off")
    assert not store.shared
    store.put(Energy(1.0, "measured", id="r1"))
    assert store.get("r1") is not None and store.get("r2") is None
    with pytest.raises(ConfigError):
        RecordStore(max_records=True)  # type: ignore[arg-type]


def one_server(pid: int) -> Any:
    """One server for a test's processes (they inherit no listener: each would be its own)."""
    from giul_asgi.hostshare.server import ServerId

    return ServerId("ltest", "the test's", (pid, process_start(pid)))


def keep_records(directory: str, ready: Any, stop: str) -> None:
    from giul_asgi.energy import Energy
    from giul_asgi.listeners import Settled
    from giul_asgi.records import RecordStore

    store = RecordStore(share=directory, server=one_server(os.getppid()))
    stage = Energy(0.5, "measured", node="gpu0")
    store.put(Energy(1.0, "measured", node="gpu0", settled=False, id="first-only"))
    store.put(Energy(2.0, "measured", node="gpu0", settled=False, id="then-settled"))
    store.settled([Settled(Energy(2.5, "measured", node="gpu0", stages={"prefill": stage},
                                  id="then-settled"))])
    deadline = time.monotonic() + 30
    assert store.wait_ready(30) and store.shared  # written in place: nothing waits
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
        store = RecordStore(share=tmp_path, server=one_server(os.getpid()))
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


def test_a_process_in_a_pid_namespace_of_its_own_shares_through_its_namespace_s_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows and seats are named by process ids and judged alive in the reader's own PID
    namespace: two containers over one /dev/shm removed each other's (a hostile trial). A
    process outside the host's first namespace shares through its namespace's folder."""
    monkeypatch.setattr(place_module, "pid_namespace", lambda: place_module.INIT_PID_NAMESPACE)
    assert resolve(str(tmp_path)).path == tmp_path
    monkeypatch.setattr(place_module, "pid_namespace", lambda: 4026532999)
    inner = resolve(str(tmp_path)).path
    assert inner == tmp_path / "pidns-4026532999"
    assert stat.S_IMODE(os.stat(inner).st_mode) == 0o700
    monkeypatch.setattr(place_module, "pid_namespace", lambda: 4026533000)
    assert resolve(str(tmp_path)).path == tmp_path / "pidns-4026533000"
    (tmp_path / "pidns-4026533001").symlink_to(tmp_path / "pidns-4026532999")  # planted: refused
    monkeypatch.setattr(place_module, "pid_namespace", lambda: 4026533001)
    planted = resolve(str(tmp_path))
    assert planted.path is None and "pidns-4026533001" in (planted.reason or "")


def test_rings_and_tails_are_sized_by_the_place_s_room() -> None:
    """Docker's /dev/shm is 64 MB: 4 MiB rings, 1 MiB tails and a seat each filled it at about
    a dozen workers (a hostile trial: 19 MB for four), and every worker then charged the card
    whole. On a small place each process's files are a share of its room; on a large one, as
    before."""
    from giul_asgi.hostshare.journal import JOURNAL_BYTES, ring_bytes
    from giul_asgi.hostshare.place import room
    from giul_asgi.stats.tail import AREA, tail_area

    mb = 1 << 20
    assert ring_bytes(10_000) == JOURNAL_BYTES == ring_bytes(10_000, 16 << 30)
    assert ring_bytes(10_000, 64 * mb) == 1 * mb and ring_bytes(10_000, 8 * mb) == 256 * 1024
    assert ring_bytes(10, 64 * mb) == 64 * 1024  # a small store keeps its own small ring
    assert tail_area(AREA, None) == AREA == tail_area(AREA, 16 << 30)
    assert tail_area(AREA, 64 * mb) == 256 * 1024
    # What a worker's files come to on Docker's default: 28 workers fit in 64 MB (with the card
    # tape, the fold ring and the rows).
    per_worker = ring_bytes(10_000, 64 * mb) + 2 * tail_area(AREA, 64 * mb) + 452 * 1024
    assert 28 * per_worker + 4 * mb < 64 * mb
    assert (room(Path("/")) or 0) > 0


def long_ago(folder: Path) -> None:
    """A free lease last stamped longer ago than the grace (its processes gone that long)."""
    old = time.time() - place_module.GRACE_S - 1
    os.utime(folder / place_module.LEASE, (old, old))


NAMESPACE_CHILD = """
import sys
from pathlib import Path
from giul_asgi.hostshare import place
place.pid_namespace = lambda: int(sys.argv[2])  # a container's processes, as their /proc says
folder = place.resolve(sys.argv[1]).path
(folder / "stats").mkdir(exist_ok=True)
(folder / "stats" / f"row-{place.os.getpid()}.json").write_bytes(b"x" * 4096)
print(folder, flush=True)
sys.stdin.readline()  # serving, until the test lets go (or kills it)
"""


def test_a_pid_namespace_s_folder_goes_once_its_last_process_has_ended(tmp_path: Path) -> None:
    """No process can tell whether another namespace's processes run, so a restarted
    container's folder was never removed: six container restarts filled a 64 MB /dev/shm (a
    hostile trial). Each process of a namespace holds its folder's lease; once none does, the
    next process to look removes the folder, and one still held, or with no lease, is left
    alone."""
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def container(ns: int) -> tuple[subprocess.Popen[str], Path]:
        proc = subprocess.Popen([sys.executable, "-c", NAMESPACE_CHILD, str(tmp_path), str(ns)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        return proc, Path(proc.stdout.readline().strip())

    (a, folder_a), (b, folder_b) = container(4026532001), container(4026532002)
    c, folder_c = container(4026532002)  # a second process of b's container
    d = c
    assert folder_a == tmp_path / "pidns-4026532001" and folder_b == folder_c
    legacy = tmp_path / "pidns-4026532003"  # no lease: one being made, or a former version's
    legacy.mkdir(mode=0o700)
    try:
        assert place_module.sweep_namespaces(tmp_path) == 0  # all held, the legacy one young
        a.kill()
        a.wait(10)
        b.kill()
        b.wait(10)
        os.utime(legacy, (time.time() - 3600, time.time() - 3600))
        # a's lease is free but was stamped just now: its only worker may be being replaced
        assert place_module.sweep_namespaces(tmp_path) == 0
        long_ago(folder_a)
        assert place_module.sweep_namespaces(tmp_path) == 1  # a's; the lease-less one may be in use
        assert sorted(os.listdir(tmp_path)) == ["pidns-4026532002", "pidns-4026532003"]  # c holds b's
        c.send_signal(signal.SIGTERM)
        c.wait(10)
        long_ago(folder_b)
        d, folder_d = container(4026532002)  # the container restarted: a folder anew, held
        assert folder_d == folder_b and place_module.sweep_namespaces(tmp_path) == 0
        d.kill()
        d.wait(10)
        long_ago(folder_d)
        assert place_module.sweep_namespaces(tmp_path) == 1 and os.listdir(tmp_path) == [legacy.name]
    finally:
        for proc in (a, b, c, d):
            proc.kill()
            proc.wait(10)
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.stdout is not None:
                proc.stdout.close()


def test_a_sweep_half_done_is_finished_and_a_lease_swept_under_a_joiner_is_made_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    half = tmp_path / ".gone-pidns-4026532005-0a1b2c3d"  # a sweeper killed while removing it
    (half / "stats").mkdir(parents=True, mode=0o700)
    os.utime(half, (time.time() - 3600, time.time() - 3600))
    assert place_module.sweep_namespaces(tmp_path) == 1 and not half.exists()
    # a joiner whose folder is renamed away between its open and its lock makes it anew
    real_flock = place_module.fcntl.flock
    swept: list[Path] = []

    def flock(fd: int, op: int) -> None:
        if op == place_module.fcntl.LOCK_SH and not swept:
            gone = tmp_path / ".gone-x"
            os.rename(tmp_path / "pidns-4026532006", gone)
            swept.append(gone)
        real_flock(fd, op)

    monkeypatch.setattr(place_module.fcntl, "flock", flock)
    monkeypatch.setattr(place_module, "pid_namespace", lambda: 4026532006)
    got = resolve(str(tmp_path))
    assert got.path == tmp_path / "pidns-4026532006" and (got.path / place_module.LEASE).exists()
    assert swept and os.stat(got.path / place_module.LEASE).st_ino != os.stat(swept[0] / ".lease").st_ino


def test_restarted_containers_leave_one_folder_in_real_pid_namespaces(tmp_path: Path) -> None:
    """The same with the kernel's namespaces (``unshare -p``: root, or skipped): each restart
    removes the last one's folder, and a process of the host's namespace removes the last."""
    import shutil as sh
    import subprocess
    import sys

    unshare = sh.which("unshare")
    if unshare is None or subprocess.run([unshare, "-p", "-f", "--mount-proc", "true"],
                                         capture_output=True, check=False).returncode != 0:
        pytest.skip("no PID namespaces here (unshare -p needs root)")
    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "GIUL_ASGI_LOAD_DIR": str(place)}
    script = ("from giul_asgi.hostshare import resolve; p = resolve().path; "
              "(p / 'row').write_bytes(b'x'); print(p)")
    seen = []
    for _ in range(3):
        run = subprocess.run([unshare, "-p", "-f", "--mount-proc", sys.executable, "-c", script], env=env,
                             capture_output=True, text=True, check=True, timeout=60)
        seen.append(Path(run.stdout.strip()).name)
        assert os.listdir(place) == [seen[-1]], (seen, os.listdir(place))
        long_ago(place / seen[-1])  # the grace passed since it ended
    assert all(name.startswith("pidns-") for name in seen)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60, capture_output=True)
    assert os.listdir(place) == ["row"]


def test_a_held_lease_is_stamped_while_its_process_lives(tmp_path: Path) -> None:
    """The grace counts from the last stamp: a holder renews it, so a namespace whose only
    worker is being replaced is never older than one stamp when the next joins."""
    import subprocess
    import sys

    script = (
        "import os, sys, time\n"
        "from giul_asgi.hostshare import place\n"
        "place.STAMP_EVERY_S = 0.1\n"
        "place.pid_namespace = lambda: 4026532010\n"
        "lease = place.resolve(sys.argv[1]).path / place.LEASE\n"
        "os.utime(lease, (time.time() - 3600, time.time() - 3600))\n"
        "time.sleep(0.6)\n"
        "print(time.time() - os.stat(lease).st_mtime)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert float(run.stdout) < 10.0, run.stdout  # stamped an hour back, renewed since


def _lap_the_ring(path: str, seconds: float) -> None:
    from giul_asgi.hostshare.ring import Ring

    ring = Ring.open(Path(path), writable=True)
    row = ring.row("lap-1-")
    end, counter = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        counter += 1
        now = time.monotonic()
        ring.append(f"lap-1-{counter:x}".encode(), b"x" * (32 * (1 + counter % 16)), now, counter, row, now)
    ring.close()


def test_a_reader_never_takes_a_cursor_half_moved_by_a_writer_in_another_process(tmp_path: Path) -> None:
    # struct's pack_into and unpack_from move a cursor byte by byte: a reader beside a writer
    # lapping a 4 KiB ring took one half moved (an 8 KiB copy) 1-6 times in 3-4 s, raising
    # struct.error out of entries(), and counted up to 448 units of false damage (a hostile
    # review). The cursors are one 8-byte copy each way now.
    from giul_asgi.hostshare.ring import Ring

    path = tmp_path / "ring"
    Ring.create(path, None, 4096, 600.0).close()
    writer = mp.get_context("spawn").Process(target=_lap_the_ring, args=(str(path), 2.5))
    writer.start()
    ring = Ring.open(path)
    errors, reads = [], 0
    try:
        while writer.is_alive() or reads == 0:
            try:
                entries, _, _ = ring.entries(0)
                reads += 1
                assert all(e.data == b"x" * (32 * (1 + e.counter % 16)) for e in entries)
            except struct.error as exc:
                errors.append(exc)
    finally:
        writer.join(30)
    assert reads > 100 and not errors and ring.damaged == 0, (reads, errors[:3], ring.damaged)
