"""NVML: the card's own energy counter where it has one, its power gauge where it does not.

``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer) is a cumulative millijoule
register: a delta between two reads is a true measurement with no sampling to fall through.
Where it answers ``NotSupported`` we read power instead: field ``NVML_FI_DEV_POWER_INSTANT``
first (``nvmlDeviceGetPowerUsage`` is a one-second average on H100-class cards, which
smears energy across neighbouring requests), then ``nvmlDeviceGetPowerUsage``. What each
GPU supports is probed once, when the reader is built, and never on a request's path.

Power and energy are board-level: a MIG slice cannot be metered alone, so a node whose
GPU is in MIG mode says so in ``notes`` rather than dividing the board silently.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from ..errors import ReaderUnavailable
from .base import Kind, Reading

NVML_FI_DEV_POWER_INSTANT = 186
NVML_ERROR_NOT_SUPPORTED = 3
#: A100/H100 counters advance about every 100 ms; reading faster only repeats values.
COUNTER_PERIOD_S = 0.1
POWER_PERIOD_S = 0.1


def _load_nvml(nvml: ModuleType | None) -> ModuleType:
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        raise ReaderUnavailable(
            "the pynvml module is not installed", remedy="pip install nvidia-ml-py"
        ) from None
    return pynvml


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _not_supported(nvml: ModuleType, exc: BaseException) -> bool:
    code = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)
    return getattr(exc, "value", None) == code


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """What one GPU answered when asked once, at start."""

    index: int
    name: str | None
    counter: bool
    instant_power: bool
    average_power: bool
    mig: bool | None
    error: str | None = None


def _instant_power_mw(nvml: ModuleType, handle: Any) -> float:
    field_id = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
    values = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    value = values[0]
    if value.nvmlReturn != 0:
        raise nvml.NVMLError(value.nvmlReturn)
    return float(value.value.uiVal)


def _probe_one(nvml: ModuleType, index: int, handle: Any) -> GpuProbe:
    try:
        raw_name = nvml.nvmlDeviceGetName(handle)
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
    except Exception:
        name = None
    checks: dict[str, bool] = {}
    for key, call in (
        ("counter", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        ("instant", lambda: _instant_power_mw(nvml, handle)),
        ("average", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
    ):
        try:
            call()
            checks[key] = True
        except Exception:
            checks[key] = False
    mig: bool | None
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        mig = bool(current)
    except Exception:
        mig = None
    return GpuProbe(index, name, checks["counter"], checks["instant"], checks["average"], mig)


def probe_nvml(nvml: ModuleType | None = None) -> list[GpuProbe]:
    """Every visible GPU and what it supports; empty when NVML is absent or will not start."""
    try:
        nvml = _load_nvml(nvml)
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        probes = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                probes.append(_probe_one(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index)))
            except Exception as exc:
                probes.append(GpuProbe(index, None, False, False, False, None, _describe(exc)))
        return probes
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


class NvmlReader:
    """Reads a node's GPUs through NVML and sums them: one counter, or one power gauge."""

    source = "local"
    method: Literal["measured", "simulated"] = "measured"
    blocking = True

    def __init__(
        self,
        gpus: Sequence[int] = (0,),
        *,
        period: float | None = None,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml = _load_nvml(nvml)
        self.clock = clock
        self.gpus = tuple(gpus)
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise ReaderUnavailable(
                f"NVML would not start ({_describe(exc)})",
                remedy="check the NVIDIA driver is loaded (nvidia-smi), or use reader='none'",
            ) from None
        self._open = True
        try:
            count = nvml.nvmlDeviceGetCount()
            if not self.gpus:  # an empty list means every GPU this host shows
                self.gpus = tuple(range(count))
            if not self.gpus:
                raise ReaderUnavailable("NVML sees no GPU on this host")
            missing = [g for g in self.gpus if g >= count]
            if missing:
                raise ReaderUnavailable(
                    f"GPU index {missing[0]} not present: NVML sees {count} GPU(s)",
                    remedy="fix the node's gpus list (CUDA_VISIBLE_DEVICES does not renumber NVML)",
                )
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus]
            self.probes = [_probe_one(nvml, g, h) for g, h in zip(self.gpus, self._handles, strict=True)]
        except ReaderUnavailable:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise ReaderUnavailable(f"NVML failed while probing: {_describe(exc)}") from None

        self.notes: list[str] = [
            f"GPU {p.index} is in MIG mode: energy is the whole board's, not a slice's"
            for p in self.probes if p.mig
        ]
        self.kind: Kind
        self._read_one: Callable[[Any], float]
        if all(p.counter for p in self.probes):
            self.kind, self.backend = "counter", "nvml_counter"
            self._read_one = nvml.nvmlDeviceGetTotalEnergyConsumption
            self.period = period or COUNTER_PERIOD_S
        elif all(p.instant_power for p in self.probes):
            self.kind, self.backend = "power", "nvml_power"
            self._read_one = lambda h: _instant_power_mw(nvml, h)
            self.period = period or POWER_PERIOD_S
        elif all(p.average_power for p in self.probes):
            self.kind, self.backend = "power", "nvml_power"
            self._read_one = nvml.nvmlDeviceGetPowerUsage
            self.period = period or POWER_PERIOD_S
            self.notes.append("power is NVML's averaged gauge: short requests are smeared")
        else:
            self.close()
            raise ReaderUnavailable(
                f"GPUs {list(self.gpus)} answer neither the energy counter nor a power gauge",
                remedy="pre-Volta or a restricted driver: use reader='none' (estimates only)",
            )

    def read(self) -> Reading:
        try:
            total_milli = 0.0
            for handle in self._handles:
                total_milli += float(self._read_one(handle))
        except Exception as exc:
            return Reading(t=self.clock(), error=_describe(exc))
        t = self.clock()
        if self.kind == "counter":
            return Reading(t=t, joules=total_milli / 1000.0)
        return Reading(t=t, watts=total_milli / 1000.0)

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
