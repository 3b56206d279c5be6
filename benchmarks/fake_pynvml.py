"""A ``pynvml`` whose calls cost what nvidia-ml-py's do: a ctypes call into C, the GIL let go.

Production reads NVML through nvidia-ml-py: each call builds its ctypes out-parameters,
looks the C function up in a cache, makes one foreign call into libnvidia-ml.so (ctypes lets
the GIL go for the call and takes it back after) and checks the return code. The tests'
fake (tests/fake_nvml.py) is plain Python: it never lets the GIL go and costs nothing, so a
benchmark over it measures a cheaper path than production's. This module keeps
nvidia-ml-py's shape (the same names, out-parameters, return-code check, ``NVMLError`` with
``.value``) and makes every call one ctypes call into libc's ``clock_nanosleep``, GIL
released, until an absolute deadline drawn from the call's cost:

- ``nvmlDeviceGetTotalEnergyConsumption``: log-normal, median 20 us, sigma 0.45 (p90 about
  36 us, p99 about 57 us), kept within 8-200 us; one call in 5,000 stalls 2 ms (a busy
  driver). Why: the DESIGN's "usually tens of microseconds, a busy driver can stall one for
  milliseconds"; public figures put one NVML query at about 20-45 us on recent cards (a
  four-metric sample at about 90 us on an RTX 5080; codecarbon's simulator charges 40-50 us
  a query) and a few hundred on Kepler.
- field values (instant power) 25 us, ``nvmlDeviceGetPowerUsage`` 20 us, the compute-process
  list 250 us (the slow query in every account), ``nvmlInit`` 50 ms (tens to hundreds of ms
  on real hosts), handles, names, counts 5 us.

The wait is a sleep (no CPU): what a real driver spends in the kernel is unknown here, and a
second foreign call to burn CPU would double the GIL hand-overs a read causes. The calling
thread's timer slack is set to 1 us on its first call (prctl), or every 20 us sleep would
last 70 (Linux's default slack is 50 us); the reader thread is the only thread that calls.

Every call records when it began and how late Python got the GIL back after its deadline
(``stats``): the GIL hand-over a read causes, measured where it happens. The counter is a
:class:`truecard.TrueCard`'s (whole mJ, steps at its period with jitter, ramp tails, foreign
load), so a benchmark can compute each request's truth beside it.

    import fake_pynvml
    card = fake_pynvml.install([fake_pynvml.Gpu(TrueCard())])   # sys.modules["pynvml"]
    ... Node(reader="nvml") reads it ...
    fake_pynvml.uninstall()

``python benchmarks/fake_pynvml.py`` prints the calibration: what each call costs here, beside
nvidia-ml-py's own Python around a C call that does nothing.
"""

from __future__ import annotations

import ctypes
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from ctypes import byref, c_uint, c_uint64
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from truecard import TrueCard, TrueReader

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_FI_DEV_POWER_INSTANT = 186
NVML_FI_DEV_POWER_AVERAGE = 185

_CLOCK_MONOTONIC = 1
_TIMER_ABSTIME = 1
_PR_SET_TIMERSLACK = 29


class NVMLError(Exception):
    """nvidia-ml-py's error: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
                NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_NOT_FOUND: "Not Found",
                NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument"}.get(
                    self.value, f"Unknown Error ({self.value})")


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


def _nvmlCheckReturn(ret: int) -> int:
    if ret != NVML_SUCCESS:
        raise NVMLError_NotSupported() if ret == NVML_ERROR_NOT_SUPPORTED else NVMLError(ret)
    return ret


@dataclass(frozen=True)
class Cost:
    """One call's time in the driver: log-normal around ``median_us``, kept within bounds."""

    median_us: float
    sigma: float = 0.45
    floor_us: float = 2.0
    cap_us: float = 200.0

    def draws(self, rng: random.Random, n: int) -> tuple[int, ...]:
        """``n`` durations in ns."""
        return tuple(
            int(min(self.cap_us, max(self.floor_us, rng.lognormvariate(math.log(self.median_us), self.sigma)))
                * 1000)
            for _ in range(n)
        )


COSTS: dict[str, Cost] = {
    "counter": Cost(20.0, floor_us=8.0), "fields": Cost(25.0, floor_us=10.0),
    "average": Cost(20.0, floor_us=8.0), "processes": Cost(250.0, 0.3, 100.0, 2000.0),
    "init": Cost(50_000.0, 0.2, 20_000.0, 200_000.0), "small": Cost(5.0, 0.3, 2.0, 50.0),
}
#: One call in STALL_EVERY (of the reading calls) stalls STALL_US: a busy driver.
STALL_EVERY = 5000
STALL_US = 2000.0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


