"""Which node and tier a request runs on, and the bounded label its statistics go under.

The window must open when the request arrives, before the framework has matched a route,
so routes are matched against the path first (a template such as ``/v1/models/{id}``
matches ``/v1/models/llama-3``). Once the framework has matched (Starlette and FastAPI
write ``scope["route"]``), the label becomes the real template. A raw path is never a label:
paths that match nothing share one label, so label count stays bounded.

Mounts: Starlette writes a mount's *matched* prefix into ``root_path``
(``app.mount("/tenants/{tid}", sub)`` gives ``/tenants/42``), so the prefix is turned back
into the mounts' templates by walking the app's mounts; where that fails, the label stays
what the patterns gave, never the raw prefix.

Which requests are metered (nothing else is touched: not a header, not a byte):

- with ``routes`` declared, the requests they match (and those ``decide`` routes); to meter
  every other path too, declare a catch-all last: ``Route("/*", node=...)``;
- with none declared, every request;
- never :data:`NEVER_METERED` (health checks, scrapes, the framework's own documents), the
  app's own documents found where it says (FastAPI's ``openapi_url``, ``docs_url``,
  ``redoc_url``; every ``Mount`` of ``StaticFiles``), nor the operator's ``exclude=``.

Configuration is checked when the router is built (duplicate names, a route to a node or
tier that is not declared): it fails once, at startup, with :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import Node, Route, Tier
from ..errors import ConfigError

log = logging.getLogger("giul_asgi.routing")

UNMATCHED = "<unmatched>"
_MOUNT_DEPTH = 8
_PARAM = re.compile(r"\{[^}/]+\}")
_CACHE_SIZE = 1024
_MISSING: Any = object()

#: Health checks and scrapes: Kubernetes' probes, load balancers', Prometheus'.
HEALTH_PATHS: tuple[str, ...] = (
    "/health", "/health/*", "/healthz", "/livez", "/readyz", "/ready", "/live", "/ping", "/metrics",
)
#: The framework's own documents at their usual paths (FastAPI's defaults, a browser's icon).
DOCUMENT_PATHS: tuple[str, ...] = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                                   "/favicon.ico")
#: What is never metered, whatever is declared (``/energy``: ours, or the app's own when
#: ``energy_path=None``).
NEVER_METERED: tuple[str, ...] = (*HEALTH_PATHS, *DOCUMENT_PATHS, "/energy", "/energy/*")
#: The attributes where FastAPI keeps the paths of its documents (None when switched off).
_DOCUMENT_URLS = ("openapi_url", "docs_url", "redoc_url", "swagger_ui_oauth2_redirect_url")

Decider = Callable[[Mapping[str, Any]], "tuple[Node | str | None, Tier | str | None] | None"]


@dataclass(frozen=True, slots=True)
class Target:
    node: Node | None
    tier: Tier | None
    label: str


def compile_pattern(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    """A template (``{id}``), a glob (``*``) or a regex, as one compiled regex."""
    if isinstance(pattern, re.Pattern):
        return pattern
    out = []
    pos = 0
    for match in _PARAM.finditer(pattern):
        out.append(_glob(pattern[pos:match.start()]))
        out.append(r"[^/]+")
        pos = match.end()
    out.append(_glob(pattern[pos:]))
    return re.compile("^" + "".join(out) + "$")


def _glob(text: str) -> str:
    return ".*".join(re.escape(part) for part in text.split("*"))


def route_path(scope: Mapping[str, Any]) -> str:
    """The request's path as the app it reaches routes it: without the ``root_path`` it is
    mounted at (a middleware on ``app.mount("/api", sub)`` sees ``/api/v1/...`` with
    ``root_path`` ``/api``; ``uvicorn --root-path``), by Starlette's own rule, so that the
    routes, ``/energy`` and ``exclude`` are written as the app's own paths."""
    path: str = scope.get("path", "")
    root = scope.get("root_path") or ""
    if not root or not path.startswith(root):
        return path
    if len(path) == len(root):
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


def route_template(
    scope: Mapping[str, Any], root_path: str = "", app: Any = None
) -> str | None:
    """The framework's matched route template, once its router has run, or None.

    ``root_path`` is the scope's own before the app ran (what a proxy set); ``app`` is the
    application whose mounts are walked when the router added a prefix to it.
    """
    route = scope.get("route")
    path_format = getattr(route, "path_format", None) or getattr(route, "path", None)
    if not isinstance(path_format, str) or not path_format:
        return None
    now = scope.get("root_path", "")
    if now == root_path:
        return root_path + path_format  # the common case: no mount on the way
    if not isinstance(now, str) or not now.startswith(root_path):
        return None
    prefix = mount_template(app, now[len(root_path):])
    if prefix is None:
        return None
    own = getattr(route, "path", None)
    if _routes_of(route) is not None and isinstance(own, str) and path_format.startswith(own):
        # The matched route is itself the last mount (``Mount("/static", StaticFiles())``):
        # its prefix is already in the walked templates; only its rest is added.
        path_format = path_format[len(own):]
    return root_path + prefix + path_format


