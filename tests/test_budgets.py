"""Budgets: a bad one stops the startup; a soft one says what is left; a hard one refuses with 429.

Figures come from the real middleware: a node with no reader and a tier's hint price each
answer's 100 tokens at exactly 100 J (estimated), so every header value is known in advance.
The refusal is read by the real ``openai`` client from a real uvicorn; the period's end is
moved on a fake clock; the sharing between workers is checked here with rows written as a
live and a dead worker write them, and with real workers in test_budgets_server.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server import serve

from giul_asgi import Budget, ConfigError, EnergyMiddleware, Ledgers, Node, Route, Tier
from giul_asgi.budgets import Budgets, Measuring, OverBudget, spending
from giul_asgi.budgets.shared import DEAD, ROW_SCHEMA, framed, unframed
from giul_asgi.energy import Energy
from giul_asgi.hostshare.rows import process_start
from giul_asgi.hostshare.server import ServerId
from giul_asgi.listeners import Settled
from giul_asgi.tenants import hashed

J = 100.0  # each answer: 100 completion tokens at 1,000 J per 1k tokens (estimated)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    app.calls += 1  # type: ignore[attr-defined]
    body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "hi"}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 100, "total_tokens": 105}})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body.encode()})


app.calls = 0  # type: ignore[attr-defined]


def team(scope: dict[str, Any]) -> str | None:
    value = dict(scope["headers"]).get(b"x-team")
    return value.decode() if value is not None else None


def middleware(budgets: list[Budget], place: Path | str = "off", **kwargs: Any) -> EnergyMiddleware:
    kwargs.setdefault("tenant", team)
    return EnergyMiddleware(app, nodes=[Node("dark", reader="none", workers_dir=str(place))],
                            tiers=[Tier("8b", 1000.0)], ledgers=Ledgers(), budgets=budgets,
                            metrics_path="/metrics", **kwargs)


def client(metered: EnergyMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=metered), base_url="http://gw")


# -- a bad budget is said once, with its remedy ---------------------------------------------------

BAD_BUDGETS: list[tuple[dict[str, Any], str]] = [
    ({}, "needs joules= or grams="),
    ({"joules": 1.0, "grams": 1.0}, "not both"),
    ({"joules": 0}, "must be a number > 0"),
    ({"joules": -5.0}, "must be a number > 0"),
    ({"joules": float("nan")}, "must be a number > 0"),
    ({"joules": float("inf")}, "must be a number > 0"),
    ({"joules": "100"}, "must be a number > 0"),
    ({"joules": True}, "must be a number > 0"),
    ({"grams": 0.0}, "must be a number > 0"),
    ({"joules": 1.0, "per": "team"}, "must be one of"),
    ({"joules": 1.0, "key": ""}, "non-empty name"),
    ({"joules": 1.0, "key": 7}, "non-empty name"),
    ({"joules": 1.0, "key": "team a!"}, "is not a tenant as the middleware names one"),
    ({"joules": 1.0, "period": "week"}, "is not a period"),
    ({"joules": 1.0, "period": 0.5}, "seconds"),
    ({"joules": 1.0, "period": 1e9}, "seconds"),
    ({"joules": 1.0, "period": True}, "seconds"),
    ({"joules": 1.0, "period": float("nan")}, "seconds"),
    ({"joules": 1.0, "hard": "yes"}, "must be True or False"),
    ({"joules": 1.0, "name": "has space"}, "must be 1 to 64"),
    ({"joules": 1.0, "name": ""}, "must be 1 to 64"),
    ({"joules": 1.0, "name": "x" * 65}, "must be 1 to 64"),
]


@pytest.mark.parametrize(("values", "said"), BAD_BUDGETS, ids=[str(v) for v, _ in BAD_BUDGETS])
def test_a_bad_budget_is_refused_when_built_with_its_remedy(values: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        Budget(**values)
    assert caught.value.remedy


BAD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"budgets": Budget(joules=1.0)}, "must be a list of Budget"),
    ({"budgets": "tenant/day"}, "must be a list of Budget"),
    ({"budgets": [42]}, "must be a Budget"),
    ({"budgets": [{"joules": 1.0, "perr": "tier"}]}, "unknown key 'perr'"),
    ({"budgets": [Budget(joules=1.0), Budget(joules=2.0)]}, "two budgets are named 'tenant/day/J'"),
    ({"budgets": [Budget(joules=1.0)], "tenant": None}, "has no tenant"),
    ({"budgets": [Budget(joules=1.0, per="tier", key="70b")]}, "tier '70b', which is not declared"),
    ({"budgets": [Budget(joules=1.0, per="route")]}, "no route is declared"),
    ({"budgets": [Budget(joules=1.0, per="route", key="/v1/*")], "routes": [Route("/v2/*")]},
     "which is no Route's pattern"),
    ({"budgets": [Budget(grams=1.0)]}, "no node has a carbon intensity"),
    # A header's tenants are named by the value's hash: the raw key can never match (and is
    # not echoed: it is most likely the secret itself).
    ({"budgets": [Budget(joules=1.0, key="sk-team-a")], "tenant": "authorization"},
     "keys on a tenant that no request can have"),
    ({"budgets": [Budget(joules=1.0, key="key:team-a")], "tenant": "x-api-key"},
     "keys on a tenant that no request can have"),
    ({"budgets": [Budget(joules=1.0)], "tenant": "authorization", "tenant_header": "x-api-key"},
     "both say who a request is for"),
    ({"budgets": [Budget(joules=1.0)], "tenant": team, "tenant_header": "x-api-key"},
     "both say who a request is for"),
]


@pytest.mark.parametrize(("settings", "said"), BAD_SETTINGS, ids=[s for _, s in BAD_SETTINGS])
def test_a_budget_that_names_what_the_middleware_lacks_is_refused(
    settings: dict[str, Any], said: str,
) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        middleware(**settings)
    assert caught.value.remedy


SECRET = "sk-proj-" + "Ab3" * 52  # an OpenAI project key's length (164 characters)


@pytest.mark.parametrize("key", ["sk-secret-123", SECRET, f"Bearer {SECRET}", "sk-secret-123\n"])
@pytest.mark.parametrize("tenant", ["authorization", None])
def test_a_budget_keyed_on_a_raw_api_key_is_refused_without_showing_it(key: str, tenant: str | None) -> None:
    # A hostile trial: a long key, "Bearer ...", one read from a file with its newline, or a
    # key with no tenant configured were echoed in the startup line (in the key, or in the
    # budget's default name).
    with pytest.raises(ConfigError) as caught:
        middleware([Budget(joules=1.0, key=key)], tenant=tenant)
    said = f"{caught.value} {caught.value.remedy}"
    assert "secret" not in said and "Ab3Ab3" not in said, said


def test_budgets_keyed_as_the_header_names_tenants_and_on_none_are_taken() -> None:
    key = hashed("sk-team-a")
    assert key is not None
    metered = middleware([Budget(joules=1.0, key=key), Budget(joules=2.0, key="<none>")],
                         tenant="authorization")
    assert metered.budgets is not None


@pytest.mark.anyio
async def test_a_budget_on_none_caps_the_requests_that_carry_no_tenant() -> None:
    metered = middleware([Budget(joules=1000.0, key="<none>", hard=True)], tenant="authorization")
    async with client(metered) as http:
        anonymous = await http.post("/v1/chat/completions", json={})
        keyed = await http.post("/v1/chat/completions", json={},
                                headers={"authorization": "Bearer sk-a"})
    assert anonymous.headers["x-energy-budget"] == "tenant=_none_/day/J"  # a label-safe name
    assert "x-energy-budget" not in keyed.headers  # another tenant: not this budget's key


def test_a_per_tier_budget_without_tiers_is_refused() -> None:
    with pytest.raises(ConfigError, match="no tier is declared"):
        EnergyMiddleware(app, nodes=[Node("dark", reader="none")], ledgers=Ledgers(),
                         budgets=[Budget(joules=1.0, per="tier")])


def test_budgets_read_from_tables_and_good_ones_are_normalised() -> None:
    metered = middleware([{"joules": 5, "period": "hour", "hard": True}])  # type: ignore[list-item]
    assert metered.budgets is not None
    (budget,) = metered.budgets.budgets
    assert (budget.joules, budget.period_s, budget.name, budget.unit) == (5.0, 3600.0, "tenant/hour/J", "J")
    assert Budget(grams=2, per="tier", key="70b", period=900).name == "tier=70b/900s/g"
    assert EnergyMiddleware(app, nodes=[Node("dark", reader="none")], ledgers=Ledgers()).budgets is None


# -- soft: what is left, on every answer; one line and one count when crossed -----------------------

@pytest.mark.anyio
async def test_a_soft_budget_says_what_is_left_and_counts_its_crossing_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.budgets")
    metered = middleware([Budget(joules=250.0)])
    async with client(metered) as c:
        seen = []
        for _ in range(5):
            r = await c.post("/v1/chat/completions", headers={"x-team": "team-a"})
            assert r.status_code == 200
            assert float(r.headers["x-energy-joules"]) == J
            seen.append(r.headers["x-energy-budget-remaining"])
            assert r.headers["x-energy-budget"] == "tenant/day/J"
        assert seen == ["250", "150", "50", "0", "0"]  # left when each was admitted; never below 0
        other = await c.post("/v1/chat/completions", headers={"x-team": "team-b"})
        assert other.headers["x-energy-budget-remaining"] == "250"  # each tenant on its own
        anonymous = await c.post("/v1/chat/completions")
        assert anonymous.headers["x-energy-budget-remaining"] == "250"  # <none>: one budget for all
        crossed = _wait(lambda: [r for r in caplog.records if "crossed" in r.getMessage()])
        assert len(crossed) == 1, [r.getMessage() for r in crossed]
        assert "'tenant/day/J' crossed for tenant 'team-a'" in crossed[0].getMessage()
        assert "soft: its requests go on" in crossed[0].getMessage()
        for _ in range(3):  # past it, nothing more is said
            await c.post("/v1/chat/completions", headers={"x-team": "team-a"})
        metrics = (await c.get("/metrics")).text
        state = (await c.get("/energy", params={"window": "all"})).json()["budgets"]
    time.sleep(0.1)
    assert len([r for r in caplog.records if "crossed" in r.getMessage()]) == 1
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples[("giul_budget_exceeded_total", (("budget", "tenant/day/J"), ("key", "team-a")))] == 1.0
    assert not [k for k in samples if k[0] == "giul_budget_exceeded_total" and ("key", "team-b") in k[1]]
    (item,) = state["items"]
    assert item["keys"]["team-a"] == {"spent": 800.0, "remaining": 0.0, "over": True, "refused": 0}
    assert item["keys"]["team-b"]["remaining"] == 150.0
    assert item["keys"]["<none>"]["spent"] == J
    assert item["period_end"] - item["period_start"] == 86400.0 and item["period_end"] % 86400.0 == 0
    assert item["exceeded"] == {"team-a": 1}
    assert state["shared"] is False and "sharing is off" in state["shared_reason"]


@pytest.mark.anyio
async def test_the_tightest_budget_is_the_one_said_and_a_named_key_counts_alone() -> None:
    metered = middleware([Budget(joules=1000.0), Budget(joules=150.0, key="team-a", name="team-a-daily")])
    async with client(metered) as c:
        a = [await c.post("/", headers={"x-team": "team-a"}) for _ in range(2)]
        b = await c.post("/", headers={"x-team": "team-b"})
    assert [(r.headers["x-energy-budget"], r.headers["x-energy-budget-remaining"]) for r in a] == [
        ("team-a-daily", "150"), ("team-a-daily", "50")]
    assert (b.headers["x-energy-budget"], b.headers["x-energy-budget-remaining"]) == ("tenant/day/J", "1000")


@pytest.mark.anyio
async def test_route_and_tier_budgets_count_by_the_route_pattern_and_the_tier() -> None:
    metered = EnergyMiddleware(
        app, nodes=[Node("dark", reader="none", workers_dir="off")],
        tiers=[Tier("8b", 1000.0), Tier("70b", 2000.0)], ledgers=Ledgers(),
        routes=[Route("/v1/chat/*", tier="8b"), Route("/v1/big/*", tier="70b")],
        budgets=[Budget(joules=500.0, per="route", key="/v1/chat/*"), Budget(joules=5000.0, per="tier")])
    async with client(metered) as c:
        chat = [await c.post("/v1/chat/completions") for _ in range(2)]
        big = [await c.post("/v1/big/completions") for _ in range(2)]
    assert [r.headers["x-energy-budget-remaining"] for r in chat] == ["500", "400"]  # the route's is tighter
    assert [r.headers["x-energy-budget"] for r in big] == ["tier/day/J"] * 2
    assert [r.headers["x-energy-budget-remaining"] for r in big] == ["5000", "4800"]  # 200 J each on 70b


@pytest.mark.anyio
async def test_no_budget_no_header_and_unmetered_paths_are_never_refused() -> None:
    metered = middleware([Budget(joules=50.0, hard=True)])
    async with client(metered) as c:
        first = await c.post("/v1/chat/completions", headers={"x-team": "t"})
        over = await c.post("/v1/chat/completions", headers={"x-team": "t"})
        health = await c.get("/health", headers={"x-team": "t"})
    assert first.status_code == 200 and over.status_code == 429
    assert health.status_code == 200 and "x-energy-budget-remaining" not in health.headers
    async with client(EnergyMiddleware(app, nodes=[Node("dark", reader="none")], ledgers=Ledgers())) as c:
        plain = await c.post("/v1/chat/completions")
    assert "x-energy-budget-remaining" not in plain.headers


# -- hard: refused before the app runs, as OpenAI's clients read a rate limit ------------------------

def test_a_hard_budget_refuses_before_the_app_with_a_429_the_openai_client_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.budgets")
    metered = middleware([Budget(joules=250.0, hard=True)])
    with serve(metered) as base:
        # Closed with the test: its pooled connection outlived it (an unraisable socket warning).
        with openai.OpenAI(base_url=base + "/v1", api_key="sk-test", default_headers={"x-team": "team-a"},
                           max_retries=0) as ai:
            before = app.calls  # type: ignore[attr-defined]
            for _ in range(3):  # 250 J left, 100 J each: the third is admitted with 50 J left
                answer = ai.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}])
                assert answer.http_response.status_code == 200
            with pytest.raises(openai.RateLimitError) as caught:
                ai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            assert app.calls - before == 3  # type: ignore[attr-defined]  # the refused one never ran
            other = ai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                               extra_headers={"x-team": "team-b"})
            assert other.model_extra is not None and other.model_extra["energy"]["joules"] == J
        state = httpx.get(base + "/energy", params={"window": "all"}).json()["budgets"]
    error = caught.value
    assert error.status_code == 429
    assert error.type == "energy_budget_exceeded" and error.code == "energy_budget_exceeded"
    assert isinstance(error.body, dict) and error.body["type"] == "energy_budget_exceeded"
    assert "'tenant/day/J' for tenant 'team-a' is spent: 300 of 250 joules" in error.body["message"]
    headers = error.response.headers
    to_end = 86400 - time.time() % 86400
    assert abs(int(headers["retry-after"]) - to_end) <= 2, (headers["retry-after"], to_end)
    assert headers["x-energy-budget-remaining"] == "0" and headers["x-energy-budget"] == "tenant/day/J"
    if to_end > 60:
        assert headers["x-should-retry"] == "false"
    assert state["items"][0]["keys"]["team-a"]["refused"] == 1
    assert any("its requests are refused (429) until then" in r.getMessage() for r in caplog.records)


# -- the period ends on the clock everyone reads ------------------------------------------------------

class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_period_ends_on_the_epoch_and_the_next_starts_empty(tmp_path: Path) -> None:
    clock = Clock(1000 * 60.0 + 30.0)  # 30 s into a minute
    budgets = Budgets([Budget(joules=100.0, hard=True, period=60)], directory="off", clock=clock)
    budgets.setup()
    slots, headers = budgets.admit("t", "/", None)
    assert dict(headers)[b"x-energy-budget-remaining"] == b"100"
    budgets.spend(slots, Energy(120.0, "measured", id="r1", settled=True))
    with pytest.raises(OverBudget) as caught:
        budgets.admit("t", "/", None)
    assert caught.value.retry_after == 30 and caught.value.period_end == 1001 * 60.0
    budgets.tick()
    assert budgets.exceeded() == {("tenant/60s/J", "t"): 1}
    clock.t = 1000 * 60.0 + 59.9  # a request closes just before the end, its figure settles after
    slots, _ = budgets.admit("u", "/", None)
    budgets.spend(slots, Energy(40.0, "measured", id="r2", settled=False))
    clock.t = 1001 * 60.0 + 0.001
    slots, headers = budgets.admit("t", "/", None)  # before the thread swaps: the new period's
    assert dict(headers)[b"x-energy-budget-remaining"] == b"100"
    budgets.tick()
    assert budgets.spent == {(0, "t"): 120.0}  # what it reserved, in the new period it runs in
    budgets.settled([Settled(Energy(90.0, "measured", id="r2"))])  # corrects the period it was in
    assert budgets.spent == {(0, "t"): 120.0}
    budgets.spend(slots, Energy(30.0, "measured", id="r3"))
    assert budgets.spent == {(0, "t"): 30.0}
    slots, headers = budgets.admit("t", "/", None)
    assert dict(headers)[b"x-energy-budget-remaining"] == b"70"
    budgets.spend(slots, Energy(None, "unknown", id="r4"))  # its reservation goes with it
    budgets.tick()
    assert budgets.spent == {(0, "t"): 30.0}
    assert budgets.snapshot()["items"][0]["period_end"] == 1002 * 60.0


def test_a_hard_budget_reserves_a_request_s_usual_cost_while_it_runs() -> None:
    """A hostile tester opened 40 requests at once on one key: all were admitted, and the
    key spent 2.5x its hard budget. Each admission now reserves the key's usual cost until
    its own figure replaces it, so requests admitted together see each other."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(20.0, "measured", id="r0", settled=True))  # usual: 20 J
    admitted = []
    with pytest.raises(OverBudget):
        for _ in range(40):  # in flight together: none has closed
            admitted.append(budgets.admit("t", "/", None)[0])
    assert len(admitted) == 4  # 20 spent + 4 x 20 reserved reaches 100
    for k, slots in enumerate(admitted):
        budgets.spend(slots, Energy(25.0, "measured", id=f"r{k + 1}", settled=True))
    assert budgets.spent == {(0, "t"): pytest.approx(120.0)}  # the figures, no reservation left


