"""A scripted stand-in for the ``pynvml`` module: counters, power, errors, resets, no GPU.

Each fake GPU has a cumulative energy counter in mJ and a power reading in mW that a test
sets directly, plus switches for ``NotSupported`` and for errors raised mid-run. The shape
of the API (exception classes with ``.value``, field values with ``nvmlReturn`` and
``value.uiVal``) follows nvidia-ml-py, so the reader code is the code that meets a real card.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
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
        }.get(self.value, f"Unknown Error ({self.value})")


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    energy_mj: int = 0
    power_mw: int = 100_000
    counter: bool = True
    instant: bool = True
    average: bool = True
    mig: bool = False
    fail: int | None = None  # raise NVMLError(fail) from every read while set
    calls: list[str] = field(default_factory=list)


class FakeNvml:
    """Use as a module: ``reader = NvmlReader(nvml=FakeNvml([FakeGpu()]))``."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None):
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    # -- lifecycle
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index >= len(self.gpus):
            raise NVMLError(2)
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> bytes:
        return gpu.name.encode()

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        return (int(gpu.mig), int(gpu.mig))

    # -- readings
    def _check(self, gpu: FakeGpu, supported: bool, what: str) -> None:
        gpu.calls.append(what)
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        if not supported:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._check(gpu, gpu.counter, "counter")
        return gpu.energy_mj

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._check(gpu, gpu.average, "average")
        return gpu.power_mw

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> list:
        gpu.calls.append("fields")
        if gpu.fail is not None:
            raise NVMLError(gpu.fail)
        out = []
        for fid in field_ids:
            ok = fid == NVML_FI_DEV_POWER_INSTANT and gpu.instant
            out.append(SimpleNamespace(
                fieldId=fid,
                nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=gpu.power_mw if ok else 0),
            ))
        return out
