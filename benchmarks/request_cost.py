"""What a request costs through the middleware, one tree against another: a small A/B.

Each variant is a Starlette app behind ``EnergyMiddleware`` on a busy simulated card, called
in process (no server) as benchmarks/overhead.py does: a JSON answer, and an OpenAI stream of
10 chunks; with the settings a variant names (``energy_format``, a ``Prefer`` header, a PUE).
Each tree runs in a process of its own (``PYTHONPATH`` = the tree), the trees interleaved
(their order turned each repeat), several repeats; time is the main thread's CPU time
(``time.thread_time``: what other processes on a shared machine do not inflate; the node's
reader thread is not in it, and its booking of a span is timed apart in ``--parts``); the
table gives each variant's median microseconds a request and the difference from the first
tree's same variant (or, for a variant the first tree cannot run, from its plain ``json`` or
``sse-10``).

``--parts`` times the pieces alone instead (the least of three runs of many calls, steadier on
a loaded machine than whole requests): the headers, the block, grading a share, a statistics
record, the format chosen from a request's headers, and the reader thread's booking of one
span with 1 and 8 windows open.

    python benchmarks/request_cost.py --tree /tmp/base --tree . --repeats 5
    python benchmarks/request_cost.py --tree /tmp/base --tree . --parts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: name -> (path, middleware settings, request headers, node settings)
VARIANTS: dict[str, tuple[str, dict[str, Any], list[tuple[bytes, bytes]], dict[str, Any]]] = {
    "json": ("/v1/chat/completions", {}, [], {}),
    "sse-10": ("/v1/stream/10", {}, [], {}),
    "json neuralwatt": ("/v1/chat/completions", {"energy_format": "neuralwatt"}, [], {}),
    "json Prefer": ("/v1/chat/completions", {}, [(b"prefer", b"energy=neuralwatt")], {}),
    "sse-10 neuralwatt": ("/v1/stream/10", {"energy_format": "neuralwatt"}, [], {}),
    "json pue": ("/v1/chat/completions", {}, [], {"pue": 1.2}),
}


def build(settings: dict[str, Any], node_settings: dict[str, Any]) -> Any:
    from _apps import chat, stream
    from starlette.applications import Starlette
    from starlette.routing import Route

    import giul_asgi
    from giul_asgi import EnergyMiddleware, Ledgers
    from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader

    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
    card.start_job(150.0)
    node = giul_asgi.Node("sim", idle_w=70.0, reader_factory=lambda _n: SimulatedReader(card),
                          **node_settings)
    app = Starlette(routes=[Route("/v1/chat/completions", chat), Route("/v1/stream/{n:int}", stream)])
    return EnergyMiddleware(app, nodes=[node], ledgers=Ledgers(), **settings)


async def per_request(app: Any, path: str, headers: list[tuple[bytes, bytes]], n: int) -> float:
    message = {"type": "http.request", "body": b"", "more_body": False}
    never = asyncio.Event()
    sent = [False]

    async def receive() -> dict[str, Any]:
        if sent[0]:
            await never.wait()
        sent[0] = True
        return message

    async def send(_m: Any) -> None:
        return None

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"bench"), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "extensions": {}}
    start = time.thread_time()
    for _ in range(n):
        sent[0] = False
        await app(dict(scope), receive, send)
        await asyncio.sleep(0)
    return (time.thread_time() - start) / n * 1e6


async def measure(n: int, names: list[str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in names:
        path, settings, headers, node_settings = VARIANTS[name]
        try:
            app = build(settings, node_settings)
        except Exception:  # a setting this tree does not have
            out[name] = None
            continue
        await per_request(app, path, headers, 300)  # warm: the reader starts, caches fill
        await asyncio.sleep(0.2)
        out[name] = await per_request(app, path, headers, n)
        await app.aclose()
    return out


def timed(fn: Any, n: int) -> float:
    """Microseconds of the thread's CPU a call: the least of three runs of ``n`` calls."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, time.thread_time() - start)
    return best / n * 1e6


