"""One card, host-wide: every process's windows on it, the one tape its holder reads, its books.

A card is shared by every process of the host that draws on it, from any server: four
workers of one uvicorn, a second gateway started by the same shell, a batch job's meter. Its
energy must be charged once. So the processes meet at the card's table, a folder in the host's
place (``cards/<card>/``), and exactly one of them reads the card:

- ``lock``: whoever holds it (``flock``, released by the kernel when its holder dies, even of
  ``kill -9``) is the card's *holder*: it reads the card, decides every span for the whole host
  (:class:`~giul_asgi.spans.CardSpan`) and publishes it. The others follow. When the
  holder goes, the next process to find the lock free takes it, and the time between the two
  tapes is published as a gap (filled from the prior, never booked as measured).
- ``tape``: what the holder publishes: a ring of decided pieces (spans and gaps), and the
  card's books (measured, what no window took, and what departed processes left) under a
  sequence lock.
- ``p-<pid>-<start>-<n>``: one file per ledger on the card: its heartbeat and books (written by
  it), its windows' opens and closes (a ring it writes, the holder reads), and its part of each
  published piece (a ring the holder writes, it reads).

Everything is memory-mapped: a window's open or close is two stores in this process's file (no
system call on the request path, nothing lost to a ``kill -9``: the kernel owns the pages), and
the holder reads every ring on its reader thread. Space is reserved with ``posix_fallocate``
before a file is mapped (a store into a page that a full tmpfs cannot back would be a SIGBUS):
a full place fails at join, loudly, and the card is then this process's alone.

``time.monotonic()`` is one clock for every process of a Linux host, so times line up.

Bound: per card, ``lock`` and ``tape`` (1.0 MiB) and one file per live ledger on it (452 KiB);
a departed ledger's file is removed by the holder within a second of its going.

The parts, each read on its own:

- :mod:`.layout`: where everything lies in the tape and in a seat (sizes, offsets, records);
- :mod:`.files`: the files made whole and mapped, or :class:`Unusable`;
- :mod:`.tape`: the tape's books and its ring of pieces, read and written;
- :mod:`.books`: what a ledger publishes in its seat, and the card's books summed for an answer;
- :mod:`.others`: the other seats as the holder follows them, and the retiring of departed ones;
- :mod:`.table`: :class:`CardTable`, one ledger's seat, tying them together;
- :mod:`.sweep`: the folders of cards nobody reads any more, removed.
"""

from __future__ import annotations

from .books import HostBooks, SeatBooks
from .files import Unusable

# Named here as they were when this package was one module (``cards.SEAT_BYTES``, the tests').
from .layout import SEAT_BYTES as SEAT_BYTES
from .layout import SHOWN as SHOWN
from .layout import TAPE_BYTES as TAPE_BYTES
from .others import CENSUS_S as CENSUS_S
from .others import LIVENESS_S as LIVENESS_S
from .sweep import FORGET_CARD_S, ledgers_on, sweep_cards
from .table import CardTable

__all__ = ["FORGET_CARD_S", "CardTable", "HostBooks", "SeatBooks", "Unusable",
           "ledgers_on", "sweep_cards"]
