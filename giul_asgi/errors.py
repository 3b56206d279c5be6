"""Typed errors, each carrying the remedy an operator can act on.

They are raised where a setting is checked: when the middleware, a node or a reader is
built, and at lifespan startup (a reader asked for by name that cannot work), which they
stop with one line (:mod:`giul_asgi.asgi.startup`). Nothing on a request's path raises
one: a reader that fails later costs a measurement, never the request.
"""

from __future__ import annotations

from typing import Self


class GiulError(Exception):
    """Base for every error this library raises. ``remedy`` says what to do about it."""

    def __init__(self, message: str, *, remedy: str = "") -> None:
        self.message = message
        self.remedy = remedy
        super().__init__(f"{message}. {remedy}" if remedy else message)

    def about(self, who: str) -> Self:
        """The same error said of ``who`` (a node): its message begins with it, once."""
        if self.message.startswith(f"{who}: "):
            return self
        return type(self)(f"{who}: {self.message}", remedy=self.remedy)


class ConfigError(GiulError, ValueError):
    """A node, tier or route description is wrong; the message names the bad key."""


class ReaderUnavailable(GiulError, RuntimeError):
    """A reader was asked for explicitly and cannot work on this host."""
