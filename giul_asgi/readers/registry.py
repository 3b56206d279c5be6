"""The reader a node names, by name: one factory per way of reading a card.

``READERS["nvml"](spec)`` builds the local NVML reader, ``READERS["agent"](spec)`` the
giul-agent reader, and so on. The ledger's poller calls a factory from its own thread (a
factory may block: it probes the card or the URL once), so nothing here runs on the event
loop. A factory raises :class:`~giul_asgi.errors.ReaderUnavailable` (with a remedy) when
the reader cannot work on this host, and :class:`~giul_asgi.errors.ConfigError` naming the
key when ``spec.options`` holds one it does not know or a value of the wrong kind.

Reader modules are imported inside their factories, so naming the registry costs neither
httpx nor pynvml until a node asks for them. :class:`Options` is the one place options
are checked, shared by every reader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigError
from .base import NullReader, Reader, ReaderSpec

ReaderFactory = Callable[[ReaderSpec], Reader]


class Options:
    """``spec.options`` checked against the keys a reader knows; typed getters that name the key."""

    def __init__(self, options: Mapping[str, Any] | None, reader: str, allowed: Iterable[str]) -> None:
        self.reader = reader
        self.raw: Mapping[str, Any] = dict(options or {})
        known = set(allowed)
        unknown = sorted(k for k in self.raw if k not in known)
        if unknown:
            raise ConfigError(
                f"reader {reader!r}: unknown option {unknown[0]!r}",
                remedy=f"{reader!r} knows {sorted(known) or 'no options'}",
            )

    def _bad(self, key: str, want: str) -> ConfigError:
        return ConfigError(f"reader {self.reader!r}: option {key!r} must be {want}, got {self.raw[key]!r}")

    def number(self, key: str, default: float, *, minimum: float = 0.0, strict: bool = True) -> float:
        if key not in self.raw:
            return default
        value = self.raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self._bad(key, "a number")
        if value < minimum or (strict and value == minimum):
            raise self._bad(key, f"{'>' if strict else '>='} {minimum}")
        return float(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.raw.get(key, default)
        if value not in choices:
            raise self._bad(key, f"one of {list(choices)}")
        return str(value)

    def text(self, key: str, default: str | None) -> str | None:
        value = self.raw.get(key, default)
        if value is not None and (not isinstance(value, str) or not value):
            raise self._bad(key, "a non-empty string")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def ints(self, key: str) -> tuple[int, ...] | None:
        if key not in self.raw:
            return None
        value = self.raw[key]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise self._bad(key, "a list of integers >= 0")
        return tuple(value)

    def texts(self, key: str) -> tuple[str, ...] | None:
        if key not in self.raw:
            return None
        value = self.raw[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise self._bad(key, "a list of strings")
        return tuple(value)


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


def _none(spec: ReaderSpec) -> Reader:
    Options(spec.options, "none", ())
    reader = NullReader("node configured with reader='none'", period=spec.period or 1.0)
    reader.clock = spec.clock
    return reader


#: The node's ``reader`` name -> a factory. The lead adds ``simulated`` and ``auto``.
READERS: dict[str, ReaderFactory] = {
    "nvml": _nvml,
    "agent": _agent,
    "dcgm": _dcgm,
    "smi": _smi,
    "rapl": _rapl,
    "amd": _amd,
    "none": _none,
}

__all__ = ["READERS", "Options", "ReaderFactory"]
