"""What a node's reader thread does beside reading the card, each job given only what it needs.

The poller runs these between reads, each at its own period and watched like a read (a slow
one is a failed reading, never a stalled thread): the upstream's load (the inference server's
running requests, read from its own metrics), the carbon intensity, the node's trace, and the
hourly history of the card's books. Each chore is handed narrow callables (a clock, a
function to call with what it found), never the ledger that built it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: How often the upstream's metrics are looked at (seconds).
UPSTREAM_EVERY_S = 0.25


class Upstream:
    """Reads the inference server's running requests and hands them on (poller thread); only
    while ``deciding()``: the process that decides the card's spans needs them, no other."""

    def __init__(self, url: str, clock: Callable[[], float], note: Callable[[float, float], None],
                 deciding: Callable[[], bool]) -> None:
        self.url, self.clock, self.note, self.deciding = url, clock, note, deciding
        self.load: Any = None

    def __call__(self) -> None:
        if not self.deciding():
            return
        if self.load is None:
            from ..readers.upstream import UpstreamLoad

            self.load = UpstreamLoad(self.url, clock=self.clock)
        reading = self.load.read()
        if reading.ok and reading.running is not None:
            self.note(reading.t, reading.running)


__all__ = ["UPSTREAM_EVERY_S", "Upstream"]
