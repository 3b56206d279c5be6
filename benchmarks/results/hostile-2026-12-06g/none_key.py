# A hostile trial's script (2026-12-06g), kept as it ran.
# Hostile35: a hard key="<none>" budget (5 J/day) under tenant="authorization".
import sys
import time

import httpx

B = sys.argv[1]


def go(h, label, n):
    codes = []
    for _ in range(n):
        r = httpx.post(B + "/v1/chat/completions", json={}, headers=h, timeout=10)
        codes.append(r.status_code)
        time.sleep(0.1)
    print(
        label, codes, r.headers.get("x-energy-budget-remaining"), r.text[:160] if r.status_code != 200 else ""
    )


go({}, "no header:", 12)
go({"authorization": "Bearer sk-real"}, "with key:", 4)
go({"authorization": "Bearer "}, "'Bearer ' (empty):", 3)
go({"authorization": ""}, "empty header:", 3)
go({"authorization": "   "}, "spaces:", 3)
