"""A request's window on its node's ledger: open, mark stages, close, read the figure.

A meter never reads a card. It borrows the node's ledger (one per node, shared by every
request), records times, and asks the ledger for its share::

    async with Meter.for_node(node, tier) as m:
        await retrieve(); m.mark("retrieve")
        await generate(); m.mark("generate")
    energy = m.result(tokens=412)          # provisional if the card has not reported yet
    energy = await m.settled(timeout=0.5)  # the settled figure

Stages are graded like the total, and the total is never the sum of the stages.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from .config import Node, Tier
from .energy import Energy, Figure, Provenance, classify, grade_figure
from .errors import ConfigError
from .ledger import Ledger, Ledgers, Window, default_ledgers

_NO_NAMES: Mapping[str, Node | Tier] = {}
_NO_READER = Provenance(method="measured", backend="none", source="none", idle_watts=None)
#: The meter of the request being handled; set by the middleware for its handlers.
_current: ContextVar[Meter | None] = ContextVar("giul_asgi_current_meter", default=None)


def current_meter() -> Meter | None:
    """The meter of the request this code is handling, or None outside a metered request."""
    return _current.get()


class Meter:
    """One window on one node's ledger. Use :meth:`for_node` to build one."""

    # Set when the window opens and when a count is known; class defaults until then.
    _window: Window | None = None
    _tokens: int | None = None

    def __init__(
        self,
        ledger: Ledger | None,
        tier: Tier | None = None,
        *,
        route: str | None = None,
        sync: Callable[[], object] | None = None,
        token_kind: str = "output",
        ledgers: Ledgers | None = None,
        catalog: Mapping[str, Node | Tier] | None = None,
    ) -> None:
        self.ledger = ledger
        self.tier = tier
        self.route = route
        self.token_kind = token_kind
        self._sync = sync
        self._ledgers = ledgers
        self._catalog = catalog or _NO_NAMES

    @classmethod
    def for_node(
        cls,
        node: Node | None,
        tier: Tier | None = None,
        *,
        ledgers: Ledgers | None = None,
        route: str | None = None,
        sync: Callable[[], object] | None = None,
        token_kind: str = "output",
    ) -> Meter:
        """A meter on ``node``'s shared ledger (``None``: nothing to read, estimates only)."""
        ledgers = ledgers if ledgers is not None else default_ledgers()
        ledger = ledgers.get(node) if node is not None else None
        return cls(ledger, tier, route=route, sync=sync, token_kind=token_kind, ledgers=ledgers)

    # -- the window -------------------------------------------------------------------------
    @property
    def node(self) -> str | None:
        return self.ledger.node.name if self.ledger is not None else None

    @property
    def window(self) -> Window | None:
        return self._window

    @property
    def closed(self) -> bool:
        return self._window is not None and self._window.t_close is not None

    def open(self) -> Meter:
        """Open the window (the async context manager calls this for you)."""
        if self._window is not None:
            raise RuntimeError("a Meter is one window: build a new one for the next request")
        if self.ledger is not None:
            self.ledger.ensure_started()
            self._window = self.ledger.open()
        else:
            self._window = Window(time.monotonic(), 0.0, None)
        return self

    def close(self) -> None:
        window = self._window
        if window is None or window.t_close is not None:
            return
        if self.ledger is not None:
            self.ledger.close(window, tokens=self._tokens)
        else:
            window.t_close = time.monotonic()
            window.settled = True
            window.error = "no node: nothing to read"

    async def __aenter__(self) -> Meter:
        return self.open()

    async def __aexit__(self, *exc: object) -> None:
        self._run_sync()
        self.close()

    def mark(self, name: str) -> None:
        """End the current stage at now and start the next; ``name`` names the one ending."""
        if self._window is None:
            raise RuntimeError("mark() before the window opened: use `async with meter:`")
        if self.ledger is not None:
            self.ledger.mark(self._window, name)
        elif self._window.t_close is None:
            window = self._window
            if window.marks is None:
                window.marks, window.stage_shares = [], [0.0]
            window.marks.append((name, time.monotonic()))
            window.stage_shares.append(0.0)  # type: ignore[union-attr]

    def tokens(self, count: int | None) -> None:
        """Set the request's token count; before close it also weights a token split."""
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise TypeError(f"tokens must be an int, got {type(count).__name__}")
        self._tokens = count

    @property
    def token_count(self) -> int | None:
        return self._tokens

    def bind(self, node: Node | str | None = None, tier: Tier | str | None = None) -> Meter:
        """Move this request to another node and/or tier once the handler knows its upstream.

        The time already spent on the old node is given back to it, unattributed: a request
        is charged only on the node that served it.
        """
        if tier is not None:
            self.tier = self._lookup(tier, Tier)
        if node is not None:
            target = self._lookup(node, Node)
            if self.ledger is None or target != self.ledger.node:
                ledgers = self._ledgers if self._ledgers is not None else default_ledgers()
                new_ledger = ledgers.get(target)
                if self._window is not None and self._window.t_close is None:
                    if self.ledger is not None:
                        self.ledger.abandon(self._window)
                    new_ledger.ensure_started()
                    self._window = new_ledger.open()
                self.ledger = new_ledger
        return self

    def _lookup(self, value: Any, kind: type) -> Any:
        if isinstance(value, kind):
            return value
        found = self._catalog.get(f"{kind.__name__.lower()}:{value}")
        if found is None:
            raise ConfigError(
                f"no {kind.__name__.lower()} named {value!r}",
                remedy=f"declare it in the middleware's {kind.__name__.lower()}s=[...]",
            )
        return found

    # -- the sync form ------------------------------------------------------------------------
    def sync(self) -> Meter:
        """This meter as a sync context manager, for local work outside an event loop."""
        return self

    def __enter__(self) -> Meter:
        if self.ledger is not None and self.ledger.measures:
            self.ledger.read_now()
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self._run_sync()
        self.close()
        ledger, window = self.ledger, self._window
        if ledger is None or window is None or not ledger.measures:
            return
        # A stepped counter may not have counted the window's tail yet: read until it has,
        # for at most a few of its periods.
        for _ in range(8):
            ledger.read_now()
            if window.settled:
                return
            time.sleep(ledger.poll_s)

    def _run_sync(self) -> None:
        if self._sync is not None:
            # A failed sync must not break the work it measured.
            with contextlib.suppress(Exception):
                self._sync()

    # -- the answer ---------------------------------------------------------------------------
    def result(self, tokens: int | None = None) -> Energy:
        """The figure for the closed window: settled, or provisional (``settled=False``)."""
        return Energy.from_figure(self.figure(tokens))

    def figure(self, tokens: int | None = None) -> Figure:
        """:meth:`result` as a :class:`Figure`: the same fields, cheaper to build."""
        window = self._closed_window()
        if tokens is not None:
            self.tokens(tokens)
        name, hint = self._tier_parts()
        if self.ledger is None:
            return grade_figure(
                None, provenance=_NO_READER, seconds=window.seconds, tier=name,
                route=self.route, tokens=self._tokens, token_kind=self.token_kind,
                hint_per_1k=hint, error=window.error, settled=True,
            )
        return self.ledger.figure(window, name, self.route, self._tokens, self.token_kind, hint)

    @property
    def settled_now(self) -> bool:
        """Whether the closed window's figure is final (no reading will change it)."""
        window = self._window
        return window is not None and window.settled

    def tally(self) -> tuple[str | None, str | None, str, float | None, int | None, float]:
        """``(node, tier, method, joules, tokens, seconds)`` of :meth:`figure`, without
        building it: what the statistics add up, by the same rules (``classify``)."""
        window = self._closed_window()
        name, hint = self._tier_parts()
        ledger = self.ledger
        if ledger is None:
            share, provenance = None, _NO_READER
        else:
            share, provenance = ledger.share_now(window), ledger.provenance
        joules, method, _ = classify(share, provenance, self._tokens, hint)
        return self.node, name, method, joules, self._tokens, window.seconds

    def _closed_window(self) -> Window:
        window = self._window
        if window is None or window.t_close is None:
            raise RuntimeError("result() before the window closed: leave `async with` first")
        return window

    def _tier_parts(self) -> tuple[str | None, float]:
        """The tier's name and its joules-per-1k-tokens hint (0: no estimate)."""
        tier = self.tier
        return (tier.name, tier.joules_per_1k_hint) if tier is not None else (None, 0.0)

    async def settled(self, timeout: float | None = None) -> Energy:
        """Wait (at most ``timeout`` seconds) for the next reading, then the figure."""
        if self.ledger is not None and self._window is not None:
            await self.ledger.wait_settled(self._window, timeout)
        return self.result()
