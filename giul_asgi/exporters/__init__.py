"""Ways out for the statistics and the records: Prometheus, OpenTelemetry, record sinks.

Each module imports its third-party library only when used: ``prometheus`` needs
``prometheus-client`` (the ``prometheus`` extra), ``otel`` needs ``opentelemetry-api``
(the ``otel`` extra); ``sink`` needs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def ledger_totals(ledgers: Iterable[Any] | None) -> Iterator[Any]:
    """Each ledger's books for the whole host (``host_totals()``: every worker process on
    the card), skipping any that fails: a read never breaks a scrape."""
    if ledgers is None:
        return
    try:
        items = list(ledgers)
    except Exception:
        return
    for ledger in items:
        try:
            totals = getattr(ledger, "host_totals", None) or ledger.totals
            yield totals()
        except Exception:
            continue
