"""Tenants: who a request is for, never its key, in a bounded set of labels whatever the traffic.

The hash a key becomes is checked against hashlib directly (LiteLLM's ``hashed_api_key`` is
the SHA-256 hex digest of the key, so ours must be its first 16 digits). Bounds are checked
with 10,000 distinct keys through the middleware, the statistics and Prometheus text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from giul_asgi import EnergyMiddleware, Ledgers, Node, Tier, current_meter
from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.exporters.prometheus import EnergyCollector, prometheus_text
from giul_asgi.exporters.sink import JsonLinesSink
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import OTHER, EnergyStats
from giul_asgi.tenants import MAX_NAME, UNSEEN_AFTER, TenantPlaces, hashed, tenant_name, tenant_source

SECRET = "sk-live-4f9c2a7be01d44c39a1f"
J_PER_TOKEN = 0.3  # Tier("8b", 300.0): 300 J per 1k tokens, estimated (no reader)


def litellm_hash(key: str) -> str:
    """LiteLLM's ``hash_token``: the SHA-256 hex digest of the key as sent (no scheme)."""
    return hashlib.sha256(key.encode()).hexdigest()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    headers = dict(scope["headers"])
    bind = headers.get(b"x-bind")
    if bind is not None:
        meter = current_meter()
        assert meter is not None
        meter.bind(tenant=bind.decode())
    tokens = int(headers.get(b"x-tokens", b"10"))
    body = json.dumps({"usage": {"completion_tokens": tokens}}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def middleware(**kwargs: Any) -> EnergyMiddleware:
    return EnergyMiddleware(app, nodes=[Node("dark", reader="none")], tiers=[Tier("8b", 300.0)],
                            ledgers=Ledgers(), metrics_path="/metrics", **kwargs)


async def call(mw: Any, headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, dict[bytes, bytes], bytes]:  # type: ignore[assignment]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": list(headers), "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 5000)}
    await mw(scope, receive, send)
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


async def record(mw: EnergyMiddleware, headers: list[tuple[bytes, bytes]] = ()) -> Energy:  # type: ignore[assignment]
    status, head, _ = await call(mw, headers)
    assert status == 200  # a tenant never fails a request
    energy = mw.records.get(head[b"x-energy-id"].decode())
    assert energy is not None
    return energy


async def get(mw: EnergyMiddleware, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=mw, client=("127.0.0.1", 5000))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.get(path)


# -- the tenant of a request ------------------------------------------------------------------

def test_a_key_becomes_the_first_16_digits_of_litellms_hash() -> None:
    want = "key:" + litellm_hash(SECRET)[:16]
    assert hashed(SECRET) == hashed(SECRET.encode()) == want
    assert hashed(f"Bearer {SECRET}") == hashed(f"bearer  {SECRET} ") == want
    assert hashed(f"BEARER\t{SECRET}") == want
    assert hashed("sk-other") != want
    assert hashed("") is None and hashed("Bearer ") is None and hashed(b"  ") is None


@pytest.mark.anyio
async def test_a_secret_is_hashed_and_never_stored_exported_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sink = JsonLinesSink(tmp_path / "energy.jsonl")
    mw = middleware(tenant="authorization", sinks=[sink])
    energy = await record(mw, [(b"authorization", f"Bearer {SECRET}".encode())])
    assert energy.tenant == "key:" + litellm_hash(SECRET)[:16]
    _, head, body = await call(mw, [(b"authorization", f"Bearer {SECRET}".encode())])
    assert json.loads(body)["energy"]["tenant"] == energy.tenant
    energy_json = (await get(mw, "/energy?window=all")).text
    metrics = (await get(mw, "/metrics")).text
    sink.close()
    line = json.loads((tmp_path / "energy.jsonl").read_text().splitlines()[0])
    assert line["tenant"] == energy.tenant
    assert energy.tenant in json.loads(energy_json)["tenants"]
    assert f'tenant="{energy.tenant}"' in metrics
    for text in (energy_json, metrics, (tmp_path / "energy.jsonl").read_text(), caplog.text,
                 body.decode(), repr(head), repr(energy.as_dict())):
        assert SECRET not in text and SECRET[3:15] not in text


def test_a_tenant_header_no_request_carries_is_logged_once_with_the_one_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``tenant="autorization "`` left every tenant null forever, silently (issue 21)."""
    caplog.set_level(logging.WARNING, logger="giul_asgi.tenants")
    source = tenant_source("autorization ")
    assert source is not None
    scope = {"headers": [(b"authorization", f"Bearer {SECRET}".encode()), (b"host", b"gw")]}
    for _ in range(UNSEEN_AFTER - 1):
        assert source(scope) is None
    assert not caplog.records  # not before the first UNSEEN_AFTER requests have been seen
    for _ in range(3 * UNSEEN_AFTER):
        assert source(scope) is None
    [warning] = caplog.records
    text = warning.getMessage()
    assert "'autorization'" in text and "did you mean tenant='authorization'?" in text
    assert SECRET not in text and SECRET[3:15] not in text  # names only, never a value


def test_a_tenant_header_seen_once_early_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.tenants")
    source = tenant_source("x-api-key")
    assert source is not None
    assert source({"headers": [(b"x-api-key", b"k1")]}) is not None
    for _ in range(2 * UNSEEN_AFTER):  # most requests carry no key (health checks, anonymous)
        assert source({"headers": []}) is None
    assert not caplog.records


@pytest.mark.anyio
async def test_the_middleware_says_so_for_a_misspelt_tenant_header(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.tenants")
    mw = middleware(tenant="autorization ")
    for _ in range(UNSEEN_AFTER):
        await call(mw, [(b"authorization", f"Bearer {SECRET}".encode())])
    assert [r.getMessage().count("autorization") for r in caplog.records] == [1]


@pytest.mark.anyio
@pytest.mark.parametrize(("value", "tenant"), [
    (None, None),  # no header
    (b"", None),
    (b"   ", None),
    (b"Bearer ", None),
    (b"k" * 10_240, "key:" + hashlib.sha256(b"k" * 10_240).hexdigest()[:16]),
    (b"\xff\xfe\x80cl\xc3\xa9", "key:" + hashlib.sha256(b"\xff\xfe\x80cl\xc3\xa9").hexdigest()[:16]),
])
async def test_bad_headers_cost_at_most_the_tenant(value: bytes | None, tenant: str | None) -> None:
    mw = middleware(tenant="x-api-key")
    headers = [] if value is None else [(b"x-api-key", value)]
    energy = await record(mw, [(b"x-other", b"1"), *headers, (b"x-api-key", b"second value")])
    assert energy.tenant == (tenant if value is not None else hashed("second value"))
    assert energy.joules == 10 * J_PER_TOKEN


@pytest.mark.anyio
async def test_a_header_name_is_matched_whatever_its_case_and_the_first_value_counts() -> None:
    mw = middleware(tenant="X-LiteLLM-Key")
    energy = await record(mw, [(b"x-litellm-key", b"sk-a"), (b"x-litellm-key", b"sk-b")])
    assert energy.tenant == hashed("sk-a")


@pytest.mark.anyio
async def test_a_callable_names_the_tenant_made_safe_and_bounded() -> None:
    names = iter(["team-a", "  équipe rouge\n", "x" * 1000, "x" * 999 + "y", "<other>", "   "])
    mw = middleware(tenant=lambda scope: next(names))
    got = [(await record(mw)).tenant for _ in range(6)]
    assert got[0] == "team-a"
    assert got[5] is None  # blank
    for name in got[1:5]:
        assert name is not None and len(name) <= MAX_NAME
        assert name.isascii() and name.isprintable() and "<" not in name and " " not in name
    assert got[1].startswith("_quipe_rouge~")  # type: ignore[union-attr]
    assert got[2] != got[3]  # cut to the same prefix, told apart by the hash of the whole
    assert got[4] != OTHER  # no name can pass for the label of the rest


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["raises", "int", "bytes"])
async def test_a_callable_that_fails_costs_the_tenant_not_the_request_and_is_logged_once(
    bad: str, caplog: pytest.LogCaptureFixture,
) -> None:
    def tenant(scope: Any) -> Any:
        if bad == "raises":
            raise ValueError(f"no team for key {SECRET}")
        return 42 if bad == "int" else SECRET.encode()

    mw = middleware(tenant=tenant)
    with caplog.at_level(logging.WARNING, logger="giul_asgi.tenants"):
        for _ in range(3):
            energy = await record(mw)
            assert energy.tenant is None and energy.joules == 10 * J_PER_TOKEN
    warnings = [r for r in caplog.records if r.name == "giul_asgi.tenants"]
    assert len(warnings) == 1
    assert SECRET not in caplog.text and SECRET[3:15] not in caplog.text


@pytest.mark.anyio
async def test_a_handler_binds_the_tenant() -> None:
    mw = middleware(tenant="x-api-key")
    energy = await record(mw, [(b"x-api-key", b"sk-a"), (b"x-bind", b"team-b")])
    assert energy.tenant == "team-b"
    energy = await record(mw, [(b"x-bind", hashed("sk-z").encode())])  # type: ignore[union-attr]
    assert energy.tenant == hashed("sk-z")


@pytest.mark.anyio
async def test_bind_refuses_a_tenant_that_is_not_a_string() -> None:
    mw = middleware()
    seen: list[BaseException] = []

    async def binding(scope: Any, receive: Any, send: Any) -> None:
        meter = current_meter()
        assert meter is not None
        try:
            meter.bind(tenant=7)  # type: ignore[arg-type]
        except TypeError as exc:
            seen.append(exc)
        await app(scope, receive, send)

    mw.app = binding
    energy = await record(mw)
    assert len(seen) == 1 and energy.tenant is None


@pytest.mark.anyio
async def test_without_a_tenant_setting_every_record_says_null() -> None:
    mw = middleware()
    assert mw._tenant is None  # nothing runs per request
    energy = await record(mw, [(b"authorization", f"Bearer {SECRET}".encode())])
    assert energy.tenant is None and energy.as_dict()["tenant"] is None
    data = (await get(mw, "/energy?window=all")).json()
    assert list(data["tenants"]) == ["<none>"]


@pytest.mark.parametrize("bad", [
    5, "", " ", "x api key", "x-api-key:", ":authority", b"x-api-key", object(), int,
])
def test_a_tenant_that_cannot_work_fails_when_the_middleware_is_built(bad: Any) -> None:
    with pytest.raises(ConfigError) as info:
        middleware(tenant=bad)
    assert info.value.remedy


def test_an_async_tenant_function_is_refused() -> None:
    async def tenant(scope: Any) -> str:
        return "a"

    class Later:
        async def __call__(self, scope: Any) -> str:
            return "a"

    for bad in (tenant, Later()):
        with pytest.raises(ConfigError, match="coroutine") as info:
            middleware(tenant=bad)
        assert "plain function" in info.value.remedy


@pytest.mark.parametrize("bad", [0, -1, "5", True, 2.5, None])
def test_max_tenants_is_checked(bad: Any) -> None:
    with pytest.raises(ConfigError):
        middleware(tenant="x-api-key", max_tenants=bad)
    with pytest.raises(ConfigError):
        TenantPlaces(bad)


def test_max_tenants_beside_stats_of_ones_own_is_refused() -> None:
    with pytest.raises(ConfigError, match="EnergyStats"):
        middleware(tenant="x-api-key", max_tenants=5, stats=EnergyStats())
    assert middleware(tenant="x-api-key", max_tenants=5).stats.tenants.max_tenants == 5  # type: ignore[attr-defined]


def test_tenant_name_keeps_a_plain_name_as_it_is() -> None:
    for name in ("team-a", "user@example.com", "org/team:prod", "k" * MAX_NAME):
        assert tenant_name(name) == name
    assert tenant_name("k" * (MAX_NAME + 1)) != "k" * MAX_NAME


# -- the bounded labels -----------------------------------------------------------------------

def heavy_tailed(n_keys: int, n_records: int, heavy: int, seed: int) -> list[tuple[str, float]]:
    """``heavy`` keys with 50 J a request take 30% of the requests; the rest of the
    ``n_keys`` share the other 70% at about 1 J each, every key at least once."""
    rng = random.Random(seed)
    keys = [f"sk-{i:05d}" for i in range(n_keys)]
    out = [(k, rng.expovariate(1.0)) for k in keys]  # each key once
    for _ in range(n_records - n_keys):
        if rng.random() < 0.3:
            out.append((keys[rng.randrange(heavy)], 50.0))
        else:
            out.append((keys[rng.randrange(heavy, n_keys)], rng.expovariate(1.0)))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ten_thousand_keys_keep_the_heavy_ones_in_bounded_memory(seed: int) -> None:
    places = TenantPlaces(100)
    records = heavy_tailed(10_000, 60_000, heavy=40, seed=seed)
    by_label: dict[str, float] = {}
    truth: dict[str, float] = {}
    sizes = []
    for i, (key, joules) in enumerate(records):
        label = places.label(key, joules)
        by_label[label] = by_label.get(label, 0.0) + joules
        truth[key] = truth.get(key, 0.0) + joules
        if i % 997 == 0:
            sizes.append(places.size())
    sizes.append(places.size())
    bound = places.bound()
    assert bound == {"placed": 100, "candidates": 2001, "labels_given": 200}
    for size in sizes:
        for name, most in bound.items():
            assert size[name] <= most, (name, size)
    heavy = {f"sk-{i:05d}" for i in range(40)}
    assert heavy <= set(places.placed())  # the heavy keys keep their label
    assert set(by_label) - {OTHER} <= places._given and len(by_label) <= 201
    assert by_label[OTHER] > 0.5 * sum(truth[k] for k in truth if k not in heavy)  # the rest
    assert sum(by_label.values()) == pytest.approx(sum(truth.values()), rel=1e-12)  # conserved


def test_a_late_heavy_tenant_earns_a_place_and_a_churn_of_heavy_ones_stays_bounded() -> None:
    places = TenantPlaces(3)
    for i in range(30):
        assert places.label(f"early{i % 3}", 1.0) == f"early{i % 3}"
    assert places.label("late", 5.0) == OTHER  # 5 J: not yet 1.25 x the smallest (10 J)
    assert places.label("late", 10.0) == "late"  # 15 J > 12.5 J: earns the place
    assert len(places.placed()) == 3 and "late" in places.placed()
    # wave after wave of ever heavier tenants: labels given never exceed 2 x max_tenants
    for wave in range(50):
        for k in range(3):
            places.label(f"wave{wave}-{k}", 10.0 ** (wave / 5 + 2))
    assert places.size()["labels_given"] <= 6 and places.size()["placed"] == 3
    assert places.label("brand-new", 1e30) == OTHER  # every label given: the rest is <other>


def test_unknown_joules_count_under_a_label_and_rank_as_nothing() -> None:
    places = TenantPlaces(1)
    assert places.label("a", None) == "a"
    assert places.label("b", float("nan")) == OTHER
    assert places.label("b", -3.0) == OTHER
    assert places.placed() == {"a": 0.0}


# -- the statistics, /energy and Prometheus -------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def fed(stats: EnergyStats, records: list[tuple[str | None, float | None]], route: str = "/v1/chat") -> None:
    for tenant, joules in records:
        stats.record(Energy(joules, "measured" if joules else "unknown", node="gpu0", tier="8b",
                            route=route, seconds=0.1, tokens=10, tenant=tenant),
                     outcome="ok", status=200)


def series(text: bytes, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_tenants_section_and_prometheus_stay_bounded_and_add_up_at_ten_thousand_keys() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock, max_tenants=100)
    records = heavy_tailed(10_000, 40_000, heavy=30, seed=7)
    for i in range(0, len(records), 500):
        clock.t += 1.0
        fed(stats, [(hashed(k), j) for k, j in records[i:i + 500]])
    fed(stats, [(None, 2.0)] * 10)  # requests with no tenant
    snap = stats.snapshot("all")
    tenants = snap["tenants"]
    assert len(tenants) <= 2 * 100 + 2 and OTHER in tenants and "<none>" in tenants
    assert {hashed(f"sk-{i:05d}") for i in range(30)} <= set(tenants)
    assert sum(t["requests"] for t in tenants.values()) == snap["totals"]["requests"] == 40_010
    assert sum(t["joules"]["sum"] for t in tenants.values()) == pytest.approx(
        snap["totals"]["joules"]["sum"], rel=1e-6)
    assert set(tenants[OTHER]) == set(snap["routes"]["/v1/chat"])  # the routes' shape
    text = prometheus_text(EnergyCollector(stats))
    joules = series(text, "giul_energy_joules_total")
    assert 32 <= len(joules) <= 2 * 100 + 2
    assert sum(joules.values()) == pytest.approx(sum(j for _, j in records) + 20.0, rel=1e-9)
    assert len(series(text, "giul_requests_total")) == len(joules)
    assert len(series(text, "giul_tokens_total")) == len(joules)
    size, bound = stats.size(), stats.bound()
    for name in ("keys", "cells", "tenants_placed", "tenant_candidates"):
        assert size[name] <= bound[name], name


def test_a_tenant_that_loses_its_place_never_makes_a_counter_go_down() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock, max_tenants=2)
    collector = EnergyCollector(stats)
    fed(stats, [("a", 10.0), ("b", 20.0), ("c", 1.0)])
    before = series(prometheus_text(collector), "giul_energy_joules_total")
    assert {dict(k)["tenant"] for k in before} == {"a", "b", OTHER}
    clock.t += 60.0
    fed(stats, [("c", 30.0), ("a", 5.0)])  # c (31 J) takes a's place (10 J); a's 5 J: <other>
    after = series(prometheus_text(collector), "giul_energy_joules_total")
    for key, value in before.items():
        assert after[key] >= value, key  # a's series stops growing, never falls
    by_tenant = {dict(k)["tenant"]: v for k, v in after.items()}
    assert by_tenant == {"a": 10.0, "b": 20.0, "c": 30.0, OTHER: 1.0 + 5.0}
    assert sum(by_tenant.values()) == 66.0


@pytest.mark.anyio
async def test_energy_filters_by_tenant_and_documents_it() -> None:
    stats = EnergyStats(clock=Clock())
    fed(stats, [("team-a", 1.0), ("team-b", 2.0), ("team-b", 3.0), (None, None)])
    endpoint = EnergyEndpoint(stats=stats, ledgers=[])
    transport = httpx.ASGITransport(app=endpoint, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        data = (await client.get("/energy?window=all&tenant=team-b")).json()
        every = (await client.get("/energy?window=all")).json()
    assert list(data["tenants"]) == ["team-b"] and data["filters"]["tenant"] == "team-b"
    assert data["tenants"]["team-b"]["joules"]["sum"] == 5.0
    assert data["totals"]["requests"] == 4  # the totals stay the whole host's
    assert list(data["series"]["tenants"]) == ["team-b"]
    assert set(every["tenants"]) == {"team-a", "team-b", "<none>"}
    assert every["tenants"]["<none>"]["joules"]["sum"] is None  # unknown, never 0
    doc = (Path(__file__).parent.parent / "docs" / "energy-schema.md").read_text()
    for word in ("`tenants`", "`tenant`", "?tenant=", "max_tenants"):
        assert word in doc


def test_other_workers_tenants_merge_and_add_up() -> None:
    one, two = EnergyStats(clock=Clock(), max_tenants=2), EnergyStats(clock=Clock(), max_tenants=2)
    fed(one, [("a", 5.0), ("b", 1.0), ("x", 0.5)])
    fed(two, [("c", 7.0), ("a", 1.0), ("y", 0.25)])
    merged = one.empty_like()
    merged.merge_state(one.state())
    merged.merge_state(two.state())
    tenants = merged.snapshot("all")["tenants"]
    assert {k: v["joules"]["sum"] for k, v in tenants.items()} == {
        "a": 6.0, "b": 1.0, "c": 7.0, OTHER: 0.75}


@pytest.mark.anyio
async def test_ten_thousand_keys_through_the_middleware_stay_bounded_and_add_up() -> None:
    mw = middleware(tenant="x-api-key", max_tenants=20)
    records = heavy_tailed(10_000, 12_000, heavy=10, seed=11)
    for key, joules in records:
        tokens = 1000 if joules == 50.0 else 10  # a heavy key's request: 300 J, else 3 J
        await call(mw, [(b"x-api-key", f"Bearer {key}".encode()), (b"x-tokens", str(tokens).encode())])
    data = (await get(mw, "/energy?window=all")).json()
    tenants = data["tenants"]
    assert len(tenants) <= 2 * 20 + 1 and OTHER in tenants
    assert {hashed(f"sk-{i:05d}") for i in range(10)} <= set(tenants)  # the heavy keys
    assert sum(t["requests"] for t in tenants.values()) == data["totals"]["requests"] == 12_000
    assert sum(t["joules"]["sum"] for t in tenants.values()) == pytest.approx(
        data["totals"]["joules"]["sum"], rel=1e-6)
    text = (await get(mw, "/metrics")).text.encode()
    joules = series(text, "giul_energy_joules_total")
    assert len(joules) <= 2 * 20 + 1
    assert sum(joules.values()) == pytest.approx(data["totals"]["joules"]["sum"], rel=1e-6)
    assert "sk-0" not in text.decode() and "sk-0" not in json.dumps(data)
    size, bound = mw.stats.size(), mw.stats.bound()  # type: ignore[attr-defined]
    for name in ("keys", "tenants_placed", "tenant_candidates"):
        assert size[name] <= bound[name], name


@pytest.mark.anyio
async def test_opentelemetry_spans_carry_the_tenant_and_counters_a_bounded_one() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from giul_asgi.exporters.otel import otel_recorder

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mw = middleware(tenant="x-api-key",
                    otel=otel_recorder(MeterProvider(metric_readers=[reader]), max_tenants=1))
    tracer = provider.get_tracer("test")
    for key in ("sk-a", "sk-b", "sk-a"):
        with tracer.start_as_current_span("server"):
            await call(mw, [(b"x-api-key", key.encode())])
    spans = exporter.get_finished_spans()
    assert [dict(s.attributes or {}).get("giul.energy.tenant") for s in spans] == [
        hashed("sk-a"), hashed("sk-b"), hashed("sk-a")]
    points = [(dict(p.attributes), p.value) for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics if m.name == "giul.energy"
              for p in m.data.data_points]
    assert {a["tenant"]: v for a, v in points} == {hashed("sk-a"): 6.0, OTHER: 3.0}


def test_several_workers_keep_every_tenant_label_whatever_order_their_rows_merge_in() -> None:
    workers = []
    for w in range(4):
        stats = EnergyStats(clock=Clock(), max_tenants=50)
        fed(stats, [(f"w{w}-t{i}", 1.0 + i) for i in range(50)])
        workers.append(stats.state())
    seen = []
    for order in (workers, workers[::-1], workers[1::2] + workers[::2]):
        merged = EnergyStats(clock=Clock(), max_tenants=50)
        for state in order:
            merged.merge_state(state)
        text = prometheus_text(EnergyCollector(merged))
        seen.append(series(text, "giul_energy_joules_total"))
    assert seen[0] == seen[1] == seen[2] and len(seen[0]) == 200  # 4 x 50 tenants, none merged away
