# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: many.py PORT NTENANTS CONC PREFIX -- each distinct tenant sends 2 requests at once; reports codes, rate."""

import asyncio
import collections
import sys
import time

import httpx

port, n, conc, prefix = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


async def main():
    codes = collections.Counter()
    q = asyncio.Queue()
    for k in range(n):
        q.put_nowait(k)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=60, limits=httpx.Limits(max_connections=conc)
    ) as c:

        async def w():
            while not q.empty():
                k = q.get_nowait()
                ten = f"{prefix}-{k}-" + "x" * (k % 7) * 50
                rs = await asyncio.gather(
                    *(
                        c.post("/v1/chat/completions", headers={"x-tenant": ten}, json={"delay": 0})
                        for _ in range(2)
                    )
                )
                for r in rs:
                    codes[r.status_code if r.status_code == 200 else r.json()["error"]["code"]] += 1

        t0 = time.time()
        await asyncio.gather(*(w() for _ in range(conc // 2)))
        print(f"{n} tenants in {time.time() - t0:.1f}s codes {dict(codes)}")


asyncio.run(main())
