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
measured the same within noise (176 against 179), so the reads stay frequent.

The poller runs the same under asyncio and trio: it is a thread, and it hands its readings
to the ledger, which serialises them with the request path under one lock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..readers.base import Process, ProcessLister, Reader, Reading

log = logging.getLogger("giul_asgi.poller")

#: Seconds between looks at the card's process list.
PROCESS_EVERY_S = 2.0
#: Reads per counter period (a gauge's: four). Narrow brackets from the first second make the
#: step phase, and so first and settled figures, as good as attribution.py shows; at four a
#: period 300 ms requests' settled uncertainty doubled (14.7% median) and a foreign load's
#: settled figures were covered 78% of the time, where ten a period gives 5% and 100%.
READS_PER_PERIOD = 10


class Sink(Protocol):
    """What the poller feeds: the ledger."""

    def attach(self, reader: Reader) -> None: ...

    def failed(self, error: BaseException) -> None: ...

    def ingest(self, reading: Reading) -> None: ...

    def note_processes(self, processes: list[Process] | None) -> None: ...


class Poller:
    """Builds a node's reader off the loop, then reads it at its pace until stopped."""

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
    ) -> None:
        self.name = name
        self._build = build
        self._sink = sink
        self.read_timeout = read_timeout
        self.close_timeout = close_timeout
        self._clock = clock
        #: (every seconds, call): other sources beside the card (the upstream's load, the
        #: workers' table), run on the reader thread between reads, watched like a read.
        self.chores = list(chores or ())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"giul-reader-{name}", daemon=True)
        self._watch = threading.Thread(target=self._watchdog, name=f"giul-watch-{name}", daemon=True)
        self._busy_since: float | None = None  # when the driver call in progress began
        self._busy_with = ""
        self.reader: Reader | None = None
        self.read_seconds_max = 0.0

    def start(self) -> None:
        self._thread.start()
        self._watch.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the reader to stop (after one last read) and wait at most ``timeout``."""
        self._stop.set()
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
            reader = self._call("building the reader", self._build)
        except Exception as exc:
            self._sink.failed(exc)
            return
        if self._stop.is_set():
            return
        self.reader = reader
        self._sink.attach(reader)
        if reader.kind == "none":
            return
        hint = getattr(reader, "poll_s", None)
        per = READS_PER_PERIOD if reader.kind == "counter" else 4
        poll_s = float(hint) if hint else max(0.005, min(reader.period / per, 1.0))
        jitter = random.Random(id(self))
        lists = isinstance(reader, ProcessLister)
        next_look = 0.0
        due = [0.0] * len(self.chores)
        while not self._stop.is_set():
            self._read(reader)
            now = self._clock()
            if lists and now >= next_look:
                next_look = now + PROCESS_EVERY_S
                self._look(reader)
            for i, (every, chore) in enumerate(self.chores):
                if self._clock() >= due[i]:
                    due[i] = self._clock() + every
                    self._chore(chore)
            # Jittered reads bracket the counter's steps at varied phases, so the tape
            # learns where they fall to well under a poll.
            self._stop.wait(poll_s * jitter.uniform(0.5, 1.5))
        self._read(reader)  # the last reading settles what closed since the one before
        try:
            self._call("closing the reader", reader.close)
        except Exception as exc:
            log.warning("closing the reader of node %r: %s", self.name, exc)

    def _read(self, reader: Reader) -> None:
        try:
            reading = self._call("a read", reader.read)
        except Exception as exc:  # a read must never raise; if it does, it failed
            reading = Reading(t=self._clock(), error=f"{type(exc).__name__}: {exc}")
        if not isinstance(reading, Reading):
            reading = Reading(t=self._clock(), error=f"reader returned {type(reading).__name__}")
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

    # -- the watchdog -------------------------------------------------------------------------
    def _watchdog(self) -> None:
        """While a driver call overruns its bound, book a failed reading every bound."""
        last_booked = 0.0
        while self._thread.is_alive() and not self._stop.wait(self.read_timeout / 2):
            since = self._busy_since
            now = self._clock()
            if since is None or now - since <= self.read_timeout or now - last_booked < self.read_timeout:
                continue
            last_booked = now
            self._ingest(Reading(
                t=now, error=f"{self._busy_with} blocked for more than {self.read_timeout:g} s",
            ))
