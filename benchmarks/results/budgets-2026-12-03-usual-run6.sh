#!/bin/bash
# usage: unshare -m bash run6.sh SECONDS PORT [PYTHONPATH]
mount -t tmpfs -o size=128m tmpfs /dev/shm
PY=/work/main/.venv/bin/python; cd /tmp/hostile/bud; P=$2; export PYTHONPATH=${3:-/work/main}
$PY -m uvicorn app:app --port $P --workers 4 --log-level warning > server-$P.log 2>&1 & M=$!
for i in $(seq 60); do curl -s -o /dev/null "localhost:$P/energy" && break; sleep 0.5; done; sleep 2
$PY - <<PY
import asyncio, time, httpx, collections, json
U = "http://127.0.0.1:$P"
B = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
H = {"x-team": "team-a"}
admitted, refused = [], 0
async def client(c, until):
    global refused
    while time.monotonic() < until:
        r = await c.post(U + "/v1/chat/completions", json=B, headers=H)
        if r.status_code == 200: admitted.append(r.headers["x-energy-id"])
        else:
            refused += 1; await asyncio.sleep(0.02)
async def main():
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        for _ in range(3): 
            r = await c.post(U + "/v1/chat/completions", json=B, headers={"x-team": "warm"})
        await asyncio.sleep(1.0)
        until = time.monotonic() + $1
        await asyncio.gather(*[client(c, until) for _ in range(40)])
asyncio.run(main())
time.sleep(4)
recs = [httpx.get(U + "/energy/requests/" + i).json().get("record") for i in admitted]
j = [r["joules"] for r in recs if r and r.get("joules")]
mean = sum(j) / len(j)
st = httpx.get(U + "/energy", params={"window": "all"}).json()["budgets"]
print("admitted", len(admitted), "refused", refused, "settled sum %.1f" % sum(j), "unsettled", sum(1 for r in recs if r and not r["settled"]), "missing", sum(1 for r in recs if not r), "mean %.2f" % mean, "over %.1f J = %.2f req" % (sum(j) - 300, (sum(j) - 300) / mean))
print(json.dumps(st)[:600])
PY
kill $M; wait
