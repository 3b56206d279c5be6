"""An app as a user writes it with a hard budget, over a simulated card (for test_budgets_server).

``EnergyMiddleware(app, nodes=[...], tenant=..., budgets=[Budget(...)])`` and nothing else
about energy: each request's tenant is its ``x-team`` header, and team ``team-a`` may spend
``$BUDGETS_LIMIT`` joules a day, hard. ``/work?seconds=`` answers ``{"pid": ...}`` after
that long, loading the node's simulated card while it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from urllib.parse import parse_qs

from giul_asgi import Budget, EnergyMiddleware, Node


async def work(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    seconds = float(parse_qs(scope["query_string"].decode()).get("seconds", ["0"])[0])
    await asyncio.sleep(seconds)
    body = json.dumps({"pid": os.getpid()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def team(scope: dict[str, Any]) -> str | None:
    value = dict(scope["headers"]).get(b"x-team")
    return value.decode() if value is not None else None


app = EnergyMiddleware(
    work, nodes=[Node("sim", reader="simulated", idle_w=60.0)], tenant=team,
    budgets=[Budget(joules=float(os.environ["BUDGETS_LIMIT"]), key="team-a", hard=True)],
)
