"""Sweep the folders of cards nobody reads any more (no holder, every seat's process gone).

A card's folder (its ``lock``, its 1 MiB ``tape``, a seat per ledger) outlives its processes:
a demo's card named for its port, a fake GPU's, stay in the place after their last ledger has
gone. Once a process, when a ledger joins a table, the cards untouched for
:data:`FORGET_CARD_S` that nobody holds and nobody sits at are removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from ..keys import folder_name
from ..place import held_if_free, own_entries
from ..rows import alive

#: A card's folder untouched this long, with nobody holding or sitting at it, is removed.
FORGET_CARD_S = 60.0


def _seat_alive(name: str) -> bool:
    """Whether the seat file ``p-<pid>-<start>-<n>`` belongs to a process that still runs."""
    parts = name.split("-")
    if len(parts) != 4 or not parts[1].isdigit():
        return True  # not a seat of ours: leave the folder alone
    return alive(int(parts[1]), parts[2] if parts[2] != "0" else None)


def sweep_cards(directory: Path, keep: Path | None = None) -> int:
    """Remove the folders of cards nobody reads any more: no process holds the lock, every
    seat's process is gone, nothing changed for :data:`FORGET_CARD_S` (a demo's card named
    for its port, a fake GPU's: each 1.5 MB that a hostile tester saw pile up to 650 MB).
    Runs when a ledger joins a table, on its reader thread; returns how many went. Never
    raises: workers that start together sweep together, and one found a folder another had
    just removed (FileNotFoundError out of its join: that worker read the card alone, and
    four workers charged it 1.75x, the suite's test_four_workers_on_one_card)."""
    removed = 0
    try:
        entries = list(own_entries(directory / "cards"))
    except OSError:
        return 0
    for entry, info in entries:
        folder = Path(entry.path)
        if folder == keep or not stat.S_ISDIR(info.st_mode) or time.time() - info.st_mtime < FORGET_CARD_S:
            continue
        try:
            removed += _sweep(folder)
        except OSError:  # swept by another process meanwhile, or not ours to sweep
            continue
    return removed


def _sweep(folder: Path) -> int:
    """Remove one card's folder if nobody reads it; 1 if removed. Raises OSError."""
    names = os.listdir(folder)
    if any(n.startswith("p-") and _seat_alive(n) for n in names):
        return 0
    with held_if_free(folder / "lock") as free:
        if not free:
            return 0  # somebody holds the card (it is read), or its lock cannot be opened
        if time.time() - os.stat(folder, follow_symlinks=False).st_mtime < FORGET_CARD_S:
            return 0  # a ledger sat down meanwhile
        for name in os.listdir(folder):
            if name != "lock":
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)
        with contextlib.suppress(OSError):
            os.unlink(folder / "lock")
        os.rmdir(folder)
    return 1


def ledgers_on(directory: Path, key: str) -> Iterable[str]:
    """The ledgers' files at a card's table (for tests and the bound)."""
    folder = directory / "cards" / folder_name(key)
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("p-"))
    except OSError:
        return []


__all__ = ["FORGET_CARD_S", "ledgers_on", "sweep_cards"]
