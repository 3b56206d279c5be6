"""From a node's configuration to the factory that builds its reader.

This is the one place below the middleware that reads a :class:`~giul_asgi.config.Node` on
behalf of the readers: it turns the node into a :class:`~giul_asgi.readers.base.ReaderSpec`
of plain values and picks the factory by the node's ``reader`` name from the registry, so
readers never import the configuration. The factory runs later, on the poller's thread.
A node with ``boundary="host"`` gets its reader composed with the host's RAPL zones
(:class:`~giul_asgi.readers.host.HostReader`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

from ..config import Node
from ..errors import ReaderUnavailable
from ..hostshare.keys import reader_uuids
from ..readers.base import Reader, ReaderSpec
from ..readers.registry import READERS


def spec_of(node: Node) -> ReaderSpec:
    return ReaderSpec(
        gpus=node.gpus, period=node.period_s, url=node.url, token=node.token,
        idle_w=node.idle_w, options=node.options,
    )


#: Kept for callers: the registry is the one table of reader names (auto and simulated included).
FACTORIES: dict[str, Callable[[ReaderSpec], Reader]] = READERS


def reader_factory(node: Node) -> Callable[[], Reader]:
    """A no-argument callable that builds the node's reader (it may block: call it off
    the event loop)."""
    build = _cards_factory(node)
    if node.boundary != "host":
        return build
    return lambda: host_reader(node, build())


def _cards_factory(node: Node) -> Callable[[], Reader]:
    custom = node.reader_factory
    if custom is not None:
        return lambda: custom(node)
    factory = FACTORIES[node.reader]
    spec = spec_of(node)
    return lambda: factory(spec)


def host_reader(node: Node, cards: Reader) -> Reader:
    """``cards`` with the host's RAPL package zones (and DRAM zones, where published) added.
    A node whose reader reads nothing stays as it is (its figures are unknown either way)."""
    if cards.kind == "none":
        return cards
    from ..readers.host import HostReader
    from ..readers.rapl import RaplReader

    spec = ReaderSpec(period=node.period_s, options={"root": node.rapl_root} if node.rapl_root else {},
                      clock=cards.clock)
    try:
        parts: list[Reader] = [RaplReader(spec)]
    except ReaderUnavailable as exc:
        cards.close()
        raise ReaderUnavailable(f"boundary='host' needs the host's RAPL zones: {exc.message}",
                                remedy=exc.remedy or "leave boundary='gpu'") from None
    # A CPU that publishes no DRAM zone (AMD's): the package is the host's CPU part.
    with contextlib.suppress(ReaderUnavailable):
        parts.append(RaplReader(replace(spec, options={**spec.options, "domain": "dram"})))
    named = getattr(cards, "card_id", None)
    uuids = reader_uuids(cards)
    card = named or ("+".join(uuids) if uuids else None)
    if card is None and node.reader_factory is None:
        card = f"{node.name}|{node.reader}|gpus={','.join(map(str, node.gpus)) or 'all'}"
    return HostReader(cards, parts, card_id=f"host:{card}" if card else None)


def explicit(node: Node) -> bool:
    """Whether the operator asked for this reader by name: then its failure stops startup."""
    return node.reader not in ("auto", "none") or node.reader_factory is not None
