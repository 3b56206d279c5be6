"""The examples run as written: the OpenAI gateway proxies, streams, routes by model, fails cleanly.

The gateway is tested here without giul-asgi's middleware (``meter=False``): what it does as a
proxy. tests/test_demo.py drives it metered, through the demo.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server import free_port, serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from giul_asgi import ConfigError
from giul_asgi.demo.engine import Speed
from giul_asgi.demo.upstream import SimGpu, SimModel, Upstream

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from examples import openai_gateway as gw  # noqa: E402


def config(upstreams: dict[str, str]) -> gw.GatewayConfig:
    """Two nodes read by nothing (the proxy is what is tested), one model per upstream."""
    return gw.load_gateway_config({
        "node": [{"name": "a", "reader": "none"}, {"name": "b", "reader": "none"}],
        "tier": [{"name": "big"}, {"name": "small"}],
        "model": [{"name": name, "upstream": url + "/v1", "node": "a" if i == 0 else "b",
                   "tier": "big" if i == 0 else "small"}
                  for i, (name, url) in enumerate(upstreams.items())],
    })


FAST = Speed(step_s=0.002, per_seq_w=100.0)


@pytest.fixture(scope="module")
def two_upstreams() -> Iterator[dict[str, str]]:
    one = Upstream((SimGpu(0, "A", 50.0, 500.0),), (SimModel("m-big", 0, FAST),
                                                    SimModel("m-emb", 0, FAST, embedding=True)))
    two = Upstream((SimGpu(0, "B", 20.0, 100.0),), (SimModel("m-small", 0, FAST),))
    with serve(one.app) as a, serve(two.app) as b:
        yield {"m-big": a, "m-small": b, "m-emb": a}


@pytest.fixture(scope="module")
def gateway(two_upstreams: dict[str, str]) -> Iterator[str]:
    with serve(gw.create_app(config(two_upstreams), meter=False)) as url:
        yield url


def test_openai_client_works_through_the_gateway_unchanged(gateway: str, closing: Any) -> None:
    client = closing(openai.OpenAI(base_url=gateway + "/v1", api_key="unused"))
    for model in ("m-big", "m-small"):
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert answer.model == model and answer.usage is not None
        assert answer.usage.completion_tokens == 3
    text = client.completions.create(model="m-small", prompt="go", max_tokens=2)
    assert text.usage is not None and text.usage.completion_tokens == 2
    emb = client.embeddings.create(model="m-emb", input="x")
    assert len(emb.data[0].embedding) == 64
    assert sorted(m.id for m in client.models.list()) == ["m-big", "m-emb", "m-small"]


def test_a_stream_the_client_asked_usage_of_keeps_it(gateway: str, closing: Any) -> None:
    client = closing(openai.OpenAI(base_url=gateway + "/v1", api_key="unused"))
    chunks = list(client.chat.completions.create(
        model="m-big", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_a_stream_without_include_usage_gets_no_usage(gateway: str, closing: Any) -> None:
    with httpx.stream("POST", gateway + "/v1/chat/completions", json={
        "model": "m-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "stream": True,
    }) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    objects = [json.loads(e[5:]) for e in events[:-1]]
    assert all("usage" not in o for o in objects)  # not the chunk, not "usage": null either
    assert objects[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for o in objects if o["choices"][0]["delta"].get("content")) == 4
    completions = list(closing(openai.OpenAI(base_url=gateway + "/v1", api_key="x")).completions.create(
        model="m-small", prompt="go", max_tokens=3, stream=True))
    assert all(c.usage is None for c in completions) and completions[-1].choices[0].finish_reason


class Spy:
    """A fake upstream that records what the gateway sent and answers as told."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.delay = 0.0
        self.break_stream = False

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        await asyncio.sleep(self.delay)
        if not body.get("stream"):
            return JSONResponse({"id": "x", "object": "chat.completion", "choices": []})

        async def events() -> AsyncIterator[bytes]:
            head = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "spy"}
            yield b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {"content": "a"},
                                          "finish_reason": None}], "usage": None}).encode() + b"\r\n\r\n"
            if self.break_stream:
                raise RuntimeError("the upstream died mid-stream")
            yield b"data: " + json.dumps({**head, "choices": [{"index": 0, "delta": {},
                                          "finish_reason": "stop"}], "usage": None}).encode() + b"\r\n"
            yield b"\r\n"
            usage = json.dumps({**head, "choices": [], "usage": {"prompt_tokens": 1,
                                "completion_tokens": 7, "total_tokens": 8}}).encode()
            yield b"data: " + usage[:20]  # one event over two chunks
            yield usage[20:] + b"\r\n\r\ndata: [DONE]\r\n\r\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "spy", "object": "model"},
                                                          {"id": "other", "object": "model"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/v1/models", self.models)])


class FakeMeter:
    def __init__(self) -> None:
        self.counts: list[int] = []

    def tokens(self, n: int) -> None:
        self.counts.append(n)


@pytest.fixture
def spy() -> Iterator[tuple[Spy, str]]:
    s = Spy()
    with serve(s.app()) as url:
        yield s, url


def test_gateway_asks_for_usage_only_on_streams_and_strips_it(spy: tuple[Spy, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    s, url = spy
    monkeypatch.setenv("SPY_KEY", "upstream-key")
    cfg = gw.load_gateway_config({"node": [{"name": "n", "reader": "none"}], "model": [
        {"name": "*", "upstream": url + "/v1", "node": "n", "api_key_env": "SPY_KEY"}]})
    with serve(gw.create_app(cfg, meter=False)) as gateway:
        r = httpx.post(gateway + "/v1/chat/completions", json={"model": "spy", "messages": []},
                       headers={"authorization": "Bearer client-key"})
        assert r.status_code == 200
        assert "stream_options" not in s.bodies[-1]  # not streamed: nothing added
        assert s.headers[-1]["authorization"] == "Bearer upstream-key"  # never the client's
        with httpx.stream("POST", gateway + "/v1/chat/completions",
                          json={"model": "spy", "messages": [], "stream": True}) as r:
            raw = b"".join(r.iter_bytes())
        assert s.bodies[-1]["stream_options"] == {"include_usage": True}
        assert b"usage" not in raw and raw.endswith(b"data: [DONE]\n\n")
        assert raw.count(b"data: ") == 3
        body = {"model": "spy", "messages": [], "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", gateway + "/v1/chat/completions", json=body) as r:
            raw = b"".join(r.iter_bytes())
        assert b'"completion_tokens": 7' in raw  # the client asked: byte for byte
        models = httpx.get(gateway + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["spy", "other"]  # the catch-all lists them all


def test_the_stripped_usage_goes_to_the_meter() -> None:
    meter = FakeMeter()
    events, rest = gw._split_events(b'data: {"choices": [], "usage": {"completion_tokens": 5}}\n\n'
                                    b'data: {"choices": [{"index": 0}], "usage": null}\n\ndata: [DO')
    kept = [gw._without_usage(e, meter) for e in events]
    assert kept[0] is None and meter.counts == [5]
    assert kept[1] == b'data: {"choices":[{"index":0}]}\n\n'
    assert rest == b"data: [DO"
    assert gw._without_usage(b"data: not json with \"usage\"\n\n", meter) == \
        b"data: not json with \"usage\"\n\n"
    assert gw._without_usage(b'data: {"choices": []}\n\n', None) == b'data: {"choices": []}\n\n'



def test_upstream_down_is_a_502_and_slow_is_a_504(spy: tuple[Spy, str], closing: Any) -> None:
    s, url = spy
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = gw.load_gateway_config({"node": [{"name": "n", "reader": "none"}], "model": [
        {"name": "gone", "upstream": dead + "/v1", "node": "n"},
        {"name": "slow", "upstream": url + "/v1", "node": "n"}]})
    app = gw.create_app(cfg, meter=False, timeout=httpx.Timeout(0.3, connect=1.0))
    with serve(app) as gateway:
        client = closing(openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0))
        with pytest.raises(openai.APIStatusError) as down:
            client.chat.completions.create(model="gone", messages=[{"role": "user", "content": "x"}])
        assert down.value.status_code == 502 and "unreachable" in down.value.message
        s.delay = 1.0
        with pytest.raises(openai.APIStatusError) as slow:
            client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
        assert slow.value.status_code == 504
        s.delay = 0.0
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        r = httpx.post(gateway + "/v1/chat/completions", content=b"{bad")
        assert r.status_code == 400 and r.json()["error"]["message"]
        assert httpx.post(gateway + "/v1/chat/completions", json=[1]).status_code == 400
        assert httpx.post(gateway + "/v1/chat/completions", json={"model": 3}).status_code == 404
    only_dead = gw.load_gateway_config({"model": [{"name": "gone", "upstream": dead + "/v1"}]})
    with serve(gw.create_app(only_dead, meter=False)) as gateway:
        assert httpx.get(gateway + "/v1/models").status_code == 502


def test_a_stream_broken_upstream_ends_with_an_error_the_client_raises(
    spy: tuple[Spy, str], closing: Any
) -> None:
    s, url = spy
    s.break_stream = True
    cfg = gw.load_gateway_config({"model": [{"name": "*", "upstream": url + "/v1"}]})
    with serve(gw.create_app(cfg, meter=False)) as gateway:
        client = closing(openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0))
        stream = client.chat.completions.create(model="spy", messages=[], stream=True)
        with pytest.raises(openai.APIError, match="broke off"):
            list(stream)


@pytest.mark.parametrize(("data", "words"), [
    ({}, "at least one [[model]]"),
    ({"model": [{"name": "x"}]}, "upstream must be a non-empty string"),
    ({"model": [{"name": "x", "upstream": "ftp://h/v1"}]}, "http(s) URL"),
    ({"model": [{"name": "x", "upstream": "http://h/v1", "node": "nope"}]}, "no [[node]] named"),
    ({"model": [{"name": "x", "upstream": "http://h/v1", "tier": "nope"}]}, "no [[tier]] named"),
    ({"model": [{"name": "x", "upstream": "http://h/v1", "colour": 1}]}, "unknown key 'colour'"),
    ({"model": [{"name": "x", "upstream": "http://h/v1"}] * 2}, "same name"),
    ({"model": ["x"]}, "must be a table"),
    ({"model": [{"name": "x", "upstream": "http://h/v1", "node": ""}]}, "node must be"),
])
def test_bad_gateway_configs_are_refused_with_the_key_named(data: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        gw.load_gateway_config(data)
    assert words in str(exc.value)


def test_gateway_toml_files_that_are_missing_or_broken(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        gw.load_gateway_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[model]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        gw.load_gateway_config(bad)
    assert gw.main(["--config", str(tmp_path / "missing.toml")]) == 2


def test_the_shipped_gateway_toml_loads() -> None:
    cfg = gw.load_gateway_config(gw.DEFAULT_CONFIG)
    assert {m.name for m in cfg.models} == {"sim-70b", "sim-8b", "sim-embed"}
    assert {n.reader for n in cfg.nodes} == {"simulated"}
    assert all(n.url == "http://127.0.0.1:8001" for n in cfg.nodes)


def test_meter_example_runs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import giul_asgi.ledger.registry as ledger_module

    # The example uses the process's default ledgers, as a script does; other tests in this
    # process may have left a different node named "sim" there.
    fresh = ledger_module.Ledgers()
    monkeypatch.setattr(ledger_module, "_default", fresh)
    try:
        runpy.run_path(str(ROOT / "examples" / "meter_local.py"), run_name="__main__")
    finally:
        fresh.close(timeout=1.0)
    out = capsys.readouterr().out
    assert "async:" in out and "sync:" in out and "simulated" in out


def test_a_bad_config_under_uvicorn_factory_is_one_line_and_status_3(tmp_path: Path) -> None:
    """A stranger's trial: ``uvicorn --factory examples.openai_gateway:app_from_env`` (the
    example's own docstring) printed a whole traceback for a bad config, exit status 1."""
    import os
    import subprocess

    bad = tmp_path / "bad.toml"
    bad.write_text('[[model]]\nname = "m"\nupstream = "http://127.0.0.1:9/v1"\n'
                   '[[node]]\nname = "a"\nidle_ww = 1.0\n')
    env = dict(os.environ, GIUL_GATEWAY_CONFIG=str(bad), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "uvicorn", "--factory", "examples.openai_gateway:app_from_env",
               "--port", str(free_port())]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 3 and len(said) == 1 and "Traceback" not in said[0], said
    assert said[0].startswith("giul-asgi gateway: ") and "idle_ww" in said[0], said
