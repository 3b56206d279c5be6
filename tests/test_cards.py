"""The card's table: one process reads a card for every process of the host that draws on it.

Two seats at one table stand for two processes (they are two ledgers: two files, two locks);
real processes (spawned, killed with -9) where the kernel's part matters: the lock freed by a
death, files left behind.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from giul_asgi.config import Node
from giul_asgi.hostshare import card_key
from giul_asgi.hostshare import place as place_module
from giul_asgi.hostshare.cards import SEAT_BYTES, CardTable, SeatBooks, Unusable, ledgers_on
from giul_asgi.hostshare.keys import folder_name
from giul_asgi.hostshare.server import ServerId
from giul_asgi.meter import Meter
from giul_asgi.spans import CardSpan, Coverage, Gap

KEY = "card:test"


def span(t0: float, t1: float, above: float, covered: float, *, members: int = 2, tails: bool = False,
         unseen: float = 0.0, measured: float | None = None, unwatched: bool = False,
         level: float | None = None, quiet: bool = False, doubt_w: float = 0.0) -> CardSpan:
    """A decided span over a 70 W floor (``measured``: before a foreign load was taken off;
    ``level``: a witnessed foreign level, seen lately, subtracted in doubt by ``doubt_w``)."""
    measured = above if measured is None else measured
    return CardSpan(t0, t1, above, measured + 70.0 * (t1 - t0), 0.001, 0.001, measured, tails=tails,
                    covered=covered, members=members, unseen=unseen, foreign_j=measured - above,
                    quiet=quiet, doubt_w=doubt_w, foreign_unc_w=doubt_w, unwatched=unwatched,
                    level=level, level_recent=level is not None)


def books(received: float = 0.0, charged: float = 0.0, forfeit: float = 0.0, in_flight: float = 0.0,
          estimated: float = 0.0, windows: int = 0) -> SeatBooks:
    return SeatBooks(received, charged, forfeit, in_flight, estimated, windows)


def test_one_seat_holds_the_card_and_the_other_takes_its_part(tmp_path: Path) -> None:
    holder, follower = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        assert holder.try_hold() and not follower.try_hold()
        follower.opened(1, 10.0)
        follower.opened(2, 10.5)
        follower.closed(2, 10.8)
        holder.look(force=True)
        coverage = holder.coverages(10.0, 11.0)[follower.name]
        assert coverage.open_s == pytest.approx(1.0 + 0.3) and coverage.open_n == 2
        assert coverage.open_now == 1 and coverage.last_close == -math.inf
        # The holder's own windows covered 0.7 s of the span: the follower's part is 1.3 / 2.0.
        decided = span(10.0, 11.0, 100.0, covered=2.0, members=3)
        holder.publish(decided, {follower.name: coverage}, 0.1)
        taken = follower.pending()
        assert len(taken) == 1 and taken[0][1] == pytest.approx(1.3)
        piece = taken[0][0]
        # as decided, and the floor it was cut above (the holder's node gives none: 0 W)
        assert isinstance(piece, CardSpan) and piece == replace(decided, cut_above_w=0.0)
        assert decided.part(1.3) + decided.part(0.7) == pytest.approx(100.0)  # the card, once
        assert follower.pending() == []  # taken once
    finally:
        holder.close()
        follower.close()


def test_the_holder_counts_the_other_ledgers_windows_in_an_upstreams_count(tmp_path: Path) -> None:
    """Another worker's windows in the server's count: surely those open all through the
    scrape and the count's lag, maybe those that began or ended in it, none ended before."""
    holder, follower = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        assert holder.try_hold()
        follower.opened(1, 10.0)  # open since long before
        follower.opened(2, 10.95)  # began just before the scrape
        follower.opened(3, 10.0)
        follower.closed(3, 10.5)  # ended long before
        holder.look(force=True)
        assert holder.others_open_at(11.0) == (2, [])
        surely, maybe = holder.others_open_at(11.0, spread_s=0.002, lag_s=0.1)
        assert surely == 1 and maybe == [pytest.approx((10.95, 11.002))]
    finally:
        holder.close()
        follower.close()


