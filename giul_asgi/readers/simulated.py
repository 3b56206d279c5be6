"""A simulated card that knows the truth, so we can grade what we charge against it.

The card has an idle floor, a power cap, a cumulative energy counter that advances in steps
(as A100/H100 registers do every ~100 ms), an instant gauge and a one-second averaged
gauge. Jobs add load in watts above idle; when the sum passes the cap every job is scaled
down alike. Each job's true energy is its share of the above-idle power by its load, which
is what a perfect attribution would charge it. A :class:`VirtualClock` makes tests exact.

Readings from here are always ``method="simulated"``: a simulated card never reads as a
measured one.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .base import Kind, Reading


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        self.now += seconds
        return self.now


@dataclass(eq=False, slots=True)
class Job:
    """Load a piece of work puts on the card, and the energy it truly caused."""

    load_w: float
    started: float
    stopped: float | None = None
    true_joules: float = 0.0


class SimulatedCard:
    """Piecewise-constant power: exact energy between events, stepped counter on top."""

    def __init__(
        self,
        *,
        idle_w: float = 60.0,
        cap_w: float = 700.0,
        counter_period: float = 0.1,
        average_window: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cap_w <= idle_w:
            raise ValueError("cap_w must exceed idle_w")
        self.idle_w = idle_w
        self.cap_w = cap_w
        self.counter_period = counter_period
        self.average_window = average_window
        self.clock = clock
        self._lock = threading.Lock()
        self._t = clock()
        self._energy = 0.0  # joules since creation, idle included
        self._counter = 0.0  # value at the last counter step
        self._jobs: list[Job] = []
        self._load = 0.0
        # (t, cumulative J) at each event, enough to answer a 1 s trailing average.
        self._history: deque[tuple[float, float]] = deque(maxlen=4096)
        self._history.append((self._t, 0.0))
        self.reset_offset = 0.0

    # -- the physics -------------------------------------------------------------------
    def _above(self) -> float:
        return min(self._load, self.cap_w - self.idle_w)

    def _advance(self, t: float) -> None:
        dt = t - self._t
        if dt <= 0:
            return
        above = self._above()
        power = self.idle_w + above
        if self.counter_period > 0:
            last_step = math.floor(t / self.counter_period) * self.counter_period
            if last_step > self._t:
                self._counter = self._energy + power * (last_step - self._t)
        else:
            self._counter = self._energy + power * dt
        self._energy += power * dt
        if self._load > 0:
            scale = above / self._load
            for job in self._jobs:
                job.true_joules += job.load_w * scale * dt
        self._t = t
        self._history.append((t, self._energy))

    def start_job(self, load_w: float) -> Job:
        with self._lock:
            now = self.clock()
            self._advance(now)
            job = Job(load_w=load_w, started=now)
            self._jobs.append(job)
            self._load += load_w
            return job

    def stop_job(self, job: Job) -> Job:
        with self._lock:
            now = self.clock()
            self._advance(now)
            if job.stopped is None:
                job.stopped = now
                self._jobs.remove(job)
                self._load -= job.load_w
                if not self._jobs:
                    self._load = 0.0  # no float residue when the card empties
            return job

    def reset_counter(self) -> None:
        """What a driver reload does: the cumulative register starts again from zero."""
        with self._lock:
            self._advance(self.clock())
            self.reset_offset += self._counter
            self._counter = 0.0
            self._energy = 0.0
            self._history.clear()
            self._history.append((self._t, 0.0))

    # -- what a reader sees ------------------------------------------------------------
    def energy_j(self) -> float:
        """The stepped counter, as NVML reports it."""
        with self._lock:
            self._advance(self.clock())
            return self._counter

    def true_energy_j(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self._energy

    def instant_w(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self.idle_w + self._above()

    def average_w(self) -> float:
        with self._lock:
            now = self.clock()
            self._advance(now)
            since = now - self.average_window
            older = [(t, e) for t, e in self._history if t <= since]
            if older:
                t0, e0 = older[-1]
                # Power is constant between events: interpolate inside that segment.
                nxt = next(((t, e) for t, e in self._history if t > since), (now, self._energy))
                span = nxt[0] - t0
                e_since = e0 + (nxt[1] - e0) * ((since - t0) / span if span > 0 else 0.0)
                return (self._energy - e_since) / self.average_window
            t0, e0 = self._history[0]
            return (self._energy - e0) / (now - t0) if now > t0 else self.idle_w + self._above()


Gauge = Literal["counter", "instant", "average"]


class SimulatedReader:
    """Reads a :class:`SimulatedCard` the way NVML reads a real one."""

    backend = "simulated"
    source = "local"
    method: Literal["measured", "simulated"] = "simulated"
    blocking = False

    def __init__(
        self,
        card: SimulatedCard,
        *,
        gauge: Gauge = "counter",
        period: float | None = None,
        fail: Callable[[], str | None] | None = None,
    ) -> None:
        self.card = card
        self.gauge = gauge
        self.kind: Kind = "counter" if gauge == "counter" else "power"
        self.period = period or (card.counter_period if gauge == "counter" else 0.1) or 0.1
        self.clock = card.clock
        self._fail = fail
        self.reads = 0

    def read(self) -> Reading:
        self.reads += 1
        if self._fail is not None and (reason := self._fail()):
            return Reading(t=self.clock(), error=reason)
        t = self.clock()
        if self.gauge == "counter":
            return Reading(t=t, joules=self.card.energy_j())
        if self.gauge == "instant":
            return Reading(t=t, watts=self.card.instant_w())
        return Reading(t=t, watts=self.card.average_w())

    def close(self) -> None:
        return None
