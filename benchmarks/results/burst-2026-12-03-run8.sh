#!/bin/bash
# Attack 8: 4 uvicorn workers over the tests' shared file card (workers_app), 32 x 50 ms burst from idle. Inside unshare -m.
mount -t tmpfs -o size=128m tmpfs /dev/shm
PY=/work/main/.venv/bin/python; cd /tmp/hostile/card; P=9371; export PYTHONDONTWRITEBYTECODE=1
export WORKERS_CARD=/tmp/hostile/card/card-$1.txt WORKERS_NODE=burst$1; rm -f $WORKERS_CARD
$PY -c "from workers_card import FileCard; FileCard.create('$WORKERS_CARD')"
$PY -m uvicorn workers_app:app --port $P --workers 4 --log-level warning > /tmp/hostile/card/server-$1.log 2>&1 & M=$!
for i in $(seq 60); do curl -s -o /dev/null "localhost:$P/energy" && break; sleep 0.5; done; sleep 3
$PY - <<PY
import asyncio, json, time, httpx, collections
from workers_card import caused
U = "http://127.0.0.1:$P"
async def main():
    async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_connections=64)) as c:
        rs = await asyncio.gather(*[c.get(U + "/", params={"watts": 100, "seconds": $2}) for _ in range(32)])
    return rs
t0 = time.time(); rs = asyncio.run(main()); print("burst of 32 took %.2f s" % (time.time() - t0), collections.Counter(r.status_code for r in rs), "pids", len({r.json()["pid"] for r in rs}))
ids = [r.headers["x-energy-id"] for r in rs]
hj = [r.headers.get("x-energy-joules") for r in rs]; print("first-figure header values not numeric:", sum(1 for v in hj if not v or not v.replace(".","",1).isdigit()), "of 32; methods", collections.Counter(r.headers.get("x-energy-method") for r in rs)); first = sum(float(v) for v in hj if v and v.replace(".","",1).isdigit())
time.sleep(5)
recs = [httpx.get(U + "/energy/requests/" + i).json()["record"] for i in ids]
settled = [r for r in recs if r["settled"]]
s = sum((r["joules"] or 0) for r in recs)
truth, n = caused("$WORKERS_CARD")
print("settled %d/32, methods %s, contended %d, unc sum %.1f" % (len(settled), dict(collections.Counter(r["method"] for r in recs)), sum(bool(r["contended"]) for r in recs), sum((r["uncertainty_joules"] or 0) for r in recs)))
print("sum settled %.2f J  first-figure sum %.2f J  truth (closed form from the card file) %.2f J over %d jobs  -> settled/truth %.3f" % (s, first, truth, n, s / truth))
print("per-request joules min/median/max", sorted(r["joules"] or 0 for r in recs)[0], sorted(r["joules"] or 0 for r in recs)[16], sorted(r["joules"] or 0 for r in recs)[-1], "errors", collections.Counter(r["error"] for r in recs).most_common(3))
cov = 0; unk = 0
for r, rec in zip(rs, recs):
    v, u = r.headers.get("x-energy-joules"), r.headers.get("x-energy-uncertainty")
    try: v, u = float(v), float(u)
    except (TypeError, ValueError): unk += 1; continue
    cov += abs(v - rec["joules"]) <= u
print("first figure covers settled within its uncertainty: %d of %d numeric (%d without a number or uncertainty)" % (cov, 32 - unk, unk))
print("sample first headers", [(r.headers.get("x-energy-joules"), r.headers.get("x-energy-uncertainty"), r.headers.get("x-energy-method")) for r in rs[:4]], "body", rs[0].text[:300])
e = httpx.get(U + "/energy").json()
print("nodes", json.dumps(e["nodes"])[:900])
PY
kill $M; wait
