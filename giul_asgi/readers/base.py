"""The contract every way of reading a card fulfils, and the reader for "nothing here".

A reader answers one question without raising: what does the node read now? Counter
readers give cumulative joules; power readers give watts and the tape integrates them. A
failure is a :class:`Reading` with ``error`` set, which the tape records as a gap.

``read`` may block (a C call into a driver, an HTTP round trip): the poller always calls it
from its own thread, with a bound, never from the event loop. Readers are built from a
:class:`ReaderSpec` (plain values), so nothing here imports the configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Kind = Literal["counter", "power", "none"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One observation of a node: cumulative joules (counters) or watts (power gauges).

    ``t`` is on the reader's ``clock`` (the ledger's clock); a remote reader places a
    reading at its own timestamp translated to that clock, not at its arrival.
    """

    t: float
    joules: float | None = None
    watts: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.joules is not None or self.watts is not None)


@dataclass(frozen=True, slots=True)
class Process:
    """A compute process seen on the card (NVML's running-process list)."""

    pid: int
    name: str | None = None


@runtime_checkable
class Reader(Protocol):
    """What the ledger needs from a card. ``read`` must never raise."""

    #: ``nvml_counter``, ``nvml_power``, ``agent``, ``dcgm``, ``simulated``, ``none``...
    backend: str
    #: ``local``, ``remote`` or ``none``.
    source: str
    #: What a good reading is: ``measured``, or ``simulated`` for a simulated card.
    method: Literal["measured", "simulated"]
    kind: Kind
    #: The nominal seconds between readings that bring new information: a hint for how
    #: often to poll. The tape learns the counter's real update period from what it sees.
    period: float
    #: The clock readings are stamped with; windows use the same one.
    clock: Callable[[], float]

    def read(self) -> Reading: ...

    def close(self) -> None: ...


@runtime_checkable
class ProcessLister(Protocol):
    """A reader that can also list the compute processes on its card (NVML can)."""

    def processes(self) -> list[Process] | None: ...


@runtime_checkable
class LoadDriven(Protocol):
    """A reader whose card the node's own windows load (the in-process simulated card).

    ``load()`` gives the node's cumulative window-seconds and the windows open now, on the
    reader's clock; the reader thread hands it over once the reader is built, so the reader
    never holds the ledger.
    """

    def drive(self, load: Callable[[], tuple[float, int]]) -> None: ...


@runtime_checkable
class Continuing(Protocol):
    """A reader whose card lives in the process that reads it (the in-process simulated card):
    each process that takes the card over runs its own copy, which must go on from the last
    holder's counter (``joules`` at ``t``: the tape's baseline) rather than start its own, or
    every change of holder is a gap whose time is only estimated (a hostile trial: records
    8.9-10.4% above the books under gunicorn's --max-requests)."""

    def resume(self, t: float, joules: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """What a reader is built from: plain values taken from a node's configuration."""

    gpus: tuple[int, ...] = (0,)
    period: float | None = None
    url: str | None = None
    token: str | None = None
    idle_w: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic


class NullReader:
    """No way to read this node. Every window is ``estimated`` or ``unknown``."""

    backend = "none"
    source = "none"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "none"

    def __init__(self, reason: str = "no reader for this node", period: float = 1.0,
                 remedy: str | None = None) -> None:
        self.reason = reason
        #: What to do about it, said with the startup's line.
        self.remedy = remedy
        self.period = period
        self.clock: Callable[[], float] = time.monotonic

    def read(self) -> Reading:
        return Reading(t=self.clock(), error=self.reason)

    def close(self) -> None:
        return None
