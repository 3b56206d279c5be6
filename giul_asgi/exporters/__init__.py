"""Ways out for the statistics and the records: Prometheus, OpenTelemetry, record sinks.

Each module imports its third-party library only when used: ``prometheus`` needs
``prometheus-client`` (the ``prometheus`` extra), ``otel`` needs ``opentelemetry-api``
(the ``otel`` extra); ``sink`` needs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def ledger_totals(ledgers: Iterable[Any] | None) -> Iterator[Any]:
    """Each ledger's ``totals()``, skipping any that fails: a read never breaks a scrape."""
    if ledgers is None:
        return
    try:
        items = list(ledgers)
    except Exception:
        return
    for ledger in items:
        try:
            yield ledger.totals()
        except Exception:
            continue
