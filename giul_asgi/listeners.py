"""Where settled figures go: one record of how a request ended, one protocol for its readers.

A request's figure settles on its node's reader thread, when the card has reported the
whole window. The statistics, the records kept by id, the sinks and OpenTelemetry all want
it then, and only then. They are *listeners*: each gets the figures that one reading
settled, in one call (a batch), so a reading that settles sixty windows costs each listener
one call and one lock rather than sixty, and nothing of it runs on the request's path.

Listeners run on a reader thread: they must be cheap, thread-safe, and never raise into
the ledger (:class:`Listeners` keeps one listener's failure from the others).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from .energy import Energy

log = logging.getLogger("giul_asgi.listeners")

#: How a request ended, as the middleware saw it.
OUTCOMES: tuple[str, ...] = ("ok", "error", "disconnect", "cancelled", "incomplete")


class Settled(NamedTuple):
    """One request's settled figure and how the request ended. Immutable, and made per
    request on the reader thread: a named tuple (a frozen dataclass's four
    ``object.__setattr__`` cost 7.3k instructions a record, the tuple 3.4k: callgrind)."""

    energy: Energy
    outcome: str = "ok"
    status: int | None = None
    #: Wall-clock time (``time.time()``) when the request ended.
    t: float = 0.0


@runtime_checkable
class Listener(Protocol):
    """Anything that wants settled figures: statistics, records, sinks, OpenTelemetry."""

    def settled(self, batch: Sequence[Settled]) -> None:
        """The figures one reading settled (never empty). Runs on a reader thread."""
        ...


class Listeners:
    """Several listeners behind one: a batch goes to each, and a failure stays with its
    listener (logged), never the ledger's nor another listener's."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[Listener] = ()) -> None:
        self._items: tuple[Listener, ...] = tuple(items)

    def __iter__(self) -> Iterator[Listener]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def settled(self, batch: Sequence[Settled]) -> None:
        for listener in self._items:
            try:
                listener.settled(batch)
            except Exception:
                log.exception("a listener of settled figures failed: %r", listener)


__all__ = ["OUTCOMES", "Listener", "Listeners", "Settled"]
