"""The simulated card: the truth the benchmarks and tests grade against."""

from __future__ import annotations

import pytest

from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader, VirtualClock


def test_counter_steps_and_gauges() -> None:
    clock = VirtualClock(0.0)
    card = SimulatedCard(idle_w=50.0, cap_w=500.0, counter_period=0.1, clock=clock)
    job = card.start_job(150.0)
    clock.advance(0.25)
    assert card.instant_w() == pytest.approx(200.0)
    assert card.energy_j() == pytest.approx(200.0 * 0.2)  # the last step, at 0.2 s
    assert card.true_energy_j() == pytest.approx(200.0 * 0.25)
    card.stop_job(job)
    clock.advance(1.0)
    assert card.instant_w() == pytest.approx(50.0)
    assert card.average_w() == pytest.approx(50.0)  # the 1 s average has caught up
    assert job.true_joules == pytest.approx(150.0 * 0.25)


def test_average_gauge_lags_a_step_change() -> None:
    clock = VirtualClock(0.0)
    card = SimulatedCard(idle_w=50.0, cap_w=500.0, clock=clock)
    clock.advance(2.0)
    card.start_job(100.0)
    clock.advance(0.5)
    assert card.instant_w() == pytest.approx(150.0)
    assert card.average_w() == pytest.approx(100.0)  # half a second of 150 W, half of 50 W


def test_cap_scales_every_job_alike_and_truth_adds_up() -> None:
    clock = VirtualClock(0.0)
    card = SimulatedCard(idle_w=100.0, cap_w=400.0, clock=clock)
    a, b = card.start_job(400.0), card.start_job(200.0)  # 600 W asked, 300 W available
    clock.advance(1.0)
    card.stop_job(a)
    card.stop_job(b)
    assert a.true_joules == pytest.approx(200.0) and b.true_joules == pytest.approx(100.0)
    assert card.true_energy_j() - 100.0 == pytest.approx(a.true_joules + b.true_joules)


def test_reset_and_readers_are_labelled_simulated() -> None:
    clock = VirtualClock(0.0)
    card = SimulatedCard(clock=clock)
    clock.advance(1.0)
    assert card.energy_j() > 0
    card.reset_counter()
    assert card.energy_j() == 0.0
    for gauge in ("counter", "instant", "average"):
        reader = SimulatedReader(card, gauge=gauge)  # type: ignore[arg-type]
        assert reader.method == "simulated" and reader.backend == "simulated"
        assert reader.read().ok
    with pytest.raises(ValueError):
        SimulatedCard(idle_w=100.0, cap_w=50.0)
    with pytest.raises(ValueError):
        clock.advance(-1.0)
