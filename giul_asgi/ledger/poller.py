"""The one thread per node that talks to its card, so the event loop never does.

Every driver call (building the reader: NVML init and the per-GPU probe; each read; the
process list; the final read; close) runs on the node's reader thread, never on the event
loop. A watchdog beside it wakes a few times per ``read_timeout``: when a call has been
running longer than that, it books a failed reading in its place ("blocked for more than
1 s"), so a wedged driver costs figures (the tape turns a long failure into a gap), never
time: no request, startup or shutdown waits on it longer than its bound.

One thread reads and books, rather than a poller handing each read to a worker: on a busy
event loop every thread that wakes must win the GIL back from it. Measured on a busy
simulated card, JSON requests in a tight loop, alternating processes: median 199 -> 178 us
added per request without the hop; with one thread, four reads a period instead of ten
measured the same within noise (176 against 179).

While a window is open or waiting to settle (``busy``), a stepped counter is read ten times a
period until the tape knows when it steps, then every 2 ms across each step from just before
it until it is seen (:mod:`.pace`): about three wake-ups a period, each a wait for the GIL
beside a busy loop, rather than ten; the thread reads as soon as it wakes, before the
table's work. So that a loop cannot keep it from them for long, the process's GIL switch
interval is 1 ms while readers run (:mod:`.switch`).

Idle costs nothing: once the node has been quiet for ``LINGER_PERIODS`` periods the thread
dozes, reading once per ``idle_s`` (the counter's own period where the
node watches for a foreign load, else ``IDLE_S``), and :meth:`Poller.wake` (a window
opened) brings it back at once. benchmarks/idle.py measures what that saves.

The thread also says how the node's reader is doing where operators look: one log line
when the reader is built (its target and first reading, or the error and its remedy), one
when it starts failing and one when it recovers; :class:`Health` holds the same for
``/energy`` and Prometheus.

The poller runs the same under asyncio and trio: it is a thread, and it hands its readings
to the ledger, which serialises them with the request path under one lock.

**Giving way.** A thread that waits for the GIL is woken each time its holder lets it go, and
an event loop lets it go at every poll of its selector, then takes it straight back before
the woken thread runs: a futex wake on the loop's thread and a wasted wake-up on ours, each
time, for as long as ours waits (and the wait never reaches the switch interval, which each
such wake starts again). Beside JSON requests back to back on one loop (benchmarks/
path_profile.py, 11,000 a second), the reader waited about 150 ms for each hand-over and
woke 0.8 times a request for nothing; the loop's thread spent 12-14 us a request in the
kernel on the wakes, and the thread read the counter 2-4 times a second where its pace asks
for about 30 (benchmarks/give_way.py). So after each answer
the request path asks :meth:`Turns.give_way`: where a reader thread of the process (any
node's) wants the GIL now (its wait is over, or it is between a driver call and its return),
the loop's thread pauses ``GIVE_WAY_S`` (the GIL let go, and nothing racing for it back); the
thread takes it and works its turn, its switch interval (1 ms), before the loop has it back:
about 1 ms a pause (a hostile review measured 1.1 ms at p50 and 6 ms at p99 on a loaded
machine, where the thread holding the GIL may wait for a core). At most once a
``GIVE_EVERY_S``, and no more than ``GIVE_SHARE`` of the loop's time in a second. Measured
the same way on a quiet machine, the loop's thread's CPU fell from 100 to 78-82 us a request
(its kernel time from 14 to 1.5), the reader's needless wake-ups from 0.9 to 0.06 a request,
and it read 28-36 times a second; on a loaded one the starvation hides (the reader's wake-ups
find a core busy, and the loop's polls less often hand the GIL to nobody) and the gain with
it. Through uvicorn (uvloop, where the reader blocked 0.13 times a request before, not 0.9)
it changed nothing measurable (benchmarks/results/overhead-2026-12-07-server.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..readers.base import LoadDriven, Process, ProcessLister, Reader, Reading
from ..switch import SWITCH
from .pace import StepPace

log = logging.getLogger("giul_asgi.poller")

#: Seconds between looks at the card's process list.
PROCESS_EVERY_S = 2.0
#: Reads per counter period (a gauge's: four). Narrow brackets from the first second make the
#: step phase, and so first and settled figures, as good as attribution.py shows; at four a
#: period 300 ms requests' settled uncertainty doubled (14.7% median) and a foreign load's
#: settled figures were covered 78% of the time, where ten a period gives 5% and 100%.
READS_PER_PERIOD = 10
#: Seconds between reads of an idle node that watches for nothing (no window, no foreign load).
IDLE_S = 1.0
#: Periods (at least ``LINGER_MIN_S``) the poller keeps its busy pace after the last window
#: or wake: closed windows settle once the counter has stepped past their ramp-down.
LINGER_PERIODS = 5
LINGER_MIN_S = 0.5
#: Stopping, the reader reads on while closed windows wait on the counter's next steps, for
#: this many periods at most (and never more than SETTLE_AT_STOP_MAX_S): one read right after
#: a recycled worker's last close could not cover its tail, and it settled unknown.
SETTLE_AT_STOP_PERIODS = 2.5
SETTLE_AT_STOP_MAX_S = 0.4
#: How long the request path lets the GIL go where the reader thread wants it (s): long
#: enough for the woken thread to take it on another core (20, 50 and 100 us measured the
#: same), and at most once a GIVE_EVERY_S (the switch interval's own share for it).
GIVE_WAY_S = 0.00002
GIVE_EVERY_S = 0.001
#: The most of the loop's time (s in a second) given to reader threads: each pause and the
#: thread's turn after it (a hostile review: a thread metering back to back without awaiting
#: gave 75-86% of its time, its node's reader keeping up with 50,000 windows a second).
GIVE_SHARE = 0.25
#: A driver call still running after this (s), five turns given, waits on the card (a
#: remote reader's HTTP call, a stalled driver), not on the GIL: no giving way until it returns.
IN_DRIVER_S = 0.005
#: The busy pace of a stepped counter: ``steps`` reads across each step once the tape knows
#: them (:mod:`.pace`), with the GIL's switch interval at 1 ms (:mod:`.switch`); ``uniform``
#: reads ``READS_PER_PERIOD`` times a period at random phases and leaves the interval alone,
#: as before (benchmarks' A/B: ``attribution.py --pace``).
PACE = "steps"


class Sink(Protocol):
    """What the poller feeds: the ledger."""

    def attach(self, reader: Reader) -> None: ...

    def reads_card(self) -> bool:
        """Whether to read the card at this lap (False: another process reads it for this
        one, which has taken what it published)."""
        ...

    def card_state(self) -> tuple[str, str | None]:
        """Where another process reads the card: how that is going (state, why)."""
        ...

    def failed(self, error: BaseException) -> None: ...

    def ingest(self, reading: Reading) -> None: ...

    def note_processes(self, processes: list[Process] | None) -> None: ...

    def next_step(self) -> tuple[float, float, float] | None:
        """When the card's counter should step next, its spread and period (s); None where
        it cannot say (see :meth:`Tape.next_step`). Asked on the reader thread only."""
        ...

    def deliver(self, budget_s: float) -> None:
        """Between reads: hand what the readings settled to its listeners, for ``budget_s``
        seconds at most (the rest at the next lap)."""
        ...


@dataclass(slots=True)
class Health:
    """How the node's reader is doing, as the reader thread last saw it."""

    reader: str
    target: str
    state: str = "starting"  # starting | ok | failing | unavailable | stopped
    reads: int = 0
    errors: int = 0
    last_error: str | None = None
    remedy: str | None = None
    last_ok_t: float | None = None
    idle: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"reader": self.reader, "target": self.target, "state": self.state,
                "reads": self.reads, "errors": self.errors, "last_error": self.last_error,
                "remedy": self.remedy, "idle": self.idle}


