"""``/energy``: the statistics as JSON, a page with plots, records by id, Prometheus text.

:class:`EnergyEndpoint` is a small ASGI app that the middleware hands its own paths to
(``endpoint.handles(path)``); it can also be mounted on its own. It serves

- ``GET {path}``: the JSON of docs/energy-schema.md (``"schema": "giul-asgi/energy/3"``),
  filtered by ``?window=``, ``?route=``, ``?node=``, ``?tenant=`` (a tenant's label as
  /energy shows it: ``key:`` and a hash, never a key); the page instead when the client
  prefers ``text/html`` (a browser);
- ``GET {path}/ui``: the page (tables and plots, drawn in the browser from the same JSON,
  refreshing itself);
- ``GET {path}/requests/{id}``: that request's record (its settled figure once settled),
  for as long as the :class:`~giul_asgi.records.RecordStore` keeps it;
- ``GET {metrics_path}``: Prometheus text, when ``metrics_path`` is given.

Access: with ``token``, a request must carry ``Authorization: Bearer <token>`` (or
``?token=``, for a browser); with ``guard``, ``guard(scope)`` (sync or async) must return
true; with neither, only loopback clients are served (the rules of
:mod:`giul_asgi.serve.access`, which giul-agent follows too). The statistics are rendered in a
worker thread, off the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import anyio.to_thread

from ..asgi.routing import route_path
from ..errors import ConfigError, GiulError, require_installed
from ..exporters import ledger_totals
from ..page import render_page
from ..records import Lookup, RecordStore
from ..stats import Cell, Statistics
from .access import Access, Guard

Scope = MutableMapping[str, Any]
RECORD_SCHEMA = "giul-asgi/energy-record/1"
_REMEDY = "ask with the X-Energy-Id of a response of this server"
#: What to do about each reason a record is missing (RecordStore.lookup's reasons).
_REMEDIES = {
    "expired after max_age_s": "ask sooner, or keep records longer: RecordStore(max_age_s=...)",
    "evicted": "ask sooner, or keep more: RecordStore(max_records=...)",
    "its process's journal was not shared": "give the host's place room or make it private "
                                            "(see the server's log), so every worker shares records",
    "its record makes no sense": "the journal was damaged: the server's log names the file",
}
LEDGER_FIELDS = (
    "measured_j", "charged_j", "unattributed_j", "foreign_j", "in_flight_j",
    "conservation_error_j", "idle_w", "mean_concurrency", "foreign_watts", "contended",
    "reads", "read_errors", "last_error", "last_reading_age_s", "resets", "period_s",
    "lost_s", "windows_open", "estimated_j", "workers",
    "drawn_j", "allocated_j", "idle_charged_j", "idle_in_flight_j", "idle_unattributed_j",
    "allocation_error_j", "upstream_error",
)

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return bytes(orjson.dumps(obj))
except ImportError:  # pragma: no cover - orjson is optional

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


class EnergyEndpoint:
    """The ``/energy`` app. ``stats`` is an EnergyStats or a HostStats (whole host)."""

    def __init__(
        self, *, stats: Statistics, ledgers: Iterable[Any] | None, path: str = "/energy",
        metrics_path: str | None = None, token: str | None = None, guard: Guard | None = None,
        records: RecordStore | None = None, refresh_s: float = 5.0,
        token_name: str = "token", guard_name: str = "guard", budgets: Any = None,
    ) -> None:
        for name, value in (("path", path), ("metrics_path", metrics_path)):
            if value is not None and (not isinstance(value, str) or not value.startswith("/")
                                      or (value != "/" and value.endswith("/"))):
                raise ConfigError(f"{name}={value!r} must start with / and not end with one",
                                  remedy='use "/energy" or "/metrics"')
        self.access = Access(token=token, guard=guard, realm="giul-energy",
                             token_name=token_name, guard_name=guard_name)
        self.stats = stats
        self.ledgers = ledgers
        self.path = path
        self.metrics_path = metrics_path
        self.records = records
        #: The middleware's budgets (``giul_asgi.budgets.Budgets``), or None.
        self.budgets = budgets
        self.refresh_s = refresh_s
        self._collector: Any = None
        if metrics_path is not None:
            _check_prometheus_client(metrics_path)

    def handles(self, path: str) -> bool:
        """Whether a request path is this endpoint's."""
        return path == self.path or path.startswith(self.path + "/") or (
            self.metrics_path is not None and path == self.metrics_path
        )

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # served on its own: nothing to start or stop
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _send(send, scope, 405, b'{"error":"only GET and HEAD"}', "application/json",
                        [(b"allow", b"GET, HEAD")])
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        refusal = await self.access.refusal(scope, query_token=_first(query, "token"))
        if refusal is not None:
            why = {"error": refusal.error, **({"remedy": refusal.remedy} if refusal.remedy else {})}
            await _send(send, scope, refusal.status, _dumps(why), "application/json", list(refusal.headers))
            return
        path = route_path(scope)  # its own paths, under a mount too
        try:
            if self.metrics_path is not None and path == self.metrics_path:
                body = await anyio.to_thread.run_sync(self.metrics_text)
                await _send(send, scope, 200, body, "text/plain; version=0.0.4; charset=utf-8")
            elif path in (self.path, self.path + "/"):
                if _wants_html(scope, query):
                    await self._page(scope, send, query)
                else:
                    data = await anyio.to_thread.run_sync(lambda: self.snapshot(**_filters(query)))
                    await _send(send, scope, 200, _dumps(data), "application/json")
            elif path == self.path + "/ui":
                await self._page(scope, send, query)
            elif path.startswith(self.path + "/requests/"):
                await self._record(scope, send, path[len(self.path + "/requests/"):])
            else:
                await _send(send, scope, 404, b'{"error":"not found"}', "application/json")
        except GiulError as exc:
            await _send(send, scope, 400, _dumps({"error": exc.message, "remedy": exc.remedy}),
                        "application/json")

    # -- content --------------------------------------------------------------------------

    def snapshot(self, window: str | None = None, route: str | None = None,
                 node: str | None = None, tenant: str | None = None) -> dict[str, Any]:
        """The documented JSON: the statistics, with node sections from the ledgers."""
        totals = list(ledger_totals(self.ledgers))
        self._observe(totals)
        data: dict[str, Any] = self.stats.snapshot(window, route=route, node=node, tenant=tenant)
        data.setdefault("workers", 1)
        data.setdefault("shared", False)
        data.setdefault("shared_reason", "statistics of this process (an EnergyStats given as stats=)")
        data.setdefault("server", None)
        records = self.records
        # Records by id are shared (or not) on their own: a full place can fail one and not the other.
        data["records_shared"] = records.shared if records is not None else False
        data["records_reason"] = (records.reason if records is not None
                                  else "this endpoint keeps no records")
        rates = self.stats.view().node_rates()
        nodes = data["nodes"]
        empty = None
        readers = _reader_health(self.ledgers)
        carbons = _carbon_health(self.ledgers)
        migs = _migs(self.ledgers)
        for t in totals:
            name = str(getattr(t, "node", None) or "<none>")
            if node is not None and name != node:
                continue
            if name not in nodes:
                empty = empty or Cell().summary()
                nodes[name] = dict(empty)
            ledger = _ledger_dict(t)
            watts, reads = rates.get(name, (None, None))
            ledger["power_w"] = watts
            ledger["reads_per_s"] = reads
            ledger["reader"] = readers.get(name)
            ledger["carbon"] = carbons.get(name)
            ledger["mig"] = migs.get(name)
            nodes[name] = {**nodes[name], "ledger": ledger}
        for section in nodes.values():
            section.setdefault("ledger", None)
        data["budgets"] = self.budgets.snapshot() if self.budgets is not None else None
        return data

    def metrics_text(self) -> bytes:
        from ..exporters.prometheus import EnergyCollector, prometheus_text

        if self._collector is None:
            self._collector = EnergyCollector(self.stats, self.ledgers, budgets=self.budgets)
        self._observe(list(ledger_totals(self.ledgers)))
        return prometheus_text(self._collector)

    def _observe(self, totals: list[Any]) -> None:
        """The power series: the samples each ledger took a step on its reader thread, and a
        sample now of a ledger that keeps none (a reading of two reads' difference)."""
        histories = _histories(self.ledgers)
        if histories:
            self.stats.observe_history(histories)
        self.stats.observe_nodes([t for t in totals
                                  if str(getattr(t, "node", None) or "<none>") not in histories])

    async def _page(self, scope: Scope, send: Any, query: dict[str, list[str]]) -> None:
        data = await anyio.to_thread.run_sync(lambda: self.snapshot(**_filters(query)))
        body = render_page(data, path=scope.get("root_path", "") + self.path, refresh_s=self.refresh_s)
        await _send(send, scope, 200, body, "text/html; charset=utf-8",
                    [(b"content-security-policy",
                      b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                      b"connect-src 'self'; img-src data:")])

    async def _record(self, scope: Scope, send: Any, key: str) -> None:
        records = self.records
        if records is None:
            found = Lookup(None, "this endpoint keeps no records")
        else:  # the other workers' journals are files: read off the event loop
            found = await anyio.to_thread.run_sync(records.lookup, key)
        energy = found.energy
        if energy is None:
            body = _dumps({"error": f"no record under {key!r}", "reason": found.reason,
                           "remedy": _REMEDIES.get((found.reason or "").split(":")[0].split(" (")[0],
                                                   _REMEDY)})
            await _send(send, scope, 404, body, "application/json")
            return
        await _send(send, scope, 200, _dumps({"schema": RECORD_SCHEMA, "record": energy.as_dict()}),
                    "application/json")


