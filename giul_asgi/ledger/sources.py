"""From a node's configuration to the factory that builds its reader.

This is the one place below the middleware that reads a :class:`~giul_asgi.config.Node` on
behalf of the readers: it turns the node into a :class:`~giul_asgi.readers.base.ReaderSpec`
of plain values and picks the factory by the node's ``reader`` name from the registry, so
readers never import the configuration. The factory runs later, on the poller's thread.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import Node
from ..errors import ReaderUnavailable
from ..readers.base import NullReader, Reader, ReaderSpec
from ..readers.registry import READERS


def spec_of(node: Node) -> ReaderSpec:
    return ReaderSpec(
        gpus=node.gpus, period=node.period_s, url=node.url, token=node.token,
        idle_w=node.idle_w, options=node.options,
    )


def _auto(spec: ReaderSpec) -> Reader:
    """NVML if this host answers, else nothing: ``auto`` never fails a startup."""
    try:
        return READERS["nvml"](spec)
    except ReaderUnavailable as exc:
        return NullReader(f"NVML unavailable: {exc.message}")


def _simulated(spec: ReaderSpec) -> Reader:
    """The card a demo upstream loads, read as an agent that must say it is simulated."""
    options = {**spec.options, "expect_simulated": True}
    return READERS["agent"](
        ReaderSpec(spec.gpus, spec.period, spec.url, spec.token, spec.idle_w, options, spec.clock)
    )


FACTORIES: dict[str, Callable[[ReaderSpec], Reader]] = {
    **READERS, "auto": _auto, "simulated": _simulated,
}


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
