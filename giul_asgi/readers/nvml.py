"""NVML: the card's own energy counter where it has one, its power gauge where it does not.

``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer) is a cumulative millijoule
register: a delta between two reads is a true measurement with no sampling to fall through.
Where it answers ``NotSupported`` we read power instead: field ``NVML_FI_DEV_POWER_INSTANT``
first (``nvmlDeviceGetPowerUsage`` is a one-second average on H100-class cards, which
smears energy across neighbouring requests), then ``nvmlDeviceGetPowerUsage``. What each
GPU supports is probed once, when the reader is built, and never on a request's path.

How often the counter really steps differs by card (about 20 ms on V100-class, about
100 ms on A100/H100, at every read on some): ``period`` is only a polling hint, and the
ledger's tape learns the real update period from the readings.

Power and energy are board-level: a MIG slice cannot be metered alone, so a node whose
GPU is in MIG mode says so in ``notes`` (and ``mig`` is true) rather than dividing the
board silently; ``options["mig_slices"]`` records the GPU instances a node stands for.

NVML calls are blocking C calls; the poller calls :meth:`NvmlReader.read` from its own
thread with a bound, so a wedged driver costs readings, never a request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from ..errors import ReaderUnavailable
from .base import Kind, Process, ReaderSpec, Reading
from .options import Options

NVML_FI_DEV_POWER_INSTANT = 186
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
#: How often to poll when the node gives no period: a hint, not the counter's update period.
POLL_HINT_S = 0.1
#: Kept for callers of 0.1: the same polling hint under its old names.
COUNTER_PERIOD_S = POLL_HINT_S
POWER_PERIOD_S = POLL_HINT_S

OPTIONS = ("prefer", "proc_root", "mig_slices")
PREFER = ("auto", "counter", "instant", "average")


def load_nvml(nvml: ModuleType | Any | None = None) -> Any:
    """The pynvml module (or the fake a test passes); ReaderUnavailable when not installed."""
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        raise ReaderUnavailable(
            "the pynvml module is not installed", remedy="pip install nvidia-ml-py"
        ) from None
    return pynvml


_load_nvml = load_nvml


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


_describe = describe


def not_supported(nvml: Any, exc: BaseException) -> bool:
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
    uuid: str | None = None
    #: whether the compute-process list answers (None: not asked)
    processes: bool | None = None


def instant_power_mw(nvml: Any, handle: Any) -> float:
    field_id = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
    values = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    value = values[0]
    if value.nvmlReturn != 0:
        raise nvml.NVMLError(value.nvmlReturn)
    return float(value.value.uiVal)


_instant_power_mw = instant_power_mw


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU read on its own, in the units a person reads (the probe's and the agent's
    view of a board; a node's reader sums its boards in the driver's units)."""

    energy_j: float | None = None
    power_w: float | None = None
    #: NVML's averaged power gauge, where asked for.
    average_w: float | None = None
    error: str | None = None


def read_gpu(nvml: Any, probe: GpuProbe, handle: Any, *, average: bool = False) -> GpuReading:
    """Read what ``probe`` says the board answers: its energy counter, its instant power, and
    (``average``) its averaged gauge. Never raises: a failed call is the reading's error."""
    if not (probe.counter or probe.instant_power or (average and probe.average_power)):
        return GpuReading(error="this GPU answers neither the energy counter nor a power field")
    try:
        energy = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0 if probe.counter else None
        power = instant_power_mw(nvml, handle) / 1000.0 if probe.instant_power else None
        mean = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0 if average and probe.average_power else None
    except Exception as exc:
        return GpuReading(error=describe(exc))
    return GpuReading(energy, power, mean)


def shut_down(nvml: Any) -> None:
    """Let go of NVML (its own ``nvmlShutdown``); a driver that fails there is let be."""
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def probe_gpu(nvml: Any, index: int, handle: Any) -> GpuProbe:
    """Ask one GPU once what it supports (each call guarded: a probe never raises)."""
    try:
        name: str | None = _text(nvml.nvmlDeviceGetName(handle))
    except Exception:
        name = None
    try:
        uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
    except Exception:
        uuid = None
    checks: dict[str, bool] = {}
    for key, call in (
        ("counter", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        ("instant", lambda: instant_power_mw(nvml, handle)),
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
    procs: bool | None
    try:
        nvml.nvmlDeviceGetComputeProcesses(handle)
        procs = True
    except Exception:
        procs = False
    return GpuProbe(
        index, name, checks["counter"], checks["instant"], checks["average"], mig,
        uuid=uuid, processes=procs,
    )


_probe_one = probe_gpu


def probe_nvml(nvml: ModuleType | Any | None = None) -> list[GpuProbe]:
    """Every visible GPU and what it supports; empty when NVML is absent or will not start."""
    try:
        nvml = load_nvml(nvml)
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        probes = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                probes.append(probe_gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index)))
            except Exception as exc:
                probes.append(GpuProbe(index, None, False, False, False, None, describe(exc)))
        return probes
    finally:
        shut_down(nvml)


