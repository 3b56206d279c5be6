"""Statistics: each request counted once, with its settled figure, in bounded memory."""

from __future__ import annotations

import pytest
from test_ledger import tick

from giul_asgi import EnergyStats, Ledger, Meter, Tier
from giul_asgi.readers import SimulatedCard, VirtualClock

TIER = Tier("8b", 300.0)


@pytest.fixture
def busy(sim_ledger: Ledger, card: SimulatedCard, clock: VirtualClock) -> Ledger:
    """The ledger of a card busy at 150 W above idle, whose power it already knows."""
    card.start_job(150.0)
    tick(sim_ledger, clock, 0.5)
    return sim_ledger


def closed_meter(ledger: Ledger | None, clock: VirtualClock, route: str = "/v1/chat") -> Meter:
    meter = Meter(ledger, TIER, route=route)
    meter.open()
    clock.advance(0.03)
    meter.tokens(40)
    meter.close()
    return meter


def test_a_deferred_request_is_counted_once_settled_with_its_settled_figure(
    busy: Ledger, clock: VirtualClock
) -> None:
    stats = EnergyStats()
    meter = closed_meter(busy, clock)
    stats.defer("/v1/chat", 200, "ok", meter)
    assert not meter.settled_now
    assert stats.snapshot()["total"]["requests"] == 0  # not yet: its figure may still move
    assert list(stats) == []

    tick(busy, clock, 0.3)
    assert meter.settled_now
    snap = stats.snapshot()
    assert snap["total"]["requests"] == 1
    assert snap["routes"]["/v1/chat"]["joules"]["simulated"] == pytest.approx(
        meter.result().joules, rel=1e-6
    )
    assert snap["nodes"]["sim"]["tokens"] == 40 and snap["tiers"]["8b"]["requests"] == 1
    [record] = list(stats)
    assert record.outcome == "ok" and record.status == 200 and record.energy.settled
    assert stats.snapshot()["total"]["requests"] == 1  # read twice, counted once


def test_statistics_add_up_what_the_figures_say(
    busy: Ledger, clock: VirtualClock
) -> None:
    """The bucket sums come from ``Meter.tally``; the ring from ``Meter.figure``: both go
    through the same grading, so the books agree with what the clients were told."""
    stats = EnergyStats(batch=7)
    meters = []
    for i in range(40):
        meter = closed_meter(busy, clock, route=f"/r{i % 3}")
        stats.defer(meter.route or "", 200, "ok", meter)
        meters.append(meter)
        tick(busy, clock, 0.01)
    tick(busy, clock, 0.5)
    no_node = closed_meter(None, clock, route="/r0")  # no reader: a labelled estimate
    stats.defer("/r0", 200, "ok", no_node)
    meters.append(no_node)
    snap = stats.snapshot()
    assert snap["total"]["requests"] == 41
    by_method: dict[str, float] = {}
    for meter in meters:
        energy = meter.result()
        assert energy.joules is not None
        by_method[energy.method] = by_method.get(energy.method, 0.0) + energy.joules
    assert set(snap["total"]["methods"]) == set(by_method) == {"simulated", "estimated"}
    for method, joules in by_method.items():
        assert snap["total"]["joules"][method] == pytest.approx(joules, rel=1e-6)
    assert sum(r.energy.joules or 0 for r in stats) == pytest.approx(sum(by_method.values()))


def test_a_ledger_that_stops_reading_cannot_grow_the_queue_without_bound(
    busy: Ledger, clock: VirtualClock
) -> None:
    stats = EnergyStats(batch=10, max_waiting=50)
    for _ in range(200):  # no reading from here on: nothing settles
        stats.defer("/x", 200, "ok", closed_meter(busy, clock))
    assert sum(map(len, stats._waiting.values())) <= 50 + 10
    stats.fold()
    assert stats.snapshot()["total"]["requests"] >= 150
    unsettled = [r for r in stats if not r.energy.settled]
    assert unsettled  # counted as they stood, and they say so


def test_fold_everything_counts_what_is_left_at_shutdown(
    busy: Ledger, clock: VirtualClock
) -> None:
    stats = EnergyStats()
    stats.defer("/x", 200, "ok", closed_meter(busy, clock))
    stats.defer("/x", None, "disconnect", closed_meter(busy, clock))
    busy.force_settle()
    stats.fold(everything=True)
    snap = stats.snapshot()
    assert snap["total"]["requests"] == 2
    assert snap["total"]["outcomes"] == {"ok": 1, "disconnect": 1}


def test_label_sets_stay_bounded(clock: VirtualClock) -> None:
    stats = EnergyStats(max_keys=3, recent=5)
    for i in range(20):
        stats.defer(f"/r{i}", 200, "ok", closed_meter(None, clock, route=f"/r{i}"))
    snap = stats.snapshot()
    assert len(snap["routes"]) <= 4 and "<other>" in snap["routes"]
    assert snap["total"]["requests"] == 20
    assert len(list(stats)) == 5
