"""Prometheus exposition: a custom collector over the statistics and the ledgers.

Not a second bookkeeping: :class:`EnergyCollector` reads :meth:`EnergyStats.counters`
(since-start counters per route, node, tier, method and outcome) and each ledger's
``totals()`` at scrape time. Everything per request is a counter or a histogram, never
an average, so replicas sum in Prometheus (``sum by (route) (rate(...))``). Label names
are fixed; their values are the statistics' bounded labels (``<other>`` past the bound).

Two bases, two metrics (not one with a ``basis`` label: the allocated joules include the
joules above idle, so a sum over such a label would count them twice, and a sum over every
label of a metric must mean something): ``giul_energy_joules_total`` above idle, what the
requests caused; ``giul_energy_allocated_joules_total`` with their share of the idle floor,
which with ``giul_node_unattributed_joules_total`` and
``giul_node_idle_unattributed_joules_total`` adds up to ``giul_node_drawn_joules_total``.

A gateway registers it in its own registry (``registry.register(EnergyCollector(stats,
ledgers))``), or lets the endpoint serve :func:`prometheus_text` at ``metrics_path``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..stats import JOULE_BUCKETS, Statistics, StatsView
from . import ledger_totals

#: A tenant label is one of the statistics' bounded tenants (``<other>`` for the rest, and
#: ``<none>`` where no tenant was resolved): never a key.
LABELS = ["route", "node", "tier", "method", "tenant"]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: ledger totals field -> (metric name, help); counters since start, in joules or counts.
_NODE_COUNTERS = (
    ("measured_j", "giul_node_measured_joules", "Energy above idle the node's reader measured, J."),
    ("charged_j", "giul_node_charged_joules", "Energy above idle charged to requests, J."),
    ("unattributed_j", "giul_node_unattributed_joules", "Energy above idle with no request open, J."),
    ("drawn_j", "giul_node_drawn_joules", "All the node drew, idle included, J."),
    ("allocated_j", "giul_node_allocated_joules",
     "Energy charged to requests with their share of the idle floor while they ran, J."),
    ("idle_unattributed_j", "giul_node_idle_unattributed_joules",
     "The idle floor while no request was open, J."),
    ("foreign_j", "giul_node_foreign_joules", "Energy above idle witnessed from a foreign load, J."),
    ("reads", "giul_node_reads", "Reads of the node's reader."),
    ("read_errors", "giul_node_reader_errors", "Reads that failed."),
    ("resets", "giul_node_counter_resets", "Energy counter resets seen (driver reloads)."),
)
_NODE_GAUGES = (
    ("idle_w", "giul_node_idle_watts", "The idle floor used for the node, W."),
    ("foreign_watts", "giul_node_foreign_watts", "Foreign load's above-idle power last seen, W."),
    ("in_flight_j", "giul_node_in_flight_joules", "Energy charged to windows still open, J."),
    ("mean_concurrency", "giul_node_mean_concurrency", "Mean number of windows in flight."),
    ("last_reading_age_s", "giul_node_last_reading_age_seconds", "Age of the last reading, s."),
    ("period_s", "giul_node_update_period_seconds", "The reader's learnt update period, s."),
    ("windows_open", "giul_node_windows_open", "Request windows open now."),
)


class EnergyCollector(Collector):
    """``collect()`` yields the giul metric families from ``stats`` and ``ledgers``.

    ``stats`` is an :class:`~giul_asgi.stats.EnergyStats` or a
    :class:`~giul_asgi.stats.HostStats` (then the counters are the whole host's).
    """

    def __init__(self, stats: Statistics, ledgers: Iterable[Any] | None = None, *,
                 budgets: Any = None) -> None:
        self.stats = stats
        self.ledgers = ledgers
        #: The middleware's budgets (``giul_asgi.budgets.Budgets``), or None.
        self.budgets = budgets

    def collect(self) -> Iterator[Metric]:
        view = self.stats.view()
        joules = CounterMetricFamily(
            "giul_energy_joules", "Energy above idle charged to requests (known figures), J.",
            labels=LABELS)
        requests = CounterMetricFamily(
            "giul_requests", "Metered requests, by outcome.", labels=[*LABELS, "outcome"])
        unknown = CounterMetricFamily(
            "giul_requests_unknown_energy", "Metered requests whose energy is unknown.",
            labels=LABELS)
        tokens = CounterMetricFamily("giul_tokens", "Tokens counted on metered requests.",
                                     labels=LABELS)
        hist = HistogramMetricFamily(
            "giul_request_joules", "Joules per request (known figures).", labels=LABELS)
        by_key: dict[tuple[str, ...], list[Any]] = {}
        for key, n, known, j, tok, buckets in view.counters():
            five = (*key[:4], key[5])  # key: route, node, tier, method, outcome, tenant
            requests.add_metric([*five, key[4]], n)
            acc = by_key.setdefault(five, [0, 0, 0.0, 0, [0] * len(buckets)])
            acc[0] += n
            acc[1] += known
            acc[2] += j
            acc[3] += tok
            acc[4] = [a + b for a, b in zip(acc[4], buckets, strict=True)]
        for labels, (n, known, j, tok, buckets) in sorted(by_key.items()):
            joules.add_metric(list(labels), j)
            unknown.add_metric(list(labels), n - known)
            tokens.add_metric(list(labels), tok)
            cumulative, running = [], 0
            for bound, count in zip((*map(_le, JOULE_BUCKETS), "+Inf"), buckets, strict=True):
                running += count
                cumulative.append((bound, running))
            hist.add_metric(list(labels), cumulative, sum_value=j)
        yield from (joules, requests, unknown, tokens, hist)
        yield allocated_family(view)
        yield carbon_family(view)
        yield from node_families(ledger_totals(self.ledgers), view)
        yield from reader_families(self.ledgers)
        if self.budgets is not None:
            yield budget_family(self.budgets)


def budget_family(budgets: Any) -> Metric:
    """How many times each budget was crossed per key since the server started: once per
    (budget, key, period), whichever worker saw it first (counted server-wide)."""
    exceeded = CounterMetricFamily(
        "giul_budget_exceeded", "Times a key reached its energy budget in a period (once per "
        "period, server-wide).", labels=["budget", "key"])
    for (name, key), count in sorted(budgets.exceeded().items()):
        exceeded.add_metric([name, key], count)
    return exceeded


def allocated_family(view: StatsView) -> Metric:
    """Allocated joules since start per label (figures where they are known): the basis a
    chargeback reconciles to the bill (a label with none has no series)."""
    allocated = CounterMetricFamily(
        "giul_energy_allocated_joules", "Energy charged to requests with their share of the idle "
        "floor while they ran (known figures), J.", labels=LABELS)
    for labels, joules in sorted(view.allocated_counters().items()):
        allocated.add_metric(list(labels), joules)
    return allocated


def carbon_family(view: StatsView) -> Metric:
    """Grams of CO2eq since start per label (figures whose carbon is known; a label with
    none has no series: unknown is never 0)."""
    carbon = CounterMetricFamily(
        "giul_carbon_grams", "CO2eq of the energy charged to requests (joules x PUE x the grid's "
        "gCO2eq/kWh / 3.6e6), over figures whose carbon is known, g.", labels=LABELS)
    for labels, grams in sorted(view.carbon_counters().items()):
        carbon.add_metric(list(labels), grams)
    return carbon


def node_families(totals: Iterable[Any], view: StatsView | None = None) -> Iterator[Metric]:
    """Node counters and gauges from ledger totals; a field that is None is left out."""
    counters: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        f: CounterMetricFamily(n, h, labels=["node"]) for f, n, h in _NODE_COUNTERS}
    gauges: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        f: GaugeMetricFamily(n, h, labels=["node"]) for f, n, h in _NODE_GAUGES}
    power = GaugeMetricFamily(
        "giul_node_power_watts",
        "Above-idle power between the last two samples of the ledger (rate() of "
        "giul_node_measured_joules_total is the Prometheus way), W.", labels=["node"])
    latest = view.node_power() if view is not None else {}
    for t in totals:
        node = str(getattr(t, "node", "") or "<none>")
        # The host's card: the same books from every worker. A card each worker has alone
        # (in-process) is a series per worker (``process``), so a scrape answered by another
        # worker never reads as a counter going down (a hostile tester's 264 falls in 70).
        process = getattr(t, "process", None)
        labels = {"node": node} if process is None else {"node": node, "process": str(process)}
        for field, family in (*counters.items(), *gauges.items()):
            value = getattr(t, field, None)
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, int | float):
                suffix = "_total" if family.type == "counter" else ""
                family.add_sample(family.name + suffix, labels, float(value))
        watts = latest.get(node)
        if watts is not None:
            power.add_metric([node], watts)
    yield from counters.values()
    yield from gauges.values()
    yield power


def reader_families(ledgers: Iterable[Any] | None) -> Iterator[Metric]:
    """Each node's reader as its thread last saw it: 1 while it reads, 0 while it fails,
    is unavailable or has not read yet (alert on it beside the last reading's age)."""
    up = GaugeMetricFamily(
        "giul_node_reader_up", "1 while the node's reader reads, 0 while it fails or is unavailable.",
        labels=["node", "reader"])
    mig = GaugeMetricFamily(
        "giul_node_mig_info", "1 for a node that reads a MIG board, labelled with the slices it "
        "stands for: its energy is the whole board's (a MIG slice cannot be metered alone).",
        labels=["node", "slices"])
    try:
        items = list(ledgers or ())
    except Exception:  # a scrape never breaks on a ledger
        items = []
    for ledger in items:
        health = getattr(ledger, "health", None)
        node = getattr(getattr(ledger, "node", None), "name", None)
        if health is not None and node is not None:
            up.add_metric([str(node), str(health.reader)], 1.0 if health.state == "ok" else 0.0)
        on_mig = getattr(ledger, "mig", None)
        if on_mig is not None and node is not None:
            mig.add_metric([str(node), on_mig.label], 1.0)
    yield up
    yield mig


def _le(bound: float) -> str:
    return repr(float(bound))


def prometheus_text(collector: Collector) -> bytes:
    """The text exposition of one collector (what ``metrics_path`` serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


__all__ = ["CONTENT_TYPE", "LABELS", "EnergyCollector", "allocated_family", "budget_family", "carbon_family",
           "node_families", "prometheus_text", "reader_families"]
