"""A card that knows the truth, written without looking at how the ledger works.

The simulated card the ledger was first checked against was built in the ledger's image:
above-idle power only while a window was open, exact steps on a virtual clock, a warm-up.
This one is built from what real cards do instead, on the real clock, read from a real
thread:

- each job ramps up over a few ms, holds its watts, and after it stops decays with a
  ramp-down tail (exponential, tens of ms), so energy keeps arriving after a window closes;
- a request under continuous batching draws by phase (:class:`PhasedJob`): its prefill
  compute-bound at high watts, then its decode memory-bound at lower watts, the step between
  them a decay like any other;
- a foreign load (steady, or bursty on/off) draws power that no window asked for;
- the energy counter is whole millijoules, and steps at a period with jittered step times,
  or moves at every read; the instant gauge averages only part of each period (as A100 and
  H100 sensors do), the averaged gauge a trailing second.

A job's truth is the energy it caused, tail included, computed in closed form from its own
start, stop and watts (a phased job's, from its start, the end of its prefill, its stop and
the two levels): nothing about windows, intervals, marks or shares enters it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from giul_asgi.readers.base import Kind, Reading

Gauge = Literal["counter", "every_read", "instant", "average"]


@dataclass(eq=False)
class Job:
    watts: float
    start: float
    stop: float | None = None

    def energy_until(self, t: float, ramp_up: float, tau: float) -> float:
        """Joules this job caused from its start until ``t`` (closed form)."""
        if t <= self.start:
            return 0.0
        end = self.stop if self.stop is not None else t
        held = min(t, end) - self.start
        # Ramp up linearly over ramp_up, then hold.
        if held <= ramp_up:
            on = self.watts * held * held / (2 * ramp_up)
            level = self.watts * held / ramp_up
        else:
            on = self.watts * (ramp_up / 2 + held - ramp_up)
            level = self.watts
        if self.stop is None or t <= self.stop:
            return on
        after = t - self.stop  # the ramp-down tail from the level reached at stop
        return on + level * tau * (1 - math.exp(-after / tau))

    def truth(self, ramp_up: float, tau: float) -> float:
        assert self.stop is not None
        return self.energy_until(self.stop + 50 * tau, ramp_up, tau)


@dataclass(eq=False)
class PhasedJob:
    """A request in two phases: ``prefill_w`` from its start to the end of its prefill, then
    ``decode_w`` to its stop. On the card it is two jobs that ramp and decay as any: the
    decode level for the whole request, and the difference for its prefill; so the step
    down at the end of prefill decays with the card's time constant, and the truth is the
    sum of the two jobs' own."""

    level: Job
    burst: Job

    @property
    def start(self) -> float:
        return self.level.start

    def truth(self, ramp_up: float, tau: float) -> float:
        return self.level.truth(ramp_up, tau) + self.burst.truth(ramp_up, tau)


@dataclass
class Foreign:
    """Another process on the card: ``watts`` above idle over [start, end), steady or in
    bursts of ``on_s`` on and ``off_s`` off."""

    watts: float
    start: float
    end: float = math.inf
    on_s: float | None = None
    off_s: float | None = None

    def energy_until(self, t: float) -> float:
        t = min(t, self.end)
        if t <= self.start:
            return 0.0
        span = t - self.start
        if self.on_s is None or self.off_s is None:
            return self.watts * span
        cycle = self.on_s + self.off_s
        whole, part = divmod(span, cycle)
        return self.watts * (whole * self.on_s + min(part, self.on_s))


