"""`giul-asgi demo`: the simulated upstream and the example gateway in one process, on 127.0.0.1.

Two uvicorn servers share one event loop: the simulated upstream (its models and the
cards they load, served as a giul-agent serves real ones) and ``examples/openai_gateway.py``
metering every answer on the card its model ran on. The sockets are bound before either
server starts, so the gateway's configuration can name the upstream's real address (port 0
picks a free one). Ctrl-C or SIGTERM stops the gateway first (its ledgers stop reading the
cards), then the upstream. With ``--upstream URL`` nothing is simulated: the gateway meters
that upstream on the nodes of ``--config`` (or the local GPUs).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import uvicorn

from ..errors import ConfigError, GiulError

#: Where examples/gateway.toml expects the demo upstream; rewritten to where it really is.
DEMO_UPSTREAM = "http://127.0.0.1:8001"
GATEWAY_MODULE = "giul_openai_gateway"


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the signals to the demo, which stops both servers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True, slots=True)
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    upstream_port: int = 8001
    upstream: str | None = None  # a real OpenAI-compatible upstream: nothing simulated
    config: Path | None = None
    idle_w: float | None = None
    load: int = 0
    concurrency: int = 16
    serve: bool = False
    seed: int = 0
    target: str | None = None  # a gateway already running: --load goes there, nothing starts


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so the port is known (and taken) before any server starts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise GiulError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                        remedy="pick another port (--port, --upstream-port; 0 takes a free one)") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def gateway_module() -> ModuleType:
    """examples/openai_gateway.py: beside the package in a clone, or packaged with it in a wheel."""
    if GATEWAY_MODULE in sys.modules:
        return sys.modules[GATEWAY_MODULE]
    path = Path(__file__).resolve().parents[2] / "examples" / "openai_gateway.py"
    if not path.exists():
        try:
            return importlib.import_module("giul_asgi.demo.openai_gateway")
        except ModuleNotFoundError:
            raise GiulError("the example gateway (examples/openai_gateway.py) is not installed",
                            remedy="run the demo from a clone: pip install -e '.[demo]'") from None
    spec = importlib.util.spec_from_file_location(GATEWAY_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[GATEWAY_MODULE] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[GATEWAY_MODULE]
        raise
    return module


def gateway_data(options: DemoOptions, upstream_url: str | None, default_config: Path) -> dict[str, Any]:
    """The gateway's configuration as a dict: the file, pointed at the upstream actually served."""
    if options.upstream is not None and options.config is None:
        node: dict[str, Any] = {"name": "local", "reader": "auto", "gpus": []}
        if options.idle_w is not None:
            node["idle_w"] = options.idle_w
        return {"node": [node], "tier": [{"name": "default"}],
                "model": [{"name": "*", "upstream": options.upstream, "node": "local", "tier": "default"}]}
    path = options.config or default_config
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found", remedy="check --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    if options.upstream is not None:
        for model in _tables(data, "model"):
            model["upstream"] = options.upstream
    elif upstream_url is not None:
        rebase(data, DEMO_UPSTREAM, upstream_url)
    return data


def rebase(data: Mapping[str, Any], old: str, new: str) -> None:
    """Point the nodes' ``url`` and the models' ``upstream`` that start with ``old`` at ``new``."""
    for table, key in (("node", "url"), ("model", "upstream")):
        for entry in _tables(data, table):
            value = entry.get(key)
            if isinstance(value, str) and (value == old or value.startswith(old + "/")):
                entry[key] = new + value[len(old):]


