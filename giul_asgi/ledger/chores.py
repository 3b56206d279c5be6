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
    book weighs its own windows' phases)."""

    def __init__(self, url: str, clock: Callable[[], float], note: UpstreamNote,
                 deciding: Callable[[], bool], phases: PhaseNote | None = None) -> None:
        self.url, self.clock, self.note, self.deciding = url, clock, note, deciding
        self.phases = phases
        self.load: Any = None

    def __call__(self) -> None:
        deciding = self.deciding()
        if not deciding and self.phases is None:
            return
        if self.load is None:
            from ..readers.upstream import UpstreamLoad

            self.load = UpstreamLoad(self.url, clock=self.clock)
        reading = self.load.read()
        if not reading.ok:
            return
        if deciding and reading.running is not None:
            self.note(reading.t, reading.running, reading.spread_s, reading.waiting or 0.0)
        if self.phases is not None:
            self.phases(reading.prompt_tokens_total, reading.generation_tokens_total,
                        reading.prefill_seconds_total, reading.decode_seconds_total)


__all__ = ["UPSTREAM_EVERY_S", "PhaseNote", "Upstream", "UpstreamNote"]
