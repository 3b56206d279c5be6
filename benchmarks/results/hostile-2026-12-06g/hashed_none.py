# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: E501
# Hostile35: the remedy's key=hashed(<the API key>) with an unset key gives key=None: a budget on every tenant.
import os

from giul_asgi import Budget
from giul_asgi.tenants import hashed

for raw in ("", "Bearer", "Bearer   ", os.environ.get("TEAM_A_KEY", "")):
    b = Budget(joules=300, key=hashed(raw), hard=True)
    print(repr(raw), "-> key", b.key, "name", b.name)