def test_a_hard_budget_counts_a_reservation_until_a_low_or_unknown_first_figure_settles() -> None:
    """A hostile trial (4 workers, 40-200 clients of one key) passed a hard budget by 9-28
    requests: a request whose first figure was unknown, or low, gave its reservation back at
    close and counted nothing (or little) until it settled, and the requests behind it were
    admitted through the gap. Now it counts at least its reservation until its figure
    settles; the settled figure replaces it, and one unknown at both ends spends nothing."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(20.0, "measured", id="r0", settled=True))  # usual: 20 J
    slots_a, _ = budgets.admit("t", "/", None)
    slots_b, _ = budgets.admit("t", "/", None)
    slots_c, _ = budgets.admit("t", "/", None)
    budgets.spend(slots_a, Energy(None, "unknown", id="a", settled=False))
    budgets.spend(slots_b, Energy(5.0, "estimated", id="b", settled=False))
    budgets.spend(slots_c, Energy(None, "unknown", id="c", settled=False))
    assert budgets.spent == {(0, "t"): pytest.approx(80.0)}  # 20 + three reservations held
    budgets.admit("t", "/", None)  # 80 spent: admitted, reserving 20
    with pytest.raises(OverBudget):
        budgets.admit("t", "/", None)
    budgets.settled([Settled(Energy(25.0, "measured", id="a")), Settled(Energy(22.0, "measured", id="b")),
                     Settled(Energy(None, "unknown", id="c"))])
    # 20 + 25 + 22 + nothing for c + the fourth's reservation (20)
    assert budgets.spent == {(0, "t"): pytest.approx(87.0)}
    # The mean moved with the settled figures (25, 22), not the first (5); what is reserved
    # is the upper decile of the recent ones (of three, the largest).
    assert budgets._mean[0] == pytest.approx(20.0 + 0.2 * (25.0 - 20.0) + 0.2 * (22.0 - 21.0))
    assert budgets._usual[0] == 25.0


def test_a_cold_hard_budget_admits_one_request_of_a_key_at_a_time_until_a_figure_is_counted() -> None:
    """Before any worker has counted a figure a hard budget has no usual cost to reserve: a
    cold server's first wave of one key (40 clients on 4 workers) was all admitted and passed
    the limit by the requests in it. Now, while the cost is unknown, a key has one request in
    flight in a worker; another is refused for a second (the budget is not spent, and says
    so); once the first's figure is counted, its cost is reserved as before."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    first, _ = budgets.admit("t", "/", None)
    for _ in range(5):  # in flight with the first: refused, nothing reserved, nothing spent
        with pytest.raises(Measuring) as caught:
            budgets.admit("t", "/", None)
    refusal = caught.value
    assert isinstance(refusal, OverBudget) and refusal.retry_after == 1
    assert "'t' is not spent (0 of 100 joules used), but this tenant's first request is still being " \
           "measured" in refusal.message and "Retry after 1 s." in refusal.message
    body = refusal.body()
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("energy_budget_exceeded", "energy_budget_measuring")
    headers = dict(refusal.headers(body))
    assert headers[b"retry-after"] == b"1" and headers[b"x-energy-budget-remaining"] == b"100"
    assert b"x-should-retry" not in headers  # OpenAI's clients retry it after a second
    other, _ = budgets.admit("u", "/", None)  # each key on its own
    with pytest.raises(Measuring):
        budgets.admit("u", "/", None)
    assert budgets.spent == {} and set(budgets._measuring) == {(0, "t"), (0, "u")}
    assert budgets.snapshot()["items"][0]["keys"] == {}  # nothing spent yet, so no key shown
    budgets.spend(first, Energy(20.0, "measured", id="r0", settled=True))  # usual: 20 J
    admitted = []
    with pytest.raises(OverBudget) as over:
        for _ in range(40):  # as today: each reserves 20 J
            admitted.append(budgets.admit("t", "/", None)[0])
    assert not isinstance(over.value, Measuring) and len(admitted) == 4  # 20 + 4 x 20 reaches 100
    budgets.admit("u", "/", None)  # its first still runs, but the cost is known: reserved
    assert budgets.spent == {(0, "t"): pytest.approx(100.0), (0, "u"): pytest.approx(20.0)}
    budgets.spend(other, Energy(30.0, "measured", id="r1", settled=True))
    assert budgets._measuring == {}
    assert budgets.snapshot()["items"][0]["keys"]["t"]["refused"] == 6  # 5 measuring, 1 over


