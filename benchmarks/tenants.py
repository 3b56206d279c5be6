"""What tenants cost a request, and what they cost when unset: measured side by side in one run.

(a) In process, microseconds per JSON request through ``EnergyMiddleware`` (raw ASGI, no
    server), each variant built alike on a node with no reader (the window still opens and
    closes, the figure is still made and spliced; records are kept in process, not
    journalled for other workers): no tenant; ``tenant="x-api-key"`` with
    a 51-character key; ``tenant="authorization"`` with ``Bearer``; a function reading the
    scope; a 10 KB key. Variants run interleaved in short rounds (the order rotating), and
    each is given as the median over rounds of its added microseconds over the no-tenant
    variant of the same round; beside it, the tenant's resolution alone (what the
    middleware calls once per request), timed on its own (least of three).
(b) What the no-tenant path runs that it did not before tenants, each statement timed
    alone (least of three runs): the middleware's ``if self._tenant is not None`` and the
    meter's ``self.tenant = None``; and beside them a bare function call, the unit of the
    request path's budget (DESIGN.md).
(c) The reader thread's side, per record: ``TenantPlaces.label`` for a placed tenant and
    for one of 10,000 keys that has no place, and ``EnergyStats.settled`` with and without
    a tenant (batches of 16).

    python benchmarks/tenants.py           # 9 repeats of 20,000 requests
    python benchmarks/tenants.py --quick   # 3 repeats of 3,000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from overhead import timed as timed_us

from giul_asgi import EnergyMiddleware, Ledgers, Node, Tier
from giul_asgi.energy import Energy
from giul_asgi.listeners import Settled
from giul_asgi.records import RecordStore
from giul_asgi.stats import EnergyStats
from giul_asgi.tenants import TenantPlaces

KEY = b"sk-proj-4f9c2a7be01d44c39a1f0c6d2e8b7a9f1c3e5d7b9a1c"
BODY = json.dumps({"id": "x", "choices": [{"message": {"content": "hi"}}],
                   "usage": {"completion_tokens": 12, "prompt_tokens": 30}}).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


def team(scope: Any) -> str | None:
    return scope.get("state", {}).get("team")


#: variant -> (the middleware's tenant setting, the request's extra headers)
VARIANTS: dict[str, tuple[Any, list[tuple[bytes, bytes]]]] = {
    "no tenant": (None, [(b"authorization", b"Bearer " + KEY)]),
    'tenant="x-api-key"': ("x-api-key", [(b"x-api-key", KEY)]),
    'tenant="authorization"': ("authorization", [(b"authorization", b"Bearer " + KEY)]),
    "tenant=function": (team, []),
    'tenant="x-api-key", 10 KB key': ("x-api-key", [(b"x-api-key", b"k" * 10_240)]),
}


def build(tenant: Any) -> EnergyMiddleware:
    return EnergyMiddleware(app, nodes=[Node("dark", reader="none")], tiers=[Tier("8b", 300.0)],
                            ledgers=Ledgers(), records=RecordStore(share=False), tenant=tenant)


def scope_for(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                    (b"accept", b"*/*"), (b"user-agent", b"bench/1"), *headers],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "extensions": {},
        "state": {"team": "team-a"},
    }


async def run(mw: EnergyMiddleware, scope: dict[str, Any], n: int) -> float:
    """Microseconds per request for ``n`` sequential requests."""
    message = {"type": "http.request", "body": b"", "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_m: Any) -> None:
        return None

    start = time.perf_counter()
    for _ in range(n):
        await mw(dict(scope), receive, send)
    return (time.perf_counter() - start) / n * 1e6


async def in_process(rounds: int, n: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per variant, us per request in each round of ``n`` requests; and the resolution alone."""
    stacks = {name: (build(tenant), scope_for(headers)) for name, (tenant, headers) in VARIANTS.items()}
    for mw, scope in stacks.values():
        await run(mw, scope, 500)  # warm up: readers started, caches filled
    times: dict[str, list[float]] = {name: [] for name in stacks}
    names = list(stacks)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            mw, scope = stacks[name]
            times[name].append(await run(mw, scope, n))
    alone = {}
    for name, (mw, scope) in stacks.items():
        resolve = mw._tenant
        alone[name] = 0.0 if resolve is None else timed(lambda r=resolve, s=scope: r(s), 20_000) / 1e3
    return times, alone


def timed(fn: Callable[[], object], n: int) -> float:
    """Nanoseconds per call of ``fn``: overhead.py's timing (the least of three runs)."""
    return timed_us(fn, n) * 1e3


class Holder:
    __slots__ = ("_tenant", "tenant")

    def __init__(self) -> None:
        self._tenant = None
        self.tenant: str | None = None


def no_tenant_path(n: int) -> list[tuple[str, float]]:
    holder = Holder()

    def check() -> None:
        if holder._tenant is not None:
            holder.tenant = None

    def store() -> None:
        holder.tenant = None

    def empty() -> None:
        return None

    def call() -> None:
        empty()

    base = timed(empty, n)
    return [
        ("empty loop body (the timing's own cost, subtracted below)", base),
        ("if self._tenant is not None (middleware, unset)", timed(check, n) - base),
        ("self.tenant = None (Meter.__init__)", timed(store, n) - base),
        ("a pure-Python function call, for scale", timed(call, n) - base),
    ]


def reader_side(n: int) -> list[tuple[str, float]]:
    places = TenantPlaces(100)
    for i in range(100):
        places.label(f"heavy{i}", 1000.0)
    keys = [f"key:{i:016x}" for i in range(10_000)]
    it = iter(range(10**9))

    def placed() -> None:
        places.label("heavy7", 3.0)

    def light() -> None:
        places.label(keys[next(it) % 10_000], 1.0)

    rows = [("TenantPlaces.label, a placed tenant", timed(placed, n)),
            ("TenantPlaces.label, one of 10,000 keys with no place", timed(light, n))]
    for name, tenant in (("EnergyStats.settled, a record with no tenant", None),
                         ("EnergyStats.settled, a record with a placed tenant", "heavy7")):
        stats = EnergyStats()
        energy = Energy(3.6, "measured", node="dark", tier="8b", route="/v1/chat/completions",
                        seconds=0.2, tokens=12, tenant=tenant)
        batch = [Settled(energy, "ok", 200, time.time())] * 16
        rows.append((name, timed(lambda s=stats, b=batch: s.settled(b), n // 16) / 16))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, n = (20, 500) if args.quick else (200, 1000)
    print(f"# tenants: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"\n## (a) a JSON request in process: {rounds} interleaved rounds of {n} requests\n")
    times, alone = asyncio.run(in_process(rounds, n))
    added = {name: statistics.median(t - b for t, b in zip(ts, times["no tenant"], strict=True))
             for name, ts in times.items()}
    print("| variant | us per request (median) | added over no tenant, us (median of paired "
          "rounds) | resolving the tenant alone, us |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} | {added[name]:+.2f} | {alone[name]:.2f} |")
    print("\n## (b) what the no-tenant path runs that it did not before, ns (least of 3)\n")
    print("| statement | ns |")
    print("|---|---:|")
    for name, ns in no_tenant_path(2_000_000 if not args.quick else 300_000):
        print(f"| {name} | {ns:.1f} |")
    print("\n## (c) the reader thread's side, ns per record (least of 3)\n")
    print("| part | ns |")
    print("|---|---:|")
    for name, ns in reader_side(200_000 if not args.quick else 30_000):
        print(f"| {name} | {ns:.0f} |")


if __name__ == "__main__":
    main()
