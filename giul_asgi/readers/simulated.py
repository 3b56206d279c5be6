"""A simulated card that knows the truth, so we can grade what we charge against it.

The card has an idle floor, a power cap, a cumulative energy counter that advances in steps
(as A100/H100 registers do every ~100 ms), an instant gauge and a one-second averaged
gauge. Jobs add load in watts above idle; when the sum passes the cap every job is scaled
down alike. Each job's true energy is its share of the above-idle power by its load, which
is what a perfect attribution would charge it. A :class:`VirtualClock` makes tests exact.

What makes it look like a real card, each off by default so the exact tests stay exact:
``jitter`` moves each counter step by up to that fraction of the period (a real register
does not tick on a perfect grid), ``resolution_j`` rounds the counter down to whole units
(``0.001`` for NVML's integer millijoules), ``ramp_down_s`` lets the power decay towards
the new load instead of dropping at once (a card takes tens of ms to settle after work
stops), ``ramp_up_s`` the same on the way up, and ``start_j`` is where the counter stood
when the driver loaded. :func:`batch_watts` is how a batch's draw grows with its size.

Readings from here are always ``method="simulated"``: a simulated card never reads as a
measured one.
"""

from __future__ import annotations

import math
import random
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


def batch_watts(batch: int, *, per_seq_w: float, exponent: float = 0.6) -> float:
    """Above-idle draw of a batch of ``batch`` sequences: sublinear, as a GPU's is.

    One sequence leaves most of the card waiting on memory; more sequences share the same
    weight reads, so each added one costs less than the one before. The card caps the sum.
    """
    if batch <= 0:
        return 0.0
    return per_seq_w * batch**exponent


@dataclass(eq=False, slots=True)
class Job:
    """Load a piece of work puts on the card, and the energy it truly caused."""

    load_w: float
    started: float
    stopped: float | None = None
    true_joules: float = 0.0


