# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: SIM115
# Hostile35 driver for attack (a): concurrent requests of different lengths, streams and JSON,
# both formats; compares first figures, settled records and an independent model of the card.
import asyncio
import json
import sys
import time

import httpx

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9510"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/h35a.json"
IDLE, WW, CAP = 60.0, 200.0, 700.0


def ww(m):
    if m <= 0:
        return 0.0
    return min(WW * m if m <= 1 else WW * m**0.6, CAP - IDLE)


async def one(c, work, stream, fmt, tag):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 8,
        "work_s": work,
        "stream": stream,
    }
    h = {"Prefer": f"energy={fmt}"}
    t0 = time.monotonic()
    first = None
    if not stream:
        r = await c.post(BASE + "/v1/chat/completions", json=body, headers=h)
        t1 = time.monotonic()
        hdr = dict(r.headers)
        first = r.json().get("energy")
        status = r.status_code
    else:
        async with c.stream("POST", BASE + "/v1/chat/completions", json=body, headers=h) as r:
            hdr = dict(r.headers)
            status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith(": energy "):
                    first = json.loads(line[len(": energy ") :])
                elif line.startswith("data: {"):
                    d = json.loads(line[6:])
                    if "energy" in d:
                        first = d["energy"]
        t1 = time.monotonic()
    return dict(
        tag=tag,
        work=work,
        stream=stream,
        fmt=fmt,
        t0=t0,
        t1=t1,
        status=status,
        id=hdr.get("x-energy-id"),
        hjoules=hdr.get("x-energy-joules"),
        hsettled=hdr.get("x-energy-settled"),
        first=first,
    )


async def main():
    res = []
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=50)) as c:
        await one(c, 0.1, False, "giul", "warm")
        await asyncio.sleep(1.5)
        # S1 solo
        for i in range(3):
            res.append(await one(c, 0.5, i % 2 == 1, ["giul", "neuralwatt"][i % 2], "solo"))
            await asyncio.sleep(1.0)
        # S2 waves of 4 different lengths, mixed stream/json, mixed formats
        for w in range(4):
            jobs = [
                one(c, L, (k + w) % 2 == 0, ["giul", "neuralwatt"][(k + w // 2) % 2], f"wave{w}")
                for k, L in enumerate([0.4, 0.8, 1.2, 1.6])
            ]
            res += await asyncio.gather(*jobs)
            await asyncio.sleep(1.5)

        # S3 staggered starts
        async def late(k):
            await asyncio.sleep(0.2 * k)
            return await one(c, 1.0, k % 2 == 0, ["giul", "neuralwatt"][k % 2], "stagger")

        res += await asyncio.gather(*(late(k) for k in range(6)))
        await asyncio.sleep(1.5)
        # S4 burst of 8 short
        res += await asyncio.gather(
            *(one(c, 0.3, k % 3 == 0, ["giul", "neuralwatt"][k % 2], "burst8") for k in range(8))
        )
        await asyncio.sleep(4.0)
        for r in res:
            if r["id"]:
                for _ in range(10):
                    g = await c.get(BASE + "/energy/requests/" + r["id"])
                    rec = (
                        g.json() if g.status_code == 200 else {"status": g.status_code, "text": g.text[:200]}
                    )
                    if (rec.get("record") or {}).get("settled") or g.status_code != 200:
                        break
                    await asyncio.sleep(1.0)
                r["settled"] = rec
    json.dump(res, open(OUT, "w"), indent=1)


asyncio.run(main())
