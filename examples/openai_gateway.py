"""An OpenAI-compatible gateway that tells each client what its answer cost in joules.

It proxies ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
``/v1/models`` to one or more OpenAI-compatible upstreams (vLLM, TGI, a llama.cpp server),
picks the upstream by the request's ``model``, and tells the meter which node and tier the
request ran on, so the energy is read from the card that did the work::

    python examples/openai_gateway.py --config examples/gateway.toml --port 8000
    uvicorn --factory examples.openai_gateway:app_from_env --port 8000   # GIUL_GATEWAY_CONFIG=...

The configuration (``examples/gateway.toml``) is giul-asgi's own ``[[node]]`` and ``[[tier]]``
tables plus one ``[[model]]`` table per model: ``name`` (``"*"`` catches the rest),
``upstream`` (the base URL a client would give the openai library: ``http://host:port/v1``),
``node``, ``tier``, and ``api_key_env`` (the environment variable holding the upstream's
key, if it needs one). The client's own credentials are never forwarded.

Streams pass through chunk by chunk. For a streamed answer the gateway asks the upstream for
the final usage chunk (``stream_options.include_usage``), so the meter knows how many tokens
were written; a client that did not ask for that chunk does not get it: the gateway reads
the token count from it, hands it to the meter and drops it. An upstream that is down or
too slow is a 502 or a 504 in OpenAI's error shape, never a hang.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tomllib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from giul_asgi import ConfigError, Node, Tier, current_meter, load_config

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "gateway.toml"
STREAMED_USAGE = ("chat/completions", "completions")  # the routes whose streams can end with usage
TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=30.0)


@dataclass(frozen=True, slots=True)
class Model:
    """Where requests for one model go: its upstream, and the node and tier it runs on."""

    name: str
    upstream: str
    node: str | None = None
    tier: str | None = None
    api_key_env: str | None = None

    def url(self, path: str) -> str:
        return f"{self.upstream.rstrip('/')}/{path}"

    def headers(self) -> dict[str, str]:
        headers = {"accept-encoding": "identity"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if key:
                headers["authorization"] = f"Bearer {key}"
        return headers


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The nodes and tiers giul-asgi meters, and the models the gateway routes."""

    nodes: tuple[Node, ...]
    tiers: tuple[Tier, ...]
    models: tuple[Model, ...]

    def model(self, name: Any) -> Model | None:
        """The model table for a request's ``model``: its own, else the catch-all ``"*"``."""
        if not isinstance(name, str):
            return None
        exact = next((m for m in self.models if m.name == name), None)
        return exact or next((m for m in self.models if m.name == "*"), None)

    def upstreams(self) -> list[str]:
        return list(dict.fromkeys(m.upstream for m in self.models))


def load_gateway_config(source: str | Path | Mapping[str, Any]) -> GatewayConfig:
    """Read a gateway TOML (or the same as a dict); a bad key is named in a ConfigError."""
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            data: dict[str, Any] = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"gateway config {str(path)!r} not found",
                              remedy="give --config the path of a gateway TOML") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"gateway config {str(path)!r} is not valid TOML: {exc}") from None
    else:
        data = dict(source)
    raw_models = data.pop("model", [])
    if isinstance(raw_models, Mapping):
        raw_models = [raw_models]
    if not isinstance(raw_models, list) or not raw_models:
        raise ConfigError("the gateway needs at least one [[model]] table",
                          remedy='add [[model]] name = "...", upstream = "http://host:port/v1"')
    config = load_config(data)
    node_names = {n.name for n in config.nodes}
    tier_names = {t.name for t in config.tiers}
    models = tuple(_model(raw, i, node_names, tier_names) for i, raw in enumerate(raw_models))
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError("two [[model]] tables have the same name", remedy="names must be unique")
    return GatewayConfig(nodes=config.nodes, tiers=config.tiers, models=models)


