"""A figure from the first request: a fresh ledger, no warm-up, on the real clock.

Issue 16: a 0.5 s ``async with Meter.for_node(node)`` used alone got no figure ("opened
before the node's reader gave its first reading"), and examples/meter_local.py printed
``None unknown`` on its first run. The window's time before the counter's first step is
now filled from the same prior as any other unreported part, inside its uncertainty.
"""

from __future__ import annotations

import asyncio
import runpy
from pathlib import Path

import pytest
from truecard import TrueCard, TrueReader

from giul_asgi import Meter, Node
from giul_asgi.ledger import Ledgers

ROOT = Path(__file__).resolve().parent.parent
IDLE = 70.0


@pytest.mark.anyio
async def test_meter_for_node_used_alone_gives_a_figure_on_its_first_call() -> None:
    # Calibration (the truth inside +-uncertainty for 9 in 10) is counted over many cold
    # windows on a virtual clock in test_ledger.py; here, on the real clock, each figure
    # exists, is labelled, and is near the truth.
    for seed in range(3):
        card = TrueCard(idle_w=IDLE, seed=seed)
        node = Node(f"cold-{seed}", idle_w=IDLE, reader_factory=lambda _n, c=card: TrueReader(c))
        ledgers = Ledgers()  # a fresh process's: nothing started, nothing learnt
        try:
            async with Meter.for_node(node, ledgers=ledgers) as meter:
                job = card.start_job(180.0)
                await asyncio.sleep(0.5)
                card.stop_job(job)
            first = meter.figure()
            settled = await meter.settled(timeout=5.0)
        finally:
            await ledgers.aclose(1.0)
        truth = job.truth(card.ramp_up, card.tau)
        assert settled.settled, settled.error
        for e in (first, settled):
            assert e.joules is not None and e.method in ("measured", "estimated"), e.error
            assert abs(e.joules - truth) <= max(e.uncertainty_joules or 0.0, 0.1 * truth), (
                "first" if e is first else "settled", e.joules, e.uncertainty_joules, truth, e)


def test_meter_local_prints_numbers_on_its_first_run(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(ROOT / "examples" / "meter_local.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "None" not in out and "unknown" not in out, out
    assert out.count("simulated") == 2
