"""The Meter: a window on a ledger that grades the ledger's raw share into a record."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
from truecard import TrueCard, TrueReader

from giul_asgi import ConfigError, Ledgers, Meter, Node, Tier, current_meter
from giul_asgi.ledger import Ledger

IDLE = 70.0


def busy_ledger(ledgers: Ledgers | None = None, name: str = "sim") -> tuple[Ledger, TrueCard]:
    card = TrueCard(idle_w=IDLE, period=0.02)
    node = Node(name, idle_w=IDLE, reader_factory=lambda _n: TrueReader(card))
    ledger = (ledgers or Ledgers()).get(node)
    ledger.ensure_started()
    time.sleep(0.1)
    return ledger, card


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_meter_under_both_event_loops(backend: str) -> None:
    ledger, card = busy_ledger(name=f"sim-{backend}")

    async def main() -> None:
        async with Meter(ledger, Tier("8b")) as m:
            job = card.start_job(150.0)
            await anyio.sleep(0.1)
            m.mark("prefill")
            await anyio.sleep(0.2)
            card.stop_job(job)
        e = await m.settled(timeout=2.0)
        assert e.settled and e.method == "measured" and e.tier == "8b"
        assert set(e.stages) == {"prefill"} and e.stages["prefill"].joules
        assert e.joules is not None and e.stages["prefill"].joules < e.joules

    anyio.run(main, backend=backend)
    ledger.stop()


def test_on_settled_is_called_once_with_the_settled_figure() -> None:
    ledger, card = busy_ledger()
    meter = Meter(ledger)
    seen: list[tuple[str, float | None, bool]] = []
    meter.on_settled(lambda e: seen.append((threading.current_thread().name, e.joules, e.settled)))
    meter.open()
    job = card.start_job(100.0)
    time.sleep(0.1)
    card.stop_job(job)
    meter.close()
    deadline = time.monotonic() + 2.0
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    late: list[float | None] = []
    meter.on_settled(lambda e: late.append(e.joules))  # after settling: called at once
    ledger.stop()
    assert len(seen) == 1 and seen[0][2] and seen[0][1] is not None
    assert late == [seen[0][1]]


def test_no_node_means_estimates_only() -> None:
    meter = Meter.for_node(None, Tier("70b", joules_per_1k_hint=4000.0), ledgers=Ledgers())
    meter.open()
    meter.close()
    e = meter.figure(tokens=100)
    assert e.method == "estimated" and e.joules == 400.0 and e.backend == "none"
    assert meter.node is None


def test_figure_before_close_is_a_clear_error() -> None:
    meter = Meter.for_node(None, ledgers=Ledgers())
    meter.open()
    with pytest.raises(RuntimeError, match="before the window closed"):
        meter.figure()
    with pytest.raises(RuntimeError, match="one window"):
        meter.open()


def test_bind_moves_the_request_to_another_node_and_names_what_is_known() -> None:
    ledgers = Ledgers()
    a, b = Node("a", reader="none"), Node("b", reader="none")
    meter = Meter(ledgers.get(a), ledgers=ledgers, catalog={"node:a": a, "node:b": b, "tier:t": Tier("t")})
    meter.open()
    meter.bind(node="b", tier="t")
    assert meter.node == "b" and meter.tier == Tier("t")
    with pytest.raises(ConfigError, match="known: \\['a', 'b'\\]"):
        meter.bind(node="c")
    meter.close()
    assert ledgers.get(a).totals().windows_open == 0


def test_current_meter_is_none_outside_a_request() -> None:
    assert current_meter() is None


def test_tokens_must_be_an_int() -> None:
    meter = Meter.for_node(None, ledgers=Ledgers())
    with pytest.raises(TypeError):
        meter.tokens(1.5)  # type: ignore[arg-type]


def test_the_sync_form_reads_the_card_itself() -> None:
    card = TrueCard(idle_w=IDLE, period=0.02)
    ledger = Ledger(Node("sync", idle_w=IDLE), TrueReader(card), poll=False)
    calls: list[str] = []
    meter = Meter(ledger, sync=lambda: calls.append("sync"))
    time.sleep(0.05)
    ledger.read_now()
    time.sleep(0.05)
    with meter.sync():
        job = card.start_job(120.0)
        for _ in range(20):
            time.sleep(0.01)
            ledger.read_now()
        card.stop_job(job)
    e = meter.figure(tokens=10)
    assert calls == ["sync"] and e.settled and e.joules and e.joules_per_token


def test_a_failing_sync_callable_does_not_break_the_work() -> None:
    def boom() -> None:
        raise RuntimeError("cuda sync failed")

    meter = Meter.for_node(None, sync=boom, ledgers=Ledgers())
    with meter.sync():
        pass
    assert meter.figure().method == "unknown"
