# A stranger's trial script (2026-12-06e), kept as it ran.
# ruff: noqa: E501
import asyncio
import hashlib
import time

import httpx

U = "http://127.0.0.1:9417"
K = "key:" + hashlib.sha256(b"pe").hexdigest()[:16]


async def spent(c):
    b = (await c.get(U + "/energy")).json()["budgets"]["items"][0]
    return b["period_start"], b["keys"].get(K)


async def main():
    async with httpx.AsyncClient(timeout=60) as c:
        # warm: a few requests of another key
        for _ in range(3):
            await c.post(
                U + "/v1/chat/completions", json={"max_tokens": 2}, headers={"authorization": "Bearer warm"}
            )
        await asyncio.sleep(1.5)
        now = time.time()
        wait = 20 - now % 20 - 1.5
        if wait < 0:
            wait += 20
        await asyncio.sleep(wait)
        print("t-left", 20 - time.time() % 20)

        async def longstream():
            r = await c.post(
                U + "/v1/chat/completions",
                json={"max_tokens": 40, "stream": True},
                headers={"authorization": "Bearer pe"},
            )
            return r.status_code, r.headers.get("x-energy-id")

        # the long stream takes 0.1s of work spread... make it longer by many tokens: WORK_S/n each -> 0.1 s total. so use several sequential
        st, i = await longstream()
        print("stream", st, i, "t-left", 20 - time.time() % 20)
        print("before end", await spent(c))
        await asyncio.sleep(20 - time.time() % 20 + 1.0)
        print("after end", await spent(c))
        r = (await c.get(U + f"/energy/requests/{i}")).json()["record"]
        print("record joules", r["joules"], r["settled"])


asyncio.run(main())
