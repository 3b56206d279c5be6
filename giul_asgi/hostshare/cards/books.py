"""A card's books on the whole host: what each ledger publishes in its seat, and their sum.

Any ledger may answer for the card's books (``/energy``, a response's figures), holder or
follower, so each sums the same things: the tape's books, what departed ledgers left in it,
and every live ledger's seat. Each answer shows every counter at the highest any ledger of
the host has shown (written in its seat before the answer goes out), so no counter falls from
one worker's answer to another's, nor when a ledger dies. Read on any thread: the seats are
mapped afresh, read-only, for each look.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..place import open_file
from .layout import (
    CLOSED,
    F64,
    IDLE,
    LIVE,
    PAGE,
    S_BEAT,
    S_CHARGED,
    S_ESTIMATED,
    S_FORFEIT,
    S_GIVEN,
    S_IN_FLIGHT,
    S_OPEN,
    S_RECEIVED,
    SEAT_FLOATS,
    SEAT_IDLE,
    SEAT_IDLE_GIVEN,
    SEAT_MAGIC,
    SHOWN_ROW,
    T_DRAWN,
    T_ERRORS,
    T_EXTERNAL_TOP,
    T_GOOD,
    T_IDLE_UNATTR,
    T_MEASURED_TOP,
    T_R_CHARGED,
    T_R_ESTIMATED,
    T_R_IDLE_CHARGED,
    T_R_IDLE_FORFEIT,
    T_R_UNATTR,
    T_READS,
    T_RESETS,
    T_UNATTRIBUTED_TOP,
    TAPE_FLOATS,
    TAPE_SHOWN,
    U64,
    finite,
    read_shown,
    write_shown,
)


@dataclass(frozen=True, slots=True)
class HostBooks:
    """A card's books summed over every ledger of the host that meters it."""

    #: Ledgers on the card now, this one included.
    workers: int
    measured_j: float
    charged_j: float
    unattributed_j: float
    in_flight_j: float
    windows_open: int
    #: Filled from the prior where no reading covered a window's time (outside the books).
    estimated_j: float = 0.0
    #: What a foreign or unseen load took; the card's reads by every holder, failed reads,
    #: counter resets; seconds since the last piece was published (None: none yet).
    foreign_j: float = 0.0
    reads: int = 0
    read_errors: int = 0
    resets: int = 0
    age_s: float | None = None
    #: All the card drew (idle included), and its idle floor no window was allocated.
    drawn_j: float = 0.0
    idle_unattributed_j: float = 0.0
    #: The idle floor charged to the host's settled windows, and to those not settled yet.
    idle_charged_j: float = 0.0
    idle_in_flight_j: float = 0.0


@dataclass(frozen=True, slots=True)
class SeatBooks:
    """What one ledger publishes of its books: its part of the pieces it took and what became
    of it (``received == charged + forfeit + in flight``; charged and forfeit as the highest
    they have been, so that the card's counters never fall)."""

    received_j: float
    charged_j: float
    forfeit_j: float
    in_flight_j: float
    estimated_j: float
    windows_open: int
    #: The same of the idle floor its windows were allocated (the allocated basis).
    idle_received_j: float = 0.0
    idle_charged_j: float = 0.0
    idle_forfeit_j: float = 0.0
    idle_in_flight_j: float = 0.0


class SeatRow(NamedTuple):
    """A seat's books as :func:`seat_row` reads them: above idle, then the
    idle floor (the allocated basis); ``given`` is the holder's word; what its answers
    showed (None: unreadable)."""

    received: float
    charged: float
    forfeit: float
    in_flight: float
    estimated: float
    windows_open: float
    given: float
    idle_received: float
    idle_charged: float
    idle_forfeit: float
    idle_in_flight: float
    idle_given: float
    shown: tuple[float, ...] | None

    @property
    def in_transit(self) -> float:
        """What the holder gave it that it has not taken yet (above idle)."""
        return max(0.0, self.given - self.received)

    @property
    def idle_in_transit(self) -> float:
        return max(0.0, self.idle_given - self.idle_received)


def seat_row(mm: mmap.mmap) -> SeatRow | None:
    """A seat's books (None: not a seat of ours, or not one that runs or ran)."""
    magic, pid, _start, state = struct.unpack_from("<8sQQQ", mm, 0)
    del pid
    if magic != SEAT_MAGIC or state not in (LIVE, CLOSED):
        return None
    v = [finite(x) for x in struct.unpack_from("<8d", mm, SEAT_FLOATS)]
    received, charged, forfeit, in_flight = (finite(x) for x in IDLE.unpack_from(mm, SEAT_IDLE))
    return SeatRow(v[S_RECEIVED], v[S_CHARGED], v[S_FORFEIT], v[S_IN_FLIGHT], v[S_ESTIMATED],
                   v[S_OPEN], v[S_GIVEN], received, charged, forfeit, in_flight,
                   finite(F64.unpack_from(mm, SEAT_IDLE_GIVEN)[0]), read_shown(mm))


