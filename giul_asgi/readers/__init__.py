"""Ways to read a card, one module each, behind the :class:`Reader` protocol."""

from __future__ import annotations

from ..config import Node
from ..errors import ReaderUnavailable
from .base import Kind, NullReader, Reader, Reading
from .nvml import NvmlReader, probe_nvml
from .simulated import SimulatedCard, SimulatedReader, VirtualClock


def make_reader(node: Node) -> Reader:
    """The reader a node asked for. ``auto`` falls back to :class:`NullReader`, never raises."""
    if node.reader_factory is not None:
        return node.reader_factory(node)
    if node.reader == "none":
        return NullReader("node configured with reader='none'")
    if node.reader == "simulated":
        card = SimulatedCard(idle_w=node.idle_w if node.idle_w is not None else 60.0)
        return SimulatedReader(card, period=node.period_s)
    try:
        return NvmlReader(node.gpus, period=node.period_s)
    except ReaderUnavailable as exc:
        if node.reader == "nvml":
            raise
        return NullReader(f"NVML unavailable: {exc.message}")


__all__ = [
    "Kind",
    "NullReader",
    "NvmlReader",
    "Reader",
    "Reading",
    "SimulatedCard",
    "SimulatedReader",
    "VirtualClock",
    "make_reader",
    "probe_nvml",
]
