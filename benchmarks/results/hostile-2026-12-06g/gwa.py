# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: B007
# Hostile35 gateway for attack (a): per-request work length from the body ("work_s").
import asyncio
import json
import os
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from giul_asgi import EnergyMiddleware, Node, Route, Tier

app = FastAPI()


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    work = float(body.get("work_s", 0.3))
    n = int(body.get("max_tokens", 8))
    cid = "chatcmpl-" + uuid.uuid4().hex[:12]
    if not body.get("stream"):
        await asyncio.sleep(work)
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi " * n},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            }
        )

    async def gen():
        for i in range(n):
            await asyncio.sleep(work / n)
            yield (
                "data: "
                + json.dumps(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": "m",
                        "choices": [{"index": 0, "delta": {"content": "hi "}, "finish_reason": None}],
                    }
                )
                + "\n\n"
            )
        yield (
            "data: "
            + json.dumps(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
                }
            )
            + "\n\n"
        )
        yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


app.add_middleware(
    EnergyMiddleware,
    nodes=[Node(os.environ.get("GW_NODE", "sim"), reader="simulated", idle_w=60.0)],
    tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
    routes=[Route("/v1/chat/completions", node=os.environ.get("GW_NODE", "sim"), tier="70b")],
    energy_format=os.environ.get("GW_FORMAT", "giul"),
)
