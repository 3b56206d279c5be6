"""The label key a record counts under, and the bound on how many keys there are.

A settled figure is counted under one key: ``(route, node, tier, method, outcome, status
class, tenant)``. The groups ``/energy`` shows (per route, node, tier, method, tenant) and the
outcome and status counts are merges of keys made when someone reads, so a record touches
one key only. A tenant comes already bounded (:class:`~giul_asgi.tenants.TenantPlaces`: the
tenants with the most joules, the rest ``<other>``); its own bound here only guards merges.

Labels come from the app (route templates, node and tier names) and could be unbounded
(a path pattern fallback, a client-chosen tier). Two bounds keep memory finite whatever
arrives: each group keeps at most ``max_labels`` names (``<other>`` included), and there are
at most ``max_keys`` keys, past which a new key's route, node and tier count as
``<other>``. Method, outcome and status class come from small closed sets, so the number
of keys is at most :func:`key_bound` ``(max_keys)``.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..listeners import OUTCOMES
from ..tenants import NONE, OTHER

#: The groups ``/energy`` reports, and where each one's label is in a :data:`Key`.
GROUPS: tuple[str, ...] = ("route", "node", "tier", "method", "tenant")
GROUP_INDEX: tuple[int, ...] = (0, 1, 2, 3, 6)
METHOD_MIX: tuple[str, ...] = ("measured", "estimated", "simulated", "unknown")
STATUS_CLASSES: tuple[str, ...] = ("1xx", "2xx", "3xx", "4xx", "5xx", "none")
UNMATCHED = "<unmatched>"

#: ``(route, node, tier, method, outcome, status class, tenant)``
Key = tuple[str, str, str, str, str, str, str]


def status_class(status: object) -> str:
    """``"2xx"`` for 200..299 and so on; ``"none"`` when no valid status was sent."""
    if not isinstance(status, int) or not 100 <= status <= 599:
        return "none"
    return f"{status // 100}xx"


def is_key(key: tuple[object, ...]) -> bool:
    """Whether ``key`` is a :data:`Key` (seven strings, method, outcome and status class
    from their sets)."""
    return (len(key) == 7 and all(isinstance(x, str) for x in key) and key[3] in METHOD_MIX
            and key[4] in OUTCOMES and key[5] in STATUS_CLASSES)


def key_bound(max_keys: int) -> int:
    """The most keys :class:`Labels` ever hands out for ``max_keys``."""
    return max_keys + len(METHOD_MIX) * len(OUTCOMES) * len(STATUS_CLASSES)


class Labels:
    """Turns a record's raw labels into its bounded :data:`Key` (not thread-safe: the
    statistics call it under their lock)."""

    __slots__ = ("_keys", "_most", "_names", "allowed_tenants", "max_keys", "max_labels")

    def __init__(self, max_labels: int = 256, max_keys: int = 4096,
                 max_tenant_labels: int | None = None) -> None:
        if not (isinstance(max_labels, int) and max_labels >= 2):
            raise ConfigError(f"max_labels={max_labels!r} must be an integer of at least 2 "
                              "(one is <other>)", remedy="use the default, 256")
        if not (isinstance(max_keys, int) and max_keys >= 1):
            raise ConfigError(f"max_keys={max_keys!r} must be a positive integer",
                              remedy="use the default, 4096")
        self.max_labels = max_labels
        self.max_keys = max_keys
        self._names: tuple[set[str], set[str], set[str], set[str]] = (set(), set(), set(), set())
        self._most = (max_labels, max_labels, max_labels, max(max_labels, max_tenant_labels or 0))
        self._keys: set[Key] = set()
        #: Where several workers' statistics merge: the only tenants that keep their label
        #: (the server's register, :meth:`ServerFolder.admit`); ``None``: any, within the bound.
        self.allowed_tenants: set[str] | None = None

    def key(self, route: object, node: object, tier: object, method: object, outcome: object,
            status: object, tenant: object = None) -> Key:
        """The bounded key of one record's raw labels."""
        return self.bounded((
            str(route or UNMATCHED), str(node or NONE), str(tier or NONE),
            method if method in METHOD_MIX else "unknown",  # type: ignore[arg-type]
            outcome if outcome in OUTCOMES else "incomplete",  # type: ignore[arg-type]
            status_class(status), str(tenant or NONE),
        ))

    def bounded(self, key: Key) -> Key:
        """``key`` (a key already made, such as another worker's) within the bounds."""
        if key in self._keys:
            return key
        if not is_key(key):
            raise ValueError(f"not a key: {key!r}")
        route, node, tier, method, outcome, status, tenant = key
        key = (self._name(0, route), self._name(1, node), self._name(2, tier), method, outcome,
               status, self._name(3, tenant))
        if key not in self._keys:
            if len(self._keys) >= self.max_keys:
                key = (OTHER, OTHER, OTHER, method, outcome, status, OTHER)
            self._keys.add(key)
        return key

    def _name(self, group: int, name: str) -> str:
        allowed = self.allowed_tenants
        if group == 3 and allowed is not None and name not in allowed and name not in (NONE, OTHER):
            return OTHER
        names = self._names[group]
        if name not in names:
            if len(names) >= self._most[group] - 1 and name != OTHER:
                return OTHER
            names.add(name)
        return name


__all__ = [
    "GROUPS", "GROUP_INDEX", "METHOD_MIX", "NONE", "OTHER", "OUTCOMES", "STATUS_CLASSES", "UNMATCHED", "Key",
    "Labels", "is_key", "key_bound", "status_class",
]
