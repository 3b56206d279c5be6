"""What a node's reader thread does beside reading the card, each job given only what it needs.

The poller runs these between reads, each at its own period and watched like a read (a slow
one is a failed reading, never a stalled thread): the upstream's load (the inference server's
running requests, read from its own metrics), the carbon intensity, the node's trace, and the
hourly history of the card's books. Each chore is handed narrow callables (a clock, a
function to call with what it found), never the ledger that built it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("giul_asgi.ledger")

#: How often the upstream's metrics are looked at (seconds).
UPSTREAM_EVERY_S = 0.25


#: What the decider is handed: when (our clock), the upstream's running requests, half the
#: scrape's time (the count was taken within that of when), and its requests queued (0: none
#: or it does not say).
UpstreamNote = Callable[[float, float, float, float], None]

#: What the phase split is handed: the upstream's cumulative prompt and generation tokens and
#: its requests' summed prefill and decode seconds (each None where it does not say).
PhaseNote = Callable[[float | None, float | None, float | None, float | None], None]


class Upstream:
    """Reads the inference server's running requests and hands them on (poller thread); only
    while ``deciding()``: the process that decides the card's spans needs them, no other.
    ``phases``, where given, is handed its phase times in every process (each process's
    book weighs its own windows' phases). ``trouble`` is told why it cannot be read (None
    once it can again): a stranger's trial found an upstream that could not be read said
    nowhere, while two replicas each charged the whole card."""

    def __init__(self, url: str, clock: Callable[[], float], note: UpstreamNote,
                 deciding: Callable[[], bool], phases: PhaseNote | None = None, *,
                 node: str = "", trouble: Callable[[str | None], None] | None = None,
                 model: str | None = None) -> None:
        self.url, self.clock, self.note, self.deciding = url, clock, note, deciding
        self.model = model
        self.phases = phases
        self.node = node
        self.trouble = trouble
        self.load: Any = None
        self._failing: str | None = None  # the error said, while it lasts

    def __call__(self) -> None:
        deciding = self.deciding()
        if not deciding and self.phases is None:
            return
        if self.load is None:
            from ..readers.upstream import UpstreamLoad

            self.load = UpstreamLoad(self.url, clock=self.clock, model=self.model)
        reading = self.load.read()
        self._say(reading.error)
        if not reading.ok:
            return
        if deciding and reading.running is not None:
            self.note(reading.t, reading.running, reading.spread_s, reading.waiting or 0.0)
        if self.phases is not None:
            self.phases(reading.prompt_tokens_total, reading.generation_tokens_total,
                        reading.prefill_seconds_total, reading.decode_seconds_total)

    def _say(self, error: str | None) -> None:
        """Say once that the upstream cannot be read (and why), and once that it can again."""
        if error == self._failing:
            return
        if error is not None and self._failing is None:
            log.warning("giul-asgi: node %r: the upstream's metrics at %s cannot be read: %s; load on "
                        "the card beyond this host's is not seen until they can (another replica's is "
                        "charged to ours) -> check that the URL serves the server's /metrics: "
                        "giul-asgi probe --upstream URL", self.node, self.url, error)
        elif error is None:
            log.info("giul-asgi: node %r: the upstream's metrics at %s are read again", self.node, self.url)
        self._failing = error
        if self.trouble is not None:
            self.trouble(None if error is None else f"the upstream's metrics cannot be read: {error}")


__all__ = ["UPSTREAM_EVERY_S", "PhaseNote", "Upstream", "UpstreamNote"]