def test_a_cold_key_whose_first_figure_is_awaited_stays_held_until_it_settles() -> None:
    """A cold card's first window is often closed before the card reported it: its first
    figure is unknown (awaited) and counts nothing. Letting the key's next request in then
    let a cold server's worker admit three in a row on a 50 J limit
    (budgets-2026-12-06-cold.md's first trials): the key stays held until that figure
    settles, which teaches the budget its usual cost."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    first, _ = budgets.admit("t", "/", None)
    budgets.spend(first, Energy(None, "unknown", id="a", settled=False))
    with pytest.raises(Measuring):
        budgets.admit("t", "/", None)
    budgets.settled([Settled(Energy(25.0, "measured", id="a"))])
    assert budgets._usual[0] == 25.0 and budgets._measuring == {}
    budgets.admit("t", "/", None)  # known: reserved, not held
    assert budgets.spent == {(0, "t"): pytest.approx(50.0)}


def test_a_figure_awaited_past_hold_s_ends_the_holding_for_the_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(spending, "HOLD_S", 0.05)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    first, _ = budgets.admit("t", "/", None)
    budgets.spend(first, Energy(None, "unknown", id="a", settled=False))
    with pytest.raises(Measuring):
        budgets.admit("t", "/", None)
    time.sleep(0.06)
    # Awaited for HOLD_S and not come: none is coming soon (a reader stuck at its start), and
    # holding keys for it would refuse requests for as long as the reader fails: held no more.
    with caplog.at_level(logging.WARNING, logger="giul_asgi.budgets"):
        for key in ("t", "t", "u"):
            budgets.admit(key, "/", None)
    assert budgets._blind[0] and budgets._measuring == {}
    assert sum("did not come" in r.getMessage() for r in caplog.records) == 1
    budgets.settled([Settled(Energy(25.0, "measured", id="a"))])  # late: it teaches the cost
    assert budgets._usual[0] == 25.0
    slots, _ = budgets.admit("t", "/", None)  # reserves it from now on
    assert slots[0][3] == 25.0


@pytest.mark.parametrize("settles", [False, True], ids=["unknown-at-close", "unknown-when-settled"])
def test_a_cold_hard_budget_whose_figures_are_unknown_stops_holding_keys(
    settles: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    """A reader that fails never refuses anyone: a figure unknown for good while nothing is
    known ends the one-at-a-time hold (no figure is coming to end it), said once."""
    caplog.set_level(logging.WARNING, logger="giul_asgi.budgets")
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    first, _ = budgets.admit("t", "/", None)
    budgets.spend(first, Energy(None, "unknown", id="a", settled=not settles))
    if settles:
        budgets.settled([Settled(Energy(None, "unknown", id="a"))])
    for _ in range(5):
        budgets.admit("t", "/", None)
    for n in range(5):  # nor are keys held for figures awaited, which no admission looks up
        slots, _ = budgets.admit(f"k{n}", "/", None)
        budgets.spend(slots, Energy(None, "unknown", id=f"w{n}", settled=False))
    assert budgets.spent == {} and budgets._measuring == {}
    said = [r.getMessage() for r in caplog.records if "no longer admitted one at a time" in r.getMessage()]
    assert len(said) == 1 and "'tenant/hour/J'" in said[0]


def test_the_keys_held_while_a_cold_budget_is_measured_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys come from clients: past MAX_MEASURING first requests in flight, a new key's is
    refused for a second too (counted under <other>), and the table never grows past it;
    keys held past HOLD_S for figures that never settled make room again."""
    monkeypatch.setattr(spending, "MAX_MEASURING", 3)
    monkeypatch.setattr(spending, "HOLD_S", 0.05)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    held = [budgets.admit(f"k{n}", "/", None)[0] for n in range(3)]
    for n in range(3, 50):
        with pytest.raises(Measuring) as caught:
            budgets.admit(f"k{n}", "/", None)
    assert caught.value.crowded and "the first requests of 3 tenants are still being measured" \
        in caught.value.message
    assert len(budgets._measuring) == 3
    assert budgets._refused == {(0, "<other>", 16): 47.0}
    budgets.spend(held[0], Energy(None, "unknown", id="x", settled=False))  # awaited: still held
    with pytest.raises(Measuring):
        budgets.admit("k3", "/", None)
    time.sleep(1.0)  # past HOLD_S, and a second since the last look at the held keys
    budgets.admit("k3", "/", None)
    assert budgets._measuring == {(0, "k1"): math.inf, (0, "k2"): math.inf, (0, "k3"): math.inf}


