# A stranger's trial script (2026-12-06e), kept as it ran.
# ruff: noqa: SIM115
import asyncio
import collections
import json
import sys
import time

import httpx

URL = sys.argv[1]
tenants = sys.argv[2].split(",")
conc = int(sys.argv[3])
dur = float(sys.argv[4])
stream = len(sys.argv) > 5 and sys.argv[5] == "stream"
res = collections.defaultdict(lambda: collections.Counter())
joules = collections.defaultdict(float)
ids = collections.defaultdict(list)
samples = {}


async def client(c, t):
    end = time.time() + dur
    while time.time() < end:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": stream,
        }
        r = await c.post(URL + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {t}"})
        if r.status_code == 200:
            res[t]["200"] += 1
            j = r.headers.get("x-energy-joules")
            if j and j != "unknown":
                joules[t] += float(j)
            else:
                res[t]["unknown_j"] += 1
            ids[t].append(r.headers.get("x-energy-id"))
        else:
            try:
                code = r.json()["error"]["code"]
            except Exception:
                code = r.text[:80]
            res[t][f"{r.status_code}:{code}"] += 1
            samples.setdefault(f"{r.status_code}:{code}", (dict(r.headers), r.text))
            if r.status_code == 429:
                await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 1.0))
            elif r.status_code >= 500:
                await asyncio.sleep(0.2)


async def main():
    async with httpx.AsyncClient(timeout=30) as c:
        await asyncio.gather(*(client(c, t) for t in tenants for _ in range(conc)))
    for t in tenants:
        print(t, dict(res[t]), "first-figure J admitted:", round(joules[t], 1))
    for k, (h, b) in samples.items():
        print(
            "SAMPLE",
            k,
            {x: h[x] for x in h if x.startswith(("retry", "x-energy-budget", "x-should"))},
            b[:400],
        )
    json.dump(ids, open("/tmp/s35-ids.json", "w"))


asyncio.run(main())