def test_a_piece_nobody_covered_is_unattributed_and_parts_add_up(tmp_path: Path) -> None:
    holder, follower = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        holder.try_hold()
        holder.look(force=True)
        holder.publish(span(0.0, 1.0, 40.0, covered=0.0, members=0), {}, 0.1)
        holder.publish(span(1.0, 2.0, 60.0, covered=1.0, unseen=1.0, members=1),
                       {follower.name: Coverage(open_s=1.0, open_n=1)}, 0.1)
        assert [mine for _, mine in follower.pending()] == [0.0, 1.0]
        follower.publish_books(books(received=30.0, charged=30.0))
        host = holder.host(books())
        assert host.measured_j == pytest.approx(100.0)
        # 40 J with nobody on the card, and the upstream's unseen load took half of the 60.
        assert host.unattributed_j == pytest.approx(70.0) and host.charged_j == pytest.approx(30.0)
        assert host.workers == 2
        assert follower.host(books(received=30.0, charged=30.0)) == host  # the same from either
    finally:
        holder.close()
        follower.close()


def test_gaps_and_a_change_of_hands_are_published(tmp_path: Path) -> None:
    first, second = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    watcher = CardTable(tmp_path, KEY, "n")
    try:
        assert first.try_hold()
        first.publish(Gap(0.0, 0.5, "no baseline reading yet", fault=False), {}, 0.1)
        first.publish(span(0.5, 1.0, 10.0, covered=0.0), {}, 0.1)
        first.close()  # leaves: the lock is free
        watcher.pending()
        assert second.try_hold()
        second.publish(span(1.4, 1.5, 5.0, covered=0.0), {}, 0.1)
        pieces = [p for p, _ in watcher.pending()]
        assert [type(p).__name__ for p in pieces] == ["Gap", "CardSpan"]
        assert isinstance(pieces[0], Gap) and (pieces[0].t0, pieces[0].t1) == (1.0, 1.4)
        assert "changed hands" in pieces[0].why and pieces[0].fault
    finally:
        for table in (first, second, watcher):
            table.close()


def test_a_departed_ledger_s_books_fold_into_the_card_s_and_never_go_down(tmp_path: Path) -> None:
    holder, gone = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        holder.try_hold()
        holder.look(force=True)
        holder.publish(span(0.0, 1.0, 50.0, covered=1.0, members=1), {gone.name: Coverage(1.0, 1)}, 0.1)
        gone.pending()
        gone.publish_books(books(received=50.0, charged=20.0, in_flight=30.0, estimated=2.0, windows=1))
        before = holder.host(books())
        assert before.charged_j == pytest.approx(20.0) and before.in_flight_j == pytest.approx(30.0)
        gone.close()  # its windows never settle: what was in flight is lost with it
        holder.look(force=True)
        after = holder.host(books())
        assert after.charged_j == pytest.approx(20.0) and after.estimated_j == pytest.approx(2.0)
        assert after.unattributed_j == pytest.approx(30.0) and after.in_flight_j == pytest.approx(0.0)
        assert after.measured_j == before.measured_j and after.workers == 1
        assert ledgers_on(tmp_path, KEY) == [holder.name]  # its file is gone
        holder.look(force=True)
        assert holder.host(books()) == after  # folded once
    finally:
        holder.close()


