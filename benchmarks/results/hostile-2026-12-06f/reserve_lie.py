# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: reserve_lie.py PORT CONC -- warm up alone (dear single requests), then one burst of CONC for tenant Z;
show 429s (Retry-After, x-should-retry, message) and what Z really spent once settled; then one more request of Z."""

import asyncio
import collections
import sys

import httpx

port, conc = int(sys.argv[1]), int(sys.argv[2])


async def main():
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=30, limits=httpx.Limits(max_connections=conc)
    ) as c:
        for _ in range(6):
            r = await c.post("/v1/chat/completions", headers={"x-tenant": "warm"}, json={"delay": 0.5})
            print("warm", r.status_code, r.headers.get("x-energy-joules"))
        await asyncio.sleep(1.5)
        out = collections.Counter()
        msg = None

        async def one():
            nonlocal msg
            r = await c.post("/v1/chat/completions", headers={"x-tenant": "Z"}, json={"delay": 0.5})
            if r.status_code == 200:
                out["200"] += 1
            else:
                out[
                    (r.json()["error"]["code"], r.headers.get("retry-after"), r.headers.get("x-should-retry"))
                ] += 1
                msg = r.json()["error"]["message"]

        await asyncio.gather(*(one() for _ in range(conc)))
        print("burst:", dict(out))
        print("message:", msg)
        await asyncio.sleep(2.5)
        b = (await c.get("/energy", params={"window": "all"})).json()["budgets"]["items"][0]
        from giul_asgi.tenants import hashed

        print("Z after settling:", b["keys"].get(hashed("Z")), "limit", b["limit"])
        r = await c.post("/v1/chat/completions", headers={"x-tenant": "Z"}, json={"delay": 0.5})
        print("next request of Z:", r.status_code, r.headers.get("x-energy-budget-remaining"))


asyncio.run(main())
