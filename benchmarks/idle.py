"""What an idle gateway process costs: CPU share of its reader thread with no window open.

Issue 16: an idle process read its card about 100 times a second, 2.3-2.6% of a core each.
Target: <= 0.3% of a core. Each row is one child process that starts a ledger on a card,
lets the reader thread settle into its pace (``--warm`` seconds), then measures
``time.process_time()`` (every thread of the process) over ``--seconds`` of wall time:

- ``before: always fast``: the reader thread with no busy signal, reading ten times a
  counter period, as every idle process did before the doze;
- ``window open``: one window held open the whole time (the busy pace, by design);
- ``idle``: no window, nothing to watch: the thread dozes, one read per second;
- ``idle, foreign watch``: no window, ``foreign="subtract"``: one read per counter period;
- ``bare server`` (gateway cards only): the same uvicorn process without the middleware, so
  the gateway rows also say what the middleware adds to an idle server (uvicorn's loop
  ticks ten times a second on its own).

Cards: ``nvml`` is the production path, ``Node(reader="nvml")`` over benchmarks/fake_pynvml
(every NVML call one ctypes call into C with the GIL released, tens of us; an idle truth card
whose counter steps every 100 ms); ``nvml-fake`` is NvmlReader over tests/fake_nvml.LiveGpu
(the read a plain Python call), ``simulated`` the in-process simulated card of
``Node(reader="simulated")``, ``gateway`` a whole gateway process over it (uvicorn,
EnergyMiddleware, its statistics and the host's sharing; one request served, then idle;
"before" there sets the idle pace to the busy one), ``gateway-nvml`` the same gateway on the
production path. Configurations are interleaved, each repeated ``--repeats`` times; the
table gives medians and ranges.

    python benchmarks/idle.py [--seconds 10] [--repeats 3] [--out FILE] [--main-root DIR]

``--main-root DIR`` runs every row a second time, interleaved, with the idle.py and giul_asgi
of another tree (a checkout of main, say): the ``tree`` column says which.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.3  # % of a core
CONFIGS = ("before: always fast", "window open", "idle", "idle, foreign watch", "bare server")
#: A gateway card's row without the middleware: what uvicorn's own loop costs idle (its
#: ticks), which the gateway rows' "added" column takes off.
BARE = "bare server"
CARDS = ("nvml", "nvml-fake", "simulated", "gateway", "gateway-nvml")


def _install_fake_pynvml() -> None:
    """``import pynvml`` gives benchmarks/fake_pynvml, over a card at its idle floor."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fake_pynvml
    from truecard import TrueCard

    fake_pynvml.install([fake_pynvml.Gpu(TrueCard(idle_w=60.0, period=0.1))])


def _reader_factory(card: str) -> Any:
    if card == "nvml-fake":
        sys.path.insert(0, str(ROOT / "tests"))
        from fake_nvml import FakeNvml, LiveGpu

        from giul_asgi.readers.base import ReaderSpec
        from giul_asgi.readers.nvml import NvmlReader

        nvml = FakeNvml([LiveGpu(watts=70.0, step_s=0.1, processes=[])])
        return lambda node: NvmlReader(ReaderSpec(gpus=(0,)), nvml=nvml)
    return None


def one_gateway(config: str, seconds: float, warm: float, nvml: bool = False) -> dict[str, Any]:
    """In the child: a whole gateway process (uvicorn, the middleware, the statistics, the
    host's sharing) over the in-process simulated card (``nvml``: the NVML reader over
    fake_pynvml), one request served, then idle."""
    import threading

    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import giul_asgi.ledger.ledger
    from giul_asgi import EnergyMiddleware, Node
    from giul_asgi.ledger import default_ledgers

    if config == "before: always fast":
        giul_asgi.ledger.ledger.IDLE_S = 0.0  # type: ignore[attr-defined]  # the idle pace = the busy pace

    async def chat(request: Request) -> JSONResponse:
        return JSONResponse({"id": "x"})

    if nvml:
        _install_fake_pynvml()
    node = Node("idle", idle_w=60.0, reader="nvml" if nvml else "simulated",
                foreign="subtract" if config == "idle, foreign watch" else "charge")
    app = Starlette(routes=[Route("/", chat)])
    if config != BARE:
        app.add_middleware(EnergyMiddleware, nodes=[node])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    httpx.get(f"http://127.0.0.1:{port}/")
    time.sleep(warm)
    ledger = next(iter(default_ledgers()), None)
    reads0 = ledger.totals().reads if ledger is not None else 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    reads1 = ledger.totals().reads if ledger is not None else 0
    server.should_exit = True
    thread.join(10)
    return {"config": config, "card": "gateway-nvml" if nvml else "gateway",
            "cpu_pct": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
            "reads_per_s": (reads1 - reads0) / (wall1 - wall0)}


