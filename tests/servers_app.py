"""An app as a new user writes it, that also says which server it is (for test_servers).

``EnergyMiddleware(app)`` over a simulated card; ``/who`` answers the process's pid and its
server's identity (:func:`giul_asgi.hostshare.server.server_identity`), ``/work`` answers
``{"pid": ...}`` after ``seconds`` (query, default 0). Nothing about sharing is set.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from urllib.parse import parse_qs

from giul_asgi import EnergyMiddleware, Node
from giul_asgi.hostshare.server import server_identity


async def work(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/who":
        server = server_identity()
        answer: dict[str, Any] = {"pid": os.getpid(), "key": server.key, "how": server.how}
    else:
        seconds = float(parse_qs(scope["query_string"].decode()).get("seconds", ["0"])[0])
        if seconds:
            await asyncio.sleep(seconds)
        answer = {"pid": os.getpid()}
    body = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


app = EnergyMiddleware(work, nodes=[Node(os.environ.get("SERVERS_NODE", "gpu"), reader="simulated")],
                       exclude=["/who"], metrics_path="/metrics")