def other_seats(folder: Path, name: str) -> list[mmap.mmap]:
    """Every other ledger's header (all but ``name``'s), mapped read-only for this look (any
    thread: the holder's own maps belong to its reader thread, which may close them meanwhile)."""
    found = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith("p-") and n != name]
    except OSError:
        return []
    for seat in names:
        try:
            fd = open_file(folder / seat, os.O_RDONLY)
        except OSError:
            continue
        try:
            found.append(mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return found


class CardBooks:
    """This ledger's books published in its seat, and the card's summed for an answer: the
    tape's and seat's maps (``tape``, ``seat``), the table's folder, this seat's ``name``."""

    def __init__(self, tape: mmap.mmap, seat: mmap.mmap, folder: Path, name: str,
                 clock: Callable[[], float]) -> None:
        self.tape = tape
        self.seat = seat
        self.folder = folder
        self.name = name
        self.clock = clock
        #: One answer for the card's books at a time in this process: what it shows is
        #: written in its seat before the answer goes out, never after a later answer's.
        self._answering = threading.Lock()

    def publish(self, books: SeatBooks) -> None:
        """This ledger's books, for anyone who answers for the card's."""
        F64.pack_into(self.seat, SEAT_FLOATS + 8 * S_BEAT, self.clock())
        struct.pack_into("<6d", self.seat, SEAT_FLOATS + 8 * S_RECEIVED, books.received_j,
                         books.charged_j, books.forfeit_j, books.in_flight_j, books.estimated_j,
                         float(books.windows_open))
        IDLE.pack_into(self.seat, SEAT_IDLE, books.idle_received_j, books.idle_charged_j,
                        books.idle_forfeit_j, books.idle_in_flight_j)

    def host(self, mine: SeatBooks) -> HostBooks:
        """The card's books on the whole host: the tape's, the departed ledgers', every live
        ledger's (``mine``: this one's, now, published first). The same from every ledger,
        and no counter falls from any ledger's answer after any other's: each is shown at
        the highest any of them showed (this one's written in its seat before the answer
        goes out; a departed ledger's is kept in the tape's)."""
        with self._answering:
            self.publish(mine)
            seats = other_seats(self.folder, self.name)
            for _ in range(8):
                seq = U64.unpack_from(self.tape, 8)[0]
                if seq % 2:
                    time.sleep(0)
                    continue
                tape, tops, rows = self._read(seats)
                if U64.unpack_from(self.tape, 8)[0] == seq:
                    break
            else:
                tape, tops, rows = self._read(seats)
            own = seat_row(self.seat)
            live = [r for r in rows if r is not None]
            everyone = [*live, own] if own is not None else live
            # The other ledgers' in transit: what the holder gave them that they have not taken.
            in_flight = sum(r.in_flight for r in everyone) + sum(r.in_transit for r in live)
            idle_in_flight = sum(r.idle_in_flight for r in everyone) + sum(r.idle_in_transit for r in live)
            now = (  # in SHOWN's order
                tape[T_MEASURED_TOP], tape[T_R_CHARGED] + sum(r.charged for r in everyone),
                tape[T_UNATTRIBUTED_TOP] + tape[T_R_UNATTR] + sum(r.forfeit for r in everyone),
                tape[T_EXTERNAL_TOP], tape[T_R_ESTIMATED] + sum(r.estimated for r in everyone),
                tape[T_DRAWN], tape[T_R_IDLE_CHARGED] + sum(r.idle_charged for r in everyone),
                tape[T_IDLE_UNATTR] + tape[T_R_IDLE_FORFEIT] + sum(r.idle_forfeit for r in everyone),
                tape[T_READS], tape[T_ERRORS], tape[T_RESETS])
            shown = [max(value, top, *(r.shown[k] for r in everyone if r.shown is not None))
                     for k, (value, top) in enumerate(zip(now, tops, strict=True))]
            write_shown(self.seat, shown)
        (measured, charged, unattributed, foreign, estimated, drawn, idle_charged, idle_unattributed,
         reads, errors, resets) = shown
        return HostBooks(
            workers=len(everyone), measured_j=measured, charged_j=charged, unattributed_j=unattributed,
            in_flight_j=in_flight, windows_open=int(sum(r.windows_open for r in everyone)),
            estimated_j=estimated, foreign_j=foreign, reads=int(reads), read_errors=int(errors),
            resets=int(resets), age_s=max(0.0, self.clock() - tape[T_GOOD]) if tape[T_GOOD] > 0 else None,
            drawn_j=drawn, idle_unattributed_j=idle_unattributed, idle_charged_j=idle_charged,
            idle_in_flight_j=idle_in_flight,
        )

    def _read(self, seats: list[mmap.mmap]) -> tuple[list[float], list[float], list[SeatRow | None]]:
        tape = [finite(v) for v in struct.unpack_from("<24d", self.tape, TAPE_FLOATS)]
        tops = [finite(v) for v in SHOWN_ROW.unpack_from(self.tape, TAPE_SHOWN)]
        return tape, tops, [seat_row(mm) for mm in seats]


__all__ = ["CardBooks", "HostBooks", "SeatBooks", "SeatRow", "other_seats", "seat_row"]
