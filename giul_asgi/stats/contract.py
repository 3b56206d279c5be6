"""What ``/energy`` and Prometheus read of the statistics: the contract they keep.

:class:`~giul_asgi.stats.EnergyStats` (one process) and :class:`~giul_asgi.stats.HostStats`
(a server's workers merged at read) both keep it, and so may a gateway's own statistics
passed as ``stats=``. The endpoint and the exporters call only what is named here: they
never ask an object what it can do, and an object that cannot is refused at startup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..listeners import Settled

#: Since-start counters of one key (route, node, tier, method, outcome, tenant): requests,
#: known, joules, tokens and the joules histogram's buckets.
Counter = tuple[tuple[str, str, str, str, str, str], int, int, float, int, list[int]]
#: (route, node, tier, method, tenant) -> a since-start sum.
LabelSums = dict[tuple[str, str, str, str, str], float]


class StatsView(Protocol):
    """The statistics as one read sees them (a server's: merged over its workers)."""

    def counters(self) -> list[Counter]: ...

    def allocated_counters(self) -> LabelSums: ...

    def carbon_counters(self) -> LabelSums: ...

    def node_rates(self) -> dict[str, tuple[float | None, float | None]]:
        """(above-idle watts, reads per second) per node from its last two samples."""
        ...

    def node_power(self) -> dict[str, float | None]: ...


@runtime_checkable
class Statistics(Protocol):
    """Statistics the middleware records into and ``/energy`` and Prometheus answer from."""

    def settled(self, batch: Sequence[Settled]) -> None: ...

    def snapshot(self, window: str | None = None, **filters: Any) -> dict[str, Any]: ...

    def view(self) -> StatsView: ...

    def observe_nodes(self, totals: Iterable[Any]) -> None: ...

    def observe_history(self, histories: Mapping[str, Sequence[Sequence[Any]]]) -> None: ...


__all__ = ["Counter", "LabelSums", "Statistics", "StatsView"]