@dataclass
class TrueCard:
    idle_w: float = 70.0
    period: float = 0.1
    step_jitter: float = 0.003
    ramp_up: float = 0.004
    tau: float = 0.02
    clock: Callable[[], float] = time.monotonic
    seed: int = 0
    jobs: list[Job] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.t0 = self.clock()
        self._done_j = 0.0  # energy of jobs whose tails are over, summed once
        self._phase = random.Random(self.seed).uniform(0, self.period)
        self._jitters: dict[int, float] = {}

    def start_job(self, watts: float) -> Job:
        with self._lock:
            job = Job(watts, self.clock())
            self.jobs.append(job)
            return job

    def start_phased(self, prefill_w: float, decode_w: float) -> PhasedJob:
        """A request whose prefill draws ``prefill_w`` until :meth:`end_prefill`, then
        ``decode_w`` until :meth:`stop_job`."""
        with self._lock:
            t = self.clock()
            job = PhasedJob(Job(decode_w, t), Job(prefill_w - decode_w, t))
            self.jobs += [job.level, job.burst]
            return job

    def end_prefill(self, job: PhasedJob) -> None:
        with self._lock:
            if job.burst.stop is None:
                job.burst.stop = self.clock()

    def stop_job(self, job: Job | PhasedJob) -> None:
        with self._lock:
            t = self.clock()
            if isinstance(job, PhasedJob):
                if job.burst.stop is None:
                    job.burst.stop = t
                job.level.stop = t
            else:
                job.stop = t

    def add_foreign(self, foreign: Foreign) -> None:
        with self._lock:
            self.foreign.append(foreign)

    def energy(self, t: float) -> float:
        """Joules drawn since the card was made, idle included, until ``t``."""
        with self._lock:
            live: list[Job] = []
            # Readers ask for times up to a second or two back (a counter's last step, the
            # averaged gauge): a job is folded into a constant only well past all of those.
            settled_before = self.clock() - 3.0
            for job in self.jobs:
                if job.stop is not None and job.stop + 50 * self.tau < settled_before:
                    self._done_j += job.truth(self.ramp_up, self.tau)
                else:
                    live.append(job)
            self.jobs = live
            jobs_j = self._done_j + sum(j.energy_until(t, self.ramp_up, self.tau) for j in live)
            foreign_j = sum(f.energy_until(t) for f in self.foreign)
        return self.idle_w * (t - self.t0) + jobs_j + foreign_j

    def last_step(self, t: float) -> float:
        """When the counter last stepped at or before ``t`` (jittered around k x period)."""
        k = math.floor((t - self.t0 - self._phase) / self.period)
        for kk in (k + 1, k, k - 1):
            step = self.t0 + self._phase + kk * self.period + self._jitter(kk)
            if step <= t:
                return step
        return self.t0

    def _jitter(self, k: int) -> float:
        # Seeding a generator costs microseconds; a counter read asks for the same steps
        # ten times a period (fake_pynvml reads it on the reader thread, holding the GIL).
        jitter = self._jitters.get(k)
        if jitter is None:
            if len(self._jitters) > 4096:
                self._jitters.clear()
            jitter = random.Random(k * 7919 + self.seed).uniform(-self.step_jitter, self.step_jitter)
            self._jitters[k] = jitter
        return jitter

    def foreign_watts(self, t: float) -> float:
        return sum((f.energy_until(t + 1e-3) - f.energy_until(t)) / 1e-3 for f in self.foreign)


class TrueReader:
    """Reads a :class:`TrueCard` as NVML reads a real one: integer mJ, or watts."""

    source = "local"
    method: Literal["measured", "simulated"] = "measured"

    def __init__(self, card: TrueCard, gauge: Gauge = "counter") -> None:
        self.card = card
        self.gauge = gauge
        self.kind: Kind = "counter" if gauge in ("counter", "every_read") else "power"
        self.backend = "nvml_counter" if self.kind == "counter" else "nvml_power"
        self.period = card.period if gauge != "every_read" else 0.02
        self.clock = card.clock
        self.reads = 0

    def read(self) -> Reading:
        self.reads += 1
        t = self.clock()
        card = self.card
        if self.gauge == "counter":
            return Reading(t, joules=math.floor(card.energy(card.last_step(t)) * 1000) / 1000)
        if self.gauge == "every_read":
            return Reading(t, joules=math.floor(card.energy(t) * 1000) / 1000)
        if self.gauge == "instant":
            # The sensor averages the first quarter of each period, and reports it after.
            start = card.last_step(t)
            if start + card.period / 4 > t:
                start = card.last_step(start - 1e-6)
            window = card.period / 4
            return Reading(t, watts=(card.energy(start + window) - card.energy(start)) / window)
        return Reading(t, watts=(card.energy(t) - card.energy(t - 1.0)) / 1.0)

    def close(self) -> None:
        return None


Fault = Literal["raises", "hangs", "stops"]


class FaultyReader:
    """A :class:`TrueReader` that works for ``after`` seconds, then fails as a real driver
    can: every read raises, every read blocks for ``hang_s``, or the counter stops moving
    (a frozen driver that answers with its last value)."""

    def __init__(self, reader: TrueReader, fault: Fault, after: float, hang_s: float = 5.0) -> None:
        self.reader = reader
        self.fault = fault
        self.hang_s = hang_s
        self.source, self.method, self.kind = reader.source, reader.method, reader.kind
        self.backend, self.period, self.clock = reader.backend, reader.period, reader.clock
        self.start = reader.clock()
        self.after = after
        self._frozen: Reading | None = None

    def failing(self) -> bool:
        return self.clock() - self.start >= self.after

    def read(self) -> Reading:
        if not self.failing():
            reading = self.reader.read()
            self._frozen = reading
            return reading
        if self.fault == "raises":
            raise RuntimeError("NVMLError_GpuIsLost: GPU is lost")
        if self.fault == "hangs":
            time.sleep(self.hang_s)
            return self.reader.read()
        frozen = self._frozen
        return Reading(self.clock(), joules=frozen.joules if frozen else 0.0)

    def close(self) -> None:
        return None
