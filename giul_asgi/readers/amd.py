"""AMD GPUs through ``amdsmi`` (ROCm's Python binding, an optional install), behind the same protocol.

``amdsmi_get_energy_count`` gives a cumulative accumulator in ticks of
``counter_resolution`` microjoules (the key is ``energy_accumulator`` in recent releases,
``power`` in older ones): a counter like NVIDIA's. Where it does not answer, we read
``amdsmi_get_power_info`` (``socket_power``, ``current_socket_power``, then
``average_socket_power``; ``"N/A"`` is unknown, never 0). ``amdsmi`` is imported only when
a node asks for this reader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

from ..errors import ReaderUnavailable
from .base import Kind, ReaderSpec, Reading
from .options import Options

OPTIONS = ("prefer",)
POLL_HINT_S = 0.1
POWER_KEYS = ("socket_power", "current_socket_power", "average_socket_power")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def energy_uj(amdsmi: Any, handle: Any) -> float:
    info = amdsmi.amdsmi_get_energy_count(handle)
    ticks = _number(info.get("energy_accumulator", info.get("power")))
    resolution = _number(info.get("counter_resolution"))
    if ticks is None or resolution is None or resolution <= 0:
        raise ValueError(f"energy count without a usable accumulator: {info!r}")
    return ticks * resolution


def power_w(amdsmi: Any, handle: Any) -> float:
    info = amdsmi.amdsmi_get_power_info(handle)
    for key in POWER_KEYS:
        value = _number(info.get(key))
        if value is not None:
            return value
    raise ValueError(f"no power in {sorted(info)}")


class AmdReader:
    """Sums the node's AMD GPUs: one energy counter (J), or instant socket power (W).

    Options: ``prefer`` (``auto`` | ``counter`` | ``power``).
    """

    backend = "amd"
    source = "local"
    method: Literal["measured", "simulated"] = "measured"

    def __init__(self, spec: ReaderSpec, *, amdsmi: Any | None = None) -> None:
        opts = Options(spec.options, "amd", OPTIONS)
        prefer = opts.choice("prefer", ("auto", "counter", "power"), "auto")
        if amdsmi is None:
            try:
                import amdsmi as module  # type: ignore[import-not-found]
            except ImportError:
                raise ReaderUnavailable("the amdsmi module is not installed",
                                        remedy="install ROCm's amdsmi Python package") from None
            amdsmi = module
        self._amdsmi = amdsmi
        self.clock: Callable[[], float] = spec.clock
        self.period = spec.period or POLL_HINT_S
        self._open = False
        try:
            amdsmi.amdsmi_init()
        except Exception as exc:
            raise ReaderUnavailable(f"amdsmi would not start ({_describe(exc)})",
                                    remedy="check the amdgpu driver is loaded (amd-smi list)") from None
        self._open = True
        try:
            handles = list(amdsmi.amdsmi_get_processor_handles())
            wanted = tuple(spec.gpus) or tuple(range(len(handles)))
            missing = [g for g in wanted if g >= len(handles)]
            if missing or not wanted:
                raise ReaderUnavailable(
                    f"GPU index {missing[0]} not present: amdsmi sees {len(handles)} GPU(s)" if missing
                    else "amdsmi sees no GPU on this host")
            self.gpus = wanted
            self._handles = [handles[g] for g in wanted]
            counter = prefer != "power" and self._answers(energy_uj)
            power = prefer != "counter" and self._answers(power_w)
        except ReaderUnavailable:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise ReaderUnavailable(f"amdsmi failed while probing: {_describe(exc)}") from None
        self.notes: list[str] = []
        self.kind: Kind
        if counter:
            self.kind, self._read_one = "counter", energy_uj
        elif power:
            self.kind, self._read_one = "power", power_w
            self.notes.append("no energy counter: reading socket power")
        else:
            self.close()
            raise ReaderUnavailable(f"AMD GPUs {list(self.gpus)} answer neither energy nor power"
                                    + ("" if prefer == "auto" else f" (prefer={prefer!r})"))

    def _answers(self, call: Callable[[Any, Any], float]) -> bool:
        try:
            for handle in self._handles:
                call(self._amdsmi, handle)
        except Exception:
            return False
        return True

    def read(self) -> Reading:
        try:
            total = sum(self._read_one(self._amdsmi, h) for h in self._handles)
        except Exception as exc:
            return Reading(t=self.clock(), error=_describe(exc))
        if self.kind == "counter":
            return Reading(t=self.clock(), joules=total / 1e6)
        return Reading(t=self.clock(), watts=total)

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._amdsmi.amdsmi_shut_down()


__all__ = ["AmdReader"]
