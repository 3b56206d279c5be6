"""Which card a node meters, in words every process of the host agrees on.

Two workers share a table only if they meter the same card. A reader that knows its GPUs'
UUIDs (NVML's probes, dcgm's ``uuids``) names them: two nodes on the same GPUs share
whatever they are called. Otherwise the node's name and what its reader reads (kind,
URL, GPU indices) name it, which every worker started from one configuration shares. A
card simulated inside the process is nobody else's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def reader_uuids(reader: Any) -> tuple[str, ...] | None:
    """The UUIDs of the GPUs a reader reads, where it knows them (never raises)."""
    try:
        uuids = getattr(reader, "uuids", None)
        if uuids is None:
            probes = getattr(reader, "probes", None)
            uuids = [getattr(p, "uuid", None) for p in probes] if probes else None
        if not uuids or not isinstance(uuids, Iterable):
            return None
        found = [u for u in uuids if isinstance(u, str) and u]
        if len(found) != len(list(uuids)):
            return None  # one GPU without a UUID: name the card another way
        return tuple(sorted(found))
    except Exception:
        return None


def card_key(node: Any, reader: Any = None) -> str | None:
    """The key of the card ``node`` meters through ``reader``; None for a card that lives
    in this process (``reader="simulated"`` with no URL): no other process loads it."""
    if getattr(node, "reader", None) == "simulated" and not getattr(node, "url", None) \
            and getattr(node, "reader_factory", None) is None:
        return None
    uuids = reader_uuids(reader)
    if uuids:
        return "uuid:" + "+".join(uuids)
    gpus = ",".join(str(g) for g in getattr(node, "gpus", ()) or ())
    target = getattr(node, "url", None) or f"gpus={gpus or 'all'}"
    return f"node:{node.name}|{getattr(node, 'reader', '?')}|{target}"


__all__ = ["card_key", "reader_uuids"]
