"""EnergyMiddleware: dispatch and lifespan; each request's work lives in the parts it calls.

Pure ASGI (never ``BaseHTTPMiddleware``, which stops the clock at the headers and hides
mid-stream crashes). A request goes one way through small parts:

    router (node, tier, label) -> Meter.open -> Exchange (the app's messages)
        -> choose(head) -> a responder (JSON / SSE / pass-through) -> the server
    (the app's last message: Exchange.answer, counted before the server has it)
    ... the app returns -> Exchange.close -> Exchange.answer (once) -> Meter.report(listeners)

The first figure is made once, when a responder needs it (headers, the JSON block, a
trailer). The settled figure goes to the listeners (statistics, records by id, sinks,
OpenTelemetry) in batches, from the node's reader thread, never on the request's path.
Nothing here reads a card or blocks: the ledger does that, once per node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread

from .. import logs
from ..budgets import Budget, Budgets, OverBudget, check_budgets
from ..config import Node, Route, Tier, settings_list
from ..context import meter_var
from ..deferred import raise_kept
from ..environment import check_environment
from ..errors import ConfigError, GiulError
from ..ledger import Ledgers, default_ledgers
from ..ledger.registry import stop_once_let_go
from ..listeners import Listener, Listeners
from ..meter import Meter
from ..records import RecordStore
from ..serve.access import check_token
from ..tenants import TenantSetting, tenant_source
from ..wire.formats import FORMATS, Formats
from .exchange import Exchange
from .options import Options, check_callable, check_names
from .responders import choose
from .routing import NEVER_METERED, Decider, PathSet, Router, app_documents, route_path
from .startup import fails_the_startup, failure_line

if TYPE_CHECKING:
    from ..serve.access import Guard
    from ..serve.endpoint import EnergyEndpoint
    from ..stats import HostStats, Statistics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("giul_asgi.middleware")


class OtelSpans(Listener, Protocol):
    """What the middleware asks of OpenTelemetry (``exporters.otel.otel_recorder()``)."""

    def current_span(self) -> Any | None: ...

    def annotate(self, span: Any | None, energy: Any) -> None: ...


class EnergyMiddleware:
    """Meters every HTTP request of ``app`` on the node its route runs on.

    With no ``nodes`` it meters one local node over every visible GPU (``unknown`` where
    there are none). With no ``routes``, every request is metered, on the first node; with
    routes, only the requests they match (``Route("/*", node=...)`` last asks for the rest).
    Health checks, the framework's documents and static mounts are never touched
    (:data:`~giul_asgi.asgi.routing.NEVER_METERED`; ``exclude=[...]`` adds paths).
    ``decide(scope) -> (node, tier) | None`` routes anything patterns cannot; a handler can
    re-bind with ``current_meter().bind(node=..., tier=...)``.

    ``tenant`` says who each request is for: a request header name (``"x-api-key"``,
    ``"authorization"``: the value is hashed, never kept) or a function ``scope -> str |
    None`` (its name is used, made safe); a handler may ``bind(tenant=...)``. The
    statistics keep the ``max_tenants`` (100) tenants with the most joules under their own
    label and the rest under ``<other>``.

    ``settings`` are :class:`~giul_asgi.asgi.options.Options`' fields (``energy_key``,
    ``inject_json``, ``max_body``, ``stream_event``, ``usage_energy``, ``energy_in_usage``,
    ``trailers``, ``energy_format``, ``token_kind``, ``settle_timeout``, ``startup_timeout``,
    ``energy_path``, ``metrics_path``, ``exclude``, ``max_tenants``, ``trace``). Everything is checked here,
    once: a bad value raises :class:`ConfigError` with its remedy before the app serves
    anything; where a framework or a server builds the app, the lifespan startup fails with
    it instead (:mod:`giul_asgi.asgi.startup`).
    """

    #: A bad setting kept for the lifespan startup to fail with (see ``fails_the_startup``).
    config_error: ConfigError | None = None
    _said_unmetered = False
    _said_nested = False
    _started = False
    _joining: HostStats | None = None  # the statistics it built, joining their server

    @fails_the_startup
    def __init__(
        self,
        app: ASGIApp,
        #: The GPUs metered, each with its idle floor (None: one local node over every GPU).
        nodes: Iterable[Node] | None = None,
        #: The model classes (their hints price a labelled estimate).
        tiers: Iterable[Tier] | None = None,
        #: Which requests run on which node and tier (None: every request, on the first node).
        routes: Iterable[Route] | None = None,
        *,
        #: A function ``scope -> (node, tier) | None`` for what patterns cannot route.
        decide: Decider | None = None,
        #: The tier of a request no route names (None: the only tier, where there is one).
        default_tier: Tier | str | None = None,
        #: The nodes' ledgers (None: this process's, shared with its other middlewares).
        ledgers: Ledgers | None = None,
        #: The statistics ``/energy`` and Prometheus answer from (None: the server's, shared).
        stats: Statistics | None = None,
        #: Where records are found by id (None: the server's, shared between its workers).
        records: RecordStore | None = None,
        #: More listeners of every settled record (``JsonLinesSink``, ``CallbackSink``).
        sinks: Iterable[Listener] = (),
        #: OpenTelemetry (``exporters.otel.otel_recorder()``): spans and metrics.
        otel: OtelSpans | None = None,
        #: A bearer token that lets clients other than loopback read ``/energy``.
        endpoint_token: str | None = None,
        #: A function ``scope -> bool`` that decides who reads ``/energy`` instead.
        endpoint_guard: Guard | None = None,
        #: Who a request is for: a header name (hashed, never kept) or ``scope -> str | None``.
        tenant: TenantSetting = None,
        #: Energy budgets per tenant, route or tier and period, soft or hard (``Budget(...)``:
        #: its fields in docs/configuration.md, Budgets).
        budgets: Iterable[Budget] = (),
        **settings: Any,
    ) -> None:
        self.app = app
        logs.show()  # our startup lines and reader failures, visible under a plain server
        if tenant is not None and settings.get("tenant_header") is not None:
            raise ConfigError(
                f"tenant={tenant!r} and tenant_header={settings['tenant_header']!r} both say who a "
                "request is for, and only one can",
                remedy="keep one: tenant=\"x-api-key\" (a header) or tenant=<a function>",
            )
        if isinstance(tenant, str):  # a header name is a plain setting; a function is held
            settings["tenant_header"], tenant = tenant, None
        if stats is not None and not _is_statistics(stats):
            raise ConfigError(f"stats={stats!r} is not statistics /energy can answer from (it lacks "
                              "snapshot, view, observe_nodes or observe_history)",
                              remedy="pass EnergyStats() or HostStats(EnergyStats()), give a sink "
                              "as sinks=[...], or leave stats unset")
        if stats is not None and "max_tenants" in settings:
            raise ConfigError("max_tenants applies to the statistics the middleware builds",
                              remedy="pass EnergyStats(max_tenants=...) as stats=, or leave stats unset")
        check_names(settings, also=_OWN_SETTINGS)
        check_environment()  # a misspelt GIUL_ASGI_* name or value stops it too
        self.options = options = Options.build(**settings)
        #: Resolves a request's tenant (None: no tenants, and nothing is done per request).
        self._tenant = tenant_source(tenant if tenant is not None else options.tenant_header)
        check_callable("decide", decide, remedy="pass a function scope -> (node, tier) or None")
        node_list = settings_list("nodes", nodes, Node, 'Node("h100-a", gpus=(0, 1), idle_w=140.0)')
        if not node_list:
            node_list = [Node("local", gpus=())]  # every visible GPU; honest where none
        if options.trace is not None:  # one trace directory for the nodes that name none
            node_list = [n if n.trace else dataclasses.replace(n, trace=options.trace) for n in node_list]
        tier_list = settings_list("tiers", tiers, Tier, 'Tier("70b", joules_per_1k_hint=4100.0)')
        route_list = settings_list("routes", routes, Route, 'Route("/v1/chat/completions", node="h100-a")')
        raise_kept(default_tier)  # a Tier object made wrong at import: its error, kept till now
        if isinstance(default_tier, str):
            found = [t for t in tier_list if t.name == default_tier]
            if not found:
                raise ConfigError(
                    f"default_tier {default_tier!r} is not declared",
                    remedy="add it to tiers=[...] or name one that is",
                )
            default_tier = found[0]
        elif default_tier is None and len(tier_list) == 1:
            default_tier = tier_list[0]
        self.router = Router(
            node_list, tier_list, route_list, default_node=node_list[0],
            default_tier=default_tier, decide=decide,
        )
        self.ledgers = ledgers if ledgers is not None else default_ledgers()
        if ledgers is not None:  # its own ledgers: dropped without aclose(), they stop once let go
            weakref.finalize(self, stop_once_let_go(ledgers)).atexit = False
        #: Never metered: health checks, documents, the operator's ``exclude``; the app's own
        #: documents are added at its first call (:meth:`_learn_app`).
        self.exclude = PathSet((*NEVER_METERED, *options.exclude))
        if stats is None:
            from ..stats import EnergyStats, HostStats

            # Shared with the host's other worker processes by default (its own where
            # nothing can be shared, saying so): /energy answers for the whole host.
            stats = self._joining = HostStats(EnergyStats(max_tenants=options.max_tenants))
            # Dropped without aclose(): the statistics it built stop with it (their last row
            # written on a thread: whoever collects it, the event loop perhaps, never waits).
            weakref.finalize(self, _close_on_a_thread, stats)
        self.stats = stats
        #: Told at once that a request was answered (its figure settles later), where the
        #: statistics keep answers in place: a worker killed meanwhile loses none.
        self._answered = getattr(stats, "answered", None)
        self._count = self._count_answer if self._answered is not None else None
        #: Every settled figure by request id, for /energy/requests/{id}.
        self.records = records if records is not None else RecordStore()
        if callable(sinks) or not isinstance(sinks, Iterable) or isinstance(sinks, str | bytes):
            raise ConfigError(f"sinks= takes a list of listeners, got {sinks!r}",
                              remedy="write sinks=[JsonLinesSink(path)] or sinks=[CallbackSink(function)]")
        sink_list = list(sinks)
        if otel is not None and otel not in sink_list:
            sink_list.append(otel)
        for sink in sink_list:
            if not callable(getattr(sink, "settled", None)):
                raise ConfigError(f"sink {sink!r} has no settled(batch) method",
                                  remedy="use giul_asgi.exporters.sink.JsonLinesSink or CallbackSink")
        self.sinks = sink_list
        #: Puts giul.energy.* on the request's recording span (OpenTelemetry, optional).
        self.otel = otel
        #: Where settled figures go, in batches, from the reader thread.
        self.listeners = Listeners([stats, self.records, *sink_list])
        #: What each key spent this period, server-wide (None: no budgets, nothing done).
        self.budgets: Budgets | None = None
        budget_list = check_budgets(
            budgets, tenants=self._tenant is not None, tiers=self.router.tiers,
            routes=self.router.labels(),
            carbon=any(n.carbon is not None or n.carbon_g_per_kwh is not None for n in node_list),
            header=options.tenant_header if tenant is None else None,
        )
        if budget_list:
            self.budgets = Budgets(budget_list, directory=node_list[0].workers_dir)
            self.listeners = Listeners([*self.listeners, self.budgets])
        self.endpoint = self._endpoint(endpoint_token, endpoint_guard)
        self._choose = functools.partial(
            choose, options=options, formats=Formats(FORMATS[options.energy_format]))
        self._catalog = self.router.catalog()
        self._energy_prefix = (options.energy_path + "/") if options.energy_path else None
        self._started = False  # the readers were started (lifespan, or the first request)
        self.startup_error: GiulError | None = None

    def keep_config_error(self, error: ConfigError) -> None:
        """Built by a framework or a server with a bad setting: serve nothing of ours, and
        fail the lifespan startup (or, without one, each request) with ``error``."""
        self.config_error = error
        self.endpoint = None
        self.exclude = PathSet(())
        self._started = False

    def _endpoint(self, token: str | None, guard: Guard | None) -> EnergyEndpoint | None:
        """The app that serves ``energy_path`` and ``metrics_path``, built (and its access
        settings checked) now."""
        options = self.options
        check_token(token, name="endpoint_token")
        check_callable("endpoint_guard", guard, remedy="pass a function scope -> bool")
        if options.energy_path is None and options.metrics_path is None:
            return None
        from ..serve.endpoint import EnergyEndpoint

        return EnergyEndpoint(
            stats=self.stats, ledgers=self.ledgers, path=options.energy_path or "/energy",
            metrics_path=options.metrics_path, token=token, guard=guard, records=self.records,
            token_name="endpoint_token", guard_name="endpoint_guard", budgets=self.budgets,
        )

    def _serves(self, path: str) -> bool:
        options = self.options
        energy = options.energy_path
        if energy is not None and (path == energy or path.startswith(self._energy_prefix or energy)):
            return True
        return options.metrics_path is not None and path == options.metrics_path

    # -- a request ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if not self._started:  # no lifespan: the first request learns the app, starts the readers
            if self.config_error is not None:  # no startup to stop: the app serves, unmetered
                self._say_unmetered()
                await self.app(scope, receive, send)
                return
            self._start_without_lifespan(scope)
        path = route_path(scope)  # the app's own path, under a mount or a --root-path
        if self.endpoint is not None and self._serves(path):
            await self.endpoint(scope, receive, send)
            return
        full = scope["path"]
        if path in self.exclude or (path != full and full in self.exclude):
            await self.app(scope, receive, send)  # health checks, documents: never touched
            return
        if meter_var.get() is not None:  # an outer EnergyMiddleware meters it: one figure
            self._say_nested()
            await self.app(scope, receive, send)
            return
        target = self.router.match(scope)
        if target is None:  # routes are declared and none is this one's: not ours to touch
            await self.app(scope, receive, send)
            return
        meter = Meter(
            self.ledgers.get(target.node), target.tier, route=target.label,
            token_kind=self.options.token_kind, ledgers=self.ledgers, catalog=self._catalog,
        )
        if self._tenant is not None:
            meter.tenant = self._tenant(scope)
        budgets = self.budgets
        if budgets is not None:  # one lookup per budget; over a hard one, refused here
            try:
                slots, budget_headers = budgets.admit(
                    meter.tenant, target.label, target.tier.name if target.tier is not None else None)
            except OverBudget as over:
                await _refuse(over, send)
                return
        try:
            meter.open()
            exchange = Exchange(
                scope, receive, send, meter, choose=self._choose,
                settle_timeout=self.options.settle_timeout, route_app=scope.get("app") or self.app,
                keep=self.records.put, answered=self._count,
            )
        except Exception:  # a bug of ours costs the figure, never the answer: served unmetered
            log.exception("giul-asgi could not open this request's window; it is served unmetered")
            if budgets is not None:  # what its admission took is given back
                budgets.give_back(slots)
            window = meter.window
            if window is not None:  # opened, then failed: no figure will close it
                with contextlib.suppress(Exception):
                    meter.ledger.abandon(window)
            await self.app(scope, receive, send)
            return
        if budgets is not None:
            exchange.also = budget_headers
        span = self.otel.current_span() if self.otel is not None else None
        outcome = "incomplete"
        token = meter_var.set(meter)
        try:
            await self.app(scope, exchange.receive, exchange.send)
            responder = exchange.responder
            outcome = "ok" if responder is not None and responder.complete else await exchange.returned()
        except BaseException as exc:
            outcome = await exchange.failed(exc)
            raise
        finally:
            meter_var.reset(token)
            exchange.close()
            try:
                if budgets is not None:  # its first figure counts now: the next admission sees it
                    budgets.spend(slots, exchange.figure())
                outcome = exchange.answer(outcome)  # counted already where its last message went
                meter.report(self.listeners, outcome, exchange.status)
            except Exception:  # a bug of ours costs the record, never the answer
                log.exception("giul-asgi could not file this request's figure")
            if span is not None and self.otel is not None:
                self.otel.annotate(span, exchange.figure())
            exchange.release()

    def _count_answer(self, meter: Meter, outcome: str, status: int | None) -> None:
        """Tell the statistics that ``meter``'s request was answered (its figure settles later)."""
        answered = self._answered
        if answered is not None:
            answered(meter.id, meter.route, meter.node,
                     meter.tier.name if meter.tier is not None else None, outcome, status, meter.tenant)

    # -- lifecycle -------------------------------------------------------------------------
    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Start the readers at startup (a reader that cannot work fails the startup, with
        its remedy, so ``uvicorn app:app`` stops with it); stop them at shutdown."""
        if self.config_error is not None:
            await self._refuse_startup(self.config_error, receive, send)
            return
        self._learn_app(scope)
        answered = failed = False

        async def receive_lifespan() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
            return message

        async def send_lifespan(message: Message) -> None:
            nonlocal answered, failed
            kind = message["type"]
            if failed:
                # The server stopped at our failed startup and cancels the app's lifespan:
                # what the app says about that (Starlette: the CancelledError's traceback
                # as shutdown.failed) would bury the one line an operator needs.
                return
            if kind == "lifespan.startup.complete" and self.startup_error is not None:
                answered = failed = True
                await send({"type": "lifespan.startup.failed", "message": self._failure()})
                return
            if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
                answered = True
            if kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.aclose()
            await send(message)

        try:
            await self.app(scope, receive_lifespan, send_lifespan)
        except BaseException:
            # An app without lifespan support raises here; our own failure still stops
            # the server rather than letting it serve figures that cannot be measured.
            if self.startup_error is not None and not answered:
                await send({"type": "lifespan.startup.failed", "message": self._failure()})
                return
            raise

    def _failure(self) -> str:
        error = self.startup_error
        assert error is not None
        return failure_line(error)

    @staticmethod
    async def _refuse_startup(error: ConfigError, receive: Receive, send: Send) -> None:
        """A bad setting: the startup fails with its one line before the app starts anything."""
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.failed", "message": failure_line(error)})
        # Servers stop at the message and ignore what follows; a test client that does
        # not (Starlette's TestClient) gets the error itself.
        raise error

    async def start(self, timeout: float | None = None) -> None:
        """Start each node's reader and wait (``startup_timeout`` at most) until built.
        A reader asked for by name that cannot work is kept in :attr:`startup_error`."""
        self._started = True
        # The records' ring is made on the store's own thread: served from its first answer.
        await anyio.to_thread.run_sync(self.records.wait_ready, self.options.startup_timeout)
        if self._joining is not None:  # so are the server's statistics, on theirs
            await anyio.to_thread.run_sync(self._joining.wait_ready, self.options.startup_timeout)
        if self.budgets is not None:
            self.budgets.start()
        try:
            await self.ledgers.start(
                list(self.router.nodes.values()),
                timeout=self.options.startup_timeout if timeout is None else timeout,
            )
        except GiulError as exc:
            # Kept for lifespan (it fails the startup with it); the ledger has logged it.
            self.startup_error = exc

    def _learn_app(self, scope: Scope) -> None:
        """Never meter the app's own documents: read once, at its first call, where every
        route and mount has been declared (the app is the scope's under Starlette's
        add_middleware, the wrapped one otherwise)."""
        self.exclude.add(app_documents(scope.get("app") or self.app))

    def _say_unmetered(self) -> None:
        """A bad setting and no lifespan (``--lifespan off``) to stop: the one line, once, at
        ERROR; the app's requests pass untouched rather than answered 500 each."""
        if not self._said_unmetered and self.config_error is not None:
            self._said_unmetered = True
            log.error("%s; nothing is metered (without a lifespan startup there is nothing "
                      "to stop)", failure_line(self.config_error))

    def _say_nested(self) -> None:
        """Added twice (two ``add_middleware`` calls, or a mounted app's own): the outer one
        meters, and this one says so once rather than add a second set of headers."""
        if not self._said_nested:
            self._said_nested = True
            log.warning("EnergyMiddleware is in the app's stack twice: the inner one passes the "
                        "requests the outer one meters -> add it once")

    def _start_without_lifespan(self, scope: Scope) -> None:
        # No lifespan (or a server that does not send it): the first request starts the
        # readers and does not wait for them (a wedged driver must not hold it); a failure
        # is logged once by the ledger and figures say unknown, never a 500 from us.
        self._learn_app(scope)
        self._started = True
        if self.budgets is not None:
            self.budgets.start()
        for node in self.router.nodes.values():
            self.ledgers.get(node).ensure_started()

    async def aclose(self) -> None:
        """Stop the readers and settle every figure, then flush the sinks (lifespan
        shutdown does this): no settled record is lost on a clean shutdown."""
        await self.ledgers.aclose(timeout=self.options.startup_timeout)
        if self.budgets is not None:  # after the ledgers: the last figures have settled
            await anyio.to_thread.run_sync(self.budgets.close)
        self.records.close()  # what is queued for the other workers is written
        for sink in self.sinks:
            aclose = getattr(sink, "aclose", None)
            if aclose is not None:
                await aclose()


async def _refuse(over: OverBudget, send: Send) -> None:
    """A request over a hard budget: 429, ``Retry-After``, OpenAI's error shape; the app
    never sees it (and it opens no window: it cost the card nothing)."""
    body = over.body()
    await send({"type": "http.response.start", "status": 429, "headers": over.headers(body)})
    await send({"type": "http.response.body", "body": body})


def _is_statistics(stats: object) -> bool:
    from ..stats import Statistics

    return isinstance(stats, Statistics)


def _close_on_a_thread(stats: HostStats) -> None:
    threading.Thread(target=stats.close, name="giul-stats-collected", daemon=True).start()


#: The settings the middleware takes itself, beside Options' fields (suggested for a typo).
_OWN_SETTINGS = tuple(inspect.signature(EnergyMiddleware.__init__).parameters)[2:-1]

__all__ = ["EnergyMiddleware"]
