"""Typed errors, each carrying the remedy an operator can act on.

They are raised where a setting is checked: when the middleware, a node or a reader is
built, and at lifespan startup (a reader asked for by name that cannot work), which they
stop with one line (:mod:`giul_asgi.asgi.startup`). Nothing on a request's path raises
one: a reader that fails later costs a measurement, never the request.
"""

from __future__ import annotations

import importlib.util
import sys
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


def require_installed(module: str, what: str, remedy: str, package: str = "") -> None:
    """A setting (``what``) that needs an optional ``package``'s ``module``: a missing one is a
    bad setting, said where the setting is checked, never a failure later (a 500 at each
    scrape, an upstream silently unread). Found, not imported: importing runs its code, and
    the check may run on the event loop."""
    try:
        found = module in sys.modules or importlib.util.find_spec(module) is not None
        why = "it is not installed"
    except (ImportError, ValueError) as exc:
        found, why = False, f"{type(exc).__name__}: {exc}"
    if not found:
        raise ConfigError(f"{what} needs {package or module}, which cannot be imported ({why})",
                          remedy=remedy)