def test_a_request_refused_by_a_later_budget_gives_back_the_cold_key_it_held() -> None:
    """Refused by a later budget, it never runs and never closes: the key's place taken by
    an earlier cold budget is given back, or that key would be refused until a figure came."""
    budgets = Budgets([Budget(joules=1000.0, hard=True, period=3600),
                       Budget(joules=100.0, hard=True, key="t", period=3600, name="t-only")],
                      directory="off", clock=Clock(6e4))
    budgets.setup()
    budgets.spent[(1, "t")] = 150.0  # as another worker's row says it (the first budget is cold)
    for _ in range(3):
        with pytest.raises(OverBudget) as caught:
            budgets.admit("t", "/", None)
        assert not isinstance(caught.value, Measuring) and caught.value.budget.name == "t-only"
    assert budgets._measuring == {}


@pytest.mark.anyio
async def test_a_cold_hard_budget_s_second_concurrent_request_gets_an_openai_shaped_429() -> None:
    release = asyncio.Event()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await release.wait()
        await app(scope, receive, send)

    metered = EnergyMiddleware(slow, nodes=[Node("dark", reader="none", workers_dir="off")],
                               tiers=[Tier("8b", 1000.0)], ledgers=Ledgers(), tenant=team,
                               budgets=[Budget(joules=250.0, hard=True)])
    async with client(metered) as c:
        first = asyncio.ensure_future(c.post("/v1/chat/completions", headers={"x-team": "team-a"}))
        other = asyncio.ensure_future(c.post("/v1/chat/completions", headers={"x-team": "team-b"}))
        await asyncio.sleep(0.05)  # both admitted, both in the app: each key has its own first
        try:  # admitted, it would wait for the release too: say so rather than hang
            second = await asyncio.wait_for(c.post("/v1/chat/completions", headers={"x-team": "team-a"}), 5)
        finally:
            release.set()
        assert (await first).status_code == 200 and (await other).status_code == 200
        after = [await c.post("/v1/chat/completions", headers={"x-team": "team-a"}) for _ in range(2)]
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.headers["x-energy-budget-remaining"] == "250"
    error = second.json()["error"]
    assert error["code"] == "energy_budget_measuring" and "first request is still being measured" \
        in error["message"]
    assert [r.status_code for r in after] == [200, 200]  # one at a time, and the cost is known now


