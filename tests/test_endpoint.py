"""/energy: the documented JSON, filters, access rules, records by id, the page by Accept."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.records import RecordStore
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats

DOCS = Path(__file__).parent.parent / "docs" / "energy-schema.md"


@dataclass
class Totals:
    """The CONTRACTS' LedgerTotals fields, for a fake ledger."""

    node: str
    measured_j: float = 0.0
    charged_j: float = 0.0
    unattributed_j: float = 0.0
    foreign_j: float = 0.0
    in_flight_j: float = 0.0
    conservation_error_j: float = 0.0
    idle_w: float | None = 60.0
    mean_concurrency: float | None = 1.0
    foreign_watts: float | None = None
    contended: bool | None = False
    reads: int = 0
    read_errors: int = 0
    last_error: str | None = None
    last_reading_age_s: float | None = 0.05
    resets: int = 0
    period_s: float | None = 0.1
    lost_s: float = 0.0
    windows_open: int = 0


@dataclass
class NodeName:
    name: str


class FakeLedger:
    def __init__(self, name: str) -> None:
        self.node = NodeName(name)
        self.t = Totals(name)

    def totals(self) -> Totals:
        return self.t


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def fed_stats(clock: Clock | None = None) -> EnergyStats:
    stats = EnergyStats(clock=clock or Clock())
    for i in range(40):
        stats.record(Energy(1.0 + i, "measured", node=f"gpu{i % 2}", tier="8b", route=f"/v1/r{i % 3}",
                            seconds=0.2, tokens=5), outcome="ok", status=200)
    return stats


def client(app: Any, host: str = "127.0.0.1") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(host, 5000)),
                             base_url="http://gw")


@pytest.mark.anyio
async def test_json_follows_the_documented_schema() -> None:
    ledgers = [FakeLedger("gpu0"), FakeLedger("gpu1"), FakeLedger("idle-node")]
    app = EnergyEndpoint(stats=fed_stats(), ledgers=ledgers)
    async with client(app) as c:
        data = (await c.get("/energy", params={"window": "all"})).json()
    documented = _documented_keys()
    assert data["schema"] == "giul-asgi/energy/3"
    assert set(data) == documented["Top level"]
    assert set(data["totals"]) == documented["Summary"]
    assert set(data["series"]) == documented["`series`"]
    assert data["totals"]["requests"] == 40 and data["totals"]["joules"]["sum"] == sum(range(1, 41))
    assert data["nodes"]["gpu0"]["ledger"]["idle_w"] == 60.0
    assert data["nodes"]["idle-node"]["requests"] == 0  # a ledger with no request yet is listed
    doc = DOCS.read_text()
    for field in data["nodes"]["gpu0"]["ledger"]:
        assert f"`{field}`" in doc


