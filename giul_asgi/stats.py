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

from .energy import Energy

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

    def add(self, energy: Energy, outcome: str) -> None:
        self.requests += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.methods[energy.method] = self.methods.get(energy.method, 0) + 1
        if energy.joules is not None:
            self.joules[energy.method] = self.joules.get(energy.method, 0.0) + energy.joules
        if energy.tokens:
            self.tokens += energy.tokens
        self.seconds += energy.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "methods": dict(self.methods),
            "joules": {k: round(v, 6) for k, v in self.joules.items()},
            "tokens": self.tokens,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True, slots=True)
class Record:
    """One request as the statistics saw it."""

    route: str
    status: int | None
    outcome: str  # "ok" | "error" | "disconnect" | "incomplete"
    energy: Energy


class EnergyStats:
    """Per-route, per-node, per-tier buckets and a ring of recent requests."""

    def __init__(self, *, max_keys: int = 256, recent: int = 1000) -> None:
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self.by_route: dict[str, Bucket] = {}
        self.by_node: dict[str, Bucket] = {}
        self.by_tier: dict[str, Bucket] = {}
        self.total = Bucket()
        self.recent: deque[Record] = deque(maxlen=recent)

    def _bucket(self, table: dict[str, Bucket], key: str | None) -> Bucket:
        name = key if key is not None else "<none>"
        bucket = table.get(name)
        if bucket is None:
            if len(table) >= self.max_keys:
                name = OTHER
            bucket = table.setdefault(name, Bucket())
        return bucket

    def record(self, route: str, status: int | None, outcome: str, energy: Energy) -> None:
        with self._lock:
            self.total.add(energy, outcome)
            self._bucket(self.by_route, route).add(energy, outcome)
            self._bucket(self.by_node, energy.node).add(energy, outcome)
            self._bucket(self.by_tier, energy.tier).add(energy, outcome)
            self.recent.append(Record(route, status, outcome, energy))

    def __iter__(self) -> Iterator[Record]:
        return iter(list(self.recent))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self.total.as_dict(),
                "routes": {k: v.as_dict() for k, v in self.by_route.items()},
                "nodes": {k: v.as_dict() for k, v in self.by_node.items()},
                "tiers": {k: v.as_dict() for k, v in self.by_tier.items()},
            }
