"""A request's claim on its settled figure, and the batch that delivers every claim a reading settles.

A reading can settle many windows at once (a batch of requests that closed inside one
counter period). Each window's figure goes to the same listeners (statistics, records,
sinks, OpenTelemetry), so they are delivered together: one lock to read every share, one
call per listener with the whole batch, on the reader's thread and never on a request's.

A :class:`Ticket` carries plain values: the window, the ledger whose book holds its share,
what grades a share into a figure (the request's meter), the listeners and how the request
ended. Nothing in it refers back to the middleware.

A request waiting for its figure keeps its objects alive until a reading settles it, and
every one of them counts toward the cyclic collector's next pass (a busy worker's passes
cost it more than a peer's whole request): so the ticket holds the meter itself rather
than a bound method of it, and a window holds one waiting callable as it is, not in a list.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..energy import Energy, Share
from ..listeners import Listener, Settled
from .window import Window

log = logging.getLogger("giul_asgi.ledger")


class Grader(Protocol):
    """What grades a settled share into the request's figure (a meter)."""

    def grade_settled(self, share: Share) -> Energy: ...


class Shares(Protocol):
    """What a ticket reads its share from: a ledger's lock and book."""

    _lock: threading.Lock

    def share_unlocked(self, window: Window) -> Share: ...


@dataclass(slots=True, eq=False)
class Ticket:
    """Deliver ``grader.grade_settled(share)`` of ``window`` to ``listeners`` once it settles."""

    window: Window
    ledger: Shares
    grader: Grader
    listeners: Listener
    outcome: str
    status: int | None
    t: float

    def __call__(self) -> None:
        """Settled already when the ticket was made: delivered at once, alone."""
        fire([self.window], [self])


def fire(
    windows: list[Window], tickets: list[Ticket] | None = None, lock: threading.Lock | None = None,
) -> None:
    """Run what waited on ``windows`` (just settled): plain callbacks one by one, tickets
    in one batch per ledger and listeners. ``lock`` (the ledger's) is held while they are
    taken from the windows, not while they run: a report the ledger takes meanwhile finds
    them there or gone, never half taken (its ticket was lost between the two once)."""
    groups: dict[tuple[int, int], list[Ticket]] = {}
    for ticket in tickets or ():
        groups.setdefault((id(ticket.ledger), id(ticket.listeners)), []).append(ticket)
    waiting: list[Callable[[], None] | list[Callable[[], None]]] = []
    if tickets is None:
        with lock if lock is not None else contextlib.nullcontext():
            for window in windows:
                if window.callbacks is not None:
                    waiting.append(window.callbacks)
                    window.callbacks = None
    for callbacks in waiting:
        for callback in callbacks if isinstance(callbacks, list) else (callbacks,):
            if type(callback) is Ticket:
                groups.setdefault((id(callback.ledger), id(callback.listeners)), []).append(callback)
                continue
            try:
                callback()
            except Exception:  # a listener's failure is never the request's or the reader's
                log.exception("a settled-figure callback failed")
    for group in groups.values():
        _deliver(group)


def _deliver(tickets: list[Ticket]) -> None:
    ledger = tickets[0].ledger
    with ledger._lock:
        shares = [ledger.share_unlocked(ticket.window) for ticket in tickets]
    batch: list[Settled] = []
    for ticket, share in zip(tickets, shares, strict=True):
        try:
            batch.append(Settled(ticket.grader.grade_settled(share), ticket.outcome, ticket.status, ticket.t))
        except Exception:
            log.exception("grading a settled figure failed")
    if batch:
        try:
            tickets[0].listeners.settled(batch)
        except Exception:
            log.exception("a listener of settled figures failed")


__all__ = ["Grader", "Ticket", "fire"]