def test_a_request_refused_by_one_hard_budget_keeps_nothing_reserved_in_another() -> None:
    """A request refused by a later budget never runs: what the earlier budgets reserved for
    it at admission is given back, or every refusal of a key over its own tight budget would
    spend a request's usual cost of the broader budget."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=1000.0, hard=True, period=3600),
                       Budget(joules=100.0, hard=True, key="t", period=3600, name="t-only")],
                      directory="off", clock=clock)
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(120.0, "measured", id="r0", settled=True))  # usual: 120 J in both
    for _ in range(5):
        with pytest.raises(OverBudget) as caught:
            budgets.admit("t", "/", None)
        assert caught.value.budget.name == "t-only"
    assert budgets.spent == {(0, "t"): 120.0, (1, "t"): 120.0}


def test_near_a_hard_limit_the_budgets_thread_shares_at_a_faster_pace() -> None:
    """What other workers admit before they see this one's spending is what a hard budget
    goes over (benchmarks/results/budgets-2026-12-03-hold.md: the sharing's lag): from half
    the limit until it is reached, the thread writes and sums every 5 ms, not every 50."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    for joules, near in ((20.0, False), (40.0, True), (50.0, False)):  # 20, 60, 110 spent
        slots, _ = budgets.admit("t", "/", None)
        budgets.spend(slots, Energy(joules, "measured", id=f"r{joules}", settled=True))
        budgets.tick()
        assert budgets._near is near, joules


def test_a_settled_figure_corrects_the_first_and_an_unknown_one_spends_nothing() -> None:
    clock = Clock(5000.0)
    budgets = Budgets([Budget(joules=100.0), Budget(grams=1.0, name="g")], directory="off", clock=clock)
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(10.0, "measured", id="a", settled=False, carbon_grams=0.01))
    budgets.spend(slots, Energy(None, "unknown", id="b", settled=False))
    budgets.spend(slots, Energy(-1.0, "measured", id="c", settled=True))  # a failed measurement
    assert budgets.spent == {(0, "t"): 10.0, (1, "t"): 0.01}
    budgets.settled([Settled(Energy(12.5, "measured", id="a", carbon_grams=0.0125)),
                     Settled(Energy(3.0, "measured", id="b")),
                     Settled(Energy(99.0, "measured", id="unknown-id"))])
    assert budgets.spent == {(0, "t"): pytest.approx(15.5), (1, "t"): pytest.approx(0.0125)}
    budgets.settled([Settled(Energy(50.0, "measured", id="a"))])  # settled once: a second is ignored
    assert budgets.spent[(0, "t")] == pytest.approx(15.5)


