# ruff: noqa: E501  (a trial's script: formatted by ruff, its long lines kept)
"""usage: odd.py PORT -- odd tenant header values: huge, non-ASCII bytes, empty, whitespace variants; does each get its own budget, any 500?"""

import sys

import httpx

port = int(sys.argv[1])
vals = [b"x" * 8000, b"\xff\xfe\xe9t\xe9", b"", b"A", b"a", b"<none>", b"<other>", b"key:0000000000000000"]
with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
    for v in vals:
        out = []
        for _ in range(8):
            r = c.post(
                "/v1/chat/completions",
                headers=[(b"x-tenant", v), (b"content-type", b"application/json")],
                content=b"{}",
            )
            out.append(r.status_code)
        print(repr(v[:20]), len(v), out)
    e = c.get("/energy", params={"window": "all"}).json()["budgets"]["items"][0]
    for k, v in e["keys"].items():
        print(k[:60], {a: round(b, 1) if isinstance(b, float) else b for a, b in v.items()})
