"""Rolling statistics per route, node and tier, in memory that does not grow with traffic.

Every metered request is recorded once, with its settled figure, whatever became of the
response: finished, failed in the app, or abandoned by a client that disconnected. Sums
count only known figures, and say how many were known, so an average never hides unknowns
as zeros. Label sets are bounded (routes are templates, and past ``max_keys`` new keys
fold into ``<other>``); the recent-request ring has a fixed length.

The middleware hands over a request's meter when the response is done (:meth:`EnergyStats.
defer`), and the meter is counted once its window has settled: in batches, and whenever
the statistics are read. That keeps the request path to one append, and no callback per
request; the books are the same.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .energy import Energy, Figure

if TYPE_CHECKING:
    from .meter import Meter

OTHER = "<other>"


@dataclass(slots=True)
class Bucket:
    """What a group of requests cost, by how each figure was obtained."""

    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    methods: dict[str, int] = field(default_factory=dict)
    joules: dict[str, float] = field(default_factory=dict)  # by method: measured, estimated...
    tokens: int = 0
    seconds: float = 0.0

    def add(
        self, method: str, joules: float | None, tokens: int | None, seconds: float, outcome: str,
    ) -> None:
        self.requests += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.methods[method] = self.methods.get(method, 0) + 1
        if joules is not None:
            self.joules[method] = self.joules.get(method, 0.0) + joules
        if tokens:
            self.tokens += tokens
        self.seconds += seconds

    def merge(self, other: Bucket) -> None:
        self.requests += other.requests
        self.tokens += other.tokens
        self.seconds += other.seconds
        for mine, theirs in (
            (self.outcomes, other.outcomes), (self.methods, other.methods),
        ):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count
        for key, joules in other.joules.items():
            self.joules[key] = self.joules.get(key, 0.0) + joules

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "methods": dict(self.methods),
            "joules": {k: round(v, 6) for k, v in self.joules.items()},
            "tokens": self.tokens,
            "seconds": round(self.seconds, 6),
        }


class Record:
    """One request as the statistics saw it; its :class:`Energy` is built when read."""

    __slots__ = ("_source", "outcome", "route", "status")

    def __init__(
        self, route: str, status: int | None, outcome: str, source: Figure | Energy | Meter,
    ) -> None:
        self.route = route
        self.status = status
        self.outcome = outcome  # "ok" | "error" | "disconnect" | "cancelled" | "incomplete"
        self._source = source

    @property
    def energy(self) -> Energy:
        source = self._source
        if isinstance(source, Energy):
            return source
        energy = Energy.from_figure(source if isinstance(source, Figure) else source.figure())
        self._source = energy
        return energy

    def __repr__(self) -> str:
        return f"Record({self.route!r}, {self.status!r}, {self.outcome!r})"


class EnergyStats:
    """Buckets per (route, node, tier), rolled up by route, node and tier when read, and a
    ring of recent requests. One bucket update per request keeps recording cheap."""

    def __init__(
        self, *, max_keys: int = 1024, recent: int = 1000, batch: int = 256,
        max_waiting: int = 16_384,
    ) -> None:
        self.max_keys = max_keys
        self.batch = batch
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        # Records, or (route, status, outcome, meter) to build one from when read.
        self._recent: deque[Record | tuple[str, int | None, str, Meter]] = deque(maxlen=recent)
        # Meters waiting for their windows to settle, one queue per ledger: a ledger settles
        # its windows in the order they closed, so each queue is counted from its front.
        self._waiting: dict[int, deque[tuple[str, int | None, str, Meter]]] = {}
        self._since_fold = 0

    def record(
        self, route: str, status: int | None, outcome: str, figure: Figure | Energy,
    ) -> None:
        """Count one request, from its settled figure."""
        with self._lock:
            self._bucket(route, figure.node, figure.tier).add(
                figure.method, figure.joules, figure.tokens, figure.seconds, outcome,
            )
            self._recent.append(Record(route, status, outcome, figure))

    def defer(self, route: str, status: int | None, outcome: str, meter: Meter) -> None:
        """Count one request once its (closed) meter's figure settles."""
        queue = self._waiting.get(id(meter.ledger))
        if queue is None:
            queue = self._waiting.setdefault(id(meter.ledger), deque())
        queue.append((route, status, outcome, meter))
        self._since_fold += 1
        if self._since_fold >= self.batch:
            self.fold()

    def fold(self, *, everything: bool = False) -> None:
        """Count the deferred requests whose figures have settled (``everything``: all of
        them, as they stand). Past ``max_waiting`` the oldest are counted unsettled rather
        than held without bound (a ledger whose reads have stopped)."""
        with self._lock:
            self._since_fold = 0
            queues = list(self._waiting.values())
            waiting = sum(map(len, queues))
            recent = self._recent
            for queue in queues:
                while queue:
                    item = queue[0]
                    meter = item[3]
                    if not (everything or meter.settled_now or waiting > self.max_waiting):
                        break
                    queue.popleft()
                    waiting -= 1
                    node, tier, method, joules, tokens, seconds = meter.tally()
                    self._bucket(item[0], node, tier).add(method, joules, tokens, seconds, item[2])
                    recent.append(item)  # its Record is built only if someone reads it

    def _bucket(self, route: str, node: str | None, tier: str | None) -> Bucket:
        """The bucket of (route, node, tier); past ``max_keys`` new keys share ``<other>``."""
        key = (route, node or "<none>", tier or "<none>")
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                key = (OTHER, OTHER, OTHER)
            bucket = self._buckets.setdefault(key, Bucket())
        return bucket

    @property
    def recent(self) -> list[Record]:
        """The latest requests counted, oldest first (at most ``recent`` of them)."""
        self.fold()
        with self._lock:
            items = list(self._recent)
        return [item if isinstance(item, Record) else Record(*item) for item in items]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.recent)

    def snapshot(self) -> dict[str, Any]:
        """Totals, and the same figures by route, by node and by tier."""
        self.fold()
        with self._lock:
            buckets = list(self._buckets.items())
        total = Bucket()
        views: dict[str, dict[str, Bucket]] = {"routes": {}, "nodes": {}, "tiers": {}}
        for (route, node, tier), bucket in buckets:
            total.merge(bucket)
            for view, name in (("routes", route), ("nodes", node), ("tiers", tier)):
                views[view].setdefault(name, Bucket()).merge(bucket)
        out: dict[str, Any] = {"total": total.as_dict()}
        for view, table in views.items():
            out[view] = {name: bucket.as_dict() for name, bucket in table.items()}
        return out
