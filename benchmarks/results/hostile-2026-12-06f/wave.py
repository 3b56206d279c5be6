# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: wave.py PORT CLIENTS ROUNDS [tenant-prefix] [ntenants] -- concurrent waves; prints counts, compares /energy and records."""

import asyncio
import collections
import json
import sys
import time

import httpx

port, clients, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
prefix = sys.argv[4] if len(sys.argv) > 4 else "t"
nten = int(sys.argv[5]) if len(sys.argv) > 5 else 1
base = f"http://127.0.0.1:{port}"


async def main():
    ids = collections.defaultdict(list)
    codes = collections.Counter()
    ras = collections.Counter()
    msgs = []
    async with httpx.AsyncClient(
        base_url=base, timeout=30, limits=httpx.Limits(max_connections=clients)
    ) as c:

        async def one(k):
            ten = f"{prefix}{k % nten}"
            r = await c.post("/v1/chat/completions", headers={"x-tenant": ten}, json={})
            if r.status_code == 200:
                ids[ten].append(
                    (
                        r.headers.get("x-energy-id"),
                        (lambda v: float(v) if v not in (None, "unknown") else 0.0)(
                            r.headers.get("x-energy-joules")
                        ),
                        r.headers.get("x-energy-budget-remaining"),
                        r.headers.get("x-energy-uncertainty"),
                    )
                )
                codes["200"] += 1
            else:
                j = r.json()["error"]
                codes[f"{r.status_code}:{j['code']}"] += 1
                ras[
                    (j["code"], r.headers.get("retry-after"), r.headers.get("x-energy-budget-remaining"))
                ] += 1
                if len(msgs) < 3:
                    msgs.append(j["message"])

        t0 = time.time()
        for _ in range(rounds):
            await asyncio.gather(*(one(k) for k in range(clients)))
        dt = time.time() - t0
        await asyncio.sleep(2.5)
        e = (await c.get("/energy", params={"window": "all"})).json()
        b = e["budgets"]["items"][0]
        print(f"elapsed {dt:.2f}s codes {dict(codes)}")
        print("429 (code, retry-after, remaining):", dict(ras))
        for m in msgs:
            print("  msg:", m)
        print("budget:", json.dumps({k: v for k, v in b.items() if k != "keys"})[:400])
        for ten in sorted(ids)[:5]:
            tot = 0.0
            n = 0
            unk = 0
            miss = []
            for rid, j0, _, unc in ids[ten]:
                rr = await c.get(f"/energy/requests/{rid}")
                if rr.status_code == 200:
                    rec = rr.json()["record"]
                    jj = rec.get("joules")
                    if jj is None:
                        unk += 1
                    else:
                        tot += jj
                        if unc not in (None, "unknown") and abs(j0 - jj) > float(unc):
                            miss.append((round(j0, 1), round(jj, 1), unc))
                    n += 1
            from giul_asgi.tenants import hashed

            key = b["keys"].get(hashed(ten)) or b["keys"].get(ten)
            print(
                f"tenant {ten}: admitted {len(ids[ten])}, records {n} (unknown {unk}) sum {tot:.1f} J; first-figure sum {sum(x[1] for x in ids[ten]):.1f}; /energy key: {key}"
            )
            print(f"  first figure outside its uncertainty of the settled: {len(miss)}/{n}", miss[:4])
        print("keys shown", len(b["keys"]), "keys_more", b.get("keys_more"))


asyncio.run(main())
