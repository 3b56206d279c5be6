"""Rolling statistics per route, node and tier, in memory that does not grow with traffic.

Every metered request is recorded once, when its figure settles, whatever became of the
response: finished, failed in the app, or abandoned by a client that disconnected. Sums
count only known figures, and say how many were known, so an average never hides unknowns
as zeros. Label sets are bounded (routes are templates, and past ``max_keys`` new keys
fold into ``<other>``); the recent-request ring has a fixed length.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .energy import Energy, Figure

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

    def add(self, figure: Figure | Energy, outcome: str) -> None:
        self.requests += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        method = figure.method
        self.methods[method] = self.methods.get(method, 0) + 1
        if figure.joules is not None:
            self.joules[method] = self.joules.get(method, 0.0) + figure.joules
        if figure.tokens:
            self.tokens += figure.tokens
        self.seconds += figure.seconds

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

    __slots__ = ("_figure", "outcome", "route", "status")

    def __init__(self, route: str, status: int | None, outcome: str, figure: Figure | Energy) -> None:
        self.route = route
        self.status = status
        self.outcome = outcome  # "ok" | "error" | "disconnect" | "cancelled" | "incomplete"
        self._figure = figure

    @property
    def energy(self) -> Energy:
        figure = self._figure
        if isinstance(figure, Figure):
            figure = self._figure = Energy.from_figure(figure)
        return figure

    def __repr__(self) -> str:
        return f"Record({self.route!r}, {self.status!r}, {self.outcome!r})"


class EnergyStats:
    """Buckets per (route, node, tier), rolled up by route, node and tier when read, and a
    ring of recent requests. One bucket update per request keeps recording cheap."""

    def __init__(self, *, max_keys: int = 1024, recent: int = 1000) -> None:
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        self.recent: deque[Record] = deque(maxlen=recent)

    def record(
        self, route: str, status: int | None, outcome: str, figure: Figure | Energy,
    ) -> None:
        """Count one request, from its settled figure."""
        key = (route, figure.node or "<none>", figure.tier or "<none>")
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_keys:
                    key = (OTHER, OTHER, OTHER)
                bucket = self._buckets.setdefault(key, Bucket())
            bucket.add(figure, outcome)
            self.recent.append(Record(route, status, outcome, figure))

    def __iter__(self) -> Iterator[Record]:
        return iter(list(self.recent))

    def snapshot(self) -> dict[str, Any]:
        """Totals, and the same figures by route, by node and by tier."""
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
