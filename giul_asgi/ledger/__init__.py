"""One ledger per node: it owns the node's reader and shares the card among windows.

- :mod:`.tape`: readings -> spans of energy above idle, or gaps (counter hygiene, step
  phase, the learnt update period, resets, stale counters, power trapezoids);
- :mod:`.book`: spans -> shares among this process's windows (overlaps, settling, totals), with
  its parts: :mod:`.window` (a request's window, the splits), :mod:`.phases` (the split that
  weighs prefill and decode at their own rates), :mod:`.prior` (what fills what
  the card has not reported), :mod:`.foreign` (the foreign-load watch) and :mod:`.unseen` (the
  upstream's load nobody here sees);
- :mod:`.poller`: the thread that builds and reads the card, every driver call bounded, and
  :mod:`.chores`: what it does beside;
- :mod:`.ledger`: the parts under one lock, and the seat at the card's table
  (:mod:`giul_asgi.hostshare.cards`); :mod:`.registry`: ledgers by node name;
- :mod:`.tickets`: settled figures delivered in batches; :mod:`.history`, :mod:`.trace`.
"""

from __future__ import annotations

from ..readers.base import NullReader
from .book import Split, TimeSplit, TokenSplit, Window
from .ledger import Ledger, LedgerTotals
from .phases import PhaseSplit, SpanSplit
from .registry import NULL_NODE, Ledgers, default_ledgers
from .tickets import Ticket

__all__ = [
    "NULL_NODE",
    "Ledger",
    "LedgerTotals",
    "Ledgers",
    "NullReader",
    "PhaseSplit",
    "SpanSplit",
    "Split",
    "Ticket",
    "TimeSplit",
    "TokenSplit",
    "Window",
    "default_ledgers",
]
