"""The contract every way of reading a card fulfils, and the reader for "nothing here".

A reader answers one question, cheaply and without raising: what does the node read now?
Counter readers give cumulative joules; power readers give watts and the ledger integrates
them. A failure is a :class:`Reading` with ``error`` set, which the ledger records as a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Kind = Literal["counter", "power", "none"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One observation of a node: cumulative joules (counters) or watts (power gauges)."""

    t: float
    joules: float | None = None
    watts: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.joules is not None or self.watts is not None)


@runtime_checkable
class Reader(Protocol):
    """What the ledger needs from a card. Implementations must never raise from ``read``."""

    #: ``nvml_counter``, ``nvml_power``, ``simulated``, ``none``...
    backend: str
    #: ``local``, ``remote`` or ``none``.
    source: str
    #: What a good reading is: ``measured``, or ``simulated`` for a simulated card.
    method: Literal["measured", "simulated"]
    kind: Kind
    #: Seconds between readings that bring new information (the counter's step period).
    period: float
    #: True when ``read`` may block (C calls, HTTP): the ledger then reads from a thread.
    blocking: bool
    #: The clock readings are stamped with; windows use the same one.
    clock: Callable[[], float]

    def read(self) -> Reading: ...

    def close(self) -> None: ...


class NullReader:
    """No way to read this node. Every window is ``estimated`` or ``unknown``."""

    backend = "none"
    source = "none"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "none"
    blocking = False

    def __init__(self, reason: str = "no reader for this node", period: float = 1.0) -> None:
        self.reason = reason
        self.period = period
        self.clock: Callable[[], float] = time.monotonic

    def read(self) -> Reading:
        return Reading(t=self.clock(), error=self.reason)

    def close(self) -> None:
        return None
