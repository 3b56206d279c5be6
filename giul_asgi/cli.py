"""`giul-asgi`: the demo gateway, what this host can meter, and the agent.

    giul-asgi demo                 a metered OpenAI-compatible gateway over a simulated GPU server
    giul-asgi demo --load 200      ... sends 200 mixed requests, prints what they cost, exits
    giul-asgi demo --upstream URL  ... meters a real upstream (vLLM, TGI, llama.cpp) instead
    giul-asgi probe [--json]       what each GPU answers: counter, power gauges, MIG
    giul-asgi agent                serve this host's GPU counters to remote gateways
    giul-asgi --version

Exit status: 0 done, 2 bad usage or configuration, 1 a runtime failure (a port taken, an
upstream that never came up, requests that failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .errors import ConfigError, GiulError


# -- argument types: a bad value is a usage error (exit 2) that names it -------------------------
def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a whole number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 0..65535 (0: any free one), got {value}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"seconds must be > 0, got {text}")
    return value


def watts(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"watts must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"watts must be >= 0, got {text}")
    return value


def count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL such as http://127.0.0.1:8001/v1, got {text!r}")
    return text.rstrip("/")


# -- demo ----------------------------------------------------------------------------------------
def demo(args: argparse.Namespace) -> int:
    from .demo.server import DemoOptions, run_demo

    options = DemoOptions(
        host=args.host, port=args.port, upstream_port=args.upstream_port, upstream=args.upstream,
        config=Path(args.config) if args.config else None, idle_w=args.idle_w, load=args.load,
        concurrency=args.concurrency, serve=args.serve, seed=args.seed,
    )
    return asyncio.run(run_demo(options, say=lambda line: print(line, flush=True)))


# -- probe ---------------------------------------------------------------------------------------
def probe(args: argparse.Namespace) -> int:
    try:
        from .probe import format_probe, probe_report  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:  # until giul_asgi/probe.py lands
        return _probe_nvml_only(args)
    report = probe_report(seconds=args.seconds, simulate=args.simulate)
    print(json.dumps(report, indent=2) if args.json else format_probe(report))
    return 0


def _probe_nvml_only(args: argparse.Namespace) -> int:
    from .readers.nvml import probe_nvml

    if args.simulate:
        return _probe_simulated(args.seconds)

    gpus = probe_nvml()
    report: dict[str, Any] = {
        "version": __version__, "host": platform.node(), "platform": platform.platform(),
        "python": platform.python_version(), "nvml": bool(gpus),
        "gpus": [{"index": g.index, "name": g.name, "error": g.error, "counter": g.counter,
                  "instant_power": g.instant_power, "average_power": g.average_power, "mig": g.mig}
                 for g in gpus],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"giul-asgi {__version__} probe on {report['host']} ({report['platform']})")
    if not gpus:
        print("NVML: not available (no driver, no GPU, or nvidia-ml-py missing)")
        print("-> the middleware here reports method=unknown, or estimated where a tier gives")
        print("   joules_per_1k_hint; nothing is invented. `giul-asgi demo` shows metered")
        print("   answers on simulated cards.")
        return 0
    for g in report["gpus"]:
        print(f"\ngpu {g['index']}: {g['name'] or '?'}")
        if g["error"]:
            print(f"  error: {g['error']}")
            continue
        for key, what in (("counter", "energy counter"), ("instant_power", "instant power"),
                          ("average_power", "averaged power")):
            print(f"  {what + ':':17} {'yes' if g[key] else 'no'}")
        if g["mig"]:
            print("  MIG mode: energy is board-level; a slice cannot be metered alone")
    return 0


def _probe_simulated(seconds: float) -> int:
    """One metered window on a simulated card (the probe's walk-through before probe.py)."""
    from .config import Node
    from .ledger import Ledgers  # type: ignore[attr-defined,unused-ignore]
    from .meter import Meter
    from .readers.simulated import SimulatedCard, SimulatedReader

    card = SimulatedCard(idle_w=70.0, cap_w=700.0, counter_period=0.1)
    node = Node("simulated", idle_w=70.0, reader_factory=lambda _n: SimulatedReader(card))  # type: ignore[call-arg,unused-ignore]
    print("simulated card: 70 W idle, 700 W cap, counter steps every 100 ms;")
    print(f"a request puts 180 W of load on it for {seconds:g} s")

    async def window() -> None:
        async with Meter.for_node(node, ledgers=Ledgers()) as m:  # type: ignore[attr-defined,unused-ignore]
            job = card.start_job(180.0)
            await asyncio.sleep(seconds)
            truth = card.stop_job(job).true_joules
        energy = await m.settled(timeout=2.0)
        print(f"  joules={energy.joules} method={energy.method} backend={energy.backend} "
              f"source={energy.source} settled={energy.settled}")
        print(f"  uncertainty_joules={energy.uncertainty_joules} mean_watts={energy.mean_watts}")
        print(f"  the simulated truth: {truth:.3f} J above idle")

    asyncio.run(window())
    return 0


# -- the parser ----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="giul-asgi", description="What each answer of an LLM gateway cost in joules.",
        epilog="Exit status: 0 done, 2 bad usage or configuration, 1 a runtime failure.")
    parser.add_argument("--version", action="version", version=f"giul-asgi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,probe,agent}")

    d = sub.add_parser("demo", help="a metered OpenAI-compatible gateway over a simulated GPU server",
                       description="Start the example gateway (examples/openai_gateway.py) metered by "
                                   "giul-asgi, over a batching simulated upstream whose work loads "
                                   "simulated cards. Every figure says method=simulated.")
    d.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    d.add_argument("--port", type=port, default=8000, help="the gateway's port (default 8000; 0: free)")
    d.add_argument("--upstream-port", type=port, default=8001,
                   help="the simulated upstream's port (default 8001; 0: free)")
    d.add_argument("--load", type=count(0), default=0, metavar="N",
                   help="send N mixed requests, print the joules table, exit (unless --serve)")
    d.add_argument("--concurrency", type=count(1), default=16, help="requests in flight (default 16)")
    d.add_argument("--serve", action="store_true", help="keep serving after --load")
    d.add_argument("--seed", type=int, default=0, help="seed of the load's mix and the cards")
    d.add_argument("--upstream", type=url, default=None, metavar="URL",
                   help="meter this OpenAI-compatible upstream (http://host:port/v1) instead of "
                        "simulating one; on this host's GPUs unless --config names the nodes")
    d.add_argument("--config", default=None, metavar="FILE",
                   help="gateway TOML: nodes, tiers, [[model]] tables (default examples/gateway.toml)")
    d.add_argument("--idle-w", type=watts, default=None,
                   help="with --upstream and no --config: the local node's idle floor in W")
    d.set_defaults(run=demo)

    p = sub.add_parser("probe", help="what this host's GPUs can be metered with")
    p.add_argument("--seconds", type=positive_seconds, default=1.0, help="length of the test window (> 0)")
    p.add_argument("--simulate", action="store_true", help="walk a simulated card instead")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=probe)

    a = sub.add_parser("agent", help="serve this host's GPU energy counters over HTTP (giul-agent)")
    from . import agent

    agent.add_arguments(a)
    a.set_defaults(run=agent.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    started = time.perf_counter()
    try:
        status: int = args.run(args)
    except ConfigError as exc:
        _fail(exc)
        return 2
    except GiulError as exc:
        _fail(exc)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted after {time.perf_counter() - started:.1f} s", file=sys.stderr)
        return 130
    return status


def _fail(exc: GiulError) -> None:
    print(f"giul-asgi: {exc.message}", file=sys.stderr)
    if exc.remedy:
        print(f"  -> {exc.remedy}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
