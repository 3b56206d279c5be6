"""The reader a node names, by name: one factory per way of reading a card.

``READERS["nvml"](spec)`` builds the local NVML reader, ``READERS["agent"](spec)`` the
giul-agent reader, and so on. The ledger's poller calls a factory from its own thread (a
factory may block: it probes the card or the URL once), so nothing here runs on the event
loop. A factory raises :class:`~giul_asgi.errors.ReaderUnavailable` (with a remedy) when
the reader cannot work on this host, and :class:`~giul_asgi.errors.ConfigError` naming the
key when ``spec.options`` holds one it does not know or a value of the wrong kind.

Reader modules are imported inside their factories, so naming the registry costs neither
httpx nor pynvml until a node asks for them. :class:`Options` is the one place options
are checked, shared by every reader (in :mod:`.options`, so readers need not import this).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..errors import ReaderUnavailable
from .base import NullReader, Reader, ReaderSpec
from .options import Options

ReaderFactory = Callable[[ReaderSpec], Reader]


def _nvml(spec: ReaderSpec) -> Reader:
    from .nvml import NvmlReader

    return NvmlReader(spec)


def _agent(spec: ReaderSpec) -> Reader:
    from .agent import AgentReader

    return AgentReader(spec)


def _dcgm(spec: ReaderSpec) -> Reader:
    from .dcgm import DcgmReader

    return DcgmReader(spec)


def _smi(spec: ReaderSpec) -> Reader:
    from .smi import SmiReader

    return SmiReader(spec)


def _rapl(spec: ReaderSpec) -> Reader:
    from .rapl import RaplReader

    return RaplReader(spec)


def _amd(spec: ReaderSpec) -> Reader:
    from .amd import AmdReader

    return AmdReader(spec)


def _simulated(spec: ReaderSpec) -> Reader:
    """With a URL, the card a demo upstream loads, read as an agent that must say it is
    simulated; without one, an in-process card the node's own windows load."""
    if spec.url is None:
        from .simulated_local import LocalSimulatedReader

        return LocalSimulatedReader(spec)
    return _agent(replace(spec, options={**spec.options, "expect_simulated": True}))


def _dcgmi(spec: ReaderSpec) -> Reader:
    from .dcgmi import DcgmiReader

    return DcgmiReader(spec)


#: What a host without a GPU can do (said once: a stranger read it twice in one warning).
_TRY = "to try giul-asgi on a host without a GPU: reader='simulated'"


def _auto(spec: ReaderSpec) -> Reader:
    """NVML if this host answers, else nothing: ``auto`` never fails a startup."""
    try:
        return _nvml(spec)
    except ReaderUnavailable as exc:
        remedy = exc.remedy or ""
        if "reader='simulated'" not in remedy:  # NVML's own remedy says it where the driver is missing
            remedy = f"{remedy}; {_TRY}" if remedy else _TRY
        return NullReader(f"NVML unavailable: {exc.message}", remedy=remedy)



def _none(spec: ReaderSpec) -> Reader:
    Options(spec.options, "none", ())
    reader = NullReader("node configured with reader='none'", period=spec.period or 1.0)
    reader.clock = spec.clock
    return reader


#: The node's ``reader`` name -> a factory: the only table of reader names.
READERS: dict[str, ReaderFactory] = {
    "auto": _auto,
    "nvml": _nvml,
    "agent": _agent,
    "dcgm": _dcgm,
    "dcgmi": _dcgmi,
    "smi": _smi,
    "rapl": _rapl,
    "amd": _amd,
    "simulated": _simulated,
    "none": _none,
}

__all__ = ["READERS", "Options", "ReaderFactory"]
