"""MIG in the records (issue 17 item 6): a node on MIG slices names them in every record,
in its /energy ledger block and in Prometheus, with the board-level caveat, not only in
``probe``; the figure is never divided by slices. Read through a fake NVML (tests/fake_nvml.py)
whose board is in MIG mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_nvml import FakeNvml, LiveGpu

from giul_asgi import EnergyMiddleware, Ledgers, Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.mig import mig_of
from giul_asgi.readers.nvml import NvmlReader
from giul_asgi.replay import load, replay

IDLE = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def figure_on(gpu: LiveGpu, clock: Clock, node: Node) -> tuple[Ledger, Any]:
    reader = NvmlReader(node.gpus, nvml=FakeNvml([gpu]), clock=clock, options=dict(node.options))
    ledger = Ledger(node, reader, poll=False)
    for _ in range(10):
        clock.now += 0.02
        ledger.ingest(reader.read())
    meter = Meter(ledger)
    meter.open()
    gpu.watts = 260.0
    for _ in range(25):
        clock.now += 0.02
        ledger.ingest(reader.read())
    gpu.watts = IDLE
    meter.close()
    for _ in range(25):
        clock.now += 0.02
        ledger.ingest(reader.read())
    return ledger, meter.figure()


def test_a_record_on_named_mig_slices_names_them_with_the_board_level_caveat(tmp_path: Path) -> None:
    clock = Clock()
    gpu = LiveGpu(mig=True, watts=IDLE, clock=clock)
    node = Node("mig-a", idle_w=IDLE, options={"mig_slices": [1, 2]}, trace=str(tmp_path))
    ledger, energy = figure_on(gpu, clock, node)
    assert energy.settled and energy.joules is not None and energy.method == "measured"
    assert energy.mig is not None
    assert "MIG slices [1, 2]" in energy.mig and "cannot be metered alone" in energy.mig
    assert energy.as_dict()["mig"] == energy.mig
    # Not divided: the board's above-idle energy over the window, all of it this window's.
    totals = ledger.totals()
    assert energy.joules == pytest.approx(totals.charged_j, rel=1e-9)
    # A replay of the node's trace says the same.
    ledger.stop()
    (row,) = replay(load(tmp_path)).rows
    assert row["mig"] == energy.mig and row["joules"] == energy.joules


def test_a_mig_board_whose_slices_are_not_named_says_so() -> None:
    clock = Clock()
    _, energy = figure_on(LiveGpu(mig=True, watts=IDLE, clock=clock), clock, Node("mig-b", idle_w=IDLE))
    assert energy.mig is not None and "slices not named" in energy.mig and "mig_slices" in energy.mig


def test_a_board_not_on_mig_says_nothing() -> None:
    clock = Clock()
    _, energy = figure_on(LiveGpu(watts=IDLE, clock=clock), clock, Node("whole", idle_w=IDLE))
    assert energy.mig is None and energy.as_dict()["mig"] is None


def test_readers_that_cannot_tell_are_not_on_mig() -> None:
    class Plain:
        pass

    class Told:
        mig = None
        mig_slices = (3,)

    assert mig_of(Plain()) is None
    told = mig_of(Told())
    assert told is not None and told.slices == (3,) and told.label == "3"


@pytest.mark.anyio
async def test_energy_and_prometheus_name_the_slices() -> None:
    gpus = {"mig-a": LiveGpu(mig=True, watts=IDLE), "plain": LiveGpu(watts=IDLE)}

    def nvml_reader(node: Node) -> NvmlReader:
        return NvmlReader(node.gpus, nvml=FakeNvml([gpus[node.name]]), options=dict(node.options))

    nodes = [Node("mig-a", idle_w=IDLE, options={"mig_slices": [1, 2]}, reader_factory=nvml_reader),
             Node("plain", idle_w=IDLE, reader_factory=nvml_reader)]

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    middleware = EnergyMiddleware(app, nodes, ledgers=Ledgers(), metrics_path="/metrics")
    await middleware.start(timeout=20.0)  # returns once both readers are built
    transport = httpx.ASGITransport(app=middleware)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            block = (await client.post("/v1/chat/completions")).json()["energy"]
            assert block["node"] == "mig-a" and "MIG slices [1, 2]" in block["mig"]
            data = (await client.get("/energy?window=all")).json()
            mig = data["nodes"]["mig-a"]["ledger"]["mig"]
            assert mig["slices"] == [1, 2] and "cannot be metered alone" in mig["caveat"]
            assert data["nodes"]["plain"]["ledger"]["mig"] is None
            metrics = (await client.get("/metrics")).text
    finally:
        await middleware.aclose()
    assert 'giul_node_mig_info{node="mig-a",slices="1,2"} 1.0' in metrics
    assert 'giul_node_mig_info{node="plain"' not in metrics
    assert "cannot be metered alone" in metrics  # the caveat is in the family's help
