"""The app of budgets-2026-12-03-usual-run6.sh: one chat route of 0.1 s under a hard budget."""

import asyncio
import os

from fastapi import FastAPI

from giul_asgi import Budget, EnergyMiddleware, Node, Route

app = FastAPI()
ANSWER = {"id": "x", "object": "chat.completion",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


@app.post("/v1/chat/completions")
async def chat() -> dict[str, object]:
    await asyncio.sleep(0.1)
    return {**ANSWER, "pid": os.getpid()}


app.add_middleware(
    EnergyMiddleware, nodes=[Node("sim", reader="simulated", idle_w=140.0)],
    routes=[Route("/v1/chat/completions", node="sim")], tenant="x-team",
    budgets=[Budget(joules=float(os.environ.get("BUD", "300")), per="tenant", period="day", hard=True)])