def _documented_keys() -> dict[str, set[str]]:
    sections: dict[str, set[str]] = {}
    current = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        elif current and (m := re.match(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)*", line)):
            names = re.findall(r"`([a-z_]+)`", line.split("|")[1])
            sections.setdefault(current, set()).update(names)
            assert m
    return sections


@pytest.mark.anyio
async def test_filters_keep_one_row_and_a_bad_window_is_a_400() -> None:
    app = EnergyEndpoint(stats=fed_stats(), ledgers=[FakeLedger("gpu0"), FakeLedger("gpu1")])
    async with client(app) as c:
        data = (await c.get("/energy?window=1h&route=/v1/r1&node=gpu1")).json()
        assert list(data["routes"]) == ["/v1/r1"] and list(data["nodes"]) == ["gpu1"]
        assert data["totals"]["requests"] == 40 and data["window"] == "1h"
        bad = await c.get("/energy?window=3d")
        assert bad.status_code == 400 and "use one of" in bad.json()["remedy"]
        assert (await c.post("/energy")).status_code == 405
        assert (await c.get("/energy/nope")).status_code == 404


@pytest.mark.anyio
async def test_only_loopback_clients_by_default() -> None:
    app = EnergyEndpoint(stats=fed_stats(), ledgers=[])
    async with client(app, host="10.1.2.3") as c:
        r = await c.get("/energy")
        assert r.status_code == 403 and "token=" in r.json()["remedy"]
    async with client(app, host="::1") as c:
        assert (await c.get("/energy")).status_code == 200


@pytest.mark.anyio
async def test_the_loopback_refusal_names_the_middlewares_own_settings() -> None:
    """The 403's remedy said "give it a token= or a guard="; the middleware's settings are
    endpoint_token= and endpoint_guard=, and token= is itself a bad setting (issue 21)."""
    from starlette.applications import Starlette

    from giul_asgi import EnergyMiddleware, Ledgers, Node

    app = EnergyMiddleware(Starlette(), nodes=[Node("n", reader="none")], ledgers=Ledgers())
    async with client(app, host="10.1.2.3") as c:
        r = await c.get("/energy")
    remedy = r.json()["remedy"]
    assert r.status_code == 403 and "endpoint_token=" in remedy and "endpoint_guard=" in remedy
    assert " token=" not in remedy and " guard=" not in remedy
    standalone = EnergyEndpoint(stats=fed_stats(), ledgers=[])  # its own settings: token=, guard=
    async with client(standalone, host="10.1.2.3") as c:
        remedy = (await c.get("/energy")).json()["remedy"]
    assert "set token=" in remedy and "guard=" in remedy and "endpoint_" not in remedy


@pytest.mark.anyio
async def test_a_token_is_required_when_given_from_anywhere() -> None:
    app = EnergyEndpoint(stats=fed_stats(), ledgers=[], token="s3cret-token-0123", metrics_path="/metrics")
    async with client(app, host="10.1.2.3") as c:
        assert (await c.get("/energy")).status_code == 401
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/energy", headers={"Authorization": "Bearer wrong-token"})).status_code == 401
        ok = await c.get("/energy", headers={"Authorization": "Bearer s3cret-token-0123"})
        assert ok.status_code == 200
        assert (await c.get("/energy/ui?token=s3cret-token-0123")).status_code == 200


@pytest.mark.anyio
async def test_a_guard_decides_and_a_failing_guard_refuses() -> None:
    async def guard(scope: dict[str, Any]) -> bool:
        return dict(scope["headers"]).get(b"x-ops") == b"yes"

    def broken(scope: dict[str, Any]) -> bool:
        raise RuntimeError("boom")

    async with client(EnergyEndpoint(stats=fed_stats(), ledgers=[], guard=guard), "10.0.0.9") as c:
        assert (await c.get("/energy")).status_code == 403
        assert (await c.get("/energy", headers={"x-ops": "yes"})).status_code == 200
    async with client(EnergyEndpoint(stats=fed_stats(), ledgers=[], guard=broken)) as c:
        assert (await c.get("/energy")).status_code == 403


@pytest.mark.anyio
async def test_a_request_record_is_served_settled_for_a_bounded_time() -> None:
    now = [0.0]
    records = RecordStore(max_records=2, max_age_s=60, clock=lambda: now[0])
    app = EnergyEndpoint(stats=fed_stats(), ledgers=[], records=records)
    first = Energy(5.0, "measured", id="req-1", settled=False)
    records.put(first)
    records.put(Energy(5.5, "measured", id="req-1", settled=True))  # the settled figure
    async with client(app) as c:
        r = (await c.get("/energy/requests/req-1")).json()
        assert r["schema"] == "giul-asgi/energy-record/1"
        assert r["record"]["settled"] is True and r["record"]["joules"] == 5.5
        now[0] = 61.0
        assert (await c.get("/energy/requests/req-1")).status_code == 404
    records.put(Energy(1.0, "measured", id="a"))
    records.put(Energy(1.0, "measured", id="b"))
    records.put(Energy(1.0, "measured", id="c"))
    records.put(Energy(1.0, "measured", id=None))  # no id: ignored
    assert len(records) == 2 and records.get("a") is None and records.get("c") is not None


@pytest.mark.anyio
async def test_a_browser_gets_the_page() -> None:
    app = EnergyEndpoint(stats=fed_stats(), ledgers=[])
    async with client(app) as c:
        page = await c.get("/energy", headers={"Accept": "text/html,application/xhtml+xml"})
        assert page.headers["content-type"].startswith("text/html") and b"uPlot" in page.content
        assert b"https://" not in page.content.split(b"<script>")[0]  # nothing fetched elsewhere
        assert (await c.get("/energy?format=json", headers={"Accept": "text/html"})).json()


def test_handles_its_paths_only() -> None:
    app = EnergyEndpoint(stats=EnergyStats(), ledgers=None, metrics_path="/metrics")
    assert app.handles("/energy") and app.handles("/energy/ui") and app.handles("/energy/requests/x")
    assert app.handles("/metrics") and not app.handles("/energyx") and not app.handles("/v1/chat")


def test_bad_configuration_is_refused() -> None:
    for kwargs in ({"path": "energy"}, {"path": "/energy/"}, {"token": "short"}, {"guard": 3},
                   {"metrics_path": "metrics"}):
        with pytest.raises(ConfigError):
            EnergyEndpoint(stats=EnergyStats(), ledgers=None, **kwargs)
    with pytest.raises(ConfigError):
        RecordStore(max_records=0)
    with pytest.raises(ConfigError):
        RecordStore(max_age_s=-1)
