"""OpenTelemetry: span attributes for a request's energy, and metric instruments.

Importing this module imports ``opentelemetry-api`` (the ``otel`` extra); nothing else in
giul_asgi imports it, so without the extra there is no cost.

- :meth:`OtelRecorder.annotate` sets ``giul.energy.*`` attributes, and the GenAI
  ``gen_ai.usage.output_tokens`` / ``gen_ai.usage.input_tokens`` where the record's token
  kind says which, on a span that is recording. Unknown stays absent, never 0.
- As a listener of settled figures (``recorder.settled(batch)``), it adds each settled
  record to counters equivalent to the Prometheus ones: ``giul.energy`` (J, a
  counter like the hardware semconv's ``hw.energy``), ``giul.energy.allocated`` (J, with the
  idle floor's share: a separate instrument, as in Prometheus), ``giul.requests``, ``giul.tokens``,
  ``giul.carbon`` (g CO2eq, figures whose carbon is known) and the ``giul.request.energy``
  histogram (J, log-spaced bucket advice).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace

from ..listeners import Settled
from ..stats import JOULE_BUCKETS, METHOD_MIX, NONE, OTHER, OUTCOMES, UNMATCHED
from ..tenants import DEFAULT_MAX_TENANTS, TenantPlaces


def energy_attributes(energy: Any) -> dict[str, Any]:
    """The span attributes of one record; a ``None`` field gives no attribute."""
    attrs: dict[str, Any] = {}
    for name, value in (
        ("giul.energy.joules", energy.joules),
        ("giul.energy.allocated_joules", getattr(energy, "allocated_joules", None)),
        ("giul.energy.method", energy.method),
        ("giul.energy.backend", energy.backend),
        ("giul.energy.source", energy.source),
        ("giul.energy.node", energy.node),
        ("giul.energy.tier", energy.tier),
        ("giul.energy.uncertainty_joules", energy.uncertainty_joules),
        ("giul.energy.settled", energy.settled),
        ("giul.energy.contended", energy.contended),
        ("giul.energy.seconds", energy.seconds),
        ("giul.energy.joules_per_token", energy.joules_per_token),
        ("giul.energy.id", energy.id),
        ("giul.energy.tenant", energy.tenant),
        ("giul.energy.carbon_grams", energy.carbon_grams),
        ("giul.energy.carbon_g_per_kwh", energy.carbon_g_per_kwh),
        ("giul.energy.carbon_source", energy.carbon_source),
        ("giul.energy.boundary", getattr(energy, "boundary", None)),
        ("giul.energy.pue", getattr(energy, "pue", None)),
    ):
        if value is not None:
            attrs[name] = value
    if isinstance(energy.tokens, int) and energy.tokens > 0:
        kind = {"output": "gen_ai.usage.output_tokens", "input": "gen_ai.usage.input_tokens"}
        key = kind.get(energy.token_kind)
        if key is not None:
            attrs[key] = energy.tokens
    return attrs


class OtelRecorder:
    """Span attributes and metric instruments for settled records.

    ``meter_provider`` defaults to the global one (``metrics.get_meter_provider()``).
    A span carries the record's tenant (``giul.energy.tenant``); the counters carry a
    ``tenant`` attribute bounded as the statistics bound theirs: the ``max_tenants`` with
    the most joules, the rest ``<other>`` (:class:`~giul_asgi.tenants.TenantPlaces`).
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None, *,
                 max_tenants: int = DEFAULT_MAX_TENANTS) -> None:
        self._tenants = TenantPlaces(max_tenants, other=OTHER)
        self._lock = threading.Lock()  # the tenant places: batches come from every reader thread
        provider = meter_provider or metrics.get_meter_provider()
        meter = provider.get_meter("giul_asgi")
        self.energy = meter.create_counter(
            "giul.energy", unit="J",
            description="Energy above idle charged to requests (known figures)")
        self.allocated = meter.create_counter(
            "giul.energy.allocated", unit="J",
            description="Energy charged to requests with their share of the idle floor while "
                        "they ran (known figures)")
        self.requests = meter.create_counter(
            "giul.requests", unit="{request}", description="Metered requests, by outcome")
        self.unknown = meter.create_counter(
            "giul.requests.unknown_energy", unit="{request}",
            description="Metered requests whose energy is unknown")
        self.tokens = meter.create_counter(
            "giul.tokens", unit="{token}", description="Tokens counted on metered requests")
        self.carbon = meter.create_counter(
            "giul.carbon", unit="g",
            description="CO2eq of the energy charged to requests (figures whose carbon is known)")
        self.histogram = meter.create_histogram(
            "giul.request.energy", unit="J", description="Joules per request (known figures)",
            explicit_bucket_boundaries_advisory=list(JOULE_BUCKETS))
        self.errors = 0

    @staticmethod
    def current_span() -> Any | None:
        """The span recording for the current request, or ``None``: call it where the
        request runs (its context), keep it, and pass it to :meth:`annotate` later."""
        span = trace.get_current_span()
        return span if span.is_recording() else None

    def annotate(self, span: Any | None, energy: Any) -> None:
        """Set the record's attributes on ``span`` if it is still recording. Never raises."""
        try:
            if span is not None and span.is_recording():
                span.set_attributes(energy_attributes(energy))
        except Exception:
            self.errors += 1

    def settled(self, batch: Sequence[Settled]) -> None:
        """Count settled records (a listener). Never raises."""
        with self._lock:
            for record in batch:
                self._count(record.energy, record.outcome)

    def _count(self, energy: Any, outcome: str) -> None:
        try:
            attrs = {
                "route": energy.route or UNMATCHED, "node": energy.node or NONE,
                "tier": energy.tier or NONE,
                "method": energy.method if energy.method in METHOD_MIX else "unknown",
                "tenant": NONE if energy.tenant is None
                else self._tenants.label(energy.tenant, energy.joules),
            }
            self.requests.add(1, {**attrs, "outcome": outcome if outcome in OUTCOMES else "incomplete"})
            joules = energy.joules
            if joules is not None and joules > 0:
                self.energy.add(joules, attrs)
                self.histogram.record(joules, attrs)
            else:
                self.unknown.add(1, attrs)
            allocated = getattr(energy, "allocated_joules", None)
            if allocated is not None and allocated > 0:
                self.allocated.add(allocated, attrs)
            if isinstance(energy.tokens, int) and energy.tokens > 0:
                self.tokens.add(energy.tokens, attrs)
            if energy.carbon_grams is not None:
                self.carbon.add(energy.carbon_grams, attrs)
        except Exception:
            self.errors += 1

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def otel_recorder(meter_provider: metrics.MeterProvider | None = None, *,
                  max_tenants: int = DEFAULT_MAX_TENANTS) -> OtelRecorder:
    """An :class:`OtelRecorder` on ``meter_provider`` (default: the global provider)."""
    return OtelRecorder(meter_provider, max_tenants=max_tenants)


__all__ = ["OtelRecorder", "energy_attributes", "otel_recorder"]
