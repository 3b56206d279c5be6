#!/bin/bash
# A cold server's first wave against a hard budget (budgets-2026-12-06-cold.md).
# usage: unshare -m bash budgets-2026-12-06-cold-run.sh SECONDS PORT PYTHONPATH LIMIT_J [WARMUP]
# In a mount namespace of its own, the server gets a fresh /dev/shm: its workers' place starts
# empty, so no worker has counted a figure. No warm-up request (WARMUP, default 0: the warm
# control sends 3 of another tenant first, as budgets-2026-12-03-usual-run6.sh did): 40
# clients of one tenant at once from the start, for SECONDS; then every admitted id's settled
# record, and per admitted request (answers.json) its worker, its answer's time and headers.
set -u
mount -t tmpfs -o size=128m tmpfs /dev/shm
unset GIUL_ASGI_LOAD_DIR
PY=/work/main/.venv/bin/python
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d /tmp/cold-XXXXXX)
cp "$HERE/budgets-2026-12-03-usual-app.py" "$DIR/app.py"  # the same app as the warm measurement
cd "$DIR"; P=$2; export PYTHONPATH=$3 BUD=$4
$PY -m uvicorn app:app --port "$P" --workers 4 --log-level warning > "server-$P.log" 2>&1 & M=$!
# ready when every worker listens: /energy is outside the budget and teaches it nothing
for i in $(seq 60); do curl -s -o /dev/null "localhost:$P/energy" && break; sleep 0.5; done; sleep 2
$PY - "$1" "$P" "$4" "${5:-0}" <<'PY'
import asyncio, collections, json, sys, time
import httpx
SECONDS, P, LIMIT, WARMUP = float(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
U = f"http://127.0.0.1:{P}"
B = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
H = {"x-team": "team-a"}
admitted, codes, pids, first_unknown, log = [], collections.Counter(), collections.Counter(), 0, []
async def client(c, until):
    global first_unknown
    while time.monotonic() < until:
        r = await c.post(U + "/v1/chat/completions", json=B, headers=H)
        if r.status_code == 200:
            admitted.append(r.headers["x-energy-id"])
            pids[r.json()["pid"]] += 1
            first_unknown += r.headers["x-energy-joules"] == "unknown"
            log.append({"t": time.monotonic(), "pid": r.json()["pid"], "id": r.headers["x-energy-id"],
                        "first": r.headers["x-energy-joules"],
                        "remaining": r.headers.get("x-energy-budget-remaining")})
        else:
            codes[r.json()["error"]["code"]] += 1
            await asyncio.sleep(0.02)
async def main():
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as c:
        for _ in range(WARMUP):
            await c.post(U + "/v1/chat/completions", json=B, headers={"x-team": "warm"})
        if WARMUP:
            await asyncio.sleep(1.0)
        until = time.monotonic() + SECONDS
        await asyncio.gather(*[client(c, until) for _ in range(40)])
asyncio.run(main())
time.sleep(4)
recs = [httpx.get(U + "/energy/requests/" + i).json().get("record") for i in admitted]
for entry, rec in zip(log, recs):
    entry["settled"] = rec and rec.get("joules")
with open(f"/tmp/cold-answers-{P}.json", "w") as out:
    json.dump(log, out)
j = [r["joules"] for r in recs if r and r.get("joules")]
mean = sum(j) / len(j)
print(json.dumps({"admitted": len(admitted), "by_worker": sorted(pids.values()), "first_unknown": first_unknown,
                  "refused": dict(codes),
                  "settled_sum": round(sum(j), 1), "unsettled": sum(1 for r in recs if r and not r["settled"]),
                  "missing": sum(1 for r in recs if not r), "mean": round(mean, 2), "largest": round(max(j), 2),
                  "over_j": round(sum(j) - LIMIT, 1), "over_req": round((sum(j) - LIMIT) / mean, 2)}))
PY
kill $M; wait
rm -rf "$DIR"
