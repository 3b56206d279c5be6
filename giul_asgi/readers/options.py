"""A reader's own options, checked in one place, with getters that name the bad key.

Every reader takes its keys from ``spec.options`` through :class:`Options`: an unknown key or a
value of the wrong kind is a :class:`~giul_asgi.errors.ConfigError` naming it, raised when the
reader is built. Readers import it from here, not from the registry that imports them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError


class Options:
    """``spec.options`` checked against the keys a reader knows; typed getters that name the key."""

    def __init__(self, options: Mapping[str, Any] | None, reader: str, allowed: Iterable[str]) -> None:
        self.reader = reader
        self.raw: Mapping[str, Any] = dict(options or {})
        known = set(allowed)
        unknown = sorted(k for k in self.raw if k not in known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.6)
            raise ConfigError(
                f"reader {reader!r}: unknown option {unknown[0]!r}",
                remedy=(f"did you mean {close[0]!r}? " if close else "")
                + f"{reader!r} knows {sorted(known) or 'no options'}",
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