def _model(raw: Any, i: int, nodes: set[str], tiers: set[str]) -> Model:
    where = f"model[{i}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table")
    allowed = {"name", "upstream", "node", "tier", "api_key_env"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}", remedy=f"allowed keys: {sorted(allowed)}")
    for key in ("name", "upstream"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}.{key} must be a non-empty string")
    for key in ("node", "tier", "api_key_env"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise ConfigError(f"{where}.{key} must be a non-empty string")
    parts = urlsplit(raw["upstream"])
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}.upstream must be an http(s) URL, got {raw['upstream']!r}",
                          remedy="write the base URL a client gives the openai library, "
                                 "such as http://127.0.0.1:8001/v1")
    if "node" in raw and raw["node"] not in nodes:
        raise ConfigError(f"{where}.node: no [[node]] named {raw['node']!r}")
    if "tier" in raw and raw["tier"] not in tiers:
        raise ConfigError(f"{where}.tier: no [[tier]] named {raw['tier']!r}")
    return Model(**{k: raw[k] for k in allowed if k in raw})


def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    """An error in the shape the openai client parses."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status)


def create_app(config: GatewayConfig, *, meter: bool = True, timeout: httpx.Timeout = TIMEOUT,
               transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The gateway app. ``meter=False`` leaves giul-asgi out (a plain proxy, for comparison)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One client for every upstream: its pool keeps connections open between requests.
        async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
            app.state.client = client
            yield

    app = FastAPI(title="giul-asgi OpenAI-compatible gateway", lifespan=lifespan)

    async def proxy(request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the body must be JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        model = config.model(body.get("model"))
        if model is None:
            return error(404, f"The model `{body.get('model')}` is not served here.",
                         "invalid_request_error", "model_not_found")
        energy = current_meter()
        if energy is not None:  # None when the gateway runs without the middleware
            energy.bind(node=model.node, tier=model.tier)
        streamed = body.get("stream") is True
        strip_usage = False
        if streamed and path in STREAMED_USAGE:
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, Mapping) else {}
            if not options.get("include_usage"):
                body["stream_options"] = {**options, "include_usage": True}
                strip_usage = True
        client: httpx.AsyncClient = request.app.state.client
        upstream = client.build_request("POST", model.url(path), json=body, headers=model.headers())
        try:
            answer = await client.send(upstream, stream=True)
        except httpx.TimeoutException as exc:
            return error(504, f"upstream {model.upstream} did not answer in time ({type(exc).__name__})",
                         "upstream_timeout")
        except httpx.HTTPError as exc:
            return error(502, f"upstream {model.upstream} is unreachable: {exc or type(exc).__name__}",
                         "upstream_unreachable")
        media = answer.headers.get("content-type", "application/json")
        if not streamed or not media.startswith("text/event-stream"):
            try:
                content = await answer.aread()
            except httpx.HTTPError as exc:
                return error(502, f"upstream {model.upstream} broke off its answer: {exc}", "upstream_error")
            finally:
                await answer.aclose()
            return Response(content, status_code=answer.status_code, media_type=media)
        chunks = relay_events(answer, energy) if strip_usage else relay_bytes(answer)
        return StreamingResponse(chunks, status_code=answer.status_code, media_type=media,
                                 headers={"cache-control": "no-cache"})

    async def chat(request: Request) -> Response:
        return await proxy(request, "chat/completions")

    async def completions(request: Request) -> Response:
        return await proxy(request, "completions")

    async def embeddings(request: Request) -> Response:
        return await proxy(request, "embeddings")

    async def models(request: Request) -> Response:
        client: httpx.AsyncClient = request.app.state.client
        listed = await asyncio.gather(*(_list(client, config, u) for u in config.upstreams()))
        if all(entries is None for entries in listed):
            return error(502, "no upstream answered /v1/models", "upstream_unreachable")
        data = [entry for entries in listed for entry in entries or ()]
        return JSONResponse({"object": "list", "data": list({e["id"]: e for e in data}.values())})

    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    if meter:
        _add_energy(app, config)
    return app


def _add_energy(app: FastAPI, config: GatewayConfig) -> None:
    """giul-asgi on the whole app: every /v1 request metered on the node of its model."""
    from giul_asgi import EnergyMiddleware, Route

    first = config.models[0]
    app.add_middleware(
        EnergyMiddleware,
        nodes=list(config.nodes),
        tiers=list(config.tiers),
        # A request lands on its model's node once the handler has read the body (bind);
        # until then, and for a request that names no known model, on the first model's.
        routes=[Route("/v1/*", node=first.node, tier=first.tier)],
        exclude=["/v1/models"],  # listing models costs no card any energy
    )


async def _list(
    client: httpx.AsyncClient, config: GatewayConfig, upstream: str
) -> list[dict[str, Any]] | None:
    """The models an upstream lists that this gateway routes to it; None when it did not answer."""
    try:
        r = await client.get(f"{upstream.rstrip('/')}/models")
        r.raise_for_status()
        data = r.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    here = [m for m in config.models if m.upstream == upstream]
    catch_all = any(m.name == "*" for m in here)
    names = {m.name for m in here}
    return [e for e in data if isinstance(e, dict) and "id" in e and (catch_all or e["id"] in names)]


async def relay_bytes(answer: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's stream as it arrives."""
    try:
        async for chunk in answer.aiter_bytes():
            yield chunk
    except httpx.HTTPError as exc:
        yield _stream_error(f"the upstream broke off its stream: {exc or type(exc).__name__}")
    finally:
        await answer.aclose()


