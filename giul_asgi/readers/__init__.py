"""Ways to read a card, one module each, behind the :class:`Reader` protocol.

Readers are built by name through :data:`~giul_asgi.readers.registry.READERS` from a
:class:`ReaderSpec` of plain values; nothing here imports the configuration.
"""

from __future__ import annotations

from .base import Kind, LoadDriven, NullReader, Process, ProcessLister, Reader, ReaderSpec, Reading

__all__ = [
    "Kind",
    "LoadDriven",
    "NullReader",
    "Process",
    "ProcessLister",
    "Reader",
    "ReaderSpec",
    "Reading",
]
