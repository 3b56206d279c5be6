"""The card's tape: the pieces its holder publishes, and the card's books beside them.

One process writes the tape, the card's holder; every other ledger of the host reads it. Its
first page holds the card's books (under a sequence lock: a reader sees them whole or reads
again), what the card's departed ledgers showed, and where the holder's reading goes on from;
after it, a ring of :data:`~.layout.TAPE_ENTRIES` decided pieces (a span or a gap, each with
its crc32, so a piece being written is never taken). This module is that file's reading and
writing and nothing else: who may write it is the table's business (:mod:`.table`).
"""

from __future__ import annotations

import math
import mmap
import struct
import zlib

from ...spans import CardSpan, Gap
from .books import seat_row
from .layout import (
    ENTRY,
    F64,
    FLOOR,
    FLOOR_MARK,
    GAP,
    PAGE,
    PIECE,
    RETIRED,
    S_CHARGED,
    S_ESTIMATED,
    S_FORFEIT,
    S_GIVEN,
    S_RECEIVED,
    SEAT_FLOATS,
    SHOWN_ROW,
    SPAN,
    T_R_CHARGED,
    T_R_ESTIMATED,
    T_R_IDLE_CHARGED,
    T_R_IDLE_FORFEIT,
    T_R_RECEIVED,
    T_R_UNATTR,
    TAPE_ENTRIES,
    TAPE_FLOATS,
    TAPE_SHOWN,
    TOPS,
    U64,
    SeqLock,
    finite,
)


class Tape:
    """The tape's map (``mm``: the holder writes it, every ledger reads it)."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm

    # -- its books ----------------------------------------------------------------------------------
    def books(self) -> SeqLock:
        return SeqLock(self.mm)

    def add(self, index: int, value: float) -> None:
        total = self.get(index) + finite(value)
        self.put(index, total)
        top = TOPS.get(index)
        if top is not None and total > self.get(top):
            self.put(top, total)

    def put(self, index: int, value: float) -> None:
        F64.pack_into(self.mm, TAPE_FLOATS + 8 * index, value)

    def get(self, index: int) -> float:
        return finite(F64.unpack_from(self.mm, TAPE_FLOATS + 8 * index)[0])

    def fold(self, seat: mmap.mmap) -> None:
        """A departed ledger's books (its seat's map) move into the tape's: what it had been
        given and not charged is lost with it (unattributed); its seat is marked retired."""
        books = [finite(v) for v in struct.unpack_from("<8d", seat, SEAT_FLOATS)]
        charged, forfeit, estimated = books[S_CHARGED], books[S_FORFEIT], books[S_ESTIMATED]
        # What it took: what the holder gave it (a follower), or what it took as holder.
        took = max(books[S_GIVEN], books[S_RECEIVED])
        row = seat_row(seat)
        idle_charged, idle_forfeit = (row.idle_charged, row.idle_forfeit) if row else (0.0, 0.0)
        idle_took = max(row.idle_given, row.idle_received) if row else 0.0
        shown = row.shown if row else None
        with self.books():
            self.add(T_R_CHARGED, charged)
            # Its forfeit, and what it had in flight or in transit: never less than the forfeit
            # already shown (the seat shows its highest), so no counter falls.
            self.add(T_R_UNATTR, max(forfeit, took - charged))
            self.add(T_R_ESTIMATED, estimated)
            self.add(T_R_RECEIVED, took)
            self.add(T_R_IDLE_CHARGED, idle_charged)
            self.add(T_R_IDLE_FORFEIT, max(idle_forfeit, idle_took - idle_charged))
            if shown is not None:  # what it showed, every process sees still
                tops = SHOWN_ROW.unpack_from(self.mm, TAPE_SHOWN)
                SHOWN_ROW.pack_into(self.mm, TAPE_SHOWN, *map(max, map(finite, tops), shown))
            U64.pack_into(seat, 24, RETIRED)  # counted in the tape's books now

    # -- its pieces ---------------------------------------------------------------------------------
    def published(self) -> int:
        return int(U64.unpack_from(self.mm, 16)[0])

    def write(self, index: int, piece: CardSpan | Gap, period: float, floor_w: float | None = None) -> None:
        """Write piece ``index`` into the ring (its crc32 last: whole, or not taken); a span
        with ``floor_w``, the idle floor the holder cut it above (W)."""
        payload: tuple[object, ...]
        if isinstance(piece, CardSpan):
            payload = (index, SPAN, 0, piece.tails, piece.quiet, piece.unwatched, piece.level_recent,
                       -1 if piece.processes_foreign is None else int(piece.processes_foreign),
                       piece.unseen_recent, piece.t0, piece.t1, piece.above_j, piece.total_j,
                       piece.stamp_s, piece.unc_j, piece.measured_j, piece.covered, piece.unseen,
                       piece.foreign_j, piece.doubt_w, piece.foreign_unc_w,
                       math.nan if piece.level is None else piece.level, piece.period, piece.busy_s,
                       piece.members, b"" if floor_w is None else FLOOR.pack(FLOOR_MARK, floor_w))
        else:
            payload = (index, GAP, piece.fault, 0, 0, 0, 0, -1, 0, piece.t0, piece.t1,
                       *([0.0] * 11), period, 0.0, 0, piece.why.encode()[:96])
        packed = PIECE.pack(*payload, 0)
        crc = zlib.crc32(packed[: PIECE.size - 4])
        at = PAGE + (index % TAPE_ENTRIES) * ENTRY
        self.mm[at:at + PIECE.size] = packed[:-4] + struct.pack("<I", crc)

    def piece(self, index: int) -> CardSpan | Gap | None:
        """Piece ``index``, or None where it is being written (or was overwritten)."""
        at = PAGE + (index % TAPE_ENTRIES) * ENTRY
        raw = bytes(self.mm[at:at + PIECE.size])
        if zlib.crc32(raw[:-4]) != struct.unpack_from("<I", raw, PIECE.size - 4)[0]:
            return None
        (seq, kind, fault, tails, quiet, unwatched, level_recent, foreign, unseen_recent, t0, t1, above,
         total, stamp, unc, measured, covered, unseen, foreign_j, doubt, foreign_unc, level, period, busy,
         members, why, _) = PIECE.unpack(raw)
        if seq != index or not (math.isfinite(t0) and math.isfinite(t1)):
            return None
        if kind == GAP:
            return Gap(t0, t1, why.rstrip(b"\0").decode(errors="replace") or "no reading", bool(fault))
        values = [finite(v) for v in (above, total, stamp, unc, measured, covered, unseen, foreign_j,
                                       doubt, foreign_unc)]
        return CardSpan(
            t0, t1, values[0], values[1], values[2], values[3], values[4], tails=bool(tails),
            covered=max(0.0, values[5]), members=members, unseen=max(0.0, values[6]),
            foreign_j=values[7], quiet=bool(quiet), doubt_w=values[8], foreign_unc_w=values[9],
            unwatched=bool(unwatched), level=level if math.isfinite(level) else None,
            level_recent=bool(level_recent), processes_foreign=None if foreign < 0 else bool(foreign),
            unseen_recent=bool(unseen_recent), period=period if math.isfinite(period) and period > 0 else 0.1,
            busy_s=max(0.0, finite(busy)), cut_above_w=_floor(why),
        )


def _floor(why: bytes) -> float | None:
    """The idle floor a span was cut above, where its holder wrote one (None: an earlier
    release's span, or garbage)."""
    if not why.startswith(FLOOR_MARK):
        return None
    value = FLOOR.unpack_from(why)[1]
    return value if math.isfinite(value) and value >= 0 else None


__all__ = ["Tape"]
