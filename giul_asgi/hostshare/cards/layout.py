"""Where everything lies in a card's two kinds of file: the tape's bytes and a seat's.

Every process of the host that meters the card maps the same ``tape`` and ``p-...`` files
(:mod:`giul_asgi.hostshare.cards`), and each reads what the others write with no system call:
so the sizes, offsets and record layouts must be one table that every part reads from, and a
change to any of them is a change of the files' version (their magic). Here, too, the few
helpers that read or write a slot whole: a float that may be garbage, a seat's two slots of
what its answers showed, the tape's books' sequence lock.
"""

from __future__ import annotations

import math
import mmap
import struct
import time
from collections.abc import Iterable

PAGE = 4096
#: Pieces the tape keeps; a follower further behind than this books the rest as a gap.
TAPE_ENTRIES = 4096
ENTRY = 256
#: Opens and closes a ledger's ring keeps between two looks of the holder (tens of ms).
EVENTS = 8192
EVENT = 32
#: Parts of pieces the holder has left for a ledger and it has not taken yet.
ANSWERS = 8192
ANSWER = 24
TAPE_BYTES = PAGE + TAPE_ENTRIES * ENTRY
SEAT_BYTES = PAGE + EVENTS * EVENT + ANSWERS * ANSWER

TAPE_MAGIC = b"GIULTAP1"
SEAT_MAGIC = b"GIULSEA1"
# The tape's header: magic, books' sequence lock, pieces published, then its books and the
# holder's state (the T_ indices below; :mod:`.tape` reads and writes them).
TAPE_HEAD = struct.Struct("<8sQQ24d")
# measured, unattributed, external, retired charged, retired unattributed, retired estimated,
# last piece's end, period, heartbeat, retired received, the holders' reads, failed reads and
# counter resets, the holder's last good reading, the highest measured, unattributed and
# external sums so far (what is shown: a counter never falls), where the holder's tape goes
# on from (a counter's value and its step's time), how many ledgers ever joined, all the card
# drew (idle included) and its idle floor no window was allocated, the departed ledgers' idle
# floor charged and forfeit (the allocated basis, as above idle's)
T_MEASURED, T_UNATTRIBUTED, T_EXTERNAL, T_R_CHARGED, T_R_UNATTR, T_R_ESTIMATED, \
    T_LAST, T_PERIOD, T_BEAT, T_R_RECEIVED, T_READS, T_ERRORS, T_RESETS, T_GOOD, \
    T_MEASURED_TOP, T_UNATTRIBUTED_TOP, T_EXTERNAL_TOP, T_BASE_VALUE, T_BASE_T, T_JOINS, \
    T_DRAWN, T_IDLE_UNATTR, T_R_IDLE_CHARGED, T_R_IDLE_FORFEIT = range(24)
#: A sum that a span measured below idle may lower (a step stamp's error, carried into the next
#: span) and the highest it has been: the books show the highest, so no counter ever falls.
TOPS = {T_MEASURED: T_MEASURED_TOP, T_UNATTRIBUTED: T_UNATTRIBUTED_TOP, T_EXTERNAL: T_EXTERNAL_TOP}
# A piece: index, kind, fault, tails, quiet, unwatched, level seen lately, foreign process
# (-1 unknown), unseen lately; 15 floats (the last: the span's time with a window open);
# members; why; crc32 of all before it.
PIECE = struct.Struct("<QBBBBBBbB15dI96sI")
SPAN, GAP = 1, 2
# A ledger's header: magic, pid, start, state, then its books and its counters.
SEAT_HEAD = struct.Struct("<8sQQQ8d4Q")
LIVE, CLOSED = 1, 2
# heartbeat, received, charged, forfeit, in flight, estimated, windows open, given (holder's)
S_BEAT, S_RECEIVED, S_CHARGED, S_FORFEIT, S_IN_FLIGHT, S_ESTIMATED, S_OPEN, S_GIVEN = range(8)
SEAT_FLOATS = 8 + 3 * 8  # where the floats start in a ledger's header
SEAT_COUNTS = SEAT_FLOATS + 8 * 8  # events written, answers written, pieces taken, spare
# After the header, in the seat's first page: its idle floor (received, charged, forfeit, in
# flight: the allocated basis, written by it), the idle floor the holder gave it (written by
# the holder), and what its answers showed (a sequence number, then SHOWN).
SEAT_IDLE, SEAT_IDLE_GIVEN, SEAT_SHOWN = 256, 288, 320
IDLE = struct.Struct("<4d")
#: The card's counters as every ledger answers for them (HostBooks' fields): an answer shows
#: each at the highest any ledger of the host has shown (each publishes what it showed; a
#: departed one's is folded into the tape's), so that no counter falls from any worker's
#: answer after another's, nor when a ledger dies, its holder included.
SHOWN = ("measured_j", "charged_j", "unattributed_j", "foreign_j", "estimated_j", "drawn_j",
         "idle_charged_j", "idle_unattributed_j", "reads", "read_errors", "resets")
