"""Several processes on one host, sharing by default: one place, tables per card, rows per process.

``uvicorn --workers 4`` and gunicorn run one process per worker; each sees only its own
requests. Without a shared view each would charge a card its whole energy, answer
``/energy`` for a quarter of the traffic and find a quarter of the records by id. This
package is the one mechanism they all use, with no setting:

- :mod:`.place`: the per-user directory on shared memory that the first process creates and
  later ones join, the one setting that moves or disables it, and why it may not work;
- :mod:`.rows`: one file per process, named by pid and start time, so dead ones expire;
- :mod:`.server`: which processes are one server (the listener they inherited, else a process alone);
- :mod:`.cards`: one table per card (keyed by :mod:`.keys`): every process's windows on it,
  the one tape its holder reads, and the card's books;
- :mod:`.ring`: a memory-mapped ring of records, written in place by one process, read by any;
- :mod:`.journal`: a server's records: each store's ring, the others' read at lookup, the dead
  ones folded, dead servers' folders removed.

The statistics of the whole host (``giul_asgi.stats``) keep their rows here too.
"""

from __future__ import annotations

from .cards import CardTable, HostBooks, SeatBooks, Unusable
from .keys import card_key, reader_uuids
from .place import ENV, OFF, Place, Setting, check_setting, log_unshared, resolve
from .rows import Row, Rows, alive, process_start
from .server import ServerId, server_identity

__all__ = [
    "ENV",
    "OFF",
    "CardTable",
    "HostBooks",
    "Place",
    "Row",
    "Rows",
    "SeatBooks",
    "ServerId",
    "Setting",
    "Unusable",
    "alive",
    "card_key",
    "check_setting",
    "log_unshared",
    "process_start",
    "reader_uuids",
    "resolve",
    "server_identity",
]