class SimulatedCard:
    """Exact energy between events (constant or exponentially settling power), stepped counter."""

    def __init__(
        self,
        *,
        idle_w: float = 60.0,
        cap_w: float = 700.0,
        counter_period: float = 0.1,
        average_window: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: float = 0.0,
        resolution_j: float | None = None,
        ramp_down_s: float = 0.0,
        ramp_up_s: float = 0.0,
        start_j: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if cap_w <= idle_w:
            raise ValueError("cap_w must exceed idle_w")
        if idle_w < 0:
            raise ValueError("idle_w must be >= 0")
        if not 0.0 <= jitter < 1.0:
            raise ValueError("jitter is a fraction of the period, in [0, 1)")
        if resolution_j is not None and resolution_j <= 0:
            raise ValueError("resolution_j must be > 0")
        if ramp_down_s < 0 or ramp_up_s < 0 or counter_period < 0:
            raise ValueError("periods and ramps must be >= 0")
        self.idle_w = idle_w
        self.cap_w = cap_w
        self.counter_period = counter_period
        self.average_window = average_window
        self.clock = clock
        self.jitter = jitter
        self.resolution_j = resolution_j
        self.ramp_down_s = ramp_down_s
        self.ramp_up_s = ramp_up_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._t = clock()
        self._energy = 0.0  # joules since creation, idle included
        self._counter = 0.0  # value at the last counter step
        self._start_j = start_j
        self._jobs: list[Job] = []
        self._load = 0.0
        self._above_now = 0.0  # the above-idle power at self._t (differs from the target in a ramp)
        self._next_step = self._first_step(self._t)
        # (t, cumulative J) at each event, enough to answer a 1 s trailing average.
        self._history: deque[tuple[float, float]] = deque(maxlen=4096)
        self._history.append((self._t, 0.0))
        self.reset_offset = 0.0

    # -- the physics -------------------------------------------------------------------
    def _target(self) -> float:
        return min(self._load, self.cap_w - self.idle_w)

    def _tau(self, target: float) -> float:
        return self.ramp_down_s if self._above_now > target else self.ramp_up_s

    def _above_after(self, dt: float) -> float:
        if dt <= 0:
            return self._above_now
        target = self._target()
        tau = self._tau(target)
        if tau <= 0:
            return target
        return target + (self._above_now - target) * math.exp(-dt / tau)

    def _energy_after(self, dt: float) -> float:
        """Joules (idle included) drawn in the ``dt`` seconds after ``self._t``."""
        if dt <= 0:
            return 0.0
        target = self._target()
        tau = self._tau(target)
        above = target * dt
        if tau > 0:
            above += (self._above_now - target) * tau * (1.0 - math.exp(-dt / tau))
        return self.idle_w * dt + above

    def _first_step(self, t: float) -> float:
        if self.counter_period <= 0:
            return t
        return (math.floor(t / self.counter_period) + 1) * self.counter_period

    def _step_after(self, step: float) -> float:
        if self.jitter <= 0:
            # On the grid, by multiplication: adding periods up would drift off it.
            return (round(step / self.counter_period) + 1) * self.counter_period
        return step + self.counter_period * (1.0 + self._rng.uniform(-self.jitter, self.jitter))

    def _advance(self, t: float) -> None:
        dt = t - self._t
        if dt <= 0:
            return
        if self.counter_period > 0:
            while self._next_step <= t:
                self._counter = self._energy + self._energy_after(self._next_step - self._t)
                self._next_step = self._step_after(self._next_step)
        gained = self._energy_after(dt)
        above = gained - self.idle_w * dt
        if self.counter_period <= 0:
            self._counter = self._energy + gained
        if self._load > 0 and self._jobs:
            for job in self._jobs:
                job.true_joules += above * (job.load_w / self._load)
        self._energy += gained
        self._above_now = self._above_after(dt)
        self._t = t
        self._history.append((t, self._energy))

    def start_job(self, load_w: float) -> Job:
        with self._lock:
            now = self.clock()
            self._advance(now)
            job = Job(load_w=load_w, started=now)
            self._jobs.append(job)
            self._load += load_w
            if self.ramp_up_s <= 0:
                self._above_now = self._target()
            return job

    def set_load(self, job: Job, load_w: float) -> None:
        """Change what a running job draws (a batch that grew or shrank around it)."""
        with self._lock:
            self._advance(self.clock())
            if job.stopped is not None:
                return
            self._load += load_w - job.load_w
            job.load_w = load_w
            self._settle_jump()

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
                self._settle_jump()
            return job

    def _settle_jump(self) -> None:
        target = self._target()
        if self._tau(target) <= 0:
            self._above_now = target

    def reset_counter(self) -> None:
        """What a driver reload does: the cumulative register starts again from zero."""
        with self._lock:
            self._advance(self.clock())
            self.reset_offset += self._counter
            self._counter = 0.0
            self._energy = 0.0
            self._start_j = 0.0
            self._history.clear()
            self._history.append((self._t, 0.0))

    # -- what a reader sees ------------------------------------------------------------
    @property
    def jobs(self) -> int:
        """How many jobs are on the card now."""
        return len(self._jobs)

    def energy_j(self) -> float:
        """The stepped counter, as NVML reports it (rounded down to ``resolution_j``)."""
        with self._lock:
            self._advance(self.clock())
            value = self._start_j + self._counter
            if self.resolution_j is None:
                return value
            return math.floor(value / self.resolution_j + 1e-9) * self.resolution_j

    def energy_mj(self) -> int:
        """The counter in whole millijoules, as ``nvmlDeviceGetTotalEnergyConsumption`` gives it."""
        with self._lock:
            self._advance(self.clock())
            return math.floor((self._start_j + self._counter) * 1000.0 + 1e-6)

    def true_energy_j(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self._energy

    def instant_w(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self.idle_w + self._above_now

    def average_w(self) -> float:
        with self._lock:
            now = self.clock()
            self._advance(now)
            since = now - self.average_window
            older = [(t, e) for t, e in self._history if t <= since]
            if older:
                t0, e0 = older[-1]
                # Interpolate inside the segment that holds the window's start.
                nxt = next(((t, e) for t, e in self._history if t > since), (now, self._energy))
                span = nxt[0] - t0
                e_since = e0 + (nxt[1] - e0) * ((since - t0) / span if span > 0 else 0.0)
                return (self._energy - e_since) / self.average_window
            t0, e0 = self._history[0]
            return (self._energy - e0) / (now - t0) if now > t0 else self.idle_w + self._above_now


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
