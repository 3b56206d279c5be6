"""/energy and giul-agent apply the same access rules (giul_asgi.serve.access), fed the same bad input.

Both servers are driven in process through httpx's ASGI transport, with the client address set;
a real uvicorn run of the agent's token check is in tests/test_agent.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from giul_asgi.agent import build_server, main, make_app
from giul_asgi.errors import ConfigError
from giul_asgi.serve.access import (
    MIN_TOKEN_CHARS,
    bearer_credentials,
    check_token,
    client_is_loopback,
    is_loopback,
    token_matches,
)
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats

TOKEN = "k9-Vq2_x7Lm~Rt4+Zs/8=="  # 22 characters of RFC 6750's b64token alphabet


class OneGpu:
    """A GPU source that always reads the same figures."""

    simulated = True
    gpu_indices = (0,)

    def read_gpus(self) -> list[dict[str, Any]]:
        return [{"index": 0, "uuid": "GPU-a", "name": "a", "t": time.monotonic(), "energy_j": 1.0,
                 "power_w": 100.0, "mig": False, "error": None}]

    def close(self) -> None:
        pass


def endpoint(token: str | None) -> tuple[Any, str]:
    return EnergyEndpoint(stats=EnergyStats(), ledgers=[], token=token), "/energy"


def agent(token: str | None) -> tuple[Any, str]:
    return make_app(OneGpu(), token=token, cache_s=0.0), "/readings"


SERVERS: dict[str, Callable[[str | None], tuple[Any, str]]] = {"endpoint": endpoint, "agent": agent}
BAD_TOKENS = {
    "one character": "x",
    "blank": "",
    "whitespace": "   \t",
    "short": "a" * (MIN_TOKEN_CHARS - 1),
    "inner space": "abcdefgh ijklmnopq",
    "padded": f" {TOKEN} ",
    "newline": TOKEN + "\n",
    "not text": b"0123456789abcdefgh",
}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_a_bad_token_is_refused_when_the_server_is_built(server: str, bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SERVERS[server](BAD_TOKENS[bad])  # type: ignore[arg-type]
    assert "secrets.token_urlsafe(32)" in caught.value.remedy


@pytest.mark.parametrize("given", ["x", "", "   "])
def test_the_agent_server_refuses_a_bad_token_before_binding(given: str) -> None:
    with pytest.raises(ConfigError, match="token"):
        build_server(host="127.0.0.1", port=0, reader=OneGpu(), token=given)


def test_the_agent_command_refuses_a_one_character_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "token"
    short.write_text("x\n")
    assert main(["--token-file", str(short)]) == 2
    assert "token_urlsafe" in capsys.readouterr().err


def client(app: Any, host: str = "10.1.2.3") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(host, 5000)), base_url="http://h")


@pytest.mark.anyio
@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("authorization", "status"), [
    (f"Bearer {TOKEN}", 200),
    (f"bearer {TOKEN}", 200),
    (f"BEARER {TOKEN}", 200),
    (f"BeArEr   {TOKEN}  ", 200),  # RFC 9110: 1*SP after the scheme; the value's edges are trimmed
    (None, 401),
    ("Bearer wrong-token-0123456789", 401),
    (f"Bearer {TOKEN}x", 401),
    (f"Bearer {TOKEN[:-1]}", 401),
    (TOKEN, 401),  # no scheme
    (f"Basic {TOKEN}", 401),
    (f"Bearer{TOKEN}", 401),
    ("Bearer", 401),
    ("Bearer ", 401),
    ("Bearer \u00e9t\u00e9-0123456789abcdef".encode("latin-1"), 401),  # not ASCII: refused, not a crash
])
async def test_the_bearer_scheme_is_case_insensitive_and_the_token_exact(
    server: str, authorization: str | bytes | None, status: int
) -> None:
    app, path = SERVERS[server](TOKEN)
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with client(app) as c:
        r = await c.get(path, headers=headers)
    assert r.status_code == status
    if status == 401:
        assert r.headers["www-authenticate"].startswith("Bearer realm=")


@pytest.mark.anyio
async def test_the_endpoint_serves_loopback_only_without_token_or_guard() -> None:
    app, path = endpoint(None)
    async with client(app, "10.1.2.3") as c:
        refused = await c.get(path)
    assert refused.status_code == 403 and "token=" in refused.json()["remedy"]
    for host in ("127.0.0.1", "127.8.9.10", "::1"):
        async with client(app, host) as c:
            assert (await c.get(path)).status_code == 200, host


@pytest.mark.anyio
async def test_the_agent_health_check_stays_open_and_others_need_the_token() -> None:
    app, _ = agent(TOKEN)
    async with client(app) as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/metrics")).status_code == 401


def test_parsing_and_comparison_helpers() -> None:
    assert bearer_credentials([(b"Authorization", b"bEaReR abc")]) == b"abc"
    assert bearer_credentials([(b"x-other", b"Bearer abc")]) is None
    # The first Authorization header decides; a second cannot smuggle a token in.
    assert bearer_credentials([(b"authorization", b"Basic zz"), (b"authorization", b"Bearer abc")]) is None
    assert token_matches("\u00e9", TOKEN) is False and token_matches(None, TOKEN) is False
    assert token_matches(TOKEN.encode(), TOKEN) and token_matches(TOKEN, TOKEN)
    assert check_token(None) is None and check_token(TOKEN) == TOKEN
    assert is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.0.2")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.org") and not is_loopback("")
    assert not client_is_loopback({}) and not client_is_loopback({"client": None})
    assert client_is_loopback({"client": ("127.0.0.1", 1)})
