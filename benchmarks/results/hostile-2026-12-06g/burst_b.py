# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: E731, UP031
# Hostile35: N short concurrent requests; the simulated card cannot draw more than 700 W.
import asyncio
import json
import sys

import httpx

BASE, N, WORK = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
FMT = sys.argv[4] if len(sys.argv) > 4 else "giul"


async def one(c):
    r = await c.post(
        BASE + "/v1/chat/completions",
        headers={"Prefer": "energy=" + FMT},
        json={"model": "m", "messages": [], "max_tokens": 4, "work_s": WORK},
    )
    return r.headers.get("x-energy-id"), r.json().get("energy")


async def main():
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        res = await asyncio.gather(*(one(c) for _ in range(N)))
        await asyncio.sleep(3)
        for i, e in res:
            s = (await c.get(BASE + "/energy/requests/" + i)).json()["record"]
            if FMT == "giul":
                r = lambda x, d=1: None if x is None else round(x, d)
                print(
                    i,
                    "first W",
                    r(e["mean_watts"], 0),
                    "conc",
                    r(e["concurrency"], 2),
                    "joules",
                    r(e["joules"]),
                    "alloc",
                    r(e["allocated_joules"]),
                    "err",
                    e["error"],
                    "| settled W",
                    r(s["mean_watts"], 0),
                    "conc",
                    r(s["concurrency"], 2),
                    "joules",
                    r(s["joules"]),
                    "alloc",
                    r(s["allocated_joules"]),
                    "settled",
                    s["settled"],
                )
            else:
                print(
                    i,
                    "first",
                    json.dumps(e),
                    "| settled W %s alloc %.1f"
                    % (s["mean_watts"] and round(s["mean_watts"]), s["allocated_joules"]),
                )


asyncio.run(main())