def parts(n: int) -> dict[str, float | None]:
    """Each piece alone, on the objects the request path and the reader thread use."""
    from giul_asgi.energy import Provenance, Share, grade
    from giul_asgi.ledger.book import Book
    from giul_asgi.stats.cell import Cell
    from giul_asgi.wire.body import energy_json
    from giul_asgi.wire.headers import energy_headers

    provenance = Provenance("simulated", "simulated", "local", 70.0)
    share = Share(1.5, 0.1, 0.2, False, provenance, 0.08, mean_watts=220.0, concurrency=1.0,
                  split="exclusive", contended=False)
    e = grade(share, node="sim", tier="8b", route="/v1/chat/completions", tokens=48, id="1-2-3")
    out: dict[str, float | None] = {
        "headers (energy_headers)": timed(lambda: energy_headers(e), n),
        "block (energy_json)": timed(lambda: energy_json(e), n),
        "grade a share": timed(lambda: grade(share, node="sim", tier="8b", tokens=48, id="1"), n),
    }
    cell = Cell()
    out["statistics record (Cell.add)"] = timed(
        lambda: cell.add(1.5, 48, 0.08, False, None, *((3.1,) if hasattr(cell, "alloc_nj") else ())), n)
    try:
        from giul_asgi.wire.formats import NEURALWATT, Formats

        formats = Formats()
        plain = [(b"host", b"x"), (b"accept", b"*/*"), (b"content-type", b"application/json"),
                 (b"user-agent", b"OpenAI/Python 1.0"), (b"authorization", b"Bearer x")]
        out["format from headers, no Prefer"] = timed(lambda: formats.for_request(plain), n)
        prefer = [*plain, (b"prefer", b"energy=neuralwatt")]
        out["format from headers, Prefer"] = timed(lambda: formats.for_request(prefer), n)
        out["block (neuralwatt)"] = timed(lambda: NEURALWATT.block(e), n)
    except ImportError:
        for name in ("format from headers, no Prefer", "format from headers, Prefer", "block (neuralwatt)"):
            out[name] = None
    for k in (1, 8):
        out[f"book a span, {k} windows open"] = timed(_spans(Book(provenance), k), n // 4)
    return out


def _spans(book: Any, k: int) -> Any:
    """A call that books the next 100 ms span of 15 J above a 7 J floor, ``k`` windows open."""
    from giul_asgi.spans import Span

    for _ in range(k):
        book.open(0.0)
    t = [0.0]

    def span() -> None:
        t0 = t[0]
        t[0] += 0.1
        book.book(Span(t0, t[0], 15.0, 22.0, 0.0, 0.001), t[0])

    return span


def run_tree(tree: str, n: int, mode: str = "--here") -> dict[str, float | None]:
    env = {**os.environ, "PYTHONPATH": f"{Path(tree).resolve()}:{HERE}", "GIUL_ASGI_LOAD_DIR": "off"}
    done = subprocess.run([sys.executable, __file__, mode, "--n", str(n)], env=env, check=True,
                          capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--parts", action="store_true", help="time the pieces alone")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts-here", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.here:
        print(json.dumps(asyncio.run(measure(args.n, list(VARIANTS)))))
        return
    if args.parts_here:
        print(json.dumps(parts(args.n * 20)))
        return
    trees = args.tree or ["."]
    mode = "--parts-here" if args.parts else "--here"
    runs: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    for repeat in range(args.repeats):
        for tree in (trees if repeat % 2 == 0 else trees[::-1]):
            for name, value in run_tree(tree, args.n, mode).items():
                runs[tree].setdefault(name, [])
                if value is not None:
                    runs[tree][name].append(value)
    load = os.getloadavg()
    print(f"# request cost, {time.strftime('%Y-%m-%d')}; {platform.node()} {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; load {load[0]:.2f} {load[1]:.2f}; "
          f"{args.repeats} repeats, medians (us {'a call' if args.parts else 'a request'})\n")
    print("| variant | " + " | ".join(trees) + (" | diff |" if len(trees) > 1 else " |"))
    print("|---|" + "---|" * (len(trees) + (1 if len(trees) > 1 else 0)))
    digits = 2 if args.parts else 1
    for name in runs[trees[-1]]:
        meds = [statistics.median(runs[t][name]) if runs[t].get(name) else None for t in trees]
        cells = [f"{m:.{digits}f}" if m is not None else "n/a" for m in meds]
        if len(trees) > 1:
            base = meds[0]
            if base is None and not args.parts:
                plain = runs[trees[0]]["json" if name.startswith("json") else "sse-10"]
                base = statistics.median(plain) if plain else None
            cells.append(f"{meds[-1] - base:+.{digits}f}" if meds[-1] is not None and base is not None
                         else "n/a")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
