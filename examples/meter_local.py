"""Metering local work with the Meter directly: async, with stages, and the sync form.

    python examples/meter_local.py
"""

from __future__ import annotations

import asyncio
import time

from giul_asgi import Meter, Node, Tier
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader

card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
node = Node("sim", idle_w=70.0, reader_factory=lambda _n: SimulatedReader(card))


async def answer() -> None:
    async with Meter.for_node(node, Tier("8b", 300.0)) as m:
        job = card.start_job(60.0)  # "retrieval": a light load
        await asyncio.sleep(0.3)
        card.stop_job(job)
        m.mark("retrieve")
        job = card.start_job(250.0)  # "generation": the card works hard
        await asyncio.sleep(0.6)
        card.stop_job(job)
        m.mark("generate")
    energy = await m.settled(timeout=1.0)
    print("async:", energy.joules, energy.method, {k: v.joules for k, v in energy.stages.items()})


def batch() -> None:
    # No event loop: the sync form reads the card itself; sync= runs before the closing read
    # (pass torch.cuda.synchronize when the work is on a local GPU).
    with Meter.for_node(node, sync=lambda: None).sync() as m:
        job = card.start_job(200.0)
        time.sleep(0.5)
        card.stop_job(job)
    energy = m.result(tokens=128)
    print("sync:", energy.joules, energy.method, energy.joules_per_token)


if __name__ == "__main__":
    asyncio.run(answer())
    batch()
