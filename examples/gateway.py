"""A gateway in front of two (simulated) inference nodes, metered per request.

    uvicorn examples.gateway:app --port 8000
    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
         -d '{"model": "llama-70b", "messages": [{"role": "user", "content": "hi"}]}' -i

On a host with GPUs, replace the simulated nodes with ``Node("h100-a", gpus=(0, 1),
idle_w=<measured at rest>)`` and the upstream handler with a proxy to vLLM or TGI.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from giul_asgi import EnergyMiddleware, Node, Route, Tier, current_meter
from giul_asgi.demo.upstream import Upstream
from giul_asgi.readers import SimulatedCard, SimulatedReader


def simulated_node(name: str, idle_w: float) -> tuple[Node, SimulatedCard]:
    card = SimulatedCard(idle_w=idle_w, cap_w=700.0, counter_period=0.1)
    return Node(name, idle_w=idle_w, reader_factory=lambda _n: SimulatedReader(card)), card


small, small_card = simulated_node("l4-small", idle_w=20.0)
big, big_card = simulated_node("h100-big", idle_w=70.0)
upstreams = {
    "l4-small": Upstream(small_card, watts_per_request=40.0, token_seconds=0.004),
    "h100-big": Upstream(big_card, watts_per_request=180.0, token_seconds=0.01),
}

app = FastAPI(title="giul-asgi example gateway")


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    payload = await request.json()
    meter = current_meter()
    # Route by the body's model, as a real gateway does, and tell the meter where it went.
    node = "h100-big" if "70b" in str(payload.get("model", "")) else "l4-small"
    if meter is not None:
        meter.bind(node=node, tier="70b" if node == "h100-big" else "8b")
    return await upstreams[node].chat(request)


app.add_middleware(
    EnergyMiddleware,
    nodes=[small, big],
    tiers=[Tier("8b", joules_per_1k_hint=300.0), Tier("70b", joules_per_1k_hint=4100.0)],
    routes=[Route("/v1/*", node="l4-small", tier="8b")],
)
