"""The reader thread: its pace (busy, lingering, dozing, woken), and the health it reports.

These run real threads on the real clock. Every wait is for an event with a generous bound,
and every count is an upper bound on what an idle thread may do (a loaded machine only
reads less), so they hold on a busy 2-core machine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Literal

import pytest

from giul_asgi.config import Node
from giul_asgi.errors import ReaderUnavailable
from giul_asgi.ledger import Ledger
from giul_asgi.ledger.poller import Poller
from giul_asgi.listeners import Listeners
from giul_asgi.meter import Meter
from giul_asgi.readers.base import Kind, Process, Reader, Reading

WAIT_S = 20.0  # the bound on any wait for something that should happen at once


class Counter:
    """A counter reader that counts its reads and lets a test wait for the next one."""

    backend = "test_counter"
    source = "local"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "counter"
    remedy = "plug the test card back in"

    def __init__(self, period: float = 0.05, fail: bool = False) -> None:
        self.period = period
        self.clock = time.monotonic
        self.fail = fail
        self.reads = 0
        self.read_event = threading.Event()
        self.joules = 1000.0

    def read(self) -> Reading:
        self.reads += 1
        self.read_event.set()
        self.joules += 0.5
        if self.fail:
            return Reading(t=self.clock(), error="the test card is unplugged")
        return Reading(t=self.clock(), joules=self.joules)

    def close(self) -> None:
        return None


class Sink:
    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self.failure: BaseException | None = None
        self.attached = threading.Event()

    def attach(self, reader: Reader) -> None:
        self.attached.set()

    def reads_card(self) -> bool:
        return True

    def card_state(self) -> tuple[str, str | None]:
        return "ok", None

    def failed(self, error: BaseException) -> None:
        self.failure = error
        self.attached.set()

    def ingest(self, reading: Reading) -> None:
        self.readings.append(reading)

    def note_processes(self, processes: list[Process] | None) -> None:
        return None

    def next_step(self) -> tuple[float, float, float] | None:
        return None

    def deliver(self, budget_s: float) -> None:
        return None


def _until(predicate: object, bound: float = WAIT_S) -> bool:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _next_read(reader: Counter, bound: float = WAIT_S) -> bool:
    reader.read_event.clear()
    return reader.read_event.wait(bound)


def test_an_idle_node_dozes_and_a_wake_reads_at_once() -> None:
    reader, busy = Counter(), threading.Event()
    poller = Poller("n", lambda: reader, Sink(), busy=busy.is_set, idle_s=600.0)
    poller.start()
    try:
        assert _until(lambda: poller.health.idle), "an idle node never dozed"
        _next_read(reader, 0.0)
        reads = reader.reads
        time.sleep(0.5)
        assert reader.reads <= reads + 1  # dozing: at most the read in flight, not 10 a period
        busy.set()
        poller.wake()
        assert _next_read(reader), "a wake did not bring a read"  # idle_s is 600 s: only the wake can
        assert _until(lambda: reader.reads >= reads + 20), "the busy pace did not come back"
        assert not poller.health.idle
    finally:
        assert poller.stop(WAIT_S)


def test_busy_keeps_the_fast_pace_and_stop_ends_a_doze_at_once() -> None:
    reader = Counter()
    poller = Poller("n", lambda: reader, Sink(), busy=lambda: True, idle_s=600.0)
    poller.start()
    try:
        assert _until(lambda: reader.reads >= 30)
        assert not poller.health.idle
    finally:
        assert poller.stop(WAIT_S)
    reader2 = Counter()
    dozer = Poller("m", lambda: reader2, Sink(), busy=lambda: False, idle_s=600.0)
    dozer.start()
    assert _until(lambda: dozer.health.idle)
    started = time.monotonic()
    assert dozer.stop(WAIT_S)
    assert time.monotonic() - started < WAIT_S  # not the 600 s doze
    assert dozer.health.state == "stopped"


def test_without_a_busy_signal_the_pace_never_drops() -> None:
    reader = Counter(period=0.02)
    poller = Poller("n", lambda: reader, Sink())  # busy=None: tests and benchmarks feeding by hand
    poller.start()
    try:
        assert _until(lambda: reader.reads >= 60)
        assert not poller.health.idle
    finally:
        poller.stop(WAIT_S)


def test_a_ledger_wakes_its_poller_when_a_window_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("giul_asgi.ledger.ledger.IDLE_S", 600.0)  # only a wake can bring a read soon
    reader = Counter()
    ledger = Ledger(Node("n", reader="none", idle_w=10.0), reader)
    ledger.ensure_started()
    try:
        poller = ledger._poller
        assert poller is not None and poller.idle_s == 600.0
        assert _until(lambda: ledger.health is not None and ledger.health.idle)
        window = ledger.open()
        assert _next_read(reader), "opening a window did not wake the reader"
        assert _until(lambda: reader.reads > 30), "an open window did not keep the busy pace"
        ledger.close(window)
        assert _until(lambda: poller.health.idle), "the node never went idle after its window closed"
    finally:
        ledger.stop(WAIT_S)


def test_startup_line_names_reader_target_and_first_reading(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="giul_asgi.poller")
    reader = Counter()
    poller = Poller("gpu0", lambda: reader, Sink(), busy=lambda: False, reader_name="nvml",
                    target="GPUs [0]")
    poller.start()
    assert _until(lambda: poller.health.reads >= 1)
    poller.stop(WAIT_S)
    lines = [r.getMessage() for r in caplog.records if "gpu0" in r.getMessage()]
    assert lines[0] == ("node 'gpu0': reader nvml (GPUs [0]): ready, backend test_counter, method measured,"
                        " first reading 1000.500 J on its counter; reads every 1 s while idle")
    assert poller.health.state == "stopped" and poller.health.errors == 0


def test_a_failing_first_read_is_logged_with_the_readers_remedy(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="giul_asgi.poller")
    reader = Counter(fail=True)
    poller = Poller("gpu1", lambda: reader, Sink(), reader_name="agent", target="http://127.0.0.1:9")
    poller.start()
    assert _until(lambda: poller.health.errors >= 3)
    reader.fail = False
    assert _until(lambda: poller.health.state == "ok")
    reader.fail = True
    assert _until(lambda: poller.health.state == "failing")
    poller.stop(WAIT_S)
    # Only this node's lines: another test's reader thread may still be saying goodbye.
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if "'gpu1'" in r.getMessage()]
    assert messages[0] == ("WARNING", "node 'gpu1': reader agent (http://127.0.0.1:9): no reading: "
                                      "the test card is unplugged -> plug the test card back in")
    # One line per change of state, not one per failed read.
    assert [m for _, m in messages[1:]] == [
        "node 'gpu1': reader agent (http://127.0.0.1:9) reads again",
        "node 'gpu1': reader agent (http://127.0.0.1:9) started failing: the test card is unplugged"
        " -> plug the test card back in",
    ]
    assert poller.health.as_dict()["last_error"] == "the test card is unplugged"


def test_a_reader_that_cannot_be_built_is_one_error_line_with_its_remedy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="giul_asgi.poller")

    def build() -> Reader:
        raise ReaderUnavailable("NVML would not start", remedy="load the NVIDIA driver")

    sink = Sink()
    poller = Poller("gpu2", build, sink, reader_name="nvml", target="GPUs [0]")
    poller.start()
    assert sink.attached.wait(WAIT_S)
    poller.stop(WAIT_S)
    assert isinstance(sink.failure, ReaderUnavailable)
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "'gpu2'" in r.getMessage()] == [
        ("ERROR", "node 'gpu2': reader nvml (GPUs [0]) unavailable: NVML would not start"
                  " -> load the NVIDIA driver"),
    ]
    assert poller.health.state == "unavailable" and poller.health.remedy == "load the NVIDIA driver"


class Follower(Sink):
    """A sink whose card another process reads (this one never reads it)."""

    def reads_card(self) -> bool:
        return False


@pytest.mark.parametrize("sink", [Sink, Follower])
def test_a_reader_thread_leaves_the_starting_switch_interval_after_its_first_lap(
    sink: type[Sink], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The starting interval (0.2 ms) is for the thread's start; a process that reads the card
    # leaves it at its first read, one whose card another process reads at its first lap.
    from giul_asgi.ledger import poller as poller_module
    from giul_asgi.switch import CPYTHON_S, INTERVAL_S, STARTING_S, Switch

    interval = {"value": CPYTHON_S}
    puts: list[float] = []

    def put(value: float) -> None:
        interval["value"] = value
        puts.append(value)

    monkeypatch.setattr(poller_module, "SWITCH", Switch(lambda: interval["value"], put, env={}))
    monkeypatch.setattr(poller_module, "PACE", "steps")
    reader = Counter()
    poller = Poller("n", lambda: reader, sink(), busy=lambda: True)
    poller.start()
    try:
        assert puts[:2] == [INTERVAL_S, STARTING_S]
        assert _until(lambda: interval["value"] == INTERVAL_S), puts
        assert (reader.reads > 0) == (sink is Sink)
    finally:
        poller.stop(WAIT_S)
    assert interval["value"] == CPYTHON_S, puts


class Pauses:
    """The pause of the loop's thread, recorded, on a clock of its own: each pause (and the
    reader's turn after it) takes ``turn_s`` of it."""

    def __init__(self, turn_s: float = 0.0) -> None:
        self.slept: list[float] = []
        self.now = time.monotonic()
        self.turn_s = turn_s

    def clock(self) -> float:
        return self.now

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += self.turn_s


