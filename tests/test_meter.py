"""The async Meter on a live ledger task: asyncio, trio, several loops, sync form, hangs."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest
import trio
from apps import WedgedReader

from giul_asgi import Energy, Ledgers, Meter, Node, Tier, current_meter
from giul_asgi.readers import SimulatedCard, SimulatedReader


def sim_node(name: str, card: SimulatedCard, period: float = 0.02) -> Node:
    return Node(
        name, idle_w=card.idle_w, period_s=period,
        reader_factory=lambda _n: SimulatedReader(card, period=period),
    )


def real_time_card() -> SimulatedCard:
    return SimulatedCard(idle_w=60.0, cap_w=700.0, counter_period=0.02)


async def metered_request(node: Node, ledgers: Ledgers, card: SimulatedCard, load: float) -> Meter:
    async with Meter.for_node(node, Tier("8b", 300.0), ledgers=ledgers) as m:
        job = card.start_job(load)
        await anyio.sleep(0.1)
        m.mark("generate")
        card.stop_job(job)
    m.truth = job.true_joules  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_meter_under_both_event_loops(backend: str) -> None:
    card = real_time_card()
    node = sim_node("live", card)
    ledgers = Ledgers()

    async def main() -> tuple[Energy, float]:
        m = await metered_request(node, ledgers, card, 200.0)
        settled = await m.settled(timeout=1.0)
        await ledgers.aclose()
        return settled, m.truth  # type: ignore[attr-defined]

    energy, truth = anyio.run(main, backend=backend)
    assert energy.settled and energy.joules is not None
    assert energy.stages["generate"].joules is not None
    # 200 W for ~0.1 s on a real clock: within what the readings at its edges leave open.
    assert abs(energy.joules - truth) <= (energy.uncertainty_joules or 0) + 0.1 * truth


def test_same_node_from_several_event_loops_in_turn() -> None:
    card = real_time_card()
    node = sim_node("loops", card)
    ledgers = Ledgers()
    tasks = []
    for _ in range(3):
        async def main() -> float | None:
            m = await metered_request(node, ledgers, card, 100.0)
            tasks.append(ledgers.get(node)._task)
            return (await m.settled(timeout=1.0)).joules

        assert asyncio.run(main()) is not None
    assert len({id(t) for t in tasks}) == 3  # one fresh task per loop...
    assert all(t is not None and t.done() for t in tasks)  # ...and none left running


def test_a_loop_left_without_cancelling_its_tasks_does_not_keep_the_reader() -> None:
    """A loop closed by hand (its reader task never cancelled) must not leave the ledger
    thinking its reader runs: the next loop in the same thread starts its own."""
    card = real_time_card()
    node = sim_node("abandoned", card)
    ledgers = Ledgers()
    ledger = ledgers.get(node)

    first = asyncio.new_event_loop()
    first.run_until_complete(metered_request(node, ledgers, card, 100.0))
    first_task = ledger._task
    assert first_task is not None and not first_task.done()  # left pending, as by hand

    async def main() -> Energy:
        m = await metered_request(node, ledgers, card, 100.0)
        return await m.settled(timeout=1.0)

    energy = asyncio.run(main())
    assert ledger._task is not first_task
    assert energy.settled and energy.joules is not None
    first.close()


def test_trio_after_asyncio_on_the_same_ledger() -> None:
    card = real_time_card()
    node = sim_node("mixed", card)
    ledgers = Ledgers()

    async def main() -> bool:
        m = await metered_request(node, ledgers, card, 100.0)
        return (await m.settled(timeout=1.0)).settled

    assert asyncio.run(main())
    assert trio.run(main)


def test_concurrent_requests_share_one_reader() -> None:
    card = real_time_card()
    node = sim_node("shared", card)
    ledgers = Ledgers()

    async def main() -> list[Meter]:
        meters = await asyncio.gather(*(metered_request(node, ledgers, card, 20.0) for _ in range(32)))
        await asyncio.gather(*(m.settled(timeout=1.0) for m in meters))
        return list(meters)

    reader = ledgers.get(node).reader
    meters = asyncio.run(main())
    total = sum(m.result().joules or 0 for m in meters)
    truth = sum(m.truth for m in meters)  # type: ignore[attr-defined]
    slack = sum(m.result().uncertainty_joules or 0 for m in meters)
    assert abs(total - truth) <= slack + 0.1 * truth  # shared, not 32 x the card
    assert all(m.result().concurrency and m.result().concurrency > 16 for m in meters)
    # One reader at its own period, however many requests: ~0.15 s of reads at 0.01 s.
    assert reader.reads < 60  # type: ignore[attr-defined]


def test_sync_form_runs_sync_before_the_closing_read() -> None:
    card = real_time_card()
    node = sim_node("sync", card)
    order: list[str] = []
    with Meter.for_node(node, ledgers=Ledgers(), sync=lambda: order.append("sync")).sync() as m:
        job = card.start_job(300.0)
        time.sleep(0.1)
        card.stop_job(job)
        order.append("work")
    e = m.result(tokens=10)
    assert order == ["work", "sync"]
    assert e.settled and e.joules is not None and e.tokens == 10
    assert abs(e.joules - job.true_joules) <= (e.uncertainty_joules or 0) + 0.1 * job.true_joules


def test_a_failing_sync_callable_does_not_break_the_work() -> None:
    def boom() -> None:
        raise RuntimeError("cuda gone")

    with Meter.for_node(Node("x", reader="none"), ledgers=Ledgers(), sync=boom).sync() as m:
        pass
    assert m.result().method == "unknown"


def test_no_node_means_estimates_only() -> None:
    async def main() -> Meter:
        async with Meter.for_node(None, Tier("70b", 4100.0)) as m:
            m.mark("retrieve")
        return m

    m = asyncio.run(main())
    e = m.result(tokens=100)
    assert e.method == "estimated" and e.joules == pytest.approx(410.0) and e.backend == "none"
    assert m.result(tokens=0).method == "unknown"


def test_result_before_close_is_a_clear_error() -> None:
    m = Meter.for_node(None)
    with pytest.raises(RuntimeError, match="before the window closed"):
        m.result()
    with pytest.raises(RuntimeError, match="before the window opened"):
        m.mark("x")


def test_bind_moves_the_request_to_another_node() -> None:
    card_a, card_b = real_time_card(), real_time_card()
    a, b = sim_node("a", card_a), sim_node("b", card_b)
    ledgers = Ledgers()

    async def main() -> Meter:
        async with Meter.for_node(a, ledgers=ledgers) as m:
            await anyio.sleep(0.03)
            m.bind(node=b, tier=Tier("70b", 4100.0))
            job = card_b.start_job(100.0)
            await anyio.sleep(0.1)
            card_b.stop_job(job)
        await m.settled(timeout=1.0)
        await ledgers.aclose()
        return m

    m = asyncio.run(main())
    e = m.result()
    assert e.node == "b" and e.tier == "70b" and e.joules is not None
    assert ledgers.get(a).totals().charged_j == 0.0


def test_current_meter_is_none_outside_a_request() -> None:
    assert current_meter() is None


def test_a_hanging_reader_never_delays_the_request() -> None:
    release = threading.Event()
    node = Node("hang", idle_w=0.0, reader_factory=lambda _n: WedgedReader(release))  # type: ignore[arg-type,return-value]
    ledgers = Ledgers()
    ledgers.get(node).read_timeout = 0.05

    async def main() -> tuple[float, Meter]:
        started = time.perf_counter()
        async with Meter.for_node(node, ledgers=ledgers) as m:
            await anyio.sleep(0.3)
        figure = m.result()
        elapsed = time.perf_counter() - started
        assert figure.settled is False
        release.set()
        await ledgers.aclose()
        return elapsed, m

    elapsed, _m = asyncio.run(main())
    assert elapsed < 0.45
    assert ledgers.get(node).totals().read_errors >= 1
    assert ledgers.get(node).read_seconds_max >= 0.05
