"""A request's window on its node's ledger: open, mark stages, close, and grade the share.

A meter never reads a card. It borrows the node's ledger (one per node, shared by every
request), records times, and grades the raw share the ledger's book hands back into an
:class:`~giul_asgi.energy.Energy` with the tier, route, tokens and hint it knows::

    async with Meter.for_node(node, tier) as m:
        await retrieve(); m.mark("retrieve")
        await generate(); m.mark("generate")
    first = m.figure(tokens=412)          # at once: unreported part from the node's prior
    final = await m.settled(timeout=0.5)  # once the card has reported the whole window

Stages are graded like the total, and the total is never the sum of the stages.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from .config import Node, Tier
from .deferred import raise_kept
from .energy import Energy, Provenance, Share, grade
from .errors import ConfigError
from .ledger import Ledger, Ledgers, Ticket, Window, default_ledgers
from .listeners import Listener
from .tenants import tenant_name

log = logging.getLogger("giul_asgi.meter")

_NO_NAMES: Mapping[str, Node | Tier] = {}
# Request ids: this process's id and a counter, unique per process and cheap to make:
# ``<pid>-<start>-<counter>`` in hex. A child forked after import (gunicorn --preload) makes
# its own: two workers must never hand out one id.
_ids = itertools.count(1)
_PREFIX = ""


def _new_prefix() -> None:
    global _PREFIX, _ids
    _PREFIX = f"{os.getpid():x}-{int(time.time()) & 0xFFFFFF:x}-"
    _ids = itertools.count(1)


_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)


def id_prefix() -> str:
    """What every request id this process makes begins with."""
    return _PREFIX


def split_id(key: str) -> tuple[str, int] | None:
    """``(prefix, counter)`` of a request id as :class:`Meter` makes them; None otherwise."""
    head, sep, tail = key.rpartition("-")
    if not sep or not tail or len(tail) > 16 or head.count("-") != 1:
        return None
    try:
        counter = int(tail, 16)
        pid, _, start = head.partition("-")
        int(pid, 16), int(start, 16)
    except ValueError:
        return None
    return head + "-", counter


class Meter:
    """One window on one node's ledger. :meth:`for_node` builds one on the shared ledgers."""

    def __init__(
        self,
        ledger: Ledger,
        tier: Tier | None = None,
        *,
        route: str | None = None,
        token_kind: str = "output",
        sync: Callable[[], object] | None = None,
        ledgers: Ledgers | None = None,
        catalog: Mapping[str, Node | Tier] | None = None,
    ) -> None:
        self.ledger = ledger
        self.tier = tier
        self.route = route
        self.token_kind = token_kind
        self.id = f"{_PREFIX}{next(_ids):x}"
        #: Who the request is for (a name, or ``key:`` and a hash): the middleware sets it.
        self.tenant: str | None = None
        self._sync = sync
        self._ledgers = ledgers
        self._catalog = catalog or _NO_NAMES
        self._window: Window | None = None
        self._closed = False  # the window's close is recorded (the book takes it later)
        self._tokens: int | None = None
        self._usage: tuple[int, int] | None = None  # (prompt, completion), for the phase split
        self._waiting: list[Callable[[], None]] | None = None  # on_settled before the close
        self._final: Energy | None = None  # the settled figure, graded once

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
        raise_kept(tier)  # a Tier made wrong at a module's import: said here
        ledgers = ledgers if ledgers is not None else default_ledgers()
        return cls(
            ledgers.get(node), tier, route=route, sync=sync, token_kind=token_kind, ledgers=ledgers
        )

    # -- the window -------------------------------------------------------------------------
    @property
    def node(self) -> str | None:
        name = self.ledger.node.name
        return None if self.ledger.node.reader == "none" and name == "<none>" else name

    @property
    def provenance(self) -> Provenance:
        return self.ledger.provenance

    @property
    def window(self) -> Window | None:
        return self._window

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self) -> Meter:
        """Open the window (the async context manager calls this for you)."""
        if self._window is not None:
            raise RuntimeError("a Meter is one window: build a new one for the next request")
        self._window = self.ledger.open()
        return self

    def close(self) -> None:
        window = self._window
        if window is None or self._closed:
            return
        self._closed = True
        tier = self.tier.name if self.tier is not None else None
        self.ledger.close(window, self._tokens, (self.id, self.route, tier), self._usage)
        if self._waiting:
            for settled in self._waiting:
                self.ledger.when_settled(window, settled)
            self._waiting = None

    async def __aenter__(self) -> Meter:
        return self.open()

    async def __aexit__(self, *exc: object) -> None:
        self._run_sync()
        self.close()

    def mark(self, name: str) -> None:
        """End the current stage at now and start the next; ``name`` names the one ending."""
        if self._window is None:
            raise RuntimeError("mark() before the window opened: use `async with meter:`")
        self.ledger.mark(self._window, name)

    def tokens(self, count: int | None) -> None:
        """Set the request's token count; before close it also weights a token split."""
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise TypeError(f"tokens must be an int, got {type(count).__name__}")
        self._tokens = count
        self._final = None

    def usage(self, prompt: int | None, completion: int | None) -> None:
        """The request's prompt and completion tokens (an OpenAI ``usage``), before close:
        where the node weighs phases, a window with no first-token mark is cut where they
        put the end of its prefill. Either unknown (None): nothing is kept."""
        for count in (prompt, completion):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
                raise TypeError(f"token counts must be ints, got {type(count).__name__}")
        if prompt is not None and completion is not None and prompt >= 0 and completion >= 0:
            self._usage = (prompt, completion)

    def first_out(self) -> None:
        """The answer's first token went out (a stream's first event): where the node weighs
        phases, this ends the window's prefill (its ``prefill`` mark); elsewhere nothing."""
        window = self._window
        if window is not None and not self._closed:
            self.ledger.first_out(window)

    @property
    def token_count(self) -> int | None:
        return self._tokens

    def bind(
        self, node: Node | str | None = None, tier: Tier | str | None = None, *,
        tenant: str | None = None,
    ) -> Meter:
        """Move this request to another node and/or tier once the handler knows its upstream.

        The time already spent on the old node is given back to it, unattributed: a request
        is charged only on the node that served it. ``tenant`` names who the request is for
        (made safe as :func:`~giul_asgi.tenants.tenant_name`; a key goes through
        :func:`~giul_asgi.tenants.hashed` first, never as it is).
        """
        if tenant is not None:
            if not isinstance(tenant, str):
                raise TypeError(f"tenant must be a str, got {type(tenant).__name__}")
            self.tenant = tenant_name(tenant)
            self._final = None
        if tier is not None:
            self.tier = self._lookup(tier, Tier)
        if node is not None:
            target = self._lookup(node, Node)
            if target != self.ledger.node:
                ledgers = self._ledgers if self._ledgers is not None else default_ledgers()
                new_ledger = ledgers.get(target)
                if self._window is not None and not self._closed:
                    self.ledger.abandon(self._window)
                    self._window = new_ledger.open()
                self.ledger = new_ledger
        return self

    def _lookup(self, value: Any, kind: type) -> Any:
        if isinstance(value, kind):
            return value
        found = self._catalog.get(f"{kind.__name__.lower()}:{value}")
        if found is None:
            known = sorted(k.split(":", 1)[1] for k in self._catalog if k.startswith(kind.__name__.lower()))
            raise ConfigError(
                f"no {kind.__name__.lower()} named {value!r}",
                remedy=f"declare it in the middleware's {kind.__name__.lower()}s=[...] (known: {known})",
            )
        return found

    # -- the sync form ------------------------------------------------------------------------
    def sync(self) -> Meter:
        """This meter as a sync context manager, for local work outside an event loop."""
        return self

    def __enter__(self) -> Meter:
        if self.ledger.measures:
            self.ledger.read_now()
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self._run_sync()
        self.close()
        window = self._window
        if window is None or not self.ledger.measures:
            return
        # The counter may not have stepped past the window's end yet: read until it has,
        # for at most about a second.
        deadline = time.monotonic() + 1.0
        while not window.settled and time.monotonic() < deadline:
            self.ledger.read_now()
            time.sleep(0.01)

    def _run_sync(self) -> None:
        if self._sync is not None:
            # A failed sync must not break the work it measured.
            with contextlib.suppress(Exception):
                self._sync()

    # -- the answer ---------------------------------------------------------------------------
    def figure(self, tokens: int | None = None) -> Energy:
        """The closed window's figure now: settled, or first (``settled=False``) with the
        part the card has not reported filled from the node's measured prior."""
        window = self._closed_window()
        if tokens is not None and tokens != self._tokens:
            self.tokens(tokens)
        if self._final is not None:
            return self._final  # settled: nothing can change it, and it was graded once
        share = self.ledger.share(window)  # one lock: the book takes the close, then shares
        energy = self._grade(share, window)
        if energy.settled:
            self._final = energy
        return energy

    result = figure

    def _grade(self, share: Share, window: Window) -> Energy:
        tier = self.tier
        name, hint = (tier.name, tier.joules_per_1k_hint) if tier is not None else (None, 0.0)
        stages: dict[str, Energy] | None = None
        if window.marks is not None:
            values = self.ledger.stage_values(window)
            stages = {}
            prev = window.t_open
            for (stage, t_mark), value in zip(window.marks, values or (), strict=False):
                fraction = value / share.joules if share.joules else 0.0
                # The idle floor goes with time: the stage's part of the window's.
                idle = share.idle_joules
                if idle is not None:
                    idle *= (t_mark - prev) / share.seconds if share.seconds > 0 else 0.0
                part = Share(  # a stage is labelled by the same rule as its figure
                    value if share.joules is not None else None,
                    share.uncertainty * fraction, share.interpolated * fraction,
                    share.settled, share.provenance, t_mark - prev, split=share.split,
                    contended=share.contended, foreign_watts=share.foreign_watts,
                    trouble=share.trouble, basis=share.basis, idle_joules=idle,
                )
                stages[stage] = grade(part, node=self.node, tier=name, route=self.route,
                                      carbon=self.ledger.carbon)
                prev = t_mark
        energy = grade(
            share, node=self.node, tier=name, route=self.route, tokens=self._tokens,
            token_kind=self.token_kind, hint_per_1k=hint, stages=stages, id=self.id,
            tenant=self.tenant,
            carbon=self.ledger.carbon,
        )
        for unseen in (self.ledger.unshared, self.ledger.upstream_error, self.ledger.floor_caveat):
            if unseen is not None:  # other workers, or the upstream's load, cannot be seen: say so
                energy.error = unseen if energy.error is None else f"{energy.error}; {unseen}"
        return energy

    @property
    def settled_now(self) -> bool:
        """Whether the closed window's figure is final (no reading will change it)."""
        window = self._window
        return window is not None and window.settled

    def on_settled(self, callback: Callable[[Energy], None]) -> None:
        """Call ``callback(energy)`` once, with the settled figure (at once if it is).

        It may run on the node's reader thread: keep it cheap and thread-safe.
        """

        def settled() -> None:
            callback(self.figure())

        window = self._window
        if window is not None and self._closed:
            self.ledger.when_settled(window, settled)
        else:
            self._waiting = [*(self._waiting or ()), settled]  # registered at the close

    def report(self, listeners: Listener, outcome: str = "ok", status: int | None = None) -> None:
        """Send the settled figure to ``listeners`` with how the request ended, once it
        settles: in one batch with every other window the same reading settles."""
        window = self._closed_window()
        self.ledger.report(window, Ticket(
            window, self.ledger, self, listeners, outcome, status, time.time(),
        ))

    def grade_settled(self, share: Share) -> Energy:
        """The settled figure of ``share`` (the window's, as a reading settled it), kept as
        this meter's final figure: a ticket's grader."""
        energy = self._grade(share, self._closed_window())
        if energy.settled:
            self._final = energy
        return energy

    def _closed_window(self) -> Window:
        window = self._window
        if window is None or not self._closed:
            raise RuntimeError("figure() before the window closed: leave `async with` first")
        return window

    async def settled(self, timeout: float | None = None) -> Energy:
        """Wait (at most ``timeout`` seconds) for the card to report the window, then the
        figure (still ``settled=False`` if the time ran out)."""
        window = self._closed_window()
        await self.ledger.wait_settled(window, timeout)
        return self.figure()
