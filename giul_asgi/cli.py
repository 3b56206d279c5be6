"""`giul-asgi`: the demo gateway, what this host can meter, and the agent.

    giul-asgi demo                 a metered OpenAI-compatible gateway over a simulated GPU server
    giul-asgi demo --load 200      ... sends 200 mixed requests, prints what they cost, exits
    giul-asgi demo --load 200 --target URL   ... to a gateway already running (a demo, yours)
    giul-asgi demo --upstream URL  ... meters a real upstream (vLLM, TGI, llama.cpp) instead
    giul-asgi probe                what each GPU (or agent, dcgm-exporter, dcgmi) answers, measured
    giul-asgi probe --no-local --agent URL   ... what a remote agent answers (--json: as JSON)
    giul-asgi probe --idle 30      ... and the idle floor through every reader it reaches
    giul-asgi agent                serve this host's GPU counters to remote gateways
    giul-asgi replay TRACE         a node's trace (Node(trace=DIR)) run again: each figure, the books
    giul-asgi replay TRACE --split tokens   ... as another split would have charged it, per route and tier
    giul-asgi --version

Every option: docs/cli.md (generated from this parser). Exit status: 0 done, 2 bad usage or
configuration, 1 a runtime failure (a port taken, an upstream that never came up, requests
that failed).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .config import SPLITS
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


#: The demo's own environment variables (its ports).
DEMO_VARIABLES = ("GIUL_DEMO_PORT", "GIUL_DEMO_UPSTREAM_PORT")


def _check_demo_environment() -> None:
    """A ``GIUL_DEMO_*`` name the demo does not read would silently do nothing (a stranger's
    GIUL_DEMO_PRT put the demo on 8000): a bad setting, with the name it nearly is."""
    for name in sorted(os.environ):
        if name.startswith("GIUL_DEMO_") and name not in DEMO_VARIABLES:
            close = difflib.get_close_matches(name, DEMO_VARIABLES, n=1, cutoff=0.8)
            raise ConfigError(f"{name} is not a variable the demo reads (they are "
                              f"{', '.join(DEMO_VARIABLES)})",
                              remedy=(f"did you mean {close[0]}? " if close else "") + "rename or unset it")


def _env_port(name: str, default: int) -> int:
    """A default port from the environment (the README's tests run the demo on free ports)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return port(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"${name}: {exc}", remedy=f"unset {name} or give it a port") from None


# -- demo ----------------------------------------------------------------------------------------
def _check_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--target`` loads a running gateway: it needs ``--load`` and starts no server."""
    if args.target is None:
        return
    if args.load <= 0:
        parser.error("--target needs --load N (the requests to send it)")
    starting = [name for name, given in (("--serve", args.serve), ("--upstream", args.upstream),
                                         ("--config", args.config), ("--idle-w", args.idle_w))
                if given not in (None, False)]
    if starting:
        parser.error(f"--target loads a gateway already running; {', '.join(starting)} "
                     "would start one: drop them, or drop --target")


def demo(args: argparse.Namespace) -> int:
    from .demo.server import DemoOptions, run_demo

    # A load that exits serves nobody after it: free ports, so it never clashes with a demo
    # already serving on 8000 (a stranger ran the README's --load 40 beside one).
    passing = args.load > 0 and not args.serve
    _check_demo_environment()
    gateway = args.port if args.port is not None else 0 if passing else _env_port("GIUL_DEMO_PORT", 8000)
    upstream = (args.upstream_port if args.upstream_port is not None else 0 if passing
                else _env_port("GIUL_DEMO_UPSTREAM_PORT", 8001))
    options = DemoOptions(
        host=args.host, port=gateway, upstream_port=upstream, upstream=args.upstream,
        config=Path(args.config) if args.config else None, idle_w=args.idle_w, load=args.load,
        concurrency=args.concurrency, serve=args.serve, seed=args.seed, target=args.target,
    )
    return asyncio.run(run_demo(options, say=lambda line: print(line, flush=True)))


# -- probe ---------------------------------------------------------------------------------------
def _check_probe(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The probe's spans must be > 0 seconds (a usage error otherwise)."""
    for name in ("sample", "idle"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{name} must be > 0 seconds, got {value}")


# -- replay --------------------------------------------------------------------------------------
def replay(args: argparse.Namespace) -> int:
    from .replay import command

    return command(args.trace, split=args.split, idle_w=args.idle_w, as_json=args.json)


# -- the parser ----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="giul-asgi", description="What each answer of an LLM gateway cost in joules.",
        epilog="Every option: docs/cli.md. Exit status: 0 done, 2 bad usage or configuration, "
               "1 a runtime failure.")
    parser.add_argument("--version", action="version", version=f"giul-asgi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,probe,agent,replay}")

    d = sub.add_parser("demo", help="a metered OpenAI-compatible gateway over a simulated GPU server",
                       description="Start the example gateway (examples/openai_gateway.py) metered by "
                                   "giul-asgi, over a batching simulated upstream whose work loads "
                                   "simulated cards. Every figure says method=simulated.")
    d.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    d.add_argument("--port", type=port, default=None,
                   help="the gateway's port (default 8000, or $GIUL_DEMO_PORT; a free one for a "
                        "--load that exits; 0: a free one)")
    d.add_argument("--upstream-port", type=port, default=None,
                   help="the simulated upstream's port (default 8001, or $GIUL_DEMO_UPSTREAM_PORT; "
                        "a free one for a --load that exits)")
    d.add_argument("--load", type=count(0), default=0, metavar="N",
                   help="send N mixed requests, print the joules table, exit (unless --serve)")
    d.add_argument("--concurrency", type=count(1), default=16, help="requests in flight (default 16)")
    d.add_argument("--serve", action="store_true", help="keep serving after --load")
    d.add_argument("--target", type=url, default=None, metavar="URL",
                   help="with --load: send it to this running gateway (http://host:port, a demo "
                        "or your own OpenAI-compatible one: /v1/models, /v1/chat/completions, the only "
                        "routes it sends) instead of starting one")
    d.add_argument("--seed", type=int, default=0, help="seed of the load's mix and the cards")
    d.add_argument("--upstream", type=url, default=None, metavar="URL",
                   help="meter this OpenAI-compatible upstream (http://host:port/v1) instead of "
                        "simulating one; on this host's GPUs unless --config names the nodes")
    d.add_argument("--config", default=None, metavar="FILE",
                   help="gateway TOML: nodes, tiers, [[model]] tables (default examples/gateway.toml)")
    d.add_argument("--idle-w", type=watts, default=None,
                   help="with --upstream and no --config: the local node's idle floor in W")
    d.set_defaults(run=demo)

    from . import agent, probe

    p = sub.add_parser("probe", help="what this host's GPUs (and remote readers) answer, measured",
                       description="what this host's GPUs (and remote readers) answer, measured; "
                                   "exit 1 where nothing answered (the report still printed)")
    probe.add_arguments(p)
    p.set_defaults(run=probe.run)

    a = sub.add_parser("agent", help="serve this host's GPU energy counters over HTTP (giul-agent)")

    agent.add_arguments(a)
    a.set_defaults(run=agent.run)

    r = sub.add_parser("replay", help="run a node's trace again through the same tape and book",
                       description="Feed a trace a node wrote (Node(trace=DIR)) to a fresh ledger on a "
                                   "virtual clock: each request's figure (source: replay) and the "
                                   "node's books. With the live split the figures are the live ones; "
                                   "with another, compared per route and tier.")
    r.add_argument("trace", metavar="TRACE",
                   help="a giul-trace-<node>-<pid>.jsonl file (its rotated parts are read too), "
                        "or a directory: each trace in it, in turn")
    r.add_argument("--split", choices=SPLITS, default=None,
                   help="share each span by time, tokens or phases (default: the live split)")
    r.add_argument("--idle-w", type=watts, default=None,
                   help="replay with this idle floor in W (default: the live one)")
    r.add_argument("--json", action="store_true", help="print one JSON document")
    r.set_defaults(run=replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except ConfigError as exc:
        _fail(exc)
        return 2
    try:
        args = parser.parse_args(argv)
        if args.command == "probe":
            _check_probe(parser, args)
        if args.command == "demo":
            _check_demo(parser, args)
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
