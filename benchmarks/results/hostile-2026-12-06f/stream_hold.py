# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: stream_hold.py PORT STREAM_S -- a tenant's first request is a long stream; the same tenant retries every 1 s (as told)."""

import asyncio
import sys
import time

import httpx

port, stream_s = int(sys.argv[1]), float(sys.argv[2])
nstreams = int(sys.argv[3]) if len(sys.argv) > 3 else 1


async def main():
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=600, limits=httpx.Limits(max_connections=200)
    ) as c:

        async def streamer():
            async with c.stream(
                "POST", "/v1/chat/completions", headers={"x-tenant": "A"}, json={"stream_s": stream_s}
            ) as r:
                n = 0
                async for _ in r.aiter_bytes():
                    n += 1
            return time.time()

        t0 = time.time()
        sts = [asyncio.create_task(streamer()) for _ in range(nstreams)]
        await asyncio.sleep(0.3)
        first_ok = None
        refused = 0
        codes = set()
        while time.time() - t0 < stream_s + 6:
            r = await c.post("/v1/chat/completions", headers={"x-tenant": "A"}, json={})
            if r.status_code == 200:
                if first_ok is None:
                    first_ok = time.time() - t0
            else:
                refused += 1
                codes.add(
                    (
                        r.json()["error"]["code"],
                        r.headers.get("retry-after"),
                        r.headers.get("x-energy-budget-remaining"),
                    )
                )
            await asyncio.sleep(1.0)
        end = max(await asyncio.gather(*sts))
        print(
            f"stream {stream_s}s ended at {end - t0:.1f}s; same-tenant retries refused {refused}, first admitted at {first_ok}s; 429s: {codes}"
        )
        b = (await c.get("/energy", params={"window": "all"})).json()["budgets"]["items"][0]
        print("keys", b["keys"])


asyncio.run(main())
