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
    EnergyMiddleware, nodes=[Node("bd", **eval(os.environ["MYNODE"]))], tiers=[Tier("70b", 4100.0)]
)