def nested_pid_namespace(proc_root: Path = Path("/proc")) -> bool | None:
    """True inside a nested PID namespace (a container), where NVML's host PIDs are not ours."""
    try:
        for line in (proc_root / "self" / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    except OSError:
        return None
    return None


def process_name(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip() or None
    except (OSError, ValueError):
        return None


def compute_pids(nvml: Any, handle: Any, mig: bool | None) -> set[int]:
    """Compute PIDs on one board; under MIG, those of every slice (the board handle lists none)."""
    pids = {int(p.pid) for p in nvml.nvmlDeviceGetComputeProcesses(handle)}
    if mig:
        not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND)
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                slice_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except Exception as exc:
                if getattr(exc, "value", None) == not_found:
                    continue
                raise
            pids.update(int(p.pid) for p in nvml.nvmlDeviceGetComputeProcesses(slice_handle))
    return pids


def open_gpus(
    nvml: Any, gpus: Sequence[int], *, start_remedy: str, index_remedy: str
) -> tuple[tuple[int, ...], list[Any], list[GpuProbe]]:
    """Start NVML and probe the GPUs asked for (all, when none is named): their indices,
    handles and probes. Raises :class:`ReaderUnavailable`, with NVML shut again, when it
    cannot. Shared by the reader and giul-agent, which meet the same driver."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise ReaderUnavailable(f"NVML would not start ({describe(exc)})", remedy=start_remedy) from None
    try:
        count = nvml.nvmlDeviceGetCount()
        indices = tuple(gpus) or tuple(range(count))  # an empty list: every GPU this host shows
        if not indices:
            raise ReaderUnavailable("NVML sees no GPU on this host", remedy=index_remedy)
        missing = [g for g in indices if g >= count]
        if missing:
            raise ReaderUnavailable(
                f"GPU index {missing[0]} not present: NVML sees {count} GPU(s)", remedy=index_remedy
            )
        handles = [nvml.nvmlDeviceGetHandleByIndex(g) for g in indices]
        probes = [probe_gpu(nvml, g, h) for g, h in zip(indices, handles, strict=True)]
    except Exception as exc:
        shut_down(nvml)
        if isinstance(exc, ReaderUnavailable):
            raise
        raise ReaderUnavailable(f"NVML failed while probing: {describe(exc)}") from None
    return indices, handles, probes


class NvmlReader:
    """Reads a node's GPUs through NVML and sums them: one counter, or one power gauge.

    Build it from a :class:`ReaderSpec` (``NvmlReader(spec)``) or, as before, from GPU
    indices and keywords (``NvmlReader((0, 1), nvml=fake)``). Options: ``prefer``
    (``auto`` | ``counter`` | ``instant`` | ``average``), ``proc_root`` (where to read
    process names, ``/proc``), ``mig_slices`` (the GPU instance IDs the node stands for).
    """

    source = "local"
    method: Literal["measured", "simulated"] = "measured"

    def __init__(
        self,
        spec: ReaderSpec | Sequence[int] | None = None,
        *,
        period: float | None = None,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(spec, ReaderSpec):
            spec = ReaderSpec(
                gpus=tuple(spec) if spec is not None else (0,),
                period=period,
                options=options or {},
                clock=clock or time.monotonic,
            )
        opts = Options(spec.options, "nvml", OPTIONS)
        prefer = opts.choice("prefer", PREFER, "auto")
        self._proc_root = Path(opts.text("proc_root", "/proc") or "/proc")
        self.mig_slices = opts.ints("mig_slices")
        self._nested: tuple[bool | None] | None = None  # in a nested PID namespace (once known)
        self.spec = spec
        self._nvml = nvml = load_nvml(nvml)
        self.clock: Callable[[], float] = clock or spec.clock
        self.gpus = tuple(spec.gpus)
        self._open = False
        self.gpus, self._handles, self.probes = open_gpus(
            nvml, self.gpus,
            start_remedy="check the NVIDIA driver is loaded (nvidia-smi); without a GPU, reader='simulated' "
                         "to try the middleware, or reader='none' (estimates only)",
            index_remedy="fix the node's gpus list (CUDA_VISIBLE_DEVICES does not renumber NVML)",
        )
        self._open = True

        self.mig = any(p.mig for p in self.probes)
        self.notes: list[str] = [
            f"GPU {p.index} is in MIG mode: energy is the whole board's, not a slice's"
            for p in self.probes if p.mig
        ]
        if self.mig_slices is not None:
            self.notes.append(
                f"the node stands for MIG slices {list(self.mig_slices)}: readings are still board-level"
            )
        self.kind: Kind
        self.period = spec.period or POLL_HINT_S
        self._read_one: Callable[[Any], float]
        counter = all(p.counter for p in self.probes) and prefer in ("auto", "counter")
        instant = all(p.instant_power for p in self.probes) and prefer in ("auto", "instant")
        average = all(p.average_power for p in self.probes) and prefer in ("auto", "average")
        if counter:
            self.kind, self.backend = "counter", "nvml_counter"
            self._read_one = nvml.nvmlDeviceGetTotalEnergyConsumption
        elif instant:
            self.kind, self.backend = "power", "nvml_power"
            self._read_one = lambda h: instant_power_mw(nvml, h)
        elif average:
            self.kind, self.backend = "power", "nvml_power"
            self._read_one = nvml.nvmlDeviceGetPowerUsage
            self.notes.append("power is NVML's averaged gauge: short requests are smeared")
        else:
            self.close()
            wanted = "" if prefer == "auto" else f" (prefer={prefer!r})"
            raise ReaderUnavailable(
                f"GPUs {list(self.gpus)} answer neither the energy counter nor a power gauge{wanted}",
                remedy="pre-Volta or a restricted driver: use reader='none' (estimates only)",
            )

    def read(self) -> Reading:
        """The node's GPUs summed, stamped when the first driver call began.

        The driver reads its register inside the C call, which ctypes makes with the GIL
        let go; the call returns when this thread has the GIL back, which beside an event
        loop running Python flat out is a loop slice or more later (2 ms median, seconds at
        worst: benchmarks/gil_race.py). A stamp taken after the call would place every value
        that late, and a step seen by it before the step happened; taken before, it is off
        by the Python of the wrapper and the driver's own time (tens of us). A multi-GPU
        node's later boards are read after the earlier calls came back: the stamp is the
        first board's."""
        t = self.clock()
        try:
            total_milli: float = 0
            for handle in self._handles:
                total_milli += self._read_one(handle)
        except Exception as exc:
            return Reading(t=self.clock(), error=describe(exc))
        if self.kind == "counter":
            return Reading(t=t, joules=int(total_milli) / 1000.0)
        return Reading(t=t, watts=float(total_milli) / 1000.0)

    def processes(self) -> list[Process] | None:
        """The compute processes on the node's boards; None when NVML cannot list them.

        NVML gives host PIDs. Inside a container (a nested PID namespace) ``/proc/<pid>`` is
        another process or none, so names are left out there rather than guessed. Which it is
        is looked up once: a process never changes PID namespace.
        """
        try:
            pids: set[int] = set()
            for handle, probe in zip(self._handles, self.probes, strict=True):
                pids |= compute_pids(self._nvml, handle, probe.mig)
        except Exception:
            return None
        if not pids:
            return []
        if self._nested is None:
            self._nested = (nested_pid_namespace(self._proc_root),)
        nested = self._nested[0]
        return [
            Process(pid, None if nested else process_name(pid, self._proc_root))
            for pid in sorted(pids)
        ]

    def read_gpu(self, position: int, *, average: bool = False) -> GpuReading:
        """The node's ``position``-th board read on its own (:func:`read_gpu`)."""
        return read_gpu(self._nvml, self.probes[position], self._handles[position], average=average)

    def close(self) -> None:
        if self._open:
            self._open = False
            shut_down(self._nvml)


__all__ = [
    "POLL_HINT_S",
    "GpuProbe",
    "GpuReading",
    "NvmlReader",
    "instant_power_mw",
    "load_nvml",
    "open_gpus",
    "probe_gpu",
    "probe_nvml",
    "read_gpu",
    "shut_down",
]

