"""A scripted stand-in for the ``pynvml`` module: counters, power, errors, resets, no GPU.

Each fake GPU has a cumulative energy counter in whole mJ (an ``int``, as the register is)
and a power reading in mW that a test sets directly, plus switches for ``NotSupported``,
for errors raised mid-run, and for a wedged driver: ``FakeGpu(block_s=N)`` makes every call
on that GPU sleep N seconds first, and ``FakeNvml(block_s=N)`` makes every call of the
module sleep (``nvmlInit`` included). :class:`LiveGpu` is a GPU whose counter steps by
itself on a clock, every ``step_s``, at the power a test (or a benchmark's ``--fake``
run) sets, for code that samples in real time (probe, agent, gpu_check).

The shape of the API (exception classes with ``.value``, field values with ``nvmlReturn``
and ``value.uiVal``, process entries with ``.pid``) follows nvidia-ml-py, so the reader
code is the code that meets a real card.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_FI_DEV_POWER_INSTANT = 186


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        }.get(self.value, f"Unknown Error ({self.value})")


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    energy_mj: int = 0
    power_mw: int = 100_000
    average_mw: int | None = None  # the 1 s averaged gauge; None: same as power_mw
    counter: bool = True
    instant: bool = True
    average: bool = True
    mig: bool = False
    uuid: str | None = None
    fail: int | None = None  # raise NVMLError(fail) from every read while set
    block_s: float = 0.0  # every call on this GPU sleeps this long first (a wedged driver)
    #: pids of compute processes; None: the call answers NotSupported
    processes: list[int] | None = field(default_factory=list)
    #: under MIG, the compute pids of each slice (MIG device handles)
    mig_slices: list[list[int]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def counter_mj(self) -> int:
        return int(self.energy_mj)

    def instant_mw(self) -> int:
        return int(self.power_mw)

    def average_power_mw(self) -> int:
        return int(self.power_mw if self.average_mw is None else self.average_mw)


class LiveGpu(FakeGpu):
    """A GPU whose counter steps by itself: every ``step_s`` it adds ``watts * step_s`` in mJ.

    ``watts`` is what a test or benchmark sets (the load); the instant gauge answers it at
    once, the averaged gauge answers the mean over the last ``average_s``.
    """

    def __init__(
        self,
        *,
        watts: float = 60.0,
        step_s: float = 0.1,
        average_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self.clock = clock
        self.step_s = step_s
        self.average_s = average_s
        self._watts = watts
        self._t = clock()
        self._exact_mj = float(self.energy_mj)
        self._history: list[tuple[float, float]] = [(self._t, self._exact_mj)]

    @property
    def watts(self) -> float:
        return self._watts

    @watts.setter
    def watts(self, value: float) -> None:
        with self._lock:
            self._advance()
            self._watts = value

    def _advance(self) -> None:
        now = self.clock()
        self._exact_mj += self._watts * (now - self._t) * 1000.0
        self._t = now
        self._history.append((now, self._exact_mj))
        cutoff = now - self.average_s * 2
        while len(self._history) > 2 and self._history[1][0] < cutoff:
            self._history.pop(0)

    def _exact_at(self, t: float) -> float:
        """The exact energy at ``t`` (at or before now), from the piecewise history."""
        prev_t, prev_e = self._history[0]
        if t <= prev_t:
            return prev_e
        for ht, he in self._history[1:]:
            if t <= ht:
                return prev_e + (he - prev_e) * (t - prev_t) / (ht - prev_t)
            prev_t, prev_e = ht, he
        return prev_e

    def counter_mj(self) -> int:
        with self._lock:
            self._advance()
            stepped_at = (self._t // self.step_s) * self.step_s
            return int(self._exact_at(stepped_at))

    def instant_mw(self) -> int:
        with self._lock:
            return int(self._watts * 1000.0)

    def average_power_mw(self) -> int:
        with self._lock:
            self._advance()
            start = self._t - self.average_s
            return int((self._exact_mj - self._exact_at(start)) / self.average_s)


class FakeNvml:
    """Use as a module: ``reader = NvmlReader(nvml=FakeNvml([FakeGpu()]))``."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        block_s: float = 0.0,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.block_s = block_s  # every call of this module sleeps this long first
        self.inits = 0
        self.shutdowns = 0

    def _stall(self, gpu: FakeGpu | None = None) -> None:
        delay = self.block_s + (gpu.block_s if gpu is not None else 0.0)
        if delay > 0:
            time.sleep(delay)

    # -- lifecycle
    def nvmlInit(self) -> None:
        self._stall()
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._stall()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._stall()
        if index >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes:
        self._stall(gpu)
        return gpu.name.encode()

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._stall(gpu)
        if gpu.uuid is None:
            # One fake card per test: two tests' cards never meet at a card's table.
            return f"GPU-fake-{self.gpus.index(gpu):04d}-{id(self):x}"
        return gpu.uuid

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        self._stall(gpu)
        return (int(gpu.mig), int(gpu.mig))

    # -- readings
    def _check(self, gpu: FakeGpu, supported: bool, what: str) -> None:
        self._stall(gpu)
        gpu.calls.append(what)
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        if not supported:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._check(gpu, gpu.counter, "counter")
        return gpu.counter_mj()

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._check(gpu, gpu.average, "average")
        return gpu.average_power_mw()

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> list[Any]:
        self._stall(gpu)
        gpu.calls.append("fields")
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        out = []
        for fid in field_ids:
            ok = fid == NVML_FI_DEV_POWER_INSTANT and gpu.instant
            out.append(SimpleNamespace(
                fieldId=fid,
                nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=gpu.instant_mw() if ok else 0),
            ))
        return out

    # -- processes
    def nvmlDeviceGetComputeProcesses(self, gpu: Any) -> list[Any]:
        if isinstance(gpu, _MigDevice):
            return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in gpu.pids]
        self._check(gpu, gpu.processes is not None, "processes")
        pids = gpu.processes or []
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        self._stall(gpu)
        return 7 if gpu.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> _MigDevice:
        self._stall(gpu)
        if not gpu.mig or index >= len(gpu.mig_slices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigDevice(gpu, index, gpu.mig_slices[index])


@dataclass
class _MigDevice:
    parent: FakeGpu
    index: int
    pids: list[int]


def skip_with_a_driver() -> None:
    """Skip the calling test where the real pynvml starts: it checks a host without a GPU."""
    import pynvml
    import pytest

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip("this host has a working NVIDIA driver")
