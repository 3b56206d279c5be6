"""A gateway app as a new user writes it, over the card in ``$WORKERS_CARD`` (for test_workers_server).

The only line about energy is ``EnergyMiddleware(app, nodes=[...])``. Each request loads the
shared file-backed card (:class:`workers_card.FileCard`) with ``watts`` for ``seconds``, as
an inference server's work would, and answers JSON. The node's reader reads that card; the
test's plumbing (where the card file is, the node's name so concurrent runs never share a
card) comes through the environment, not through any giul setting.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from urllib.parse import parse_qs

from workers_card import FileCard, FileCardReader

from giul_asgi import EnergyMiddleware, Node

CARD = os.environ["WORKERS_CARD"]
card = FileCard(CARD)


async def work(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    query = parse_qs(scope["query_string"].decode())
    watts, seconds = float(query["watts"][0]), float(query["seconds"][0])
    job = card.start_job(watts)
    try:
        await asyncio.sleep(seconds)
    finally:
        card.stop_job(job)
    body = json.dumps({"pid": os.getpid()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


node = Node(os.environ["WORKERS_NODE"], idle_w=70.0, reader_factory=lambda _: FileCardReader(CARD))
# A Prometheus endpoint where the test asks for one (a setting users make, not a giul plumbing one).
metrics = "/metrics" if os.environ.get("WORKERS_METRICS") else None
app = EnergyMiddleware(work, nodes=[node], metrics_path=metrics)
