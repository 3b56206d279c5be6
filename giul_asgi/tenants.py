"""Who a request is for, never a secret, and the bounded set of tenant labels kept for them.

Gateways answer "who used the joules" per virtual key, user or team (LiteLLM spends per
``hashed_api_key``, ``end_user``, ``team``). Two jobs live here:

1. **The tenant of a request**, resolved once per request by the middleware when the
   operator asks (``EnergyMiddleware(app, tenant="x-api-key")``). From a header it is a
   short stable hash of the value (:func:`hashed`: ``key:`` + the first 16 hex digits of
   the SHA-256 of the value, a ``Bearer`` scheme stripped: LiteLLM's ``hashed_api_key``
   begins with the same digits), so a key is never stored, exported or logged. From a
   callable ``scope -> str | None`` it is the name returned, the operator's choice, made
   safe (:func:`tenant_name`: printable, at most 64 characters, never two names made one).
   A callable that raises or returns a non-string leaves the tenant null and is logged once
   (its type, never a value): a tenant never fails a request.
2. **Which tenants keep a label of their own** (:class:`TenantPlaces`): traffic can carry
   any number of keys, but statistics and Prometheus series must stay bounded. At most
   ``max_tenants`` tenants hold a place at a time, those with the most joules since start;
   every other request counts under ``<other>``, so the labels always add up to the whole.

Nothing here imports the rest of the package: the statistics and the middleware use it.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError

log = logging.getLogger("giul_asgi.tenants")

Scope = Mapping[str, Any]
#: What ``EnergyMiddleware(tenant=...)`` takes: a header name or ``scope -> str | None``.
TenantSetting = str | Callable[[Scope], Any] | None

#: The prefix of a tenant hashed from a secret, and how many hex digits of the hash it keeps
#: (64 bits: no two of a million keys collide but with odds below 1 in 30 million).
KEY_PREFIX = "key:"
HASH_HEX = 16
#: The longest tenant name kept; a longer one is cut and marked with a hash of the whole.
MAX_NAME = 64
#: The places default: the tenants with the most joules that keep their own label.
DEFAULT_MAX_TENANTS = 100
#: Where the tenants without a place count, and the requests that have no tenant.
OTHER = "<other>"
NONE = "<none>"
#: A tenant takes a place from another only with this many times its joules: two tenants
#: of the same size do not swap back and forth.
MARGIN = 1.25

# RFC 9110 token characters: what a header name may be made of (lower case in ASGI).
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
_HASHED = re.compile(re.escape(KEY_PREFIX) + f"[0-9a-f]{{{HASH_HEX}}}")
# What a tenant name keeps as it is; anything else becomes "_" (and the name gets a hash).
_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")


# -- a request's tenant ----------------------------------------------------------------------

def hashed(secret: str | bytes) -> str | None:
    """The tenant of a secret (an API key, an ``Authorization`` value): ``key:`` and 16 hex
    digits of its SHA-256, ``Bearer`` stripped; None when nothing is left. For handlers that
    bind a key they found elsewhere: ``current_meter().bind(tenant=hashed(key))``."""
    data = secret.encode("utf-8", "surrogatepass") if isinstance(secret, str) else bytes(secret)
    data = data.strip()
    head = data.split(None, 1)  # the scheme ends at any whitespace (RFC 9110: 1*SP, tabs seen)
    if head and head[0].lower() == b"bearer":
        data = head[1] if len(head) > 1 else b""
    if not data:
        return None
    return KEY_PREFIX + hashlib.sha256(data).hexdigest()[:HASH_HEX]


def is_hashed(name: str) -> bool:
    """Whether ``name`` is a tenant as :func:`hashed` names one (``key:`` and 16 hex digits):
    the only tenants a header gives."""
    return _HASHED.fullmatch(name) is not None


def tenant_name(value: str) -> str | None:
    """A name chosen by the operator, made safe for labels and logs: kept as it is when it
    is at most :data:`MAX_NAME` printable characters of ``A-Z a-z 0-9 . _ : @ / + = -``;
    otherwise the unsafe characters become ``_`` and a hash of the whole name is appended
    (``~`` and 16 hex digits), so two names never become one. None when blank."""
    text = value.strip()
    if not text:
        return None
    safe = _UNSAFE.sub("_", text)
    if safe == text and len(text) <= MAX_NAME:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_HEX]
    return f"{safe[:MAX_NAME - HASH_HEX - 1]}~{digest}"


def header_name(value: Any) -> str:
    """A header name to read the tenant from, checked (lower case, as ASGI gives names)."""
    if not isinstance(value, str) or not _HEADER.fullmatch(value.strip().lower()):
        raise ConfigError(
            f"tenant={value!r} is not a header name",
            remedy='name the request header that carries the key, e.g. tenant="x-api-key" or '
                   'tenant="authorization", or pass a function scope -> str | None',
        )
    return value.strip().lower()


#: A tenant header that none of a process's first this many requests carries is logged, once.
UNSEEN_AFTER = 50
_MAX_NAMES_SEEN = 64


class FromHeader:
    """The tenant of a request from one header: the hash of its first value (never the value).

    A header name that none of the first :data:`UNSEEN_AFTER` requests carries (a typo such
    as ``tenant="autorization"``) would leave every tenant null, silently: it is logged once,
    with the header name seen that comes closest (names only, never a value)."""

    __slots__ = ("_left", "_names", "name")

    def __init__(self, name: str) -> None:
        self.name = name.encode("latin-1")
        self._left = UNSEEN_AFTER  # requests left before the warning; -1: decided
        self._names: set[bytes] = set()

    def __call__(self, scope: Scope) -> str | None:
        name = self.name
        headers = scope.get("headers", ())
        for key, value in headers:
            if key.lower() == name:
                self._left = -1
                return hashed(value)
        if self._left >= 0:
            self._missed(headers)
        return None

    def _missed(self, headers: Any) -> None:
        names = self._names
        for key, _ in headers:
            if len(names) < _MAX_NAMES_SEEN:
                names.add(bytes(key).lower())
        self._left -= 1
        if self._left > 0:
            return
        self._left = -1
        header = self.name.decode("latin-1")
        seen = sorted(n.decode("latin-1") for n in names)
        close = difflib.get_close_matches(header, seen, n=1, cutoff=0.6)
        hint = f"did you mean tenant={close[0]!r}? " if close else ""
        self._names = set()
        log.warning("giul-asgi: none of the first %d requests carried the tenant header %r, so "
                    "their tenant is null; %sheaders seen: %s (logged once)", UNSEEN_AFTER, header,
                    hint, ", ".join(seen) or "none")


class FromCallable:
    """The tenant the operator's function names. A function that raises or returns
    something other than a string (or None) costs the tenant, never the request; it is
    logged once, by type only (an exception's text may quote the key)."""

    __slots__ = ("fn", "warned")

    def __init__(self, fn: Callable[[Scope], Any]) -> None:
        self.fn = fn
        self.warned = False

    def __call__(self, scope: Scope) -> str | None:
        try:
            value = self.fn(scope)
        except Exception as exc:
            self._warn(f"raised {type(exc).__name__}")
            return None
        if value is None:
            return None
        if not isinstance(value, str):
            self._warn(f"returned a {type(value).__name__}, not a str or None")
            return None
        return tenant_name(value)

    def _warn(self, what: str) -> None:
        if not self.warned:
            self.warned = True
            log.warning("giul-asgi: the tenant function %s; those requests have no tenant "
                        "(logged once)", what)


def tenant_source(setting: Any) -> Callable[[Scope], str | None] | None:
    """What resolves a request's tenant for ``EnergyMiddleware(tenant=...)``, checked once:
    None (no tenants), a header name, or a plain function ``scope -> str | None``."""
    if setting is None:
        return None
    if isinstance(setting, str):
        return FromHeader(header_name(setting))
    if not callable(setting) or isinstance(setting, type):
        raise ConfigError(
            f"tenant={setting!r} must be a header name or a function scope -> str | None",
            remedy='pass e.g. tenant="x-api-key", or tenant=lambda scope: scope["state"]["team"]',
        )
    if inspect.iscoroutinefunction(setting) or inspect.iscoroutinefunction(
        getattr(setting, "__call__", None)  # noqa: B004 - an instance with an async __call__
    ):
        raise ConfigError(
            f"tenant={setting!r} is a coroutine function: the tenant is resolved on the "
            "request's path and must not wait",
            remedy="pass a plain function scope -> str | None that reads what it needs from the scope",
        )
    return FromCallable(setting)


# -- which tenants keep a label --------------------------------------------------------------

class TenantPlaces:
    """Which tenants keep a label of their own: at most ``max_tenants`` at a time, those
    with the most joules since start; :meth:`label` says under which label a record counts.

    The tenants that hold a place are counted exactly. The others are tracked as
    candidates the Space-Saving way (Metwally et al. 2005), at most ``2 * candidates`` of
    them (default ``10 * max_tenants``): when there are more, the smaller half is forgotten
    and a name seen again starts from the most a forgotten one had (``floor``), so its
    count is an upper bound and ``count - floor at entry`` a lower bound of its joules.
    A candidate is given a place when that lower bound is at least ``1 / (4 *
    max_tenants)`` of all joules so far (so ten thousand light keys do not take the places
    in turn) and a place is free, or it exceeds the smallest placed tenant's total by
    :data:`MARGIN` (that one then loses its place). A heavy tenant keeps, or earns, its
    label whatever the traffic; two of the same size do not swap back and forth.

    A tenant that loses its place is not moved: what it counted keeps its label (the
    since-start counters under it never go down; Prometheus sees a series that stops
    growing, which ``sum(rate(...))`` handles), and its later requests count under
    ``<other>`` until it earns a place again. Moving its past into ``<other>`` instead
    would make its counters fall (a reset to Prometheus) and ``<other>``'s jump. Labels
    ever given are at most ``2 * max_tenants`` names: past that, a candidate that never
    had a label stays under ``<other>``, so the series stay bounded even under a churn of
    heavy tenants. Memory: at most ``max_tenants + 2 * candidates + 1`` names tracked and
    ``2 * max_tenants`` remembered.

    Not thread-safe: the statistics call it under their lock.
    """

    __slots__ = ("_floor", "_given", "_least", "_placed", "_seen", "_total", "candidates",
                 "max_labels", "max_tenants", "other", "promotions", "share")

    def __init__(self, max_tenants: int = DEFAULT_MAX_TENANTS, *, candidates: int | None = None,
                 other: str = OTHER) -> None:
        if isinstance(max_tenants, bool) or not isinstance(max_tenants, int) or max_tenants < 1:
            raise ConfigError(f"max_tenants={max_tenants!r} must be a whole number >= 1",
                              remedy=f"use the default, {DEFAULT_MAX_TENANTS}")
        self.max_tenants = max_tenants
        self.max_labels = 2 * max_tenants
        self.candidates = candidates if candidates is not None else 10 * max_tenants
        self.other = other
        self._placed: dict[str, float] = {}  # name -> joules since start
        self._seen: dict[str, list[float]] = {}  # name -> [joules, at most, floor at entry]
        self._given: set[str] = set()  # every name that ever held a place
        self._floor = 0.0
        self._least = 0.0  # at most the smallest placed total (placed totals only grow)
        self._total = 0.0  # every tenant's joules since start
        #: The least share of all joules a tenant must have to be given a place.
        self.share = 1.0 / (4 * max_tenants)
        self.promotions = 0

    def label(self, tenant: str, joules: float | None) -> str:
        """The label a record of ``tenant`` with ``joules`` (None: unknown) counts under."""
        j = joules if joules is not None and 0.0 < joules < math.inf else 0.0
        self._total += j
        placed = self._placed
        total = placed.get(tenant)
        if total is not None:
            placed[tenant] = total + j
            return tenant
        entry = self._seen.get(tenant)
        if entry is None:
            entry = self._seen[tenant] = [self._floor, self._floor]
        entry[0] += j
        surely = entry[0] - entry[1]
        if surely >= self._total * self.share and (
            tenant in self._given or len(self._given) < self.max_labels
        ):
            if len(placed) < self.max_tenants:
                return self._place(tenant, surely)
            if surely > self._least * MARGIN:
                least_name = min(placed, key=placed.__getitem__)
                self._least = least = placed[least_name]
                if surely > least * MARGIN:
                    del placed[least_name]
                    self._seen[least_name] = [least, 0.0]  # known exactly while it was placed
                    return self._place(tenant, surely)
        if len(self._seen) > 2 * self.candidates:
            self._forget()
        return self.other

    def _place(self, tenant: str, joules: float) -> str:
        del self._seen[tenant]
        self._placed[tenant] = joules
        self._given.add(tenant)
        self.promotions += 1
        return tenant

    def _forget(self) -> None:
        """Keep the ``candidates`` largest candidates; the rest are forgotten, and the most
        one of them had becomes the floor a name seen again starts from."""
        ranked = sorted(self._seen.items(), key=lambda item: item[1][0], reverse=True)
        self._floor = max(self._floor, ranked[self.candidates][1][0])
        self._seen = dict(ranked[:self.candidates])

    def placed(self) -> dict[str, float]:
        """The tenants holding a place now, with their joules since start."""
        return dict(self._placed)

    def size(self) -> dict[str, int]:
        return {"placed": len(self._placed), "candidates": len(self._seen),
                "labels_given": len(self._given)}

    def bound(self) -> dict[str, int]:
        """The most each count of :meth:`size` can reach, whatever the traffic."""
        return {"placed": self.max_tenants, "candidates": 2 * self.candidates + 1,
                "labels_given": self.max_labels}


__all__ = [
    "DEFAULT_MAX_TENANTS", "HASH_HEX", "KEY_PREFIX", "MAX_NAME", "NONE", "OTHER", "UNSEEN_AFTER",
    "FromCallable", "FromHeader", "TenantPlaces", "TenantSetting", "hashed", "header_name", "is_hashed",
    "tenant_name", "tenant_source",
]
