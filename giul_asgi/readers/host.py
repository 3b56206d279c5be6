"""The host boundary: a node's cards and the host's CPU package and DRAM, read as one counter.

Google's comprehensive accounting of AI serving counts the host that feeds the accelerators
(its CPU and DRAM) beside them. A node with ``boundary="host"`` reads its cards as usual and
the host's RAPL zones (:mod:`.rapl`: the package zones, and the DRAM zones where the CPU
publishes them) at the same instant, and hands the ledger their sum: one counter, so its
energy above idle is shared among the windows by the node's split like the cards' alone, and
every figure says ``boundary: host``. The node's ``idle_w`` is then the host's floor (cards,
CPU and DRAM at rest).

Both parts must be counters (a card read through a power gauge cannot be added to a counter
reading by reading). A failed part fails the reading (the ledger books a gap): a figure is
never the cards' alone labelled as the host's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from ..errors import ReaderUnavailable
from .base import Kind, Process, Reader, Reading


class HostReader:
    """``gpu`` (the node's own reader) plus ``cpu`` (RAPL readers), summed per reading."""

    boundary = "host"
    kind: Kind = "counter"

    def __init__(self, gpu: Reader, cpu: Sequence[Reader], *, card_id: str | None = None) -> None:
        if gpu.kind != "counter" or not cpu or any(part.kind != "counter" for part in cpu):
            raise ReaderUnavailable(
                f"boundary='host' adds RAPL counters to the node's, and its reader "
                f"({gpu.backend}) is a {gpu.kind} reader",
                remedy="read the cards through their energy counter (NVML on Volta or newer, "
                       "dcgm's total energy), or leave boundary='gpu'",
            )
        self.gpu = gpu
        self.cpu = tuple(cpu)
        self.backend = f"{gpu.backend}+{'+'.join(sorted({part.backend for part in cpu}))}"
        self.source = gpu.source
        self.method: Literal["measured", "simulated"] = gpu.method
        self.period = min(gpu.period, *(part.period for part in cpu))
        self.clock: Callable[[], float] = gpu.clock
        #: The host's card is not the cards alone: never one table with a gpu-boundary node.
        self.card_id = card_id
        #: MIG slices and the like are the cards' (what the ledger asks the reader).
        self.mig = getattr(gpu, "mig", None)
        self.mig_slices = getattr(gpu, "mig_slices", None)
        self.notes = [*(getattr(gpu, "notes", ()) or ()),
                      *(n for part in cpu for n in (getattr(part, "notes", ()) or ()))]

    def read(self) -> Reading:
        first = self.gpu.read()
        if not first.ok or first.joules is None:
            return first
        total = first.joules
        for part in self.cpu:
            reading = part.read()
            if not reading.ok or reading.joules is None:
                return Reading(first.t, error=f"the host's {part.backend}: {reading.error or 'no value'}")
            total += reading.joules
        return Reading(first.t, joules=total)

    def processes(self) -> list[Process] | None:
        """The cards' process list, where their reader has one."""
        lister = getattr(self.gpu, "processes", None)
        return lister() if callable(lister) else None

    def close(self) -> None:
        for reader in (self.gpu, *self.cpu):
            reader.close()


__all__ = ["HostReader"]
