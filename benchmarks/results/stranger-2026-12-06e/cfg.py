# A stranger's trial script (2026-12-06e), kept as it ran.
import os

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route as R

from giul_asgi import EnergyMiddleware, Node, Tier


async def chat(request):
    return JSONResponse({"usage": {"completion_tokens": 3}})


app = Starlette(routes=[R("/v1/chat/completions", chat, methods=["POST"])])
app.add_middleware(
    EnergyMiddleware,
    nodes=[Node("sim", reader="simulated", idle_w=60.0)],
    tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
    **{"tenant": "authorization", **eval(os.environ["MYCFG"])},
)