def _check_prometheus_client(metrics_path: str) -> None:
    """Serving ``metrics_path`` needs prometheus-client: a missing one is a bad setting, said
    at startup, never a 500 at each scrape."""
    require_installed("prometheus_client", f"metrics_path={metrics_path!r}",
                      "pip install 'giul-asgi[prometheus]', or leave metrics_path unset", "prometheus-client")


def _histories(ledgers: Any) -> dict[str, list[Any]]:
    """Each node's books, one sample a step, as its ledger's reader thread took them (a
    ledger whose reader thread has not taken two is left to be sampled now)."""
    out: dict[str, list[Any]] = {}
    try:
        for ledger in list(ledgers or ()):
            history = getattr(ledger, "history", None)
            samples = history.samples() if history is not None else []
            if len(samples) >= 2:
                out[str(ledger.node.name)] = samples
    except Exception:  # the page never breaks on a ledger
        pass
    return out


def _reader_health(ledgers: Any) -> dict[str, dict[str, Any]]:
    """Each node's reader as its thread last saw it (state, target, last error, remedy)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for ledger in list(ledgers or ()):
            health = getattr(ledger, "health", None)
            if health is not None:
                out[str(ledger.node.name)] = health.as_dict()
    except Exception:  # the page never breaks on a ledger
        pass
    return out


def _carbon_health(ledgers: Any) -> dict[str, dict[str, Any]]:
    """Each node's carbon intensity: where it comes from, its age, why it is unknown."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for ledger in list(ledgers or ()):
            health = getattr(ledger, "carbon_health", None)
            if health is not None:
                out[str(ledger.node.name)] = health
    except Exception:  # the page never breaks on a ledger
        pass
    return out