def test_odd_values_in_a_seat_count_as_nothing_and_a_torn_piece_waits(tmp_path: Path) -> None:
    holder, odd = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        holder.try_hold()
        odd.publish_books(books(received=math.nan, charged=math.inf, windows=1))
        host = holder.host(books(charged=1.0))
        assert host.charged_j == 1.0 and all(math.isfinite(v) for v in
                                              (host.measured_j, host.unattributed_j, host.in_flight_j))
        # A finite number no card draws (a hostile trial's 1e300 stayed in every book for good):
        # nothing, as NaN is, and never shown as the highest any seat showed.
        odd.publish_books(books(received=1e300, charged=1e300, windows=1))
        host = holder.host(books(charged=1.0))
        assert host.charged_j == 1.0 and host.measured_j < 1e15
        assert holder.host(books(charged=1.0)).charged_j == 1.0
        holder.publish(span(0.0, 1.0, 5.0, covered=0.0), {}, 0.1)
        # A byte of the published piece changes under the reader (a torn write): not taken.
        at = 4096 + 20
        holder.tape.mm[at] = holder.tape.mm[at] ^ 0xFF
        assert odd.pending() == []
        holder.tape.mm[at] = holder.tape.mm[at] ^ 0xFF
        assert len(odd.pending()) == 1
    finally:
        holder.close()
        odd.close()


def test_a_damaged_tape_or_a_planted_link_is_refused(tmp_path: Path) -> None:
    table = CardTable(tmp_path, KEY, "n")
    folder = table.folder
    table.close()
    (folder / "tape").write_bytes(b"x" * 4096)
    with pytest.raises(Unusable, match=r"not one of ours|bytes"):
        CardTable(tmp_path, KEY, "n")
    (folder / "tape").unlink()
    os.symlink(tmp_path / "elsewhere", folder / "tape")
    with pytest.raises(Unusable):
        CardTable(tmp_path, KEY, "n")
    assert not (tmp_path / "elsewhere").exists()  # nothing was written through the link


def _hold_and_wait(directory: str, ready: Any, stop: str) -> None:
    table = CardTable(Path(directory), KEY, "n")
    assert table.try_hold()
    table.opened(7, time.monotonic())
    table.publish_books(books(received=9.0, charged=4.0, in_flight=5.0, windows=1))
    ready.set()
    _until_told(stop)


