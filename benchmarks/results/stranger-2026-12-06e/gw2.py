# A stranger's trial script (2026-12-06e), kept as it ran.
# ruff: noqa: B007
import asyncio
import json
import os
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from giul_asgi import Budget, EnergyMiddleware, Node, Route, Tier

WORK_S = float(os.environ.get("MYGW_WORK_S", "0.1"))
app = FastAPI()


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    model = body.get("model", "m")
    n = int(body.get("max_tokens", 8))
    cid = "chatcmpl-" + uuid.uuid4().hex[:12]
    created = int(time.time())
    if not body.get("stream"):
        await asyncio.sleep(WORK_S)
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hello " * n},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            }
        )
    include_usage = (body.get("stream_options") or {}).get("include_usage")

    async def gen():
        for i in range(n):
            await asyncio.sleep(WORK_S / n)
            ch = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": {"content": "hello "}, "finish_reason": None}],
            }
            yield f"data: {json.dumps(ch)}\n\n"
        ch = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        yield f"data: {json.dumps(ch)}\n\n"
        if include_usage:
            ch = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            }
            yield f"data: {json.dumps(ch)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


@app.get("/healthz")
async def health():
    return {"ok": True}


_p = os.environ.get("MYGW_PERIOD", "hour")
PERIOD = float(_p) if _p.replace(".", "").isdigit() else _p
budgets = [
    Budget(
        joules=float(os.environ.get("MYGW_HARD_J", "300")),
        per="tenant",
        period=PERIOD,
        hard=True,
        name="hard",
    ),
    Budget(joules=float(os.environ.get("MYGW_SOFT_J", "150")), per="tenant", period=PERIOD, name="soft"),
]
app.add_middleware(
    EnergyMiddleware,
    nodes=[Node(os.environ.get("MYNODE", "sim"), reader="simulated", idle_w=60.0)],
    tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
    routes=[Route("/v1/chat/completions", node=os.environ.get("MYNODE", "sim"), tier="70b")],
    tenant="authorization",
    budgets=budgets,
    metrics_path="/metrics",
    energy_format=os.environ.get("MYGW_FORMAT", "giul"),
)