async def relay_events(answer: httpx.Response, energy: Any) -> AsyncIterator[bytes]:
    """The stream event by event, less the usage the gateway asked for and the client did not.

    The usage chunk's ``completion_tokens`` goes to the meter, which is what it was asked for;
    the ``"usage": null`` the upstream then puts on every other chunk goes too.
    """
    buffer = b""
    try:
        async for chunk in answer.aiter_bytes():
            buffer += chunk
            events, buffer = _split_events(buffer)
            out = [kept for event in events if (kept := _without_usage(event, energy)) is not None]
            if out:
                yield b"".join(out)
        if buffer:
            yield buffer
    except httpx.HTTPError as exc:
        yield _stream_error(f"the upstream broke off its stream: {exc or type(exc).__name__}")
    finally:
        await answer.aclose()


def _split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank line) and what is left over."""
    buffer = buffer.replace(b"\r\n", b"\n")
    *events, rest = buffer.split(b"\n\n")
    return [e + b"\n\n" for e in events], rest


def _without_usage(event: bytes, energy: Any) -> bytes | None:
    if b'"usage"' not in event:
        return event
    lines = event.rstrip(b"\n").split(b"\n")
    data = b"\n".join(line[5:].lstrip(b" ") for line in lines if line.startswith(b"data:"))
    try:
        obj = json.loads(data)
    except ValueError:
        return event
    if not isinstance(obj, dict) or "usage" not in obj:
        return event
    usage = obj.pop("usage")
    if isinstance(usage, Mapping) and not obj.get("choices"):
        tokens = usage.get("completion_tokens")
        if energy is not None and isinstance(tokens, int):
            energy.tokens(tokens)
        return None  # the chunk the client did not ask for
    others = [line for line in lines if not line.startswith(b"data:")]
    return b"\n".join([*others, b"data: " + json.dumps(obj, separators=(",", ":")).encode()]) + b"\n\n"


def _stream_error(message: str) -> bytes:
    """What a stream ends with when its upstream fails mid-way (the openai client raises on it)."""
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def app_from_env() -> FastAPI:
    """For ``uvicorn --factory``: the config named by ``GIUL_GATEWAY_CONFIG``, else gateway.toml.
    A bad one is one line and exit status 3, as a failed startup is (not uvicorn's traceback)."""
    try:
        return create_app(load_gateway_config(os.environ.get("GIUL_GATEWAY_CONFIG", DEFAULT_CONFIG)))
    except ConfigError as exc:
        print(f"giul-asgi gateway: {exc}", file=sys.stderr)
        raise SystemExit(3) from None


def main(argv: Iterable[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="gateway TOML")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        app = create_app(load_gateway_config(args.config))
    except ConfigError as exc:
        print(f"giul-asgi gateway: {exc}", file=sys.stderr)
        return 2
    # INFO: each node's reader line at startup (the README points to it); no access lines.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
