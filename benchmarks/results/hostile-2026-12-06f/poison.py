# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: poison.py PORT N DELAY [method] -- N requests of tenant 'poison' (delay s, or client disconnect if method=abort); prints their first figures."""

import asyncio
import collections
import sys

import httpx

port, n, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
how = sys.argv[4] if len(sys.argv) > 4 else "post"


async def main():
    seen = collections.Counter()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:

        async def one():
            try:
                if how == "abort":
                    await asyncio.wait_for(
                        c.post("/v1/chat/completions", headers={"x-tenant": "poison"}, json={"delay": 1.0}),
                        0.05,
                    )
                else:
                    r = await c.post(
                        "/v1/chat/completions", headers={"x-tenant": "poison"}, json={"delay": delay}
                    )
                    seen[
                        (
                            r.status_code,
                            r.headers.get("x-energy-joules", "-")[:6],
                            r.headers.get("x-energy-method"),
                        )
                    ] += 1
            except Exception as e:
                seen[type(e).__name__] += 1

        await asyncio.gather(*(one() for _ in range(n)))
    print("poison:", dict(seen))


asyncio.run(main())