SHOWN_ROW = struct.Struct(f"<{len(SHOWN)}d")
TAPE_SHOWN = 1024  # in the tape's first page: the highest its departed ledgers showed
#: A span's idle floor, as its holder cut it (W), in the piece's ``why`` bytes (a gap's reason;
#: a span's were empty), after a marker: a follower whose operator gave the card another floor
#: says which its figures are above. Per piece, so a floor is never taken for another holder's
#: pieces; a holder of an earlier release writes none, and its pieces' floor is not known.
FLOOR = struct.Struct("<8sd")
FLOOR_MARK = b"GIULFLR1"
EVENT_ROW = struct.Struct("<QBxxxxxxxdQ")
OPEN, CLOSE = 1, 2
ANSWER_ROW = struct.Struct("<QdI4x")
U64 = struct.Struct("<Q")
F64 = struct.Struct("<d")
TAPE_FLOATS = 24  # where the tape's books start in its header
RETIRED = 3
EVENTS_AT = PAGE
ANSWERS_AT = PAGE + EVENTS * EVENT


#: A value in a card's files past this (J, W, s, window-seconds) is damage, read as nothing:
#: a card draws 1e15 J in no lifetime, and the books show the highest any seat ever showed,
#: so a planted 1e300 stayed in every worker's books for good (a hostile trial).
MAX_VALUE = 1e15


def finite(value: float) -> float:
    """A number read from a card's files, or 0.0 where it is damage (NaN, infinite, absurd)."""
    return value if math.isfinite(value) and abs(value) <= MAX_VALUE else 0.0


def read_shown(mm: mmap.mmap) -> tuple[float, ...] | None:
    """What a seat's answers showed, from the last of its two slots written whole (a
    ledger killed while writing one leaves the other); None where it kept changing."""
    for _ in range(8):
        seq = U64.unpack_from(mm, SEAT_SHOWN)[0]
        values = SHOWN_ROW.unpack_from(mm, SEAT_SHOWN + 8 + (seq % 2) * SHOWN_ROW.size)
        if U64.unpack_from(mm, SEAT_SHOWN)[0] - seq <= 1:  # the other slot, at most, was rewritten
            return tuple(finite(v) for v in values)
        time.sleep(0)
    return None


def write_shown(mm: mmap.mmap, values: Iterable[float]) -> None:
    """Write what this seat's answer shows into its other slot, then make that slot the last."""
    seq = U64.unpack_from(mm, SEAT_SHOWN)[0]
    SHOWN_ROW.pack_into(mm, SEAT_SHOWN + 8 + ((seq + 1) % 2) * SHOWN_ROW.size, *values)
    U64.pack_into(mm, SEAT_SHOWN, seq + 1)


class SeqLock:
    """The tape's books are changed between an odd and an even sequence number: a reader
    that saw the same even number before and after read them whole."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm

    def __enter__(self) -> None:
        U64.pack_into(self.mm, 8, U64.unpack_from(self.mm, 8)[0] | 1)

    def __exit__(self, *exc: object) -> None:
        U64.pack_into(self.mm, 8, (U64.unpack_from(self.mm, 8)[0] | 1) + 1)


__all__ = [
    "ANSWER", "ANSWERS", "ANSWERS_AT", "ANSWER_ROW", "CLOSE", "CLOSED", "ENTRY", "EVENT", "EVENTS",
    "EVENTS_AT", "EVENT_ROW", "F64", "GAP", "IDLE", "LIVE", "OPEN", "PAGE", "PIECE", "RETIRED",
    "SEAT_BYTES", "SEAT_COUNTS", "SEAT_FLOATS", "SEAT_HEAD", "SEAT_IDLE", "SEAT_IDLE_GIVEN",
    "SEAT_MAGIC", "SEAT_SHOWN", "SHOWN", "SHOWN_ROW", "SPAN", "S_BEAT", "S_CHARGED", "S_ESTIMATED",
    "S_FORFEIT", "S_GIVEN", "S_IN_FLIGHT", "S_OPEN", "S_RECEIVED", "TAPE_BYTES", "TAPE_ENTRIES",
    "TAPE_FLOATS", "TAPE_HEAD", "TAPE_MAGIC", "TAPE_SHOWN", "TOPS", "T_BASE_T", "T_BASE_VALUE",
    "T_BEAT", "T_DRAWN", "T_ERRORS", "T_EXTERNAL", "T_EXTERNAL_TOP", "T_GOOD", "T_IDLE_UNATTR",
    "T_JOINS", "T_LAST", "T_MEASURED", "T_MEASURED_TOP", "T_PERIOD", "T_READS", "T_RESETS",
    "T_R_CHARGED", "T_R_ESTIMATED", "T_R_IDLE_CHARGED", "T_R_IDLE_FORFEIT", "T_R_RECEIVED",
    "T_R_UNATTR", "T_UNATTRIBUTED", "T_UNATTRIBUTED_TOP", "U64", "SeqLock", "finite", "read_shown",
    "write_shown",
]