def _tables(data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    value = [value] if isinstance(value, dict) else value
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _config(app: Any) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


async def _serve(server: QuietServer, sock: socket.socket) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:  # uvicorn's way to say the app's startup failed
        raise GiulError(f"the server stopped at startup (uvicorn exit status {exc.code})",
                        remedy="see the log lines above") from None


async def _start(server: QuietServer, sock: socket.socket, what: str,
                 timeout: float = 30.0) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(_serve(server, sock), name=what)
    deadline = time.monotonic() + timeout
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
            raise GiulError(f"the {what} did not start", remedy="the log lines above say why")
        await asyncio.sleep(0.01)
    return task


async def run_demo(options: DemoOptions, *, say: Callable[[str], None] = print) -> int:
    """Serve until Ctrl-C/SIGTERM, or until ``--load`` is done (unless ``serve``). Exit status.
    With ``target``, only the load, sent to that gateway."""
    if options.target is not None:
        return await load_target(options, say=say)
    from .upstream import Upstream

    gateway = gateway_module()
    simulated = options.upstream is None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    servers: list[tuple[QuietServer, asyncio.Task[None]]] = []
    sockets: list[socket.socket] = []
    try:
        up_sock = bind(options.host, options.upstream_port) if simulated else None
        if up_sock is not None:
            sockets.append(up_sock)
        gw_sock = bind(options.host, options.port)
        sockets.append(gw_sock)
        upstream_url = _url(up_sock) if up_sock is not None else None
        data = gateway_data(options, upstream_url, Path(gateway.DEFAULT_CONFIG))
        config = gateway.load_gateway_config(data)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if up_sock is not None:
            upstream = Upstream(seed=options.seed)
            server = QuietServer(_config(upstream.app))
            servers.append((server, await _start(server, up_sock, "simulated upstream")))
        server = QuietServer(_config(gateway.create_app(config)))
        servers.append((server, await _start(server, gw_sock, "gateway")))
        api = _url(gw_sock)
        say(f"giul-asgi demo: the gateway is up ({'simulated upstream' if simulated else options.upstream})")
        say(f"  API        {api}/v1   (OPENAI_BASE_URL={api}/v1, any API key)")
        say(f"  energy     {api}/energy")
        say(f"  page       {api}/energy/ui")
        if upstream_url is not None:
            say(f"  upstream   {upstream_url}/v1   (its simulated cards: {upstream_url}/readings)")
        say("ready")
        status = 0
        if options.load > 0:
            status = await _load(api, options, stop, say)
        if options.serve or options.load <= 0:
            say("serving; Ctrl-C stops")
            await stop.wait()
        return status
    finally:
        for server, task in reversed(servers):  # the gateway first: its readers stop before the cards
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10.0)
        for sock in sockets:
            sock.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def load_target(options: DemoOptions, *, say: Callable[[str], None] = print) -> int:
    """``--load N --target URL``: the demo's load and table against a gateway already running
    (no port of ours is taken, so it can be pointed at a demo serving beside it)."""
    import httpx

    assert options.target is not None
    api = options.target.removesuffix("/v1")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        say(f"giul-asgi demo: loading the gateway at {api} (chat completions, streamed and not)")
        return await _load(api, options, stop, say, chat_only=True)
    except (httpx.HTTPError, RuntimeError) as exc:
        raise GiulError(f"cannot load the gateway at {api}: {type(exc).__name__}: {exc}",
                        remedy="start one (giul-asgi demo --serve) or check --target; it must "
                               "serve the OpenAI API under /v1 (GET /v1/models lists its models)",
                        ) from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def _load(api: str, options: DemoOptions, stop: asyncio.Event, say: Callable[[str], None],
                chat_only: bool = False) -> int:
    """The load and its table. ``chat_only``: a gateway not ours promises /v1/chat/completions
    alone (a stranger's gateway answered the text completions and embeddings 404)."""
    from .load import Plan, format_table, run_load, summarise

    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # the demo extra brings it; without it, no bar
        tqdm = None

    bar = tqdm(total=options.load, unit="req", desc="load", file=sys.stderr) if tqdm else None
    plan = Plan(requests=options.load, concurrency=options.concurrency, seed=options.seed)
    if chat_only:
        plan = dataclasses.replace(plan, embed_share=0.0, completion_share=0.0)
    started = time.perf_counter()
    work = asyncio.ensure_future(run_load(api, plan, progress=bar.update if bar else None))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if bar is not None:
            bar.close()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        say("load interrupted")
        return 1
    outcomes = work.result()
    elapsed = time.perf_counter() - started
    failed = [o for o in outcomes if o.error is not None]
    say(f"\n{len(outcomes)} requests in {elapsed:.1f} s ({len(failed)} failed), "
        f"concurrency {options.concurrency}:\n")
    say(format_table(summarise(outcomes)))
    for o in failed[:3]:
        say(f"  failed: {o.route} {o.model}: {o.error}")
    return 1 if failed else 0