def test_the_request_path_gives_way_only_where_a_thread_of_ours_wants_the_gil() -> None:
    # A loop that polls its selector more often than the switch interval starves a thread
    # waiting for the GIL (the module's docstring). After an answer the request path lets it
    # go for GIVE_WAY_S, where a reader thread or its watchdog wants it now, at most once a
    # GIVE_EVERY_S; never where both wait on, nor for a driver call past IN_DRIVER_S.
    from giul_asgi.ledger import poller as poller_module

    pauses = Pauses()
    turns = poller_module.Turns(pauses.clock, pauses)
    poller = Poller("n", Counter, Sink(), read_timeout=1.0, clock=pauses.clock)  # not started
    turns.running.append(poller)

    def later() -> None:  # past the last turn's GIVE_EVERY_S
        pauses.now += poller_module.GIVE_EVERY_S
        turns.give_way()

    poller._wants_at = poller._watch_at = pauses.now + 600.0  # both wait (a doze, the watchdog's)
    later()
    assert pauses.slept == []
    poller._wants_at = 0.0  # the reader's wait is over: it wants the GIL
    later()
    turns.give_way()  # within GIVE_EVERY_S of the last: not again
    assert pauses.slept == [poller_module.GIVE_WAY_S]
    poller._busy_since = pauses.now  # a driver call's return waits for the GIL too
    later()
    assert len(pauses.slept) == 2
    pauses.now += poller_module.IN_DRIVER_S  # five turns on: it waits on the card, not the GIL
    later()
    assert len(pauses.slept) == 2
    poller._watch_at = 0.0  # ... and once the watchdog wants the GIL, it is given way to
    later()
    assert len(pauses.slept) == 3