def one(config: str, card: str, seconds: float, warm: float) -> dict[str, Any]:
    """In the child: start the ledger, let it settle, measure."""
    if card.startswith("gateway"):
        return one_gateway(config, seconds, warm, nvml=card == "gateway-nvml")
    from giul_asgi.config import Node
    from giul_asgi.ledger import Ledger
    from giul_asgi.ledger.poller import Poller

    factory = _reader_factory(card)
    if card == "nvml":
        _install_fake_pynvml()
    reader = "nvml" if card == "nvml" else "simulated" if factory is None else "auto"
    node = Node(
        "idle", idle_w=60.0, reader=reader,
        foreign="subtract" if config == "idle, foreign watch" else "charge", reader_factory=factory,
    )
    ledger = Ledger(node)
    if config == "before: always fast":
        # The poller as it was: no busy signal, so the busy pace for ever.
        ledger._poller = Poller(node.name, ledger._build, ledger, clock=ledger.clock)
        ledger._poller.start()
    else:
        ledger.ensure_started()
    window = ledger.open() if config == "window open" else None
    time.sleep(warm)
    reads0 = ledger.totals().reads
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    reads1 = ledger.totals().reads
    if window is not None:
        ledger.close(window)
    ledger.stop()
    return {"config": config, "card": card, "cpu_pct": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
            "reads_per_s": (reads1 - reads0) / (wall1 - wall0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cards", default=",".join(CARDS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--main-root", default=None, help="also run each row on this tree (main)")
    parser.add_argument("--one", nargs=2, metavar=("CONFIG", "CARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.seconds, args.warm)))
        return 0
    cards = [c for c in args.cards.split(",") if c]
    trees = [("this", ROOT)] + ([("main", Path(args.main_root).resolve())] if args.main_root else [])
    load_start = os.getloadavg()
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for repeat in range(args.repeats):
        for card in cards:
            for config in CONFIGS:
                gateway = card.startswith("gateway")
                if (gateway and config == "window open") or (not gateway and config == BARE):
                    continue
                for tree, root in trees:
                    out = subprocess.run(
                        [sys.executable, str(root / "benchmarks" / "idle.py"), "--one", config, card,
                         "--seconds", str(args.seconds), "--warm", str(args.warm)],
                        capture_output=True, text=True, check=True, cwd=root,
                        env={**os.environ, "PYTHONPATH": str(root)},
                    )
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    runs.setdefault((tree, card, config), []).append(result)
                    print(f"repeat {repeat + 1}: {tree} {card:9} {config:22} {result['cpu_pct']:.3f}% "
                          f"{result['reads_per_s']:.1f} reads/s", file=sys.stderr)
    lines = [
        f"# idle: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node() or 'host'}, "
        f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}",
        "",
        f"    python benchmarks/idle.py --seconds {args.seconds:g} --warm {args.warm:g} "
        f"--repeats {args.repeats} --cards {','.join(cards)}"
        + (f" --main-root {args.main_root}" if args.main_root else ""),
        "",
        "Load average at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(
            *load_start, *os.getloadavg()),
        "",
        "CPU share of one idle process (every thread), `time.process_time()` over wall time, "
        f"{args.seconds:g} s a run after {args.warm:g} s to settle; configurations interleaved; "
        f"median (min-max) of {args.repeats}. A gateway's row also says what the middleware "
        "adds to the same server without it (its median less the bare server's); the target "
        "is judged on that where there is one.",
        "",
        "| tree | card | configuration | CPU, % of a core | added over the bare server | reads/s "
        "| target <= 0.3% |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for card, config, (tree, _) in itertools.product(cards, CONFIGS, trees):
        rs = runs.get((tree, card, config))
        if not rs:
            continue
        cpu = [r["cpu_pct"] for r in rs]
        reads = statistics.median(r["reads_per_s"] for r in rs)
        bare = runs.get((tree, card, BARE))
        added = statistics.median(cpu) - statistics.median(r["cpu_pct"] for r in bare) \
            if bare and config != BARE else None
        judged = added if added is not None else statistics.median(cpu)
        verdict = "n/a (busy by design)" if config in ("window open", "before: always fast") \
            else "n/a (no middleware)" if config == BARE else ("met" if judged <= TARGET else "MISSED")
        lines.append(f"| {tree} | {card} | {config} | {statistics.median(cpu):.3f} "
                     f"({min(cpu):.3f}-{max(cpu):.3f}) | {'-' if added is None else f'{added:.3f}'} "
                     f"| {reads:.1f} | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
