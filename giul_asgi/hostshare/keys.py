"""Which card a node meters, in words every process of the host agrees on.

Two processes share a table only if they meter the same card. A reader that knows its GPUs'
UUIDs (NVML's probes, dcgm's ``uuids``) names them, and a reader made in code may name its card
(``card_id``): two nodes on the same GPUs share whatever they are called. Otherwise a reader
built from the node's configuration is named by the node's name and what it reads (kind, URL,
GPU indices), which every worker started from one configuration shares. The simulated card
that lives in the holder's process is a server's own: its workers share it, and another
server's node of the same name simulates a card of its own. A card read by code that does
not say which card is nobody else's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import ServerId


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


def card_key(
    node: Any, reader: Any = None, *, custom: bool = False, server: ServerId | None = None,
) -> str | None:
    """The key of the card ``node`` meters through ``reader``; None for a card nobody else
    meters: a ``custom`` reader (a node's ``reader_factory``, or a reader handed to the ledger)
    that does not say which card it reads (its ``card_id``, or its GPUs' UUIDs): a reader made
    in code may read anything, and two such readers sharing a node's name are not one card.
    A simulated card that lives in the process (``reader="simulated"`` with no URL) is one
    card per node name and ``server``: whichever of the server's processes holds it runs it,
    loaded by every one's windows; a server of one process (``server.alone``) has it to itself,
    at no table (None). A card per name on the host joined unrelated servers trying the
    README's node: a fresh server's first request found five processes and another's energy
    on its card (a stranger's trial, 2026-12-08); and a table per server left a 1.5 MB folder
    for a minute at each restart of a single-process one (a hostile trial)."""
    if getattr(node, "reader", None) == "simulated" and not getattr(node, "url", None) \
            and getattr(node, "reader_factory", None) is None:
        # its physics is its settings: two nodes of one name that simulate differently are
        # two cards (one's figures from the other's card would answer for neither)
        options = sorted((str(k), repr(v)) for k, v in dict(getattr(node, "options", {}) or {}).items())
        digest = hashlib.sha256(repr((options, getattr(node, "idle_w", None))).encode()).hexdigest()[:12]
        if server is None:
            return f"node:{node.name}|simulated|{digest}"
        return None if server.alone else f"node:{node.name}|simulated|{digest}|{server.key}"
    named = getattr(reader, "card_id", None)
    if isinstance(named, str) and named:
        return "card:" + named
    uuids = reader_uuids(reader)
    if uuids:
        return "uuid:" + "+".join(uuids)
    if custom:
        return None
    gpus = ",".join(str(g) for g in getattr(node, "gpus", ()) or ())
    target = getattr(node, "url", None) or f"gpus={gpus or 'all'}"
    return f"node:{node.name}|{getattr(node, 'reader', '?')}|{target}"


def folder_name(key: str) -> str:
    """A file-system-safe folder name for a card key, readable and unique."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._]+", "_", key).strip("_.")[:48]
    return f"{slug}-{digest}" if slug else digest


__all__ = ["card_key", "folder_name", "reader_uuids"]
