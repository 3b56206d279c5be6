"""The table's files made and mapped: whole or not at all, and never a SIGBUS.

A ``tape`` or ``p-...`` file is made by one process (exclusively: of two that race, one makes
it) and mapped by all. Its space is reserved with ``posix_fallocate`` before it is mapped (a
store into a page that a full tmpfs cannot back would be a SIGBUS), and its header is written
last, so a process that finds the header finds the whole file. What cannot be made or is not
one of ours raises :class:`Unusable`: the card is then the process's alone.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from pathlib import Path

from ..place import open_file


class Unusable(OSError):
    """The card's table cannot be joined (the place is full, not ours, damaged): the card is
    then this process's alone, and its figures say so."""


class FileMap:
    """One file of the table, mapped read-write, with its size reserved on the filesystem."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = open_file(path, flags)
        try:
            if create:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not a SIGBUS later
            elif os.fstat(fd).st_size < size:
                raise Unusable(f"{path.name} is {os.fstat(fd).st_size} bytes, not {size}")
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()


def make_file(path: Path, size: int, header: bytes) -> bool:
    """Create ``path`` (exclusively: of two processes that race, one makes it), reserve its
    size and write its header last, so a reader that finds the header finds the whole file.
    Returns False where another process made it first."""
    try:
        made = FileMap(path, size, create=True)
    except FileExistsError:
        return False
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a half-made file (no room): nobody may take it for a table
        raise
    try:
        made.mm[: len(header)] = header
    finally:
        made.close()
    return True


def open_made(path: Path, size: int, magic: bytes, *, wait_s: float = 2.0) -> FileMap:
    """Map a file another process may be making this instant: wait (briefly) for its header."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            made = FileMap(path, size, create=False)
        except Unusable:
            made = None  # not its full size yet
        if made is not None:
            if bytes(made.mm[: len(magic)]) == magic:
                return made
            made.close()
        if time.monotonic() > deadline:
            raise Unusable(f"{path.name} is not one of ours (damaged, or another version)")
        time.sleep(0.005)


__all__ = ["FileMap", "Unusable", "make_file", "open_made"]