class Poller:
    """Builds a node's reader off the loop, then reads it at its pace until stopped.

    ``busy()`` says whether windows need the busy pace (open, or closed and not settled);
    None keeps the busy pace always. ``idle_s`` is the pace of an idle node: None reads at
    the counter's own period (a node that watches for a foreign load). ``load`` is handed
    to a reader the node's windows load (the in-process simulated card).
    """

    def __init__(
        self,
        name: str,
        build: Callable[[], Reader],
        sink: Sink,
        *,
        read_timeout: float = 1.0,
        close_timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        chores: list[tuple[float, Callable[[], None]]] | None = None,
        busy: Callable[[], bool] | None = None,
        idle_s: float | None = IDLE_S,
        reader_name: str = "custom",
        target: str = "",
        load: Callable[[], tuple[float, int]] | None = None,
        shared: Callable[[], bool] | None = None,
        startup_says: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        #: Whether a failure to build the reader is the startup's to say (its one line): then
        #: it is logged here at DEBUG only, not a second time.
        self._startup_says = startup_says
        self._build = build
        self._sink = sink
        self.read_timeout = read_timeout
        self.close_timeout = close_timeout
        self._clock = clock
        #: (every seconds, call): other sources beside the card (the upstream's load, the
        #: workers' table), run on the reader thread between reads, watched like a read.
        self.chores = list(chores or ())
        self._busy = busy
        #: The node's own windows (window-seconds, open now), for a reader they load.
        self._load = load
        #: True while the card is read for other processes too: an idle node then reads at
        #: the counter's period, since their new windows are learnt only by looking.
        self._shared = shared
        self.idle_s = idle_s
        self._stop = threading.Event()
        # Set by stop() and by wake() while dozing: the one thing the reader thread waits on.
        self._alarm = threading.Event()
        self._dozing = False
        self._woken = False
        self._active_until = 0.0
        self._thread = threading.Thread(target=self._run, name=f"giul-reader-{name}", daemon=True)
        self._watch = threading.Thread(target=self._watchdog, name=f"giul-watch-{name}", daemon=True)
        self._busy_since: float | None = None  # when the driver call in progress began
        self._busy_with = ""
        self.reader: Reader | None = None
        self.read_seconds_max = 0.0
        self.health = Health(reader_name, target)
        self._announced = False
        self._switch = False  # this thread holds the GIL's switch interval (.switch)
        self._starting = False  # ... and has not read yet (the starting interval)
        #: When (time.monotonic) the reader thread and the watchdog next want the GIL: the
        #: end of their waits (0.0: now, inf: never again); :meth:`wants_gil` reads them.
        self._wants_at = 0.0
        self._watch_at = 0.0

    def start(self) -> None:
        # The GIL's switch interval before the thread starts (.switch): it is set by the
        # starting thread, which has the GIL, and NVML's start and probes are a dozen
        # hand-overs of it that a busy loop could make wait. The plain pace is the old
        # reader's, which left the interval alone; the thread puts it back as it ends.
        self._switch = PACE == "steps"
        if self._switch:
            self._starting = True
            SWITCH.join(self.name)
        TURNS.running.append(self)
        self._thread.start()
        self._watch.start()

    def wake(self) -> None:
        """A window is opening: keep (or go back to) the busy pace. Cheap: two attribute
        writes, and an Event.set only when the thread dozes."""
        self._woken = True
        if self._dozing:
            self._wants_at = 0.0
            self._alarm.set()

    def wants_gil(self, now: float) -> bool:
        """Whether the reader thread or its watchdog wants the GIL at ``now``
        (time.monotonic): its wait is over, or it is between a driver call and its return;
        not while a driver call has run ``IN_DRIVER_S`` (it waits on the card, not on the GIL)."""
        if now >= self._watch_at:
            return True
        if now < self._wants_at:
            return False
        since = self._busy_since  # a call's return waits for the GIL too, not ten turns long
        return since is None or self._clock() - since <= IN_DRIVER_S

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the reader to stop (after its last reads) and wait at most ``timeout``."""
        self._stop.set()
        self._alarm.set()
        bound = timeout if timeout is not None else self.read_timeout + self.close_timeout
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(bound)
        return not self._thread.is_alive()

    # -- the reader thread ------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with the watchdog told; exceptions are the caller's."""
        self._busy_with, self._busy_since = what, self._clock()
        try:
            return fn()
        finally:
            self.read_seconds_max = max(self.read_seconds_max, self._clock() - self._busy_since)
            self._busy_since = None

    def _run(self) -> None:
        try:
            self._run_reader()
        finally:
            self._wants_at = math.inf
            with contextlib.suppress(ValueError):  # (a forked child's list is a new one)
                TURNS.running.remove(self)
            if self._switch:
                self._started()
                SWITCH.leave()

    def _started(self) -> None:
        """The thread's start is over (its first read, or its end): the steady interval."""
        if self._starting:
            self._starting = False
            SWITCH.started()

    def _run_reader(self) -> None:
        try:
            reader = self._call("building the reader", self._build)
        except Exception as exc:
            self._unavailable(exc)
            self._sink.failed(exc)
            return
        if self._stop.is_set():
            return
        self.reader = reader
        if self._load is not None and isinstance(reader, LoadDriven):
            reader.drive(self._load)
        self.health.remedy = getattr(reader, "remedy", None)
        self._sink.attach(reader)
        if reader.kind == "none":
            self.health.state = "unavailable"
            self.health.last_error = getattr(reader, "reason", "no reader for this node")
            self._announce(None)
            return
        self._loop(reader)
        self.health.state = "stopped"
        try:
            self._call("closing the reader", reader.close)
        except Exception as exc:
            log.warning("closing the reader of node %r: %s", self.name, exc)

    def _loop(self, reader: Reader) -> None:
        """Read at the node's pace until stopped, then while closed windows wait (bounded)."""
        hint = getattr(reader, "poll_s", None)
        per = READS_PER_PERIOD if reader.kind == "counter" else 4
        poll_s = float(hint) if hint else max(0.005, min(reader.period / per, 1.0))
        idle_s = max(poll_s, self.idle_s if self.idle_s is not None else reader.period)
        linger = max(LINGER_MIN_S, LINGER_PERIODS * reader.period)
        jitter = random.Random(id(self))
        lists = isinstance(reader, ProcessLister)
        next_look = 0.0
        due = [0.0] * len(self.chores)
        self._active_until = self._clock() + linger
        shared_idle = max(poll_s, reader.period)
        paced = reader.kind == "counter" and not hint
        pace = StepPace()
        reads = False
        while not self._stop.is_set():
            # Read first, then the table's work: a read waits on nothing else once the
            # thread is awake (on a busy loop every call that lets the GIL go costs a wait
            # for it back), so it lands where the pace put it.
            read = reads
            if read:
                self._read(reader)
            reads = self._turn()
            if reads and not read:
                read = True
                self._read(reader)
            elif not reads:
                self._follow_health()
            if self._starting:  # at the table, and read if it is this process's to read
                self._started()
            now = self._clock()
            if reads and lists and now >= next_look:
                next_look = now + PROCESS_EVERY_S
                self._look(reader)
            for i, (every, chore) in enumerate(self.chores):
                if self._clock() >= due[i]:
                    due[i] = self._clock() + every
                    self._chore(chore)
            # Jittered reads bracket the counter's steps at varied phases, so the tape
            # learns where they fall to well under a poll; once it has, reads go around them.
            # Not while the card is read for other processes: their pieces are decided 30 ms
            # after their end at the soonest (the ledger's DECIDE_AFTER_S), at a lap, and two
            # laps a period left them a period late (four workers' first figures 1.1-1.25x).
            busy_wait = poll_s * jitter.uniform(0.5, 1.5)
            shared = self._shared is not None and self._shared()
            if paced and reads and not shared and PACE == "steps":
                busy_wait = pace.wait(self._clock(), self._next_step(), busy_wait)
            # The settled figures' listeners, in the time until the next read (a read is
            # late for them by one chunk at most, not by all a reading settled).
            started = self._clock()
            self._deliver(busy_wait)
            busy_wait = max(0.0, busy_wait - (self._clock() - started))
            self._pause(busy_wait, min(idle_s, shared_idle) if shared else idle_s, linger)
        self._settle_at_stop(reader, poll_s)

    def _settle_at_stop(self, reader: Reader, poll_s: float) -> None:
        """The last readings: at the busy pace while windows wait on the card (bounded), so
        that what closed just before the stop settles measured, not lost."""
        bound = min(SETTLE_AT_STOP_PERIODS * reader.period, SETTLE_AT_STOP_MAX_S)
        deadline = self._clock() + bound
        for _ in range(int(bound / poll_s) + 1):  # a test's clock may not move
            if self._turn():
                self._read(reader)
            if self._busy is None or not self._busy() or self._clock() >= deadline:
                return
            self._wants_at = time.monotonic() + poll_s  # (as every wait of the thread says)
            time.sleep(poll_s)
            self._wants_at = 0.0

    def _pause(self, busy_wait: float, idle_wait: float, linger: float) -> None:
        """Wait for the next read: the busy pace while windows need it, else doze."""
        now = self._clock()
        # Dozing is declared before busy() is asked: a window opened after the question
        # finds _dozing set and wakes us; one opened before it is seen by the question.
        self._dozing = True
        try:
            if self._woken or self._busy is None or self._busy():
                self._woken = False
                self._active_until = now + linger
            if now < self._active_until:
                self._dozing = False
                self.health.idle = False
                self._wants_at = time.monotonic() + busy_wait
                self._alarm.wait(busy_wait)
            else:
                self.health.idle = True
                self._wants_at = time.monotonic() + idle_wait
                self._alarm.wait(idle_wait)
        finally:
            self._wants_at = 0.0
            self._dozing = False
            if not self._stop.is_set():
                self._alarm.clear()

    def _deliver(self, budget_s: float) -> None:
        try:
            self._sink.deliver(budget_s)
        except Exception:  # a bug in a listener's hand-over must not stop the reading
            log.exception("node %r: handing settled figures over failed", self.name)

    def _next_step(self) -> tuple[float, float, float] | None:
        try:
            return self._sink.next_step()
        except Exception:  # a bug in the schedule must not stop the reading: plain pace
            log.exception("node %r: the counter's schedule failed", self.name)
            return None

    def _turn(self) -> bool:
        try:
            return self._sink.reads_card()
        except Exception:  # a bug in the sharing must not stop the reading: say it, read
            log.exception("node %r: the card's table failed", self.name)
            return True

    def _follow_health(self) -> None:
        """Another process reads the card for this one: its health is that reading's."""
        try:
            state, why = self._sink.card_state()
        except Exception:
            return
        health = self.health
        if state == "failing" and health.state != "failing":
            log.warning("node %r: %s", self.name, why)
        health.state, health.last_error = state, why or health.last_error
        if not self._announced:
            self._announced = True
            log.info("node %r: reader %s (%s): ready; another process on this host reads the card "
                     "for every process at its table, and this one takes its part", self.name,
                     health.reader, health.target)

    def _read(self, reader: Reader) -> None:
        try:
            reading = self._call("a read", reader.read)
        except Exception as exc:  # a read must never raise; if it does, it failed
            reading = Reading(t=self._clock(), error=f"{type(exc).__name__}: {exc}")
        if not isinstance(reading, Reading):
            reading = Reading(t=self._clock(), error=f"reader returned {type(reading).__name__}")
        self._note(reading)
        self._ingest(reading)

    def _ingest(self, reading: Reading) -> None:
        try:
            self._sink.ingest(reading)
        except Exception:  # a bug in the books must not stop the reading: say it, go on
            log.exception("node %r: booking a reading failed", self.name)

    def _chore(self, chore: Callable[[], None]) -> None:
        try:
            self._call("a look beside the card", chore)
        except Exception as exc:
            log.debug("node %r: %s", self.name, exc)

    def _look(self, reader: Any) -> None:
        try:
            processes = self._call("the process list", reader.processes)
        except Exception:
            processes = None
        self._sink.note_processes(processes)

    # -- health, said where operators look ------------------------------------------------------
    def _note(self, reading: Reading) -> None:
        health = self.health
        health.reads += 1
        if reading.ok:
            health.last_ok_t = reading.t
            if health.state == "failing":
                log.info("node %r: reader %s (%s) reads again", self.name, health.reader, health.target)
            health.state = "ok"
        else:
            health.errors += 1
            health.last_error = reading.error or "empty reading"
            if health.state == "ok":
                log.warning("node %r: reader %s (%s) started failing: %s%s", self.name, health.reader,
                            health.target, health.last_error, _remedy(health.remedy))
            health.state = "failing"
        if not self._announced:
            self._announce(reading)

    def _announce(self, reading: Reading | None) -> None:
        """The one startup line per node: reader, target, first reading or the error."""
        self._announced = True
        health, reader = self.health, self.reader
        what = f"node {self.name!r}: reader {health.reader} ({health.target})"
        if reading is None or not reading.ok:
            log.warning("%s: no reading: %s%s", what, health.last_error, _remedy(health.remedy))
            return
        value = f"{reading.joules:.3f} J on its counter" if reading.joules is not None \
            else f"{reading.watts:.1f} W"
        labels = f"backend {getattr(reader, 'backend', '?')}, method {getattr(reader, 'method', '?')}"
        idle = "once a counter period" if self.idle_s is None else f"every {self.idle_s:g} s"
        pace = "" if self._busy is None else f"; reads {idle} while idle"
        notes = "".join(f"; {note}" for note in getattr(reader, "notes", ()) or ())
        log.info("%s: ready, %s, first reading %s%s%s", what, labels, value, pace, notes)

    def _unavailable(self, exc: BaseException) -> None:
        health = self.health
        health.state = "unavailable"
        health.last_error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        health.remedy = getattr(exc, "remedy", None) or None
        self._announced = True
        log.log(logging.DEBUG if self._startup_says() else logging.ERROR,
                "node %r: reader %s (%s) unavailable: %s%s", self.name, health.reader,
                health.target, health.last_error, _remedy(health.remedy))

    # -- the watchdog -------------------------------------------------------------------------
    def _watchdog(self) -> None:
        """While a driver call overruns its bound, book a failed reading every bound."""
        last_booked = 0.0
        while self._thread.is_alive() and not self._wait_watching(self.read_timeout / 2):
            since = self._busy_since
            now = self._clock()
            if since is None or now - since <= self.read_timeout or now - last_booked < self.read_timeout:
                continue
            last_booked = now
            self._ingest(Reading(
                t=now, error=f"{self._busy_with} blocked for more than {self.read_timeout:g} s",
            ))
        self._watch_at = math.inf

    def _wait_watching(self, seconds: float) -> bool:
        """The watchdog's wait, saying when it will want the GIL back (:meth:`wants_gil`)."""
        self._watch_at = time.monotonic() + seconds
        try:
            return self._stop.wait(seconds)
        finally:
            self._watch_at = 0.0


def _let_go(seconds: float) -> None:
    """Let the GIL go for ``seconds`` on the loop's thread: a select on no descriptors, as the
    loop's own selector waits (about 100 us where Linux's timer slack is 50 us). It is a
    bounded pause for a thread of ours, not I/O: blockbuster, which a test suite may run to
    catch blocking calls on a loop, does not count it, as it does not count the loop's own
    selector. Where select cannot wait on nothing (Windows), nothing is done."""
    with contextlib.suppress(OSError):
        select.select((), (), (), seconds)


class Turns:
    """The reader threads of this process (every node's), and the request path's giving way
    to them. ``clock`` and ``let_go`` are the real ones but in tests."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic,
        let_go: Callable[[float], None] | None = None,
    ) -> None:
        self.running: list[Poller] = []
        self._clock = clock
        self._let_go = let_go if let_go is not None else _let_go
        self._gave_at = -math.inf
        self._second_at = -math.inf  # when the second being counted began
        self._given_s = 0.0  # the loop's time given in it: each pause and the turn after it

    def give_way(self) -> None:
        """After an answer, on the request path: where a reader thread of this process (or
        its watchdog) wants the GIL now, let it go for ``GIVE_WAY_S`` so that the thread
        takes it, rather than letting it win a race with the loop's next poll (the module's
        docstring). At most once a ``GIVE_EVERY_S``, and never more than ``GIVE_SHARE`` of
        the loop's time in a second: what the pause and the thread's turn after it took
        (its switch interval, longer where the machine is loaded) counts. Never raises."""
        try:
            now = self._clock()
            if now < self._gave_at + GIVE_EVERY_S:
                return
            if now - self._second_at >= 1.0:
                self._second_at, self._given_s = now, 0.0
            elif self._given_s >= GIVE_SHARE:
                return
            for poller in self.running:  # changed by other threads: one skipped, never an error
                if poller.wants_gil(now):
                    self._gave_at = now
                    self._let_go(GIVE_WAY_S)
                    self._given_s += self._clock() - now
                    return
        except Exception:  # a bug here costs the reader its turn, never the answer
            log.debug("giving way to a reader thread failed", exc_info=True)

    def after_fork(self) -> None:
        """A forked child runs none of its parent's threads: nobody to give way to."""
        self.running = []
        self._gave_at = self._second_at = -math.inf
        self._given_s = 0.0


#: This process's reader threads (a forked child starts with none).
TURNS = Turns()
os.register_at_fork(after_in_child=TURNS.after_fork)


def _remedy(remedy: str | None) -> str:
    return f" -> {remedy}" if remedy else ""
