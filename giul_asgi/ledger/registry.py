"""Ledgers by node name: the one place in a process where a node's reader is owned.

A middleware and every ``Meter.for_node`` in a handler must share a node's ledger rather than
each read the card and each charge the whole of its energy: :func:`default_ledgers` is the
process's registry.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator

import anyio

from ..config import Node
from ..errors import ConfigError, GiulError
from .ledger import Ledger

NULL_NODE = Node("<none>", reader="none")


class Ledgers:
    """Ledgers by node name: the one place a node's reader is owned.

    A process keeps one (``default_ledgers()``) so that the middleware and any
    ``Meter.for_node`` in a handler share a node's ledger instead of each reading the card
    and each charging the whole of its energy. ``get(None)`` is the null ledger: windows
    on it measure nothing and say so.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def get(self, node: Node | None) -> Ledger:
        node = node if node is not None else NULL_NODE
        ledger = self._by_name.get(node.name)
        if ledger is not None and (ledger.node is node or _same(ledger.node, node)):
            return ledger
        with self._lock:
            ledger = self._by_name.get(node.name)
            if ledger is None:
                ledger = Ledger(node)
                self._by_name[node.name] = ledger
            elif not _same(ledger.node, node):
                raise ConfigError(
                    f"two different nodes are both named {node.name!r}",
                    remedy="give each node its own name, or reuse the same Node object",
                )
            return ledger

    def __iter__(self) -> Iterator[Ledger]:
        return iter([ledger for ledger in self._by_name.values() if ledger.node is not NULL_NODE])

    async def start(self, nodes: list[Node] | tuple[Node, ...], timeout: float = 0.25) -> None:
        """Start every node's reader and wait (at most ``timeout`` in all) for them to be
        built; raise the first error of a reader asked for by name."""
        ledgers = [self.get(node) for node in nodes]
        errors: list[BaseException] = []

        async def ready(ledger: Ledger) -> None:
            try:
                await ledger.wait_ready(timeout)
            except GiulError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            for ledger in ledgers:
                group.start_soon(ready, ledger)
        if errors:
            raise errors[0]

    async def aclose(self, timeout: float | None = None) -> None:
        for ledger in list(self._by_name.values()):
            await ledger.aclose(timeout)

    def close(self, timeout: float | None = None) -> None:
        for ledger in list(self._by_name.values()):
            ledger.stop(timeout)
        self._by_name.clear()


def stop_once_let_go(ledgers: Ledgers) -> Callable[[], None]:
    """What the owner of ``ledgers`` (a middleware given its own) calls as it goes: their
    readers stop once nobody holds the registry either, however late (at once if it went with
    the owner). A request's meter waiting on its figure holds the registry until its window
    settles: the middleware looked once, half a second after its collection, and under load
    found it held and left two threads reading for ever (4 runs in 8 of tests/test_collected.py).
    A registry nobody gave an owner (``Ledgers().get(node)`` kept, the process's own) is left
    alone: its ledgers may be held on their own."""
    registry = weakref.ref(ledgers)
    by_name = ledgers._by_name  # the ledgers, not the registry: it must be free to go

    def gone() -> None:
        held = registry()
        if held is None:
            _stop_on_a_thread(by_name)
        else:
            weakref.finalize(held, _stop_on_a_thread, by_name).atexit = False

    return gone


def _stop_on_a_thread(by_name: dict[str, Ledger]) -> None:
    """Stop a collected registry's ledgers on a thread of their own: whoever collects it (the
    loop, a reader thread) never waits, nor joins itself."""
    ledgers = list(by_name.values())
    if not ledgers:
        return  # closed already, or nothing was ever metered

    def stop() -> None:
        for ledger in ledgers:
            ledger.stop(1.0)

    threading.Thread(target=stop, name="giul-ledgers-collected", daemon=True).start()


def _same(a: Node, b: Node) -> bool:
    return a == b and a.reader_factory is b.reader_factory


_default = Ledgers()


def default_ledgers() -> Ledgers:
    """The process's ledgers: one per node name, shared by every meter and middleware."""
    return _default


__all__ = ["NULL_NODE", "Ledgers", "default_ledgers", "stop_once_let_go"]
