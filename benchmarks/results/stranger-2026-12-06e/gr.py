# A stranger's trial script (2026-12-06e), kept as it ran.
import asyncio

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route as R

from giul_asgi import Budget, EnergyMiddleware, Node, Tier


async def chat(request):
    await asyncio.sleep(0.2)
    return JSONResponse({"usage": {"completion_tokens": 3}})


app = Starlette(routes=[R("/v1/chat/completions", chat, methods=["POST"])])
app.add_middleware(
    EnergyMiddleware,
    nodes=[Node("simg", reader="simulated", idle_w=60.0, carbon_g_per_kwh=400.0, pue=1.2)],
    tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
    tenant="authorization",
    metrics_path="/metrics",
    budgets=[
        Budget(grams=0.02, hard=True, period="hour", name="co2"),
        Budget(joules=150, period="hour", name="j"),
    ],
)