def _migs(ledgers: Any) -> dict[str, dict[str, Any]]:
    """Each node on a MIG board: the slices it stands for, and the board-level caveat."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for ledger in list(ledgers or ()):
            mig = getattr(ledger, "mig", None)
            if mig is not None:
                out[str(ledger.node.name)] = mig.as_dict()
    except Exception:  # the page never breaks on a ledger
        pass
    return out


def _ledger_dict(totals: Any) -> dict[str, Any]:
    # getattr, not dataclasses.asdict: conservation_error_j is a property of the totals.
    raw = {f: getattr(totals, f, None) for f in LEDGER_FIELDS}
    out = {}
    for field in LEDGER_FIELDS:
        value = raw.get(field)
        if isinstance(value, float) and value != value:  # NaN
            value = None
        out[field] = value if value is None or isinstance(value, bool | int | float | str) else str(value)
    return out


def _filters(query: dict[str, list[str]]) -> dict[str, str | None]:
    return {k: _first(query, k) for k in ("window", "route", "node", "tenant")}


def _first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


def _wants_html(scope: Scope, query: dict[str, list[str]]) -> bool:
    if (query.get("format") or [""])[0] == "json":
        return False
    accept = _header(scope, b"accept") or ""
    return "text/html" in accept and "application/json" not in accept.split(",")[0]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _send(
    send: Any, scope: Scope, status: int, body: bytes, content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})


__all__ = ["RECORD_SCHEMA", "EnergyEndpoint"]
