"""From a node's configuration to the factory that builds its reader.

This is the one place below the middleware that reads a :class:`~giul_asgi.config.Node` on
behalf of the readers: it turns the node into a :class:`~giul_asgi.readers.base.ReaderSpec`
of plain values and picks the factory by the node's ``reader`` name from the registry, so
readers never import the configuration. The factory runs later, on the poller's thread.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Node
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
    custom = node.reader_factory
    if custom is not None:
        return lambda: custom(node)
    factory = FACTORIES[node.reader]
    spec = spec_of(node)
    return lambda: factory(spec)


def explicit(node: Node) -> bool:
    """Whether the operator asked for this reader by name: then its failure stops startup."""
    return node.reader not in ("auto", "none") or node.reader_factory is not None