def _until_told(stop: str) -> None:
    """A holder in its own process keeps the card until the test says stop (a minute at most)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.01)


def _kill_and_take_over(proc: Any, me: CardTable, why: str) -> None:
    """Kill the holder with -9; ``me`` must hold the card within ten seconds."""
    os.kill(proc.pid, signal.SIGKILL)
    # Reaped by its pid, not join(): a helper it forked keeps the write end of the process's
    # sentinel open, and join() waited out its whole timeout (20 of the test's 21 s).
    deadline = time.monotonic() + 10
    while proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    deadline = time.monotonic() + 10
    while not me.try_hold():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def test_a_holder_killed_with_minus_9_frees_the_card_and_leaves_its_books(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), tmp_path / "stop"
    proc = ctx.Process(target=_hold_and_wait, args=(str(tmp_path), ready, str(stop)), daemon=True)
    proc.start()
    me = CardTable(tmp_path, KEY, "n")
    try:
        assert ready.wait(60)
        assert not me.try_hold()
        _kill_and_take_over(proc, me, "the kernel frees the lock at once")
        host = me.host(books())
        assert host.charged_j == pytest.approx(4.0)  # what it charged stays counted
        assert host.unattributed_j == pytest.approx(5.0)  # what it had in flight is lost with it
        assert len(ledgers_on(tmp_path, KEY)) == 1  # its seat removed by the new holder
    finally:
        stop.touch()
        proc.join(10)
        me.close()


def _hold_fork_and_wait(directory: str, ready: Any, stop: str, child_pid: str) -> None:
    table = CardTable(Path(directory), KEY, "n")
    assert table.try_hold()
    pid = os.fork()  # an app's helper process (multiprocessing's fork, a daemon it starts)
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    Path(child_pid).write_text(str(pid))
    ready.set()
    _until_told(stop)


def test_a_forked_helper_of_a_killed_holder_does_not_keep_the_card(tmp_path: Path) -> None:
    # A hostile trial: the holder's forked helper kept the lock's descriptor, and after a
    # kill -9 of the holder nobody read the card again (113 of 1,182 requests counted).
    ctx = mp.get_context("spawn")
    ready, stop, child = ctx.Event(), tmp_path / "stop", tmp_path / "child"
    proc = ctx.Process(target=_hold_fork_and_wait, args=(str(tmp_path), ready, str(stop), str(child)),
                       daemon=True)
    proc.start()
    me = CardTable(tmp_path, KEY, "n")
    helper = None
    try:
        assert ready.wait(60)
        helper = int(child.read_text())
        assert not me.try_hold()
        _kill_and_take_over(proc, me, "the forked helper still holds the card")
        assert os.path.exists(f"/proc/{helper}")  # the helper lives on, and holds nothing
    finally:
        stop.touch()
        proc.join(10)
        if helper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(helper, signal.SIGKILL)
        me.close()


def test_a_killed_process_not_yet_reaped_is_dead() -> None:
    """A zombie still answers kill(pid, 0): a worker killed with -9 under a parent slow to
    reap it held its windows open on the card for ever (every later span shared with them)."""
    from giul_asgi.hostshare.rows import alive, process_start

    child = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start(child.pid)
        assert alive(child.pid, start)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(child.pid, start):  # a zombie now: killed, not reaped (no wait() yet)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert Path(f"/proc/{child.pid}").exists()  # still there, as a zombie
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def tiny_place(tmp_path: Path) -> Any:
    """A 64 KB tmpfs: too small for one card's tape (Docker's /dev/shm is 64 MB; a full one
    behaves the same). Needs root to mount."""
    mount = tmp_path / "tiny"
    mount.mkdir(mode=0o700)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=700", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip() or 'not root'})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_place_is_refused_at_join_never_a_crash(tiny_place: Path) -> None:
    with pytest.raises(Unusable, match="No space"):
        CardTable(tiny_place, KEY, "n")


def test_a_ledger_on_a_full_place_says_per_process_loudly(
    tiny_place: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from truecard import TrueCard, TrueReader

    from giul_asgi.ledger import Ledger

    monkeypatch.setattr(place_module, "_logged", set())
    reader = TrueReader(TrueCard())
    reader.card_id = "tiny"  # type: ignore[attr-defined]
    ledger = Ledger(Node("tiny", idle_w=70.0, workers_dir=str(tiny_place)), reader)
    with caplog.at_level(logging.WARNING, logger="giul_asgi.ledger"):
        ledger.ensure_started()
        _until(lambda: ledger._joined and ledger.reader is not None)
        time.sleep(0.05)
    try:
        said = [r for r in caplog.records if "cannot be shared" in r.getMessage()]
        assert len(said) == 1 and "No space" in said[0].getMessage()
        meter = Meter(ledger)
        meter.open()
        meter.close()
        assert "per process" in (meter.figure().error or "")
        assert ledger.host_totals().workers == 1
    finally:
        ledger.stop(1.0)


def _until(ok: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def test_a_ledger_that_cannot_share_says_so_once_and_keeps_its_own_books(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from truecard import TrueCard, TrueReader

    from giul_asgi.ledger import Ledger

    monkeypatch.setattr(place_module, "_logged", set())  # as in a fresh process
    blocker = tmp_path / "file"
    blocker.write_text("")
    ledgers = []
    for i in range(2):
        reader = TrueReader(TrueCard())
        reader.card_id = f"card-{i}"  # type: ignore[attr-defined]
        ledgers.append(Ledger(Node(f"n{i}", idle_w=70.0, workers_dir=str(blocker / "sub")), reader))
    with caplog.at_level(logging.INFO, logger="giul_asgi.hostshare"):
        for ledger in ledgers:
            ledger.ensure_started()
        for ledger in ledgers:
            _until(lambda ledger=ledger: ledger._joined)
    try:
        said = [r for r in caplog.records if "per process" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING and "cannot use" in said[0].getMessage()
        for ledger in ledgers:
            host = ledger.host_totals()
            assert host.workers == 1 and host.charged_j == ledger.totals().charged_j
            # ... and every figure says so (issue 16 item 1): it cannot see other workers.
            meter = Meter(ledger)
            meter.open()
            meter.close()
            assert "per process" in (meter.figure().error or "")
    finally:
        for ledger in ledgers:
            ledger.stop(1.0)


def test_the_table_holds_one_file_per_live_ledger_and_removes_the_departed(tmp_path: Path) -> None:
    holder = CardTable(tmp_path, KEY, "n")
    holder.try_hold()
    seats = [CardTable(tmp_path, KEY, "n") for _ in range(5)]
    try:
        assert len(ledgers_on(tmp_path, KEY)) == 6
        for seat in seats[:4]:
            seat.close()
        holder.look(force=True)
        assert sorted(ledgers_on(tmp_path, KEY)) == sorted([holder.name, seats[4].name])
        files = sorted(p.name for p in holder.folder.iterdir())
        assert files == sorted(["lock", "tape", holder.name, seats[4].name])
        assert (holder.folder / seats[4].name).stat().st_size == SEAT_BYTES
    finally:
        holder.close()
        seats[4].close()


def test_a_seat_of_a_dead_process_is_folded_even_if_it_never_said_goodbye(tmp_path: Path) -> None:
    holder = CardTable(tmp_path, KEY, "n")
    holder.try_hold()
    ghost = CardTable(tmp_path, KEY, "n")
    ghost.publish_books(books(received=3.0, charged=3.0))
    name = ghost.name
    pid_at = 8
    struct.pack_into("<Q", ghost.seat.mm, pid_at, 2**22 + 12345)  # a pid that does not run
    try:
        holder.look(force=True)
        assert name not in ledgers_on(tmp_path, KEY)
        assert holder.host(books()).charged_j == pytest.approx(3.0)
    finally:
        holder.close()


# -- the card's key ----------------------------------------------------------------------------

def test_a_card_is_keyed_by_its_uuids_or_its_name_where_the_reader_says_it() -> None:
    nvml_like = SimpleNamespace(probes=[SimpleNamespace(uuid="GPU-b"), SimpleNamespace(uuid="GPU-a")])
    both = "uuid:GPU-a+GPU-b"
    assert card_key(Node("one"), nvml_like) == card_key(Node("two", gpus=(3,)), nvml_like) == both
    assert card_key(Node("x"), SimpleNamespace(uuids=("GPU-c",))) == "uuid:GPU-c"
    half = SimpleNamespace(probes=[SimpleNamespace(uuid="GPU-a"), SimpleNamespace(uuid=None)])
    assert card_key(Node("x"), half) == card_key(Node("x"), None) == "node:x|auto|gpus=0"
    assert card_key(Node("y", reader="agent", url="http://h:1")) == "node:y|agent|http://h:1"
    # the in-process simulated card: one per node name, settings and server, run by whichever
    # of the server's processes holds it; a server of one process has it to itself (no table)
    workers, other = ServerId("l123", "listener", (1, None)), ServerId("l456", "listener", (2, None))
    sim = card_key(Node("z", reader="simulated"), server=workers)
    assert sim is not None and sim.startswith("node:z|simulated|")
    assert sim == card_key(Node("z", reader="simulated"), server=workers)
    assert card_key(Node("z", reader="simulated", idle_w=90.0), server=workers) != sim
    assert card_key(Node("z", reader="simulated", options={"window_w": 100.0}), server=workers) != sim
    assert card_key(Node("z", reader="simulated"), server=other) != sim  # another server's
    assert card_key(Node("z", reader="simulated"), server=ServerId("p77-1", "own", (77, "1"))) is None
    # a real card is the host's, whichever server reads it
    assert card_key(Node("y", reader="agent", url="http://h:1"), server=workers) == "node:y|agent|http://h:1"
    assert card_key(Node("x"), SimpleNamespace(uuids=("GPU-c",)), server=workers) == "uuid:GPU-c"
    # A reader made in code is shared only where it says which card it reads.
    assert card_key(Node("c"), SimpleNamespace(), custom=True) is None
    assert card_key(Node("c"), SimpleNamespace(card_id="bay-3"), custom=True) == "card:bay-3"


def test_a_card_nobody_reads_any_more_is_removed_when_a_ledger_joins(tmp_path: Path) -> None:
    """A hostile tester's default place grew from 506 to 652 MB in 25 minutes: every card
    named for a port (the demo's) or a fake GPU kept its tape and dead seats for ever."""
    import os
    import time

    from giul_asgi.hostshare import cards

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    old = CardTable(place, "card:gone", "gone")
    old.close()
    gone = place / "cards" / folder_name("card:gone")
    for seat in gone.glob("p-*"):  # its process gone, as after a demo's run
        seat.rename(gone / "p-999999999-1-0")
    held = CardTable(place, "card:held", "held")
    assert held.try_hold()
    stale = time.time() - 2 * cards.FORGET_CARD_S
    for folder in (place / "cards").iterdir():
        os.utime(folder, (stale, stale))
    try:
        assert cards.sweep_cards(place) == 1
        left = sorted(p.name for p in (place / "cards").iterdir())
        assert left == [folder_name("card:held")]  # the one a process holds stays
    finally:
        held.close()
    assert cards.sweep_cards(place) == 0  # closed, but its seat is a live process's (this one)


def test_no_answer_shows_a_counter_below_another_ledger_s_earlier_one_departed_or_not(tmp_path: Path) -> None:
    """Each ledger answers with its own books as they are now and the others' as last
    published: an answer could be below another ledger's just before it. Each counter is
    shown at the highest any ledger showed, a departed one's included."""
    holder, other = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    try:
        holder.try_hold()
        holder.look(force=True)
        other.publish_books(books(received=5.0, charged=5.0))
        ahead = other.host(books(received=9.0, charged=9.0, estimated=1.0))  # its own, fresher
        assert ahead.charged_j == pytest.approx(9.0)
        other.publish_books(books(received=5.0, charged=5.0))  # a stale write of its books
        assert holder.host(books()).charged_j == pytest.approx(9.0)
        other.close()
        holder.look(force=True)  # it departs: its books fold into the tape's, and what it showed
        assert ledgers_on(tmp_path, KEY) == [holder.name]
        after = holder.host(books())
        assert after.charged_j == pytest.approx(9.0) and after.estimated_j == pytest.approx(1.0)
    finally:
        holder.close()
        other.close()


def test_a_ledger_is_ready_once_it_has_had_its_first_turn_at_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The middleware's startup waits (``wait_ready``) until the reader thread has taken its
    first turn at the card's table, not only until the reader is built: a worker joining warm
    ones (gunicorn's recycled worker) then has their rate before its first request. On a
    loaded host the turn came after a 50 ms request had closed, which answered unknown."""
    import anyio
    from truecard import TrueCard, TrueReader

    from giul_asgi.ledger import Ledger
    from giul_asgi.ledger import ledger as ledger_module

    class SlowTable(CardTable):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.3)  # a loaded host's thread start, mmap and first look
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ledger_module, "CardTable", SlowTable)
    reader = TrueReader(TrueCard())
    reader.card_id = "slow-turn"  # type: ignore[attr-defined]
    ledger = Ledger(Node("slow", idle_w=70.0, workers_dir=str(tmp_path)), reader)
    try:
        anyio.run(ledger.wait_ready, 20.0)
        assert ledger.table is not None and ledger.looked
    finally:
        ledger.stop(1.0)


def test_a_cards_folder_that_is_a_link_is_said_per_process_with_its_remedy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # A hostile trial: a link (or another user's folder) at cards/ escaped as a traceback;
    # the figures were this process's alone (1.69x) while /energy said shared, reason null.
    from truecard import TrueCard, TrueReader

    from giul_asgi.ledger import Ledger

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (place / "cards").symlink_to(tmp_path / "elsewhere")
    reader = TrueReader(TrueCard())
    reader.card_id = "linked"  # type: ignore[attr-defined]
    ledger = Ledger(Node("linked", idle_w=70.0, workers_dir=str(place)), reader)
    with caplog.at_level(logging.WARNING, logger="giul_asgi"):
        ledger.ensure_started()
        _until(lambda: ledger._joined)
    try:
        assert ledger.unshared is not None and "per process" in ledger.unshared
        said = [r.getMessage() for r in caplog.records if "cannot be shared" in r.getMessage()]
        assert len(said) == 1 and "remove" in said[0], said
        assert not any(r.exc_info for r in caplog.records)  # one line, no traceback
        assert not list((tmp_path / "elsewhere").iterdir())  # nothing written through the link
    finally:
        ledger.stop(1.0)


def test_a_figure_counts_the_windows_of_every_process_on_the_card_as_in_flight() -> None:
    # Three requests at once on two workers: this book holds one window for the second, the
    # spans say three windows covered the card (a stranger read concurrency 1.0 and 1.98).
    from giul_asgi.energy import Provenance
    from giul_asgi.ledger.book import Book
    from giul_asgi.ledger.window import Window

    book = Book(Provenance("measured", "nvml", "local", 70.0))
    book.take(span(-0.1, 0.0, 0.0, 0.0, members=0), -0.1, 0.0)
    window = book.enter(Window(0.0, 0.0, 1))
    book.take(span(0.0, 0.5, 300.0, 1.5, members=3), 0.5, 0.5)
    book.take(span(0.5, 1.0, 300.0, 1.5, members=3), 1.0, 0.5)
    book.close(window, 1.0)
    first = book.share(window)
    assert first.concurrency == pytest.approx(3.0)
    book.take(span(1.0, 1.1, 0.0, 0.0, members=0), 1.1, 0.0)
    settled = book.share(window)
    assert settled.settled and settled.concurrency == pytest.approx(3.0)
    # The card's draw over the window, all requests together: 300 J of 600 above idle
    # plus idle, whatever this book's share of it.
    assert settled.mean_watts == pytest.approx(600.0 + 70.0)


def test_workers_sweeping_at_once_never_fail_a_join(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four workers starting together swept the same stale folder together: one found it gone
    under it (FileNotFoundError out of its table's join), read the card alone, and the four
    charged it 1.75x (the suite's test_four_workers_on_one_card, once in four runs)."""
    import contextlib
    import os
    import shutil
    import time
    from collections.abc import Iterator

    from giul_asgi.hostshare import cards
    from giul_asgi.hostshare.cards import sweep

    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    CardTable(place, "card:stale", "stale").close()
    stale = place / "cards" / folder_name("card:stale")
    for seat in stale.glob("p-*"):
        seat.rename(stale / "p-999999999-1-0")  # its process gone
    old = time.time() - 2 * cards.FORGET_CARD_S
    os.utime(stale, (old, old))

    @contextlib.contextmanager
    def swept_meanwhile(path: Path) -> Iterator[bool]:
        shutil.rmtree(path.parent)  # another worker's sweep, between our look and our lock
        yield True

    monkeypatch.setattr(sweep, "held_if_free", swept_meanwhile)
    assert cards.sweep_cards(place) == 0  # nothing removed by this one, and no error


def test_a_follower_s_window_before_the_first_witness_waits_then_has_the_foreign_load_taken_off(
    tmp_path: Path,
) -> None:
    """``foreign="subtract"`` on a shared card: the holder decides the spans, the follower's
    book takes them from the table. Spans decided before any foreign level was witnessed
    (``unwatched``) leave the follower's window waiting, past its ramp-down and past the
    first level, until the node has learnt what its windows draw (a window after it); then
    what it drew there at that rate is kept and the rest taken off (as forfeit), and the
    books still add up: received == charged + forfeit + in flight."""
    from giul_asgi.energy import Provenance
    from giul_asgi.ledger.book import Book
    from giul_asgi.ledger.window import Window

    holder, follower = CardTable(tmp_path, KEY, "n"), CardTable(tmp_path, KEY, "n")
    book = Book(Provenance("measured", "nvml_counter", "local", 70.0), subtract_foreign=True)

    def piece(t0: float, above: float, covered: float, *, measured: float | None = None,
              unwatched: bool = False, level: float | None = None) -> CardSpan:
        return span(t0, t0 + 0.2, above, covered, members=1 if covered else 0, measured=measured,
                    unwatched=unwatched, level=level, quiet=level is not None and not covered,
                    doubt_w=6.0 if level is not None else 0.0)

    try:
        assert holder.try_hold()
        window = book.enter(Window(10.0, 0.0))
        book.close(window, 10.4)
        later = book.enter(Window(10.8, 0.0))
        book.close(later, 11.2)
        # The window alone, its 180 W beside 150 W foreign, nobody looked yet (66 J a span);
        # then nobody on the card, too short to believe a level yet (the book before settled
        # the window here, charged 2.3x); then the level, 150 W; then a window after it,
        # shared with the level taken off (36 J of 66), from which the node learns 180 W.
        pieces = [
            (piece(10.0, 66.0, 0.2, unwatched=True), 0.2),
            (piece(10.2, 66.0, 0.2, unwatched=True), 0.2),
            (piece(10.4, 30.0, 0.0, unwatched=True), 0.0),
            (piece(10.6, 30.0, 0.0, level=150.0), 0.0),
            (piece(10.8, 36.0, 0.2, measured=66.0, level=150.0), 0.2),
        ]
        for decided, mine in pieces:
            holder.publish(decided, {}, 0.1)
            ((taken, _),) = follower.pending()
            # the table carries the flag, the level and its doubt (and the holder's floor)
            assert taken == replace(decided, cut_above_w=0.0)
            settled = book.take(taken, decided.t1, mine)
            assert window.settled == (decided is pieces[-1][0]), decided
        assert window in settled
        share = book.share(window)
        assert share.joules == pytest.approx(180.0 * 0.4, rel=0.05)  # its own 180 W x 0.4 s
        assert share.uncertainty >= 0.5 * 150.0 * 0.4  # a node's rate learnt from one window
        totals = book.totals()
        assert totals.received_j == pytest.approx(totals.charged_j + totals.forfeit_j + totals.in_flight_j)
        assert totals.forfeit_j == pytest.approx(132.0 - share.joules)
    finally:
        holder.close()
        follower.close()


def test_a_window_whose_blind_spans_held_load_nobody_here_sees_settles_at_once_charged_whole() -> None:
    """No foreign level is taken off a span that carried load nobody on the host sees (the
    upstream's own requests take their part instead), so a window of such blind spans has
    nothing to wait for: it settles as soon as its end is seen, charged whole, and says so."""
    from giul_asgi.energy import Provenance
    from giul_asgi.ledger.book import Book
    from giul_asgi.ledger.window import Window

    book = Book(Provenance("measured", "nvml_counter", "local", 70.0), subtract_foreign=True)
    window = book.enter(Window(10.0, 0.0))
    book.close(window, 10.2)
    blind = span(10.0, 10.2, 66.0, 0.2, members=1, unseen=0.2, unwatched=True)
    after = span(10.2, 10.4, 0.0, 0.0, members=0, tails=True, unwatched=True)
    assert book.take(blind, 10.2, 0.2) == []
    assert book.take(after, 10.4, 0.0) == [window]  # no level, no rate: nothing to wait for
    share = book.share(window)
    assert share.joules == pytest.approx(33.0)  # its part beside the unseen load's
    assert "charged whole" in (share.error or "")