def test_giving_way_takes_at_most_its_share_of_the_loop_s_time() -> None:
    # A hostile review: a thread metering back to back without awaiting gave 75-86% of its
    # time to a reader with 50,000 windows a second to settle. Each pause and the turn after
    # it count; past GIVE_SHARE of a second, no more until the next.
    from giul_asgi.ledger import poller as poller_module

    pauses = Pauses(turn_s=0.004)  # a long turn each time: a loaded machine
    turns = poller_module.Turns(pauses.clock, pauses)
    poller = Poller("n", Counter, Sink())  # not started: it wants the GIL now
    turns.running.append(poller)
    start = pauses.now
    while pauses.now - start < 0.999:
        pauses.now += poller_module.GIVE_EVERY_S
        turns.give_way()
    given = len(pauses.slept) * pauses.turn_s
    assert poller_module.GIVE_SHARE <= given <= poller_module.GIVE_SHARE + pauses.turn_s
    pauses.now = start + 1.1  # the next second: its turns again
    turns.give_way()
    assert len(pauses.slept) * pauses.turn_s > given


def test_an_answer_on_any_node_gives_way_and_an_ended_reader_is_never_given_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from giul_asgi.ledger import poller as poller_module

    pauses = Pauses()
    turns = poller_module.Turns(let_go=pauses)
    monkeypatch.setattr(poller_module, "TURNS", turns)
    monkeypatch.setattr("giul_asgi.ledger.ledger.TURNS", turns)
    ledgers = [Ledger(Node(name, reader="none", idle_w=10.0), Counter()) for name in ("a", "b")]
    for ledger in ledgers:
        ledger.ensure_started()
    try:
        a, b = (ledger._poller for ledger in ledgers)
        assert a is not None and b is not None and {a, b} <= set(turns.running)
        monkeypatch.setattr(a, "wants_gil", lambda now: False)
        monkeypatch.setattr(b, "wants_gil", lambda now: True)  # node b's reader waits for the GIL
        meter = Meter(ledgers[0])
        meter.open()
        meter.close()
        meter.report(Listeners([]))  # an answer on node a: the GIL is let go for b's reader
        assert pauses.slept == [poller_module.GIVE_WAY_S]
    finally:
        for ledger in ledgers:
            ledger.stop(WAIT_S)
    assert not {a, b} & set(turns.running)  # their threads ended: nobody to give way to


def test_giving_way_never_raises_and_a_forked_child_gives_way_to_none_of_its_parent_s_readers() -> None:
    from giul_asgi.ledger import poller as poller_module

    def broken(seconds: float) -> None:
        raise RuntimeError("a bug in the pause")

    turns = poller_module.Turns(let_go=broken)
    turns.running.append(Poller("n", Counter, Sink()))  # not started: it wants the GIL now
    turns.give_way()  # the answer's path goes on
    poller_module._let_go(0.0)  # select on nothing: a pause, never an error (none on Windows)
    reader = Counter()
    poller = Poller("n", lambda: reader, Sink(), busy=lambda: True)
    poller.start()
    try:
        assert poller in poller_module.TURNS.running
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: none of the parent's threads run here
            os.write(write, b"%d" % len(poller_module.TURNS.running))
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 16) == b"0"
    finally:
        poller.stop(WAIT_S)
