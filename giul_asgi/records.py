"""Recent records by id, so a client can fetch its request's settled figure afterwards.

Every metered response carries ``X-Energy-Id``; ``GET /energy/requests/{id}`` answers from
here. The store is bounded twice: at most ``max_records`` records, each kept at most
``max_age_s`` seconds after its first figure. A later :meth:`RecordStore.put` of the same
id (the settled figure) replaces the first one in place, without renewing its age.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .errors import ConfigError


class RecordStore:
    """A bounded, thread-safe map of request id -> latest :class:`~giul_asgi.energy.Energy`."""

    def __init__(
        self, max_records: int = 10_000, max_age_s: float = 600.0, *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(max_records, int) or max_records < 1:
            raise ConfigError(f"max_records={max_records!r} must be a positive integer",
                              remedy="use 10_000")
        if not isinstance(max_age_s, int | float) or not max_age_s > 0:
            raise ConfigError(f"max_age_s={max_age_s!r} must be a positive number of seconds",
                              remedy="use 600")
        self.max_records = max_records
        self.max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def put(self, energy: Any) -> None:
        """Keep ``energy`` under ``energy.id`` (ignored without an id). Never raises."""
        try:
            key = energy.id
            if not isinstance(key, str) or not key:
                return
            now = self._clock()
            with self._lock:
                items = self._items
                old = items.get(key)
                if old is not None:
                    items[key] = (old[0], energy)
                    return
                items[key] = (now, energy)
                self._expire(now)
                while len(items) > self.max_records:
                    items.popitem(last=False)
        except Exception:
            return

    def get(self, key: str) -> Any | None:
        """The latest record under ``key``, or ``None`` (never seen, expired or evicted)."""
        with self._lock:
            self._expire(self._clock())
            item = self._items.get(key)
        return None if item is None else item[1]

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._items)

    def _expire(self, now: float) -> None:
        items, limit = self._items, now - self.max_age_s
        while items:
            first = next(iter(items.values()))
            if first[0] >= limit:
                break
            items.popitem(last=False)


__all__ = ["RecordStore"]
