"""One card's table: each process's windows on it, and its books, for every other to read.

``uvicorn --workers 4`` runs four processes, each with its own ledger that sees only its own
windows: each would charge the card's whole above-idle energy to its own requests, four
times over. Each process that meters the card publishes here, about twenty times a second,
its cumulative *window-seconds* on the card (the integral over time of how many of its
windows were open) and how many are open now; :meth:`CardTable.others` sums the other live
processes' integrals, extrapolated to the asked time, so a ledger shares an interval by its
own part of the host's whole load. Each also publishes its ledger's totals, so any process
can answer for the card's books on the whole host (:meth:`CardTable.host`).

``time.monotonic()`` is one clock for every process of a Linux host, so the figures line up.
A dead process's last integral and charges are kept (frozen) by every reader that saw it
alive, so the sums never go backwards; its row is removed after ``grace_s``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .rows import Rows

GRACE_S = 60.0
_tables = itertools.count()  # a ledger rebuilt in one process is a new row, not a smaller one
#: The books a process publishes per card (joules since its ledger started, and windows open).
BOOKS = ("measured_j", "charged_j", "in_flight_j", "windows_open", "estimated_j")


def folder_name(key: str) -> str:
    """A file-system-safe folder name for a card key, readable and unique."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._]+", "_", key).strip("_.")[:48]
    return f"{slug}-{digest}" if slug else digest


@dataclass(frozen=True, slots=True)
class HostBooks:
    """A card's books summed over every process of the host that meters it."""

    #: Processes metering the card now, this one included.
    workers: int
    measured_j: float
    charged_j: float
    in_flight_j: float
    windows_open: int
    #: Filled from the prior where no reading covered a window's time (outside the books).
    estimated_j: float = 0.0

    @property
    def unattributed_j(self) -> float:
        """What no request took: the card's energy above idle less every process's charges."""
        return self.measured_j - self.charged_j - self.in_flight_j


class CardTable:
    """This process's row in one card's table (one per node), and the others' sums."""

    def __init__(
        self, directory: Path, key: str, node: str, *, grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = key
        self.node = node
        tag = f"{hashlib.sha256(node.encode()).hexdigest()[:8]}.{next(_tables)}"
        self.rows = Rows(directory / "cards" / folder_name(key), tag=tag)
        self.grace_s = grace_s
        self.clock = clock
        self._seen: dict[str, tuple[float, dict[str, float]]] = {}  # row -> (integral, books)
        self._retired_integral = 0.0
        self._retired_charged = 0.0
        self._retired_estimated = 0.0
        self._retired_measured = 0.0
        self._live: dict[str, dict[str, float]] = {}
        self._measured_high = 0.0
        self._mine_before: float | None = None

    def publish(self, integral: float, open_now: int, t: float | None = None,
                books: Mapping[str, float] | None = None) -> None:
        """Write this process's window-seconds integral and windows open, as of ``t``."""
        row = {"t": self.clock() if t is None else t, "node": self.node, "key": self.key,
               "integral": float(integral), "open": int(open_now),
               "books": {k: float(v) for k, v in (books or {}).items() if k in BOOKS}}
        self.rows.write(json.dumps(row, separators=(",", ":")).encode())

    def others(self, t: float | None = None) -> float | None:
        """The other processes' window-seconds integral on this card at ``t``; None if the
        table could not be read."""
        now = self.clock() if t is None else t
        try:
            rows = self.rows.others()
        except OSError:
            return None
        total = 0.0
        live: dict[str, dict[str, float]] = {}
        for row in rows:
            try:
                data = json.loads(row.path.read_bytes())
                row_t = float(data["t"])
                integral, open_now = float(data["integral"]), int(data["open"])
                books = {k: float(v) for k, v in data.get("books", {}).items() if k in BOOKS}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # removed meanwhile, or not ours: skip it this time
            if not row.alive():
                self._retire(row.name)
                if now - row_t > self.grace_s:
                    self.rows.remove(row)
                continue
            before = self._seen.get(row.name, (0.0, {}))[0]
            value = max(before, integral + open_now * max(0.0, now - row_t))  # never backwards
            self._seen[row.name] = (value, books)
            live[row.name] = books
            total += value
        for name in [n for n in self._seen if n not in live]:
            self._retire(name)  # its row is gone: it left
        self._live = live
        return total + self._retired_integral

    def _retire(self, name: str) -> None:
        seen = self._seen.pop(name, None)
        if seen is None:
            return
        integral, books = seen
        self._retired_integral += integral
        self._retired_charged += books.get("charged_j", 0.0) + books.get("in_flight_j", 0.0)
        self._retired_estimated += books.get("estimated_j", 0.0)
        self._retired_measured = max(self._retired_measured, books.get("measured_j", 0.0))

    def host(self, mine: Mapping[str, float]) -> HostBooks:
        """The card's books on the whole host: ``mine`` (this process's) and the others' as
        last read by :meth:`others`. Charges add up; the card's measured energy is the
        largest any process saw (they all read one card), and never goes backwards."""
        rows = [*self._live.values(), mine]
        own = mine.get("measured_j", 0.0)
        # Every process reads the one card: what this one measured since it last looked, the
        # card drew, whoever else has died meanwhile (an older process saw more of it).
        grown = self._measured_high + max(0.0, own - self._mine_before) \
            if self._mine_before is not None else own
        self._mine_before = own
        measured = max([self._retired_measured, grown, *(r.get("measured_j", 0.0) for r in rows)])
        self._measured_high = measured
        return HostBooks(
            workers=len(rows),
            measured_j=measured,
            charged_j=self._retired_charged + sum(r.get("charged_j", 0.0) for r in rows),
            in_flight_j=sum(r.get("in_flight_j", 0.0) for r in rows),
            windows_open=int(sum(r.get("windows_open", 0.0) for r in rows)),
            estimated_j=self._retired_estimated + sum(r.get("estimated_j", 0.0) for r in rows),
        )

    def close(self) -> None:
        """Leave the table (the others keep this process's last figures, frozen)."""
        self.rows.close()


__all__ = ["BOOKS", "GRACE_S", "CardTable", "HostBooks", "folder_name"]