# -- one server's workers: rows as a live and a dead worker leave them ----------------------------------

def shared_budgets(tmp_path: Path) -> tuple[Budgets, Clock]:
    """A hard 100 J budget shared through a private place of the test's, started."""
    place = tmp_path / "place"
    place.mkdir(mode=0o700)
    server = ServerId("ltest", "a test's server", (os.getpid(), None))
    clock = Clock(time.time())
    budgets = Budgets([Budget(joules=100.0, hard=True)], directory=str(place), server=server, clock=clock)
    budgets.setup()
    assert budgets.folder is not None and budgets.shared_reason is None
    return budgets, clock


def test_other_workers_rows_count_and_a_dead_one_counts_until_its_period_ends(tmp_path: Path) -> None:
    budgets, clock = shared_budgets(tmp_path)
    assert budgets.folder is not None
    folder = budgets.folder.folder
    day = int(clock.t // 86400)
    parent = os.getppid()  # a live process that is not this one: a live worker's row
    live = folder / f"{parent}-{process_start(parent)}-b0.json"
    live.write_bytes(row(["tenant/day/J", "t", day, 60.0], ["tenant/day/J", "t", day - 1, 500.0]))
    (folder / "4194303-1-b0.json").write_bytes(row(  # no such process: a dead worker's
        ["tenant/day/J", "t", day, 30.0], ["elsewhere", "t", day, 9.0],
        refused=[["tenant/day/J", "t", day, 2]]))
    (folder / "77-1-b0.json").write_text("{not json")  # skipped, said once
    budgets.tick()
    assert budgets.spent == {(0, "t"): 90.0}  # today's, of this configuration's budgets
    assert budgets.workers == 2
    slots, headers = budgets.admit("t", "/", None)
    assert dict(headers)[b"x-energy-budget-remaining"] == b"10"
    budgets.spend(slots, Energy(15.0, "measured", id="x"))
    with pytest.raises(OverBudget):
        budgets.admit("t", "/", None)
    budgets._last_fold = 0.0
    clock.t += 2.0
    budgets.tick(read=True)  # folds the dead worker's row into dead.json
    assert not (folder / "4194303-1-b0.json").exists() and (folder / DEAD).exists()
    assert budgets.spent == {(0, "t"): 105.0}
    data = unframed(budgets.folder.rows.path.read_bytes())
    assert data is not None
    mine = json.loads(data)
    assert mine["spent"] == [["tenant/day/J", "t", day, 15.0]]
    assert mine["refused"] == [["tenant/day/J", "t", day, 1]]
    assert budgets.snapshot()["items"][0]["keys"]["t"]["refused"] == 3
    assert budgets.exceeded() == {("tenant/day/J", "t"): 1}
    # a write half done (the frame's sum disagrees): what was read before stands
    live.write_bytes(row(["tenant/day/J", "t", day, 70.0])[:-3])
    budgets.tick(read=True)
    assert budgets.spent == {(0, "t"): 105.0}
    live.write_bytes(row(["tenant/day/J", "t", day, 70.0]))
    budgets.tick(read=True)
    assert budgets.spent == {(0, "t"): 115.0}
    clock.t = (day + 1) * 86400.0 + 1.0
    budgets.tick()
    assert budgets.spent == {}  # a new day: the dead worker's spending is over with its period


def test_a_fresh_worker_reserves_the_usual_cost_the_other_workers_learnt(tmp_path: Path) -> None:
    """A hostile trial's wave (40 clients of one key, 4 workers, 3 warm-up requests that
    reached some workers only): a worker that had learnt no usual cost reserved nothing, and
    the key passed its 300 J hard limit by 5-12 requests (benchmarks/results/
    budgets-2026-12-03-usual.md). A worker's row now says the usual cost it learnt; one that
    has learnt none reserves the live workers' mean until its own figures teach it."""
    budgets, clock = shared_budgets(tmp_path)
    assert budgets.folder is not None
    day = int(clock.t // 86400)
    parent = os.getppid()  # a live process that is not this one: the warm workers' rows
    for tag, usual in (("b0", 15.0), ("b1", 25.0)):
        (budgets.folder.folder / f"{parent}-{process_start(parent)}-{tag}.json").write_bytes(
            row(["tenant/day/J", "u", day, 40.0], usual=[["tenant/day/J", usual]]))
    # A row whose usual cost makes no sense is an odd row: skipped, neither spent nor reserved.
    (budgets.folder.folder / f"{parent}-{process_start(parent)}-b2.json").write_bytes(
        row(["tenant/day/J", "v", day, 1.0], usual=[["tenant/day/J", -5.0]]))
    budgets.tick(read=True)
    assert budgets._usual[0] == 20.0 and not budgets._usual_learnt[0]  # the live rows' mean
    assert (0, "v") not in budgets.spent
    admitted = []
    with pytest.raises(OverBudget):
        for _ in range(40):  # in flight together on the fresh worker
            admitted.append(budgets.admit("t", "/", None)[0])
    assert len(admitted) == 5  # 5 x 20 J reaches 100
    budgets.spend(admitted[0], Energy(30.0, "measured", id="f0", settled=True))
    budgets.spend(admitted[1], Energy(30.0, "measured", id="f1", settled=True))
    assert budgets._mean[0] == pytest.approx(20.0 + 0.2 * 10.0 + 0.2 * 8.0)  # its own, from the borrowed
    assert budgets._usual[0] == 30.0  # the upper decile of its own figures
    budgets.tick(read=True)
    assert budgets._usual[0] == 30.0  # learnt: the others' no longer replace it
    data = unframed(budgets.folder.rows.path.read_bytes())
    assert data is not None and json.loads(data)["usual"] == [["tenant/day/J", 30.0]]
    budgets.close()


def row(*spent: list[Any], refused: list[list[Any]] | None = None, usual: list[list[Any]] | None = None,
        ) -> bytes:
    data: dict[str, Any] = {"schema": ROW_SCHEMA, "spent": list(spent), "refused": refused or []}
    if usual is not None:
        data["usual"] = usual
    return framed(json.dumps(data).encode())


def test_where_nothing_can_be_shared_the_budgets_are_the_workers_own_and_say_why(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    budgets = Budgets([Budget(joules=10.0, hard=True)], directory=str(tmp_path / "a-file"))
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(20.0, "measured", id="x"))
    budgets.tick()
    with pytest.raises(OverBudget):  # its own spending, at once
        budgets.admit("t", "/", None)
    state = budgets.snapshot()
    assert state["shared"] is False and "not a directory" in state["shared_reason"]
    assert state["workers"] == 1


def _wait(found: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.mark.anyio
async def test_a_window_that_cannot_open_serves_the_answer_unmetered_and_gives_back_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error of ours between admission and the app (the window's open) costs that request
    its figure, never its answer (served unmetered), and never the key: its hold on a cold
    hard budget is given back, so the next one is admitted rather than told the key's first
    request is still being measured."""
    from giul_asgi.meter import Meter

    metered = EnergyMiddleware(app, nodes=[Node("dark", reader="none", workers_dir="off")],
                               tiers=[Tier("8b", 1000.0)], ledgers=Ledgers(), tenant=team,
                               budgets=[Budget(joules=250.0, hard=True)])
    opened = Meter.open
    broken = True

    def open_once(self: Meter) -> None:
        if broken:
            raise RuntimeError("a bug of ours")
        opened(self)

    monkeypatch.setattr(Meter, "open", open_once)
    async with client(metered) as c:
        served = await c.post("/v1/chat/completions", headers={"x-team": "team-a"})
        broken = False
        after = await c.post("/v1/chat/completions", headers={"x-team": "team-a"})
    # a bug of ours costs the figure, never the answer: served unmetered
    assert served.status_code == 200 and "x-energy-joules" not in served.headers, served.headers
    assert after.status_code == 200 and "x-energy-joules" in after.headers, after.text


def test_a_hard_budget_reserves_the_upper_decile_of_recent_figures_not_their_mean() -> None:
    """A request's cost moves with how many share the card: a crowd of 40 settles at 5-10 J
    each and teaches a low mean, then the last requests before the limit, nearly alone, cost
    14-33 J (helper-10's warm runs, budgets-2026-12-06-cold.md: 300 J passed by 7.5-16
    requests). What a request reserves is the upper decile of the recent figures, so the
    dear ones the crowd hides are counted at admission."""
    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=300.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    figures = ([6.0] * 5 + [20.0]) * 5 + [6.0, 6.0]  # the last 32: one in six or so dear
    for n, joules in enumerate(figures):
        slots, _ = budgets.admit("crowd", "/", None)
        budgets.spend(slots, Energy(joules, "measured", id=f"r{n}", settled=True))
    assert budgets._mean[0] < 12.0  # what the moving mean alone would reserve
    assert budgets._usual[0] == 20.0
    spent = budgets.spent[(0, "crowd")]
    admitted = 0
    with pytest.raises(OverBudget):
        for _ in range(100):
            budgets.admit("crowd", "/", None)
            admitted += 1
    assert admitted == math.ceil((300.0 - spent) / 20.0)  # each in flight holds a dear one's cost


def test_what_first_figures_taught_gives_way_to_the_first_settled_one() -> None:
    """A cold card's first figures may be dear (80 J here) where the settled ones are not
    (10 J): once a figure settles the budget learns from settled figures alone, or the dear
    first ones would stay among the 32 recent and be reserved, refusing a key far below its
    limit (the review's finding)."""
    budgets = Budgets([Budget(joules=1000.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    for n in range(5):
        slots, _ = budgets.admit(f"k{n}", "/", None)
        budgets.spend(slots, Energy(80.0, "estimated", id=f"f{n}", settled=False))
    assert budgets._usual[0] == 80.0
    for n in range(10):
        slots, _ = budgets.admit("t", "/", None)
        budgets.spend(slots, Energy(10.0, "measured", id=f"s{n}", settled=True))
    assert budgets._usual[0] == 10.0


def test_measuring_refusals_of_many_keys_are_counted_within_the_tables_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys come from clients: refusals while a cold key is measured count under the key
    only while the refusal table has room, and under <other> past it."""
    monkeypatch.setattr(spending, "MAX_KEYS", 5)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    for n in range(20):
        budgets.admit(f"k{n}", "/", None)  # each key's first: held
        with pytest.raises(Measuring):
            budgets.admit(f"k{n}", "/", None)
    assert len(budgets._refused) <= 6
    assert sum(budgets._refused.values()) == 20


def test_a_first_request_that_runs_long_lets_one_more_of_its_key_in_each_hold_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant whose first request is a long stream was refused for the whole stream (a
    hostile trial: 20 s, every retry a measuring 429). The key's request in flight holds it
    for HOLD_S; past that, one more of the key runs, and holds it in turn: a cold wave still
    passes one request a worker per HOLD_S."""
    monkeypatch.setattr(spending, "HOLD_S", 0.05)
    budgets = Budgets([Budget(joules=100.0, hard=True, period=3600)], directory="off", clock=Clock(6e4))
    budgets.setup()
    budgets.admit("t", "/", None)  # the long one, still running
    with pytest.raises(Measuring):
        budgets.admit("t", "/", None)
    time.sleep(0.06)
    budgets.admit("t", "/", None)  # it ran past HOLD_S: one more
    with pytest.raises(Measuring):
        budgets.admit("t", "/", None)
    assert not budgets._blind[0]  # a long request is no sign of a stuck reader


def test_a_refusal_that_rests_on_requests_in_flight_says_so_and_asks_for_a_second() -> None:
    """A hostile trial: 2 of a tenant's requests in flight reserved past a 200 J limit, and
    the 28 behind them were told the budget "is spent" and to retry at midnight with
    x-should-retry: false, though the tenant had 36 J left once they closed. Where only this
    worker's reservations in flight reach the limit, the refusal says so, with the room left
    and a second's Retry-After; once spending itself reaches it, the period's end."""
    from giul_asgi.budgets import Reserved

    clock = Clock(1000 * 60.0)
    budgets = Budgets([Budget(joules=250.0, hard=True, period=3600)], directory="off", clock=clock)
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(100.0, "measured", id="r0", settled=True))  # usual: 100 J
    first, _ = budgets.admit("t", "/", None)
    budgets.admit("t", "/", None)  # 100 spent, 200 reserved
    with pytest.raises(Reserved) as caught:
        budgets.admit("t", "/", None)
    refusal = caught.value
    headers = dict(refusal.headers(refusal.body()))
    assert headers[b"retry-after"] == b"1" and b"x-should-retry" not in headers
    assert headers[b"x-energy-budget-remaining"] == b"150"
    error = json.loads(refusal.body())["error"]
    assert error["code"] == "energy_budget_reserved" and "is not spent" in error["message"]
    budgets.spend(first, Energy(20.0, "measured", id="r1", settled=True))  # it left room
    budgets.admit("t", "/", None)
    budgets.spend(budgets.admit("u", "/", None)[0], Energy(1.0, "measured", id="u", settled=True))
    slots, _ = budgets.admit("v", "/", None)
    budgets.spend(slots, Energy(300.0, "measured", id="v", settled=True))  # spent past it
    with pytest.raises(OverBudget) as spent:
        budgets.admit("v", "/", None)
    assert not isinstance(spent.value, Reserved) and "is spent" in spent.value.message


def test_a_request_is_charged_to_the_period_it_was_admitted_in_whenever_it_closes() -> None:
    """A hostile trial: requests admitted in a period and closing in the next were charged
    there (at no less than their reservation), so with a 60 J limit over 10 s periods the
    new period opened "spent" and told the tenant to come back at its end. A request is
    charged to the period it was admitted in: the next opens empty."""
    clock = Clock(1000 * 60.0 + 50.0)
    budgets = Budgets([Budget(joules=60.0, hard=True, period=60)], directory="off", clock=clock)
    budgets.setup()
    slots, _ = budgets.admit("t", "/", None)
    budgets.spend(slots, Energy(20.0, "measured", id="r0", settled=True))  # usual: 20 J
    in_flight = [budgets.admit("t", "/", None)[0] for _ in range(2)]  # 60 J: the limit
    clock.t = 1001 * 60.0 + 0.5  # they close in the next period
    budgets.tick()
    budgets.spend(in_flight[0], Energy(25.0, "measured", id="r1", settled=True))
    budgets.spend(in_flight[1], Energy(None, "unknown", id="r2", settled=False))
    assert budgets.spent == {}  # the new period opens empty
    slots, headers = budgets.admit("t", "/", None)
    assert dict(headers)[b"x-energy-budget-remaining"] == b"60"


def test_hard_budgets_that_cannot_be_shared_say_each_worker_admits_the_whole_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="giul_asgi.budgets")
    Budgets([Budget(joules=1.0, per="tier")], directory=False).setup()  # soft: nothing to say
    assert not [r for r in caplog.records if "admits up to the whole" in r.getMessage()]
    Budgets([Budget(joules=1.0, per="tier", hard=True)], directory=False).setup()
    said = [r.getMessage() for r in caplog.records if "admits up to the whole" in r.getMessage()]
    assert len(said) == 1 and "this worker's alone" in said[0]
