# ruff: noqa: E501, SIM102  (a trial's script: formatted by ruff, its long lines kept)
"""Hostile test app. Env: READER=simulated|hang|raise|slow, LIMIT (J), PERIOD (s), DELAY (s per request), STREAM_S."""

import asyncio
import os
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from giul_asgi import Budget, EnergyMiddleware, Node, Tier
from giul_asgi.readers.base import Reading

MODE = os.environ.get("READER", "simulated")
LIMIT = float(os.environ.get("LIMIT", "50"))
PERIOD = int(os.environ.get("PERIOD", "60"))
DELAY = float(os.environ.get("DELAY", "0.05"))


class BadReader:
    backend = "custom"
    source = "local"
    method = "measured"
    kind = "counter"
    period = 0.1
    clock = staticmethod(time.monotonic)

    def __init__(self, node):
        self.j = 0.0
        self.t0 = time.monotonic()

    def read(self):
        if MODE == "hang":
            threading.Event().wait()  # never returns
        if MODE == "raise":
            raise RuntimeError("reader broken")
        if MODE == "slow":  # a counter that only starts reporting after 30 s
            if time.monotonic() - self.t0 < 30:
                time.sleep(5)
                return Reading(t=time.monotonic(), error="warming")
        self.j += 30.0
        return Reading(t=time.monotonic(), joules=self.j)

    def close(self):
        pass


if MODE == "simulated":
    node = Node("gpu", reader="simulated", idle_w=60.0)
else:
    node = Node("gpu", idle_w=60.0, reader_factory=lambda n: BadReader(n))

app = FastAPI()


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json() if int(request.headers.get("content-length", "0") or 0) else {}
    stream_s = float(body.get("stream_s", 0))
    d = float(body.get("delay", DELAY))
    if stream_s:

        async def gen():
            end = time.monotonic() + stream_s
            while time.monotonic() < end:
                yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
                await asyncio.sleep(0.2)
            yield b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"completion_tokens":10}}\n\ndata: [DONE]\n\n'

        return StreamingResponse(gen(), media_type="text/event-stream")
    await asyncio.sleep(d)
    return JSONResponse(
        {"id": "x", "choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 16}}
    )


app.add_middleware(
    EnergyMiddleware,
    nodes=[node],
    tiers=[Tier("t", joules_per_1k_hint=1000.0)],
    tenant="x-tenant",
    budgets=[Budget(joules=LIMIT, per="tenant", period=PERIOD, hard=True)],
)
