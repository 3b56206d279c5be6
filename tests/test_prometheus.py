"""Prometheus text: parses with prometheus_client, and sums across two app instances."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_endpoint import FakeLedger, client

from giul_asgi.energy import Energy
from giul_asgi.exporters.prometheus import EnergyCollector
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.anyio
async def test_two_instances_sum_to_the_requests_they_served() -> None:
    texts, joules = [], 0.0
    for k in range(2):
        stats = EnergyStats()
        ledger = FakeLedger("gpu0")
        ledger.t.measured_j, ledger.t.charged_j, ledger.t.read_errors = 100.0 * (k + 1), 80.0, 2
        for i in range(10 + k):
            j = None if i == 0 else 0.5 * i
            joules += j or 0.0
            stats.record(Energy(j, "measured" if j else "unknown", node="gpu0", tier="8b", route="/v1/chat",
                                seconds=0.1, tokens=4), outcome="ok" if i % 4 else "error", status=200)
        app = EnergyEndpoint(stats=stats, ledgers=[ledger], metrics_path="/metrics")
        async with client(app) as c:
            r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        texts.append(r.text)
    parsed = [samples(t) for t in texts]
    total = lambda name: sum(v for p in parsed for (n, _), v in p.items() if n == name)  # noqa: E731
    assert total("giul_requests_total") == 21
    assert total("giul_energy_joules_total") == pytest.approx(joules)
    assert total("giul_requests_unknown_energy_total") == 2
    assert total("giul_tokens_total") == 84
    assert total("giul_request_joules_count") == 19  # known figures only
    assert total("giul_request_joules_sum") == pytest.approx(joules)
    assert total("giul_node_measured_joules_total") == 300.0
    assert total("giul_node_reader_errors_total") == 4
    inf = [v for p in parsed for (n, lab), v in p.items()
           if n == "giul_request_joules_bucket" and ("le", "+Inf") in lab]
    assert sum(inf) == 19
    names = {n for p in parsed for (n, _) in p}
    per_request = {n for n in names if not n.startswith("giul_node_")}
    assert not any("mean" in n or "avg" in n for n in per_request)  # counters, never averages
    labels = {k for p in parsed for (n, lab), _ in p.items() if n == "giul_requests_total" for k, _ in lab}
    assert labels == {"route", "node", "tier", "method", "tenant", "outcome"}


def test_a_gateway_registers_the_collector_in_its_own_registry() -> None:
    stats = EnergyStats()
    stats.record(Energy(2.0, "measured", node="n", tier="t", route="/r"), outcome="ok", status=200)
    registry = CollectorRegistry()
    registry.register(EnergyCollector(stats, ledgers=None))
    text = generate_latest(registry).decode()
    assert samples(text)[("giul_energy_joules_total",
                          (("method", "measured"), ("node", "n"), ("route", "/r"), ("tenant", "<none>"),
                           ("tier", "t")))] == 2.0
    assert isinstance(httpx, object)


def test_a_failing_ledger_does_not_break_a_scrape() -> None:
    class Broken:
        def totals(self) -> None:
            raise RuntimeError("reader gone")

    registry = CollectorRegistry()
    registry.register(EnergyCollector(EnergyStats(), ledgers=[Broken(), FakeLedger("ok")]))
    text = generate_latest(registry).decode()
    assert 'giul_node_idle_watts{node="ok"} 60.0' in text


def test_a_card_each_worker_has_alone_is_a_series_per_worker() -> None:
    """A hostile tester scraped four workers, each with its own in-process simulated card:
    giul_node_*_total fell 264 times in 70 scrapes, each answer another worker's books under
    one {node="sim"}. Such books carry the worker's pid; the host's card's do not."""
    import os

    from giul_asgi.config import Node
    from giul_asgi.ledger import Ledger
    from giul_asgi.readers.base import Reading

    class Card:
        backend, source, kind, method, period = "simulated", "local", "counter", "simulated", 0.1
        clock = staticmethod(lambda: 0.0)

        def read(self) -> Reading:
            return Reading(t=0.0, joules=1.0)

        def close(self) -> None:
            pass

    own = Ledger(Node("own", idle_w=60.0), Card(), poll=False)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(EnergyCollector(EnergyStats(), ledgers=[own, FakeLedger("host")]))
    samples = [s for f in text_string_to_metric_families(generate_latest(registry).decode())
               if f.name == "giul_node_measured_joules" for s in f.samples]
    assert {s.labels.get("node"): s.labels.get("process") for s in samples} == {
        "own": str(os.getpid()), "host": None}
