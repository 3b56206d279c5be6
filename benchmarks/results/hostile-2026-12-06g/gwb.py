# A hostile trial's script (2026-12-06g), kept as it ran.
# Hostile35 (b) under a server: the config named by H35_CASE, built at import as an app would.
import os

from fastapi import FastAPI

from giul_asgi import Budget, EnergyMiddleware, Node, Route, Tier
from giul_asgi.config import load_config

SECRET_SHORT = "sk-abcdEFGH1234secretXYZ"
SECRET_OPENAI = "sk-proj-" + "Ab3_" * 39
app = FastAPI()


@app.post("/v1/chat/completions")
async def chat():
    return {
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 1},
    }


case = os.environ["H35_CASE"]
kw = dict(tenant="authorization")
budgets = []
if case == "long_key":
    budgets = [Budget(joules=300, key=SECRET_OPENAI, hard=True)]
elif case == "short_key":
    budgets = [Budget(joules=300, key=SECRET_SHORT, hard=True)]
elif case == "newline_key":
    budgets = [Budget(joules=300, key=SECRET_SHORT + "\n", hard=True)]
elif case == "no_tenant_key":
    budgets = [Budget(joules=300, key=SECRET_SHORT, hard=True)]
    kw = {}
elif case == "both_tenants":
    kw = dict(tenant="authorization", tenant_header="x-api-key")
elif case == "toml_bad":
    budgets = list(load_config(os.environ["H35_TOML"]).budgets)
elif case == "hard_unshared":
    budgets = [Budget(joules=300, hard=True, name="hard"), Budget(joules=300, name="soft")]
elif case == "none_key":
    budgets = [Budget(joules=float(os.environ.get("H35_J", "300")), key="<none>", hard=True)]
app.add_middleware(
    EnergyMiddleware,
    nodes=[Node("h35b", reader="simulated", idle_w=60.0)],
    tiers=[Tier("70b", joules_per_1k_hint=4100.0)],
    routes=[Route("/v1/chat/completions", node="h35b", tier="70b")],
    budgets=budgets,
    **kw,
)
