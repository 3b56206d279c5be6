# A stranger's trial script (2026-12-06e), kept as it ran.
# ruff: noqa: B007, SIM115, UP031
import asyncio
import json
import sys
import time

import httpx

URL, tenant, conc, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
log = []


async def client(c):
    end = time.time() + dur
    while time.time() < end:
        t0 = time.time()
        r = await c.post(
            URL + "/v1/chat/completions",
            json={"model": "m", "messages": [], "max_tokens": 8},
            headers={"authorization": f"Bearer {tenant}"},
        )
        log.append(
            (
                t0,
                time.time(),
                r.status_code,
                r.headers.get("retry-after"),
                r.headers.get("x-energy-joules"),
                r.headers.get("x-energy-id"),
                r.headers.get("x-should-retry"),
            )
        )
        if r.status_code == 429:
            await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 0.5))


async def main():
    async with httpx.AsyncClient(timeout=30) as c:
        await asyncio.gather(*(client(c) for _ in range(conc)))
    json.dump(log, open(f"/tmp/s35-boundary-{tenant}.json", "w"))
    P = float(sys.argv[5])
    per = {}
    for t0, t1, st, ra, j, i, sr in log:
        p = int(t0 // P)
        d = per.setdefault(p, {"ok": 0, "J": 0.0, "429": 0, "ra": set(), "ids": []})
        if st == 200:
            d["ok"] += 1
            d["J"] += float(j) if j not in (None, "unknown") else 0
            d["ids"].append(i)
        else:
            d["429"] += 1
            d["ra"].add((ra, sr))
    for p, d in sorted(per.items()):
        # check retry-after vs period end
        print(
            p,
            "start",
            time.strftime("%H:%M:%S", time.gmtime(p * P)),
            "ok",
            d["ok"],
            "first-fig J %.1f" % d["J"],
            "429",
            d["429"],
            "retry-after/x-should-retry seen",
            sorted(d["ra"], key=str)[:6],
        )
    # also bad retry-after: refusal whose t0+ra is far from period end
    bad = [
        (t0, ra)
        for t0, t1, st, ra, j, i, sr in log
        if st == 429 and ra and int(ra) > 1 and abs(t0 + int(ra) - (t0 // P + 1) * P) > 2
    ]
    print("retry-after not pointing at period end:", len(bad), bad[:3])
    json.dump({str(p): d["ids"] for p, d in per.items()}, open(f"/tmp/s35-bids-{tenant}.json", "w"))


asyncio.run(main())
