"""Which node, tier and label a request gets; bad configuration fails when built."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.routing import Route as StarletteRoute

from giul_asgi.asgi.routing import (
    NEVER_METERED,
    UNMATCHED,
    PathSet,
    Router,
    Target,
    app_documents,
    mount_template,
    route_template,
)
from giul_asgi.config import Node, Route, Tier
from giul_asgi.errors import ConfigError


async def ok(request: Any) -> PlainTextResponse:
    return PlainTextResponse("ok")


ITEMS = StarletteRoute("/items/{item}", ok)
INNER = Starlette(routes=[ITEMS])
APP = Starlette(routes=[
    Mount("/tenants/{tid}", routes=[ITEMS, Mount("/v{version}", routes=[ITEMS])]),
    Mount("/static", app=INNER),
])


def after_routing(root_path: str, route: Any, base: str = "") -> dict[str, Any]:
    """The scope as Starlette's router leaves it: the mounts' raw prefixes in root_path."""
    return {"type": "http", "path": root_path + "/items/7", "root_path": root_path,
            "route": route, "_base": base}


@pytest.mark.parametrize(
    ("root_path", "template"),
    [
        ("/tenants/42", "/tenants/{tid}/items/{item}"),
        ("/tenants/acme-corp", "/tenants/{tid}/items/{item}"),
        ("/tenants/42/v2", "/tenants/{tid}/v{version}/items/{item}"),
        ("/static", "/static/items/{item}"),
    ],
)
def test_mount_prefixes_become_templates(root_path: str, template: str) -> None:
    """Starlette writes a mount's matched prefix into root_path: every tenant would be a
    label of its own (1025 of them, then ``<other>`` swallowing unrelated routes)."""
    assert route_template(after_routing(root_path, ITEMS), "", APP) == template


def test_a_proxys_root_path_is_kept() -> None:
    scope = after_routing("/gw/tenants/9", ITEMS)
    assert route_template(scope, "/gw", APP) == "/gw/tenants/{tid}/items/{item}"
    assert route_template({"route": ITEMS, "root_path": "/gw"}, "/gw", APP) == "/gw/items/{item}"


def test_a_prefix_no_mount_explains_is_never_a_label() -> None:
    assert route_template(after_routing("/elsewhere/42", ITEMS), "", APP) is None
    assert route_template(after_routing("/tenants/42", ITEMS), "", None) is None
    assert mount_template(object(), "/tenants/1") is None
    assert route_template({"root_path": ""}, "", APP) is None  # no route matched (a 404)


def test_labels_stay_bounded_over_many_tenants() -> None:
    labels = {route_template(after_routing(f"/tenants/{i}", ITEMS), "", APP) for i in range(2000)}
    assert labels == {"/tenants/{tid}/items/{item}"}


def target(router: Router, path: str) -> Target:
    found = router.match({"path": path})
    assert found is not None, path
    return found


def test_routes_match_templates_globs_and_nothing_else() -> None:
    a, b = Node("a"), Node("b")
    router = Router(
        [a, b], [Tier("8b")],
        [Route("/v1/models/{id}", node="b", tier="8b"), Route("/v1/*", node="a")],
        default_node=a, default_tier=None,
    )
    assert target(router, "/v1/models/llama").node == b
    assert target(router, "/v1/models/llama").label == "/v1/models/{id}"
    assert target(router, "/v1/chat").label == "/v1/*"
    assert router.match({"path": "/x"}) is None  # declared routes only: /x is not metered
    assert router.match({"path": "/x"}) is None  # (cached as such)


def test_without_routes_every_path_falls_to_the_default_and_a_catch_all_asks_for_more() -> None:
    a, b = Node("a"), Node("b")
    everything = Router([a], [], [], default_node=a, default_tier=None)
    assert target(everything, "/x").label == UNMATCHED and target(everything, "/x").node == a
    more = Router([a, b], [], [Route("/v1/*", node="b"), Route("/*", node="a")],
                  default_node=a, default_tier=None)
    assert target(more, "/v1/chat").node == b and target(more, "/x").node == a


def test_decide_meters_what_it_routes_beside_the_declared_routes() -> None:
    a, b = Node("a"), Node("b")
    router = Router([a, b], [], [Route("/v1/*", node="a")], default_node=a, default_tier=None,
                    decide=lambda scope: ("b", None) if scope["path"] == "/special" else None)
    assert target(router, "/special").node == b and target(router, "/special").label == UNMATCHED
    assert router.match({"path": "/other"}) is None
    assert target(router, "/v1/x").node == a


def test_the_app_documents_are_found_where_the_app_says() -> None:
    from fastapi import FastAPI
    from starlette.staticfiles import StaticFiles

    app = FastAPI(openapi_url="/api/schema.json", docs_url="/api/docs", redoc_url=None)
    app.mount("/assets", StaticFiles(directory=".", check_dir=False))
    sub = Starlette(routes=[Mount("/img", app=StaticFiles(directory=".", check_dir=False))])
    app.mount("/ui", sub)
    found = set(app_documents(app))
    assert {"/api/schema.json", "/api/docs", "/docs/oauth2-redirect"} <= found
    assert {"/assets", "/assets/*", "/ui/img", "/ui/img/*"} <= found
    assert app_documents(object()) == []
    paths = PathSet(NEVER_METERED)
    paths.add(found)
    for path in ("/healthz", "/health/live", "/openapi.json", "/assets/app.js", "/ui/img/a/b.png",
                 "/api/docs"):
        assert path in paths, path
    for path in ("/v1/chat/completions", "/assetsx", "/docsx", "/ui/other"):
        assert path not in paths, path


@pytest.mark.parametrize(
    ("nodes", "tiers", "routes", "message"),
    [
        ([Node("a"), Node("a", idle_w=50.0)], [], [], "two nodes are named 'a'"),
        ([Node("a")], [Tier("t"), Tier("t", 5.0)], [], "two tiers are named 't'"),
        ([Node("a")], [], [Route("/x", node="nope")], "node 'nope'"),
        ([Node("a")], [], [Route("/x", tier="nope")], "tier 'nope'"),
    ],
    ids=["duplicate-node", "duplicate-tier", "unknown-node", "unknown-tier"],
)
def test_bad_configuration_fails_when_built(
    nodes: list[Node], tiers: list[Tier], routes: list[Route], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Router(nodes, tiers, routes, default_node=nodes[0], default_tier=None)
    assert caught.value.remedy


def test_the_same_node_twice_is_not_a_duplicate() -> None:
    a = Node("a")
    assert list(Router([a, a], [], [], default_node=a, default_tier=None).nodes) == ["a"]


def test_a_failing_decide_costs_the_routing_only_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = Node("a")

    def decide(scope: Any) -> Any:
        if scope["path"] == "/boom":
            raise RuntimeError("bug in decide")
        return ("missing-node", None)

    router = Router([a], [], [], default_node=a, default_tier=None, decide=decide)
    with caplog.at_level(logging.ERROR, logger="giul_asgi.routing"):
        for path in ("/boom", "/other", "/boom"):
            assert router.match({"path": path}).node == a
    assert len([r for r in caplog.records if "decide" in r.getMessage()]) == 1


def test_path_set_exact_and_patterns() -> None:
    paths = PathSet(["/health", "/metrics/*", "/v1/{x}/status"])
    assert "/health" in paths and "/metrics/a" in paths and "/v1/q/status" in paths
    assert "/v1/chat" not in paths


def test_a_route_naming_a_node_nearly_declared_says_which_was_meant() -> None:
    """A stranger's trial: Route(node="sima") beside a declared "sim-a" said only that it
    was not declared."""
    from starlette.applications import Starlette

    from giul_asgi import ConfigError, EnergyMiddleware, Node, Route

    with pytest.raises(ConfigError, match="did you mean 'sim-a'"):
        EnergyMiddleware(Starlette(), nodes=[Node("sim-a", reader="simulated")],
                         routes=[Route("/x", node="sima")])
