# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: period.py PORT CYCLES -- tenant P hammers with 8 concurrent loops; on each 429 'exceeded', note Retry-After and when P is next admitted."""

import asyncio
import sys
import time

import httpx

port, cycles = int(sys.argv[1]), int(sys.argv[2])


async def main():
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        res = []
        state = {"promised": None, "refused_at": None}
        t_end = time.time() + cycles

        async def loop():
            while time.time() < t_end:
                r = await c.post("/v1/chat/completions", headers={"x-tenant": "P"}, json={"delay": 0.1})
                now = time.time()
                if r.status_code == 429 and r.json()["error"]["code"] == "energy_budget_exceeded":
                    if now % 10 < 1 and not state.get("said"):
                        state["said"] = 1
                        print(
                            "at phase %.2f:" % (now % 10),
                            r.headers["retry-after"],
                            r.headers.get("x-should-retry"),
                            r.json()["error"]["message"],
                        )
                    if state["promised"] is None:
                        state["promised"] = now + int(r.headers["retry-after"])
                        state["refused_at"] = now
                    else:
                        state["promised"] = min(state["promised"], now + int(r.headers["retry-after"]))
                elif r.status_code == 200 and state["promised"] is not None:
                    res.append(
                        (round(now - state["refused_at"], 2), round(now - state["promised"], 2), now % 10)
                    )
                    state["promised"] = None
                await asyncio.sleep(0.05)

        await asyncio.gather(*(loop() for _ in range(8)))
        print("(refused for s, admitted minus promised s, period phase):", res)


asyncio.run(main())