@dataclass
class Stats:
    """For every reading call (counter, fields, averaged power): when it began, and how late
    (ns past its deadline) the calling thread had the GIL back; and which threads called."""

    starts_ns: list[int] = field(default_factory=list)
    lags_ns: list[int] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)

    def reset(self) -> None:
        self.starts_ns.clear()
        self.lags_ns.clear()


class _Kind:
    """One kind of call: its drawn durations (cycled), how many were made."""

    __slots__ = ("count", "draws", "index", "reading")

    def __init__(self, draws: tuple[int, ...], reading: bool) -> None:
        self.draws, self.index, self.count, self.reading = draws, 0, 0, reading


class Driver:
    """The C side: every NVML call is one ``clock_nanosleep`` to an absolute deadline (one
    ``getpid`` where the cost is scaled to nothing, to time the Python alone)."""

    def __init__(self, costs: dict[str, Cost] | None = None, *, seed: int = 0,
                 stall_every: int = STALL_EVERY, stall_us: float = STALL_US, scale: float = 1.0) -> None:
        rng = random.Random(seed)
        costs = {**COSTS, **(costs or {})}
        self._kinds = {
            k: _Kind(tuple(int(d * scale) for d in c.draws(rng, 4096)), k in ("counter", "fields", "average"))
            for k, c in costs.items()
        }
        self._stall_every, self._stall_ns = stall_every, int(stall_us * 1000 * scale)
        self._reading_calls = 0
        self._libc = libc = ctypes.CDLL(None, use_errno=True)
        self._sleep = libc.clock_nanosleep
        self._noop = libc.getpid
        self._slack_set: set[int] = set()
        self.stats = Stats()

    def draws(self, kind: str) -> tuple[int, ...]:
        return self._kinds[kind].draws

    def call(self, kind: str) -> None:
        """Spend one call of ``kind`` in C with the GIL released."""
        tid = threading.get_ident()
        if tid not in self._slack_set:
            self._slack_set.add(tid)
            self._libc.prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
        k = self._kinds[kind]
        i = k.index
        k.index = (i + 1) & 4095
        k.count += 1
        ns = k.draws[i]
        if k.reading:
            self._reading_calls += 1
            if self._reading_calls % self._stall_every == 0:
                ns = self._stall_ns
        start = time.monotonic_ns()
        deadline = start + ns
        if ns:
            self._sleep(_CLOCK_MONOTONIC, _TIMER_ABSTIME,
                        byref(_Timespec(deadline // 1_000_000_000, deadline % 1_000_000_000)), None)
        else:
            self._noop()
        if k.reading:
            stats = self.stats
            stats.lags_ns.append(time.monotonic_ns() - deadline)
            stats.starts_ns.append(start)
            stats.threads.add(tid)

    def block(self, seconds: float) -> None:
        """A wedged driver: block in C for ``seconds``, GIL released."""
        deadline = time.monotonic_ns() + int(seconds * 1e9)
        self._sleep(_CLOCK_MONOTONIC, _TIMER_ABSTIME,
                    byref(_Timespec(deadline // 1_000_000_000, deadline % 1_000_000_000)), None)

    def calls(self) -> dict[str, int]:
        """Calls made, by kind."""
        return {name: k.count for name, k in self._kinds.items() if k.count}


class Gpu:
    """One card: a :class:`TrueCard`'s counter in whole mJ (cached per step, as the register
    holds it; ``every_read``: a counter that moves at every read), its part-time instant gauge
    and its trailing-second average.

    Faults, as a real driver fails, from ``fault_at`` (on the card's clock) on: ``raises``
    (every reading call returns GPU_IS_LOST), ``hangs`` (every reading call blocks in C for
    ``hang_s``, GIL released), ``stops`` (the counter answers its last value for ever).
    """

    def __init__(self, card: TrueCard | None = None, *, name: str = "NVIDIA H100 80GB HBM3",
                 uuid: str | None = None, counter: bool = True, instant: bool = True,
                 average: bool = True, processes: list[int] | None = None, every_read: bool = False,
                 fault: str | None = None, fault_at: float = math.inf, hang_s: float = 5.0) -> None:
        self.card = card if card is not None else TrueCard()
        self.name, self.uuid = name, uuid
        self.counter, self.instant, self.average = counter, instant, average
        self.processes = [] if processes is None else processes
        self.every_read = every_read
        self.fail: int | None = None  # every reading call returns this code while set
        self.fault, self.fault_at, self.hang_s = fault, fault_at, hang_s
        self._until = -math.inf  # the register cannot step before this
        self._mj = 0
        self._gauges = {g: TrueReader(self.card, g) for g in ("instant", "average")}

    def failing(self) -> str | None:
        """The fault in force now, if any."""
        if self.fault is None or self.card.clock() < self.fault_at:
            return None
        return self.fault

    def counter_mj(self) -> int:
        card = self.card
        now = card.clock()
        if self.every_read:
            self._mj = math.floor(card.energy(now) * 1000.0)
        elif now >= self._until:  # the register may have stepped: read the card at its last step
            step = card.last_step(now)
            # A card read within its first phase last stepped before it was made (the model's
            # negative past); a driver's counter is never below zero (a uint64 in C).
            self._mj = max(0, math.floor(card.energy(step) * 1000.0))
            self._until = step + card.period - 2 * card.step_jitter
        return self._mj

    def power_mw(self, gauge: str) -> int:
        watts = self._gauges[gauge].read().watts or 0.0
        return int(watts * 1000.0)


@dataclass
class _State:
    gpus: list[Gpu]
    driver: Driver
    initialised: int = 0


_state: _State | None = None


def _entry(kind: str, body: Callable[..., int]) -> Callable[..., int]:
    """A C entry point: its effect (the register read as the call enters the driver), then
    the call's time in the driver, GIL released.

    A real driver reads the register inside the C call, before ctypes takes the GIL back; a
    fake that read it after the wait would read it as late as the GIL came back (2 ms and
    more beside a busy loop), which no card does, and a reader that stamps its reading when
    it called (as NvmlReader does) would be told a step it could not yet have seen."""

    def call(*args: Any) -> int:
        state = _state
        if state is None:
            return NVML_ERROR_UNINITIALIZED
        ret = body(state, *args)
        state.driver.call(kind)
        return ret

    return call


def _init(state: _State, _flags: int) -> int:
    state.initialised += 1
    return NVML_SUCCESS


def _shutdown(state: _State) -> int:
    state.initialised = max(0, state.initialised - 1)
    return NVML_SUCCESS


def _count(state: _State, out: Any) -> int:
    out._obj.value = len(state.gpus)
    return NVML_SUCCESS


def _handle(state: _State, index: int, out: list[Gpu]) -> int:
    if not 0 <= index < len(state.gpus):
        return NVML_ERROR_INVALID_ARGUMENT
    out.append(state.gpus[index])
    return NVML_SUCCESS


def _faulty(state: _State, gpu: Gpu) -> int | None:
    """The return code a failing GPU gives now (None: it answers); a hang blocks in C first."""
    if gpu.fail is not None:
        return gpu.fail
    fault = gpu.failing()
    if fault == "raises":
        return NVML_ERROR_GPU_IS_LOST
    if fault == "hangs":
        state.driver.block(gpu.hang_s)
    return None


def _reading(flag: str, value: Callable[[Gpu], int]) -> Callable[[_State, Gpu, Any], int]:
    def body(state: _State, gpu: Gpu, out: Any) -> int:
        failed = _faulty(state, gpu)
        if failed is not None:
            return failed
        if not getattr(gpu, flag):
            return NVML_ERROR_NOT_SUPPORTED
        if gpu.failing() == "stops":
            out._obj.value = gpu._mj if flag == "counter" else 0
            return NVML_SUCCESS
        out._obj.value = value(gpu)
        return NVML_SUCCESS

    return body


def _fields(state: _State, gpu: Gpu, values: list[SimpleNamespace]) -> int:
    failed = _faulty(state, gpu)
    if failed is not None:
        return failed
    for v in values:
        gauge = {NVML_FI_DEV_POWER_INSTANT: "instant", NVML_FI_DEV_POWER_AVERAGE: "average"}.get(v.fieldId)
        ok = gauge is not None and getattr(gpu, gauge)
        v.nvmlReturn = NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED
        v.value.uiVal = gpu.power_mw(gauge) if gauge is not None and ok else 0
    return NVML_SUCCESS


def _processes(state: _State, gpu: Gpu, out: list[SimpleNamespace]) -> int:
    if gpu.fail is not None:
        return gpu.fail
    out.extend(SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in gpu.processes)
    return NVML_SUCCESS


_FUNCTIONS: dict[str, Callable[..., int]] = {
    "nvmlInitWithFlags": _entry("init", _init),
    "nvmlShutdown": _entry("small", _shutdown),
    "nvmlDeviceGetCount_v2": _entry("small", _count),
    "nvmlDeviceGetHandleByIndex_v2": _entry("small", _handle),
    "nvmlDeviceGetTotalEnergyConsumption": _entry("counter", _reading("counter", Gpu.counter_mj)),
    "nvmlDeviceGetPowerUsage": _entry("average", _reading("average", lambda g: g.power_mw("average"))),
    "nvmlDeviceGetFieldValues": _entry("fields", _fields),
    "nvmlDeviceGetComputeRunningProcesses_v3": _entry("processes", _processes),
    "nvmlDeviceGetName": _entry("small", lambda state, gpu: NVML_SUCCESS),
    "nvmlDeviceGetUUID": _entry("small", lambda state, gpu: NVML_SUCCESS),
    "nvmlDeviceGetMigMode": _entry("small", lambda state, gpu: NVML_SUCCESS),
}


def _nvmlGetFunctionPointer(name: str) -> Callable[..., int]:
    return _FUNCTIONS[name]


# -- the module's API, in nvidia-ml-py's shape ------------------------------------------------


def nvmlInit() -> None:
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlInitWithFlags")(0))


def nvmlShutdown() -> None:
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlShutdown")())


def nvmlDeviceGetCount() -> int:
    c_count = c_uint()
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")(byref(c_count)))
    return c_count.value


def nvmlDeviceGetHandleByIndex(index: int) -> Gpu:
    out: list[Gpu] = []
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetHandleByIndex_v2")(index, out))
    return out[0]


def nvmlDeviceGetName(handle: Gpu) -> str:
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetName")(handle))
    return handle.name


def nvmlDeviceGetUUID(handle: Gpu) -> str:
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetUUID")(handle))
    return handle.uuid or f"GPU-fake-{id(handle):x}"


def nvmlDeviceGetMigMode(handle: Gpu) -> tuple[int, int]:
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetMigMode")(handle))
    return (0, 0)


def nvmlDeviceGetTotalEnergyConsumption(handle: Gpu) -> int:
    c_millijoules = c_uint64()
    fn = _nvmlGetFunctionPointer("nvmlDeviceGetTotalEnergyConsumption")
    ret = fn(handle, byref(c_millijoules))
    _nvmlCheckReturn(ret)
    return c_millijoules.value


def nvmlDeviceGetPowerUsage(handle: Gpu) -> int:
    c_milliwatts = c_uint()
    fn = _nvmlGetFunctionPointer("nvmlDeviceGetPowerUsage")
    ret = fn(handle, byref(c_milliwatts))
    _nvmlCheckReturn(ret)
    return c_milliwatts.value


def nvmlDeviceGetFieldValues(handle: Gpu, fieldIds: Sequence[int]) -> list[SimpleNamespace]:
    values = [SimpleNamespace(fieldId=f, scopeId=0, nvmlReturn=NVML_SUCCESS, value=SimpleNamespace(uiVal=0))
              for f in fieldIds]
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")(handle, values))
    return values


def nvmlDeviceGetComputeProcesses(handle: Gpu) -> list[SimpleNamespace]:
    out: list[SimpleNamespace] = []
    _nvmlCheckReturn(_nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")(handle, out))
    return out


def nvmlDeviceGetMaxMigDeviceCount(handle: Gpu) -> int:
    return 0


def nvmlDeviceGetMigDeviceHandleByIndex(handle: Gpu, index: int) -> Gpu:
    raise NVMLError(NVML_ERROR_NOT_FOUND)


# -- installing it ------------------------------------------------------------------------------


def install(gpus: list[Gpu] | None = None, driver: Driver | None = None) -> Driver:
    """Make ``import pynvml`` give this module, over ``gpus`` (one busy-enough card when
    none), every call costing ``driver``'s time. Each GPU gets a UUID of its own unless it
    names one, so processes never take two fake cards for one (the host's sharing keys by
    UUID). Returns the driver (its ``stats``)."""
    global _state
    gpus = gpus if gpus is not None else [Gpu()]
    for i, gpu in enumerate(gpus):
        if gpu.uuid is None:
            gpu.uuid = f"GPU-fake-{threading.get_native_id():x}-{time.monotonic_ns():x}-{i}"
    _state = _State(gpus, driver or Driver())
    sys.modules["pynvml"] = sys.modules[__name__]
    return _state.driver


def driver() -> Driver | None:
    """The installed fake's driver (its ``stats`` and ``calls()``), or None."""
    return _state.driver if _state is not None else None


def uninstall() -> None:
    global _state
    _state = None
    if sys.modules.get("pynvml") is sys.modules[__name__]:
        del sys.modules["pynvml"]


def busy_card(watts: float = 150.0, idle_w: float = 70.0, period: float = 0.1) -> TrueCard:
    """A card drawing ``watts`` above idle from now on (the overhead benchmarks' load)."""
    card = TrueCard(idle_w=idle_w, period=period)
    card.start_job(watts)
    return card


# -- calibration ---------------------------------------------------------------------------------


def _quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return tuple(ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9, 0.99))  # type: ignore[return-value]


def _time_calls(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def _nvidia_ml_py_python_us(n: int) -> float | None:
    """nvidia-ml-py's own Python around one C call: its energy wrapper over libc's
    ``strcmp("", "")`` (returns 0, writes nothing), median us; None when not installed."""
    import importlib

    saved = sys.modules.pop("pynvml", None)
    try:
        real = importlib.import_module("pynvml")
    except ImportError:
        return None
    finally:
        if saved is not None:
            sys.modules["pynvml"] = saved
    if getattr(real, "_nvmlGetFunctionPointer_cache", None) is None:
        return None
    libc = ctypes.CDLL(None)
    real._nvmlGetFunctionPointer_cache["nvmlDeviceGetTotalEnergyConsumption"] = libc.strcmp
    handle = ctypes.c_char_p(b"")
    return _quantiles(_time_calls(lambda: real.nvmlDeviceGetTotalEnergyConsumption(handle), n))[0]


def calibrate(n: int = 3000) -> str:
    """Markdown: each reading call's wall time here, its GIL lag on a quiet process, and the
    fake's Python beside nvidia-ml-py's."""
    import os
    import platform
    from datetime import UTC, datetime

    lines = [f"# fake_pynvml calibration: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, "
             f"Python {platform.python_version()}",
             "", "    python benchmarks/fake_pynvml.py", "",
             f"Each call timed alone from Python, {n} calls, on a quiet thread (median / p90 / p99 us).", "",
             "| call | drawn cost p50 / p90 / p99 | wall p50 / p90 / p99 "
             "| GIL back after the deadline p50 / p90 |",
             "|---|---|---|---|"]
    rows: list[tuple[str, str, Callable[[Gpu], Any]]] = [
        ("nvmlDeviceGetTotalEnergyConsumption", "counter", nvmlDeviceGetTotalEnergyConsumption),
        ("nvmlDeviceGetFieldValues (instant)", "fields",
         lambda g: nvmlDeviceGetFieldValues(g, [NVML_FI_DEV_POWER_INSTANT])),
        ("nvmlDeviceGetPowerUsage", "average", nvmlDeviceGetPowerUsage),
    ]
    for name, kind, fn in rows:
        driver = install([Gpu(busy_card())], Driver(stall_every=10**9))
        gpu = nvmlDeviceGetHandleByIndex(0)
        walls = _time_calls(lambda fn=fn, gpu=gpu: fn(gpu), n)  # type: ignore[misc]
        drawn = [d / 1000 for d in driver.draws(kind)]
        lags = [v / 1000 for v in driver.stats.lags_ns]
        d, w, g = _quantiles(drawn), _quantiles(walls), _quantiles(lags)
        lines.append(f"| {name} | {d[0]:.1f} / {d[1]:.1f} / {d[2]:.1f} "
                     f"| {w[0]:.1f} / {w[1]:.1f} / {w[2]:.1f} | {g[0]:.1f} / {g[1]:.1f} |")
    driver = install([Gpu(busy_card())], Driver(scale=0.0, stall_every=10**9))
    gpu = nvmlDeviceGetHandleByIndex(0)
    ours = _quantiles(_time_calls(lambda: nvmlDeviceGetTotalEnergyConsumption(gpu), n))[0]
    uninstall()
    theirs = _nvidia_ml_py_python_us(n)
    lines += ["", "Python per counter read, around a C call that returns at once (the fake's driver scaled "
              "to nothing calls getpid; nvidia-ml-py's wrapper is given libc's strcmp):", "",
              f"- this fake: {ours:.2f} us (its wrapper, the entry point, the counter's step cache, the "
              "stats, one ctypes call)",
              "- nvidia-ml-py's wrapper: " + ("not installed" if theirs is None else f"{theirs:.2f} us"),
              "", f"Stalls: one reading call in {STALL_EVERY} lasts {STALL_US:g} us (off in the rows above)."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(calibrate())
