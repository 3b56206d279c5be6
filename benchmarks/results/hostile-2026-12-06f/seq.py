# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: seq.py PORT SECONDS CONC -- CONC concurrent loops of one tenant for SECONDS; timeline of statuses per second."""

import asyncio
import collections
import sys
import time

import httpx

port, secs, conc = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
tenant = sys.argv[4] if len(sys.argv) > 4 else "S"


async def main():
    tl = collections.defaultdict(collections.Counter)
    lat = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        t0 = time.time()

        async def loop():
            while time.time() - t0 < secs:
                s = time.time()
                r = await c.post("/v1/chat/completions", headers={"x-tenant": tenant}, json={})
                lat.append(time.time() - s)
                k = "200" if r.status_code == 200 else r.json()["error"]["code"][14:]
                if r.status_code == 200:
                    k += (
                        ":"
                        + r.headers.get("x-energy-method", "?")
                        + ":"
                        + r.headers.get("x-energy-joules", "?")[:5]
                    )
                tl[int(time.time() - t0)][k if r.status_code != 200 else "200"] += 1
                if r.status_code == 200 and len(lat) < 4:
                    print(
                        "sample 200 headers:",
                        {h: v for h, v in r.headers.items() if h.startswith("x-energy")},
                    )
                await asyncio.sleep(0.1)

        await asyncio.gather(*(loop() for _ in range(conc)))
        for s in sorted(tl):
            print(s, dict(tl[s]))
        print(f"max latency {max(lat):.2f}s")
        b = (await c.get("/energy", params={"window": "all"})).json()["budgets"]
        print("budget shared:", b.get("shared"), b.get("reason"), "keys", b["items"][0]["keys"])


asyncio.run(main())
