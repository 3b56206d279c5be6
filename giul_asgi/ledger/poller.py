"""The one thread per node that talks to its card, so the event loop never does.

Every driver call (building the reader: NVML init and the per-GPU probe; each read; the
process list; the final read; close) runs on a worker thread, and the poller waits for it
at most a bound. A wedged driver therefore costs figures, never time: the poller books the
read as failed ("blocked for more than 1 s"), the tape turns a long failure into a gap,
and no request, startup or shutdown waits on it longer than its bound. A call still
blocked is not called again until it returns.

The poller runs the same on asyncio and trio: it is a thread, and it hands its readings
to the ledger, which serialises them with the request path under one lock.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..readers.base import Process, ProcessLister, Reader, Reading

log = logging.getLogger("giul_asgi.poller")

#: Seconds between looks at the card's process list.
PROCESS_EVERY_S = 2.0


class Sink(Protocol):
    """What the poller feeds: the ledger."""

    def attach(self, reader: Reader) -> None: ...

    def failed(self, error: BaseException) -> None: ...

    def ingest(self, reading: Reading) -> None: ...

    def note_processes(self, processes: list[Process] | None) -> None: ...


class BlockedCall(TimeoutError):
    """A driver call did not return within its bound."""


class Worker:
    """A daemon thread that runs one call at a time; callers wait for it with a bound."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any], timeout: float, stop: threading.Event | None = None) -> Any:
        """``fn()``'s value; raises what it raised, or :class:`BlockedCall` past ``timeout``
        (or once ``stop`` is set). A call still running is never queued behind."""
        if self._busy.is_set():
            raise BlockedCall("the previous driver call is still blocked")
        box: list[Any] = []
        done = threading.Event()
        self._busy.set()
        self._calls.put((fn, box, done))
        deadline = time.monotonic() + timeout
        while not done.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                raise BlockedCall(f"driver call blocked for more than {timeout:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def _loop(self) -> None:
        while True:
            fn, box, done = self._calls.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller, who decides
                box.append((False, exc))
            finally:
                self._busy.clear()
                done.set()


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
        #: (every seconds, call): other sources beside the card (the upstream's load, the
        #: workers' table), run on this thread between reads, each bounded like a read.
        self.chores = list(chores or ())
        self._build = build
        self._sink = sink
        self.read_timeout = read_timeout
        self.close_timeout = close_timeout
        self._clock = clock
        self._stop = threading.Event()
        self._worker = Worker(f"giul-driver-{name}")
        self._thread = threading.Thread(target=self._run, name=f"giul-poller-{name}", daemon=True)
        self.reader: Reader | None = None
        self.read_seconds_max = 0.0

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the thread to stop (after one last read) and wait at most ``timeout``."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout if timeout is not None else self.read_timeout + self.close_timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            reader = self._worker.call(self._build, float("inf"), self._stop)
        except BlockedCall:
            return  # stopped while the driver was still starting
        except Exception as exc:
            self._sink.failed(exc)
            return
        self.reader = reader
        self._sink.attach(reader)
        if reader.kind == "none":
            return
        hint = getattr(reader, "poll_s", None)
        # A counter is read ten times a period, so each step is bracketed within a tenth
        # of it from the first seconds on (a read that sees no change costs microseconds);
        # a gauge, whose every read is a span to share, four times.
        per = 10 if reader.kind == "counter" else 4
        poll_s = float(hint) if hint else max(0.005, min(reader.period / per, 1.0))
        jitter = random.Random(id(self))
        lists = isinstance(reader, ProcessLister)
        next_look = 0.0
        due = [0.0] * len(self.chores)
        while not self._stop.is_set():
            self._read(reader)
            if lists and self._clock() >= next_look:
                next_look = self._clock() + PROCESS_EVERY_S
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
            self._worker.call(reader.close, self.close_timeout)
        except Exception as exc:
            log.warning("closing the reader of node %r: %s", self.name, exc)

    def _read(self, reader: Reader) -> None:
        started = self._clock()
        try:
            reading = self._worker.call(reader.read, self.read_timeout)
        except Exception as exc:  # a read must never raise; a blocked one is a failed one
            reading = Reading(t=self._clock(), error=f"{type(exc).__name__}: {exc}")
        self.read_seconds_max = max(self.read_seconds_max, self._clock() - started)
        if not isinstance(reading, Reading):
            reading = Reading(t=self._clock(), error=f"reader returned {type(reading).__name__}")
        try:
            self._sink.ingest(reading)
        except Exception:  # a bug in the books must not stop the reading: say it, go on
            log.exception("node %r: booking a reading failed", self.name)

    def _chore(self, chore: Callable[[], None]) -> None:
        try:
            self._worker.call(chore, self.read_timeout)
        except Exception as exc:
            log.debug("node %r: %s", self.name, exc)

    def _look(self, reader: Any) -> None:
        try:
            processes = self._worker.call(reader.processes, self.read_timeout)
        except Exception:
            processes = None
        self._sink.note_processes(processes)