def mount_template(app: Any, prefix: str) -> str | None:
    """The templates of the mounts that matched ``prefix`` (the raw part of a root_path),
    found by walking ``app``'s routes (anything with Starlette's ``routes``, ``path_regex``
    and ``path_format``); None when they cannot be found."""
    out = ""
    rest = prefix
    routes = _routes_of(app)
    for _ in range(_MOUNT_DEPTH):
        if not rest:
            return out
        for route in routes or ():
            regex = getattr(route, "path_regex", None)
            path_format = getattr(route, "path", None)  # a Mount's own template
            sub = _routes_of(route)
            if sub is None or regex is None or not isinstance(path_format, str):
                continue
            match = regex.match(rest + "/")
            if match is None or "path" not in match.groupdict():
                continue
            remaining = "/" + match.group("path")
            consumed = (rest + "/")[: len(rest) + 1 - len(remaining)]
            if not consumed or not rest.startswith(consumed):
                continue
            out += path_format.rstrip("/")
            rest = rest[len(consumed):]
            routes = sub
            break
        else:
            return None
    return out if not rest else None


def _routes_of(obj: Any) -> Any:
    if obj is None:
        return None
    try:
        routes = getattr(obj, "routes", None)
        if routes is None:
            router = getattr(obj, "router", None)
            routes = getattr(router, "routes", None) if router is not None else None
    except Exception:  # a property on someone else's app: not ours to break
        return None
    return routes if isinstance(routes, list | tuple) else None


def app_documents(app: Any) -> list[str]:
    """The paths where ``app`` serves its own documents: FastAPI's OpenAPI and docs URLs
    where it moved them, and every ``Mount`` of ``StaticFiles`` (as ``/prefix/*``), mounts
    within mounts included."""
    found: list[str] = []
    for name in _DOCUMENT_URLS:
        try:
            value = getattr(app, name, None)
        except Exception:  # a property on someone else's app: not ours to break
            continue
        if isinstance(value, str) and value.startswith("/"):
            found.append(value)
    try:
        from starlette.staticfiles import StaticFiles
    except ImportError:  # pragma: no cover - starlette is a dependency
        return found
    todo: list[tuple[str, Any]] = [("", app)]
    for _ in range(_MOUNT_DEPTH):
        deeper: list[tuple[str, Any]] = []
        for prefix, parent in todo:
            for route in _routes_of(parent) or ():
                path = getattr(route, "path", None)
                if not isinstance(path, str) or _is_pattern(path):
                    continue
                if isinstance(getattr(route, "app", None), StaticFiles):
                    found.extend((prefix + path, prefix + path + "/*"))
                elif _routes_of(route) is not None:
                    deeper.append((prefix + path, route))
        todo = deeper
    return found


