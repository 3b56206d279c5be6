"""A budget: how much energy (or CO2e) one tenant, route or tier may spend in a period.

LiteLLM keeps dollar budgets per key and team and names kWh and gCO2e per team as its
direction; an operator here says it in joules above idle (what a request caused) or in
grams of CO2e (the node's carbon), per period. A :class:`Budget` is a plain, frozen value,
checked when it is built, each mistake said once with its remedy
(:class:`~giul_asgi.errors.ConfigError`); :func:`check_budgets` checks what a budget names
against the middleware's other settings (its tenants, tiers, routes and carbon), so a bad
budget stops the startup rather than letting requests through unbudgeted.

Periods are fixed windows aligned on the Unix epoch (``floor(time / period)``): every worker
of a server, and every server of a fleet, agrees on when one begins and ends with no
coordination. ``"day"`` begins at 00:00 UTC and ``"hour"`` on the hour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..deferred import KeepsItsError, raise_kept
from ..errors import ConfigError
from ..tenants import NONE, is_hashed, tenant_name

#: Whose spending a budget counts, and where its key comes from.
PER: tuple[str, ...] = ("tenant", "route", "tier")
#: Named periods (seconds).
PERIODS: dict[str, float] = {"hour": 3600.0, "day": 86400.0}
#: The shortest and longest period in seconds (a year: longer is a quota, not a budget).
MIN_PERIOD_S = 1.0
MAX_PERIOD_S = 366 * 86400.0
#: A budget's name: what headers, logs, ``/energy`` and Prometheus call it.
_NAME = re.compile(r"[A-Za-z0-9._:@/+=*-]{1,64}")


@dataclass(frozen=True)
class Budget(metaclass=KeepsItsError):
    """What one tenant (route, tier) may spend in each period, and what happens past it.

    ``Budget(joules=5e6, per="tenant", period="day")`` lets each tenant spend 5 MJ above
    idle a day; ``key="team-a"`` limits that tenant alone. Soft by default: every answer
    under it says what is left (``X-Energy-Budget-Remaining``), and crossing it is logged
    once and counted (``giul_budget_exceeded_total``); ``hard=True`` refuses a request of a
    key over budget before the app runs (429, ``Retry-After``, an OpenAI-shaped error).
    """

    #: Joules above idle each key may spend in a period (give this or ``grams``).
    joules: float | None = None
    #: Grams of CO2e each key may emit in a period, from its nodes' carbon (or ``joules``).
    grams: float | None = None
    #: Whose spending is counted: ``tenant``, ``route`` (the matched Route's pattern) or ``tier``.
    per: str = "tenant"
    #: Which one: None counts each tenant (route, tier) on its own; a name, only that one.
    key: str | None = None
    #: The period: seconds, ``"hour"`` or ``"day"``, aligned on the epoch (a day starts 00:00 UTC).
    period: float | str = "day"
    #: Refuse a request of a key over budget before the app runs (429); False: say it only.
    hard: bool = False
    #: Its name in headers, logs, ``/energy`` and Prometheus (None: e.g. ``tenant/day/J``).
    name: str | None = None

    def __post_init__(self) -> None:
        joules, grams = self.joules, self.grams
        if (joules is None) == (grams is None):
            raise ConfigError(
                "a Budget needs joules= or grams= (one of them)" if joules is None else
                "a Budget counts joules= or grams=, not both",
                remedy="Budget(joules=5e6, per='tenant', period='day'), or grams=... for CO2e: "
                       "two budgets for both")
        unit = "joules" if joules is not None else "grams"
        limit = _positive(unit, joules if joules is not None else grams)
        object.__setattr__(self, unit, limit)
        if self.per not in PER:
            raise ConfigError(f"Budget(per={self.per!r}) must be one of {PER}",
                              remedy="count per tenant (tenant=... on the middleware), per route "
                                     "(the routes' patterns) or per tier")
        if self.key is not None:
            if not isinstance(self.key, str) or not self.key.strip():
                raise ConfigError(f"Budget(key={self.key!r}) must be a non-empty name, or None",
                                  remedy=f"None budgets each {self.per} on its own; a name, that one alone")
            if self.per == "tenant" and self.key != NONE and tenant_name(self.key) != self.key:
                # Never echoed: a key that is no tenant's name is most likely a secret (an API
                # key, "Bearer ...", one read from a file with its newline).
                why = (f"{len(self.key)} characters, more than 64" if len(self.key.strip()) > 64
                       else "characters no tenant's name has (spaces, newlines, quotes...)")
                raise ConfigError(
                    f"Budget(key=<a value of {len(self.key)} characters, not shown>) is not a tenant "
                    f"as the middleware names one ({why}), so no request would ever match it",
                    remedy="give the tenant as /energy's tenants show it: a function's name (at most "
                           "64 of A-Z a-z 0-9 . _ : @ / + = -), or for a header key "
                           "giul_asgi.tenants.hashed(key) ('key:' and 16 hex digits; None for an "
                           "empty key, which would budget every tenant)")
        object.__setattr__(self, "period", _period(self.period))
        if not isinstance(self.hard, bool):
            raise ConfigError(f"Budget(hard={self.hard!r}) must be True or False",
                              remedy="hard=True refuses requests over budget; False (the default) "
                                     "says it only")
        if self.name is None:
            object.__setattr__(self, "name", self.default_name())
        elif not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"Budget(name={self.name!r}) must be 1 to 64 of A-Z a-z 0-9 . _ : @ / + = * -",
                              remedy="it names the budget in headers, logs and Prometheus labels: "
                                     "e.g. name='team-a-daily'")

    @property
    def limit(self) -> float:
        """What each key may spend in a period, in :attr:`unit`."""
        value = self.joules if self.joules is not None else self.grams
        assert value is not None
        return value

    @property
    def unit(self) -> str:
        """``J`` or ``g`` (CO2e)."""
        return "J" if self.joules is not None else "g"

    @property
    def period_s(self) -> float:
        return float(self.period)

    def default_name(self) -> str:
        """``<per>[=<key>]/<period>/<unit>``: ``tenant/day/J``, ``tier=70b/3600s/g``."""
        period = next((n for n, s in PERIODS.items() if s == self.period), None) or f"{self.period:g}s"
        who = self.per if self.key is None else f"{self.per}={_UNSAFE.sub('_', self.key)}"
        return f"{who}/{period}/{self.unit}"[:64]


_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=*-]")


def _positive(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise ConfigError(f"Budget({what}={value!r}) must be a number > 0",
                          remedy=f"give what each key may spend in a period, e.g. {what}="
                                 + ("3.6e6 (1 kWh)" if what == "joules" else "500.0"))
    return float(value)


def _period(value: Any) -> float:
    if isinstance(value, str):
        seconds = PERIODS.get(value.strip().lower())
        if seconds is None:
            raise ConfigError(f"Budget(period={value!r}) is not a period",
                              remedy=f"use {', '.join(repr(p) for p in PERIODS)} or a number of seconds")
        return seconds
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not MIN_PERIOD_S <= value <= MAX_PERIOD_S:
        raise ConfigError(f"Budget(period={value!r}) must be 'hour', 'day' or {MIN_PERIOD_S:g} to "
                          f"{MAX_PERIOD_S:g} seconds",
                          remedy="periods are fixed windows aligned on the epoch: e.g. period='day', "
                                 "or period=900 for quarter hours")
    return float(value)


def build_budget(raw: Budget | Mapping[str, Any], where: str) -> Budget:
    """A Budget from itself or a table of its keys (a bad key named)."""
    if isinstance(raw, Budget):
        raise_kept(raw)  # made wrong while a server imported the app
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a Budget(...), got {type(raw).__name__}",
                          remedy="budgets=[Budget(joules=..., per='tenant', period='day')]")
    allowed = {f.name for f in fields(Budget)}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0][:32]!r}",
                          remedy=f"allowed keys: {sorted(allowed)}")
    try:
        return Budget(**raw)
    except ConfigError as error:  # which table it was: a file may hold several
        raise ConfigError(f"{where}: {error.message}", remedy=error.remedy) from None


def check_budgets(
    budgets: Any, *, tenants: bool, tiers: Iterable[str], routes: Iterable[str], carbon: bool,
    header: str | None = None,
) -> tuple[Budget, ...]:
    """The middleware's ``budgets=[...]``, checked against what it knows: a tenant budget
    needs tenants (and, where they come from ``header``, a key as the header's tenants are
    named: hashed), a tier or route budget a tier or route it can name, a grams budget a
    node with carbon; names are unique. Raises :class:`ConfigError` with the remedy."""
    if isinstance(budgets, Budget | Mapping | str | bytes) or not isinstance(budgets, Iterable):
        raise ConfigError(f"budgets={budgets!r} must be a list of Budget(...)",
                          remedy="budgets=[Budget(joules=..., per='tenant', period='day')]")
    items = tuple(build_budget(b, f"budgets[{i}]") for i, b in enumerate(budgets))
    tier_names, route_labels = sorted(set(tiers)), sorted(set(routes))
    seen: set[str] = set()
    for budget in items:
        name = budget.name
        assert name is not None
        if name in seen:
            raise ConfigError(f"two budgets are named {name!r}",
                              remedy="give each its own name=... (the name tells them apart in "
                                     "headers, /energy and Prometheus)")
        seen.add(name)
        if budget.per == "tenant" and not tenants:
            shown = name if budget.key is None or name != budget.default_name() else "tenant=<key not shown>"
            raise ConfigError(f"budget {shown!r} counts per tenant, and the middleware has no tenant",
                              remedy="say who requests are for: tenant='x-api-key' (a header, hashed) "
                                     "or tenant=function(scope); or budget per='route' or per='tier'")
        if (budget.per == "tenant" and header is not None and budget.key is not None
                and budget.key != NONE and not is_hashed(budget.key)):
            # Not echoed: a key given here is most likely the secret itself.
            raise ConfigError(
                f"budget {budget.per}/{budget.period:g}s keys on a tenant that no request can have: "
                f"tenants come from the {header!r} header, each named by its value's hash "
                f"('key:' and 16 hex digits), never by the value",
                remedy="give key=giul_asgi.tenants.hashed(<the API key>), the tenant /energy shows "
                       "for it (None for an empty key, which would budget every tenant); or "
                       "key='<none>' for requests without the header")
        if budget.per == "tier":
            if not tier_names:
                raise ConfigError(f"budget {name!r} counts per tier, and no tier is declared",
                                  remedy="declare tiers=[Tier(...)], or budget per='tenant' or per='route'")
            if budget.key is not None and budget.key not in tier_names:
                raise ConfigError(f"budget {name!r} names tier {budget.key!r}, which is not declared",
                                  remedy=f"name one of {tier_names}")
        if budget.per == "route":
            if not route_labels:
                raise ConfigError(f"budget {name!r} counts per route, and no route is declared",
                                  remedy="declare routes=[Route('/v1/chat/completions', ...), ...] "
                                         "(a budget counts per Route pattern); or budget per='tenant'")
            if budget.key is not None and budget.key not in route_labels:
                raise ConfigError(f"budget {name!r} names route {budget.key!r}, which is no Route's pattern",
                                  remedy=f"name one of {route_labels}")
        if budget.grams is not None and not carbon:
            raise ConfigError(f"budget {name!r} counts grams of CO2e, and no node has a carbon intensity",
                              remedy="give the nodes carbon_g_per_kwh=... (or carbon=a source to poll), "
                                     "or budget joules=...")
    return items


__all__ = ["MAX_PERIOD_S", "MIN_PERIOD_S", "PER", "PERIODS", "Budget", "build_budget", "check_budgets"]