class Router:
    """Maps requests to a :class:`Target`, or to None: not metered (routes are declared and
    none matches). Built once; matching is cached per path."""

    def __init__(
        self,
        nodes: Iterable[Node],
        tiers: Iterable[Tier],
        routes: Iterable[Route],
        *,
        default_node: Node | None,
        default_tier: Tier | None,
        decide: Decider | None = None,
    ) -> None:
        self.nodes = _unique("node", nodes)
        self.tiers = _unique("tier", tiers)
        self.default_node = default_node
        self.default_tier = default_tier
        self.decide = decide
        self._routes: list[tuple[re.Pattern[str], Target]] = []
        for route in routes:
            node = self._node(route.node) if route.node is not None else default_node
            tier = self._tier(route.tier) if route.tier is not None else default_tier
            label = route.pattern if isinstance(route.pattern, str) else route.pattern.pattern
            self._routes.append((compile_pattern(route.pattern), Target(node, tier, label)))
        #: Where a request no route matches goes: the default node when none is declared;
        #: nowhere (not metered) when some are.
        self._default = Target(default_node, default_tier, UNMATCHED) if not self._routes else None
        self._cache: dict[str, Target | None] = {}
        self._decide_failed = False

    def _node(self, value: Node | str) -> Node:
        return _lookup(self.nodes, Node, value, "node")

    def _tier(self, value: Tier | str) -> Tier:
        return _lookup(self.tiers, Tier, value, "tier")

    def match(self, scope: Mapping[str, Any]) -> Target | None:
        """The request's target; None when it is not to be metered."""
        if self.decide is not None:
            return self._decided(scope)
        return self._match(scope)

    def _match(self, scope: Mapping[str, Any]) -> Target | None:
        """By the app's own path, else (a pattern written with the mount's prefix, as before
        mounts were stripped) by the whole path."""
        own = route_path(scope)
        target = self._match_path(own)
        if target is None and own != scope.get("path", own):
            target = self._match_path(scope.get("path", ""))
        return target

    def _decided(self, scope: Mapping[str, Any]) -> Target | None:
        base = self._match(scope)
        try:
            decided = self.decide(scope) if self.decide is not None else None
            if decided is None:
                return base
            node, tier = decided
            return Target(
                self._node(node) if node is not None else
                base.node if base is not None else self.default_node,
                self._tier(tier) if tier is not None else
                base.tier if base is not None else self.default_tier,
                base.label if base is not None else UNMATCHED,
            )
        except Exception as exc:  # the user's callable: a bad answer costs the routing only
            if not self._decide_failed:
                self._decide_failed = True
                log.error("decide(scope) failed (%s); requests keep their route's node", exc)
            return base

    def _match_path(self, path: str) -> Target | None:
        """The target for ``path`` by the route patterns alone (cached, bounded)."""
        target = self._cache.get(path, _MISSING)
        if target is not _MISSING:
            return target  # type: ignore[return-value]
        target = self._default
        for regex, candidate in self._routes:
            if regex.match(path):
                target = candidate
                break
        if len(self._cache) < _CACHE_SIZE:
            self._cache[path] = target
        return target

    def labels(self) -> list[str]:
        """The declared routes' labels (their patterns), as requests they match carry them."""
        return [target.label for _, target in self._routes]

    def catalog(self) -> dict[str, Node | Tier]:
        """Names a handler may :meth:`Meter.bind` to."""
        out: dict[str, Node | Tier] = {f"node:{k}": v for k, v in self.nodes.items()}
        out.update({f"tier:{k}": v for k, v in self.tiers.items()})
        return out


def _unique(kind: str, items: Iterable[Any]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for item in items:
        if item.name in table and table[item.name] != item:
            raise ConfigError(
                f"two {kind}s are named {item.name!r}",
                remedy=f"give each {kind} its own name in {kind}s=[...]",
            )
        table[item.name] = item
    return table


def _lookup(table: dict[str, Any], kind: type, value: Any, what: str) -> Any:
    """An object by name from ``table``; an object given directly joins the table."""
    if isinstance(value, kind):
        table.setdefault(value.name, value)  # type: ignore[attr-defined]
        return value
    if value not in table:
        close = difflib.get_close_matches(str(value), sorted(table), n=1, cutoff=0.6)
        meant = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"a route names {what} {value!r}, which is not declared",
            remedy=f"{meant}add it to the middleware's {what}s=[...] or fix the route",
        )
    return table[value]


class PathSet:
    """Paths that are never metered (the energy endpoint, metrics, health checks)."""

    def __init__(self, patterns: Iterable[str | re.Pattern[str]]) -> None:
        self._patterns: list[str | re.Pattern[str]] = []
        self.add(patterns)

    def add(self, more: Iterable[str | re.Pattern[str]]) -> None:
        """Never meter ``more`` either (the app's documents, learnt at its first call)."""
        self._patterns = patterns = [*self._patterns, *(p for p in more if p not in self._patterns)]
        self._exact = {p for p in patterns if isinstance(p, str) and not _is_pattern(p)}
        wild = [p for p in patterns if not isinstance(p, str) or _is_pattern(p)]
        self._regex = (
            re.compile("|".join(f"(?:{compile_pattern(p).pattern})" for p in wild))
            if wild else None
        )

        # Every request asks; a pattern is tried once per path (bounded, as the router's).
        self._seen: dict[str, bool] = {}

    def __contains__(self, path: object) -> bool:
        if path in self._exact:
            return True
        if self._regex is None or not isinstance(path, str):
            return False
        found = self._seen.get(path)
        if found is None:
            found = self._regex.match(path) is not None
            if len(self._seen) < _CACHE_SIZE:
                self._seen[path] = found
        return found


def _is_pattern(text: str) -> bool:
    return "*" in text or "{" in text
