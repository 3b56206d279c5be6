"""A setting's record made wrong while a server imports the app keeps its error for the startup.

``Node(...)``, ``Tier(...)``, ``Route(...)`` and ``Budget(...)`` are usually written at a
module's top level, beside ``app.add_middleware(...)``. A bad one raised there is printed by
the server under a traceback while it imports the module (uvicorn exits 1 after 40 lines;
``uvicorn --workers`` respawns its workers for ever, each under its traceback: a stranger's
trial saw 1,572 lines in 30 s). So, where a server is importing the app (or a framework is
building its middleware stack), the record keeps its error instead of raising it, and the
middleware (or a Ledger, a Meter) that is given it fails the startup with its one line, as
for its own settings (:mod:`giul_asgi.asgi.startup`). Called by a person (a test, a function
of a script, a REPL), the record raises at once, as before; one made wrong at a module's top
level raises only where it is used (a module that makes one and never uses it imports).

A keyword the record does not take is a :class:`MisnamedSetting`: a ConfigError that says
which was meant (``idle_ww=`` -> ``idle_w=``), and the ``TypeError`` Python would have raised.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from .errors import ConfigError

#: The frames of a module being imported (CPython names them so in every supported version).
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
#: Starlette's (and FastAPI's) lazy builder of the middleware stack.
_STACK_BUILDER = "build_middleware_stack"
_MAX_FRAMES = 200
#: Where a record keeps the error it was made with.
_KEPT = "_startup_error"

T = TypeVar("T")


def built_for_a_server(frame: FrameType | None) -> bool:
    """Whether the call was made while a server builds the app: Starlette's stack builder or
    a module's import: there a raised ConfigError would be misread (see the module)."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == _STACK_BUILDER or code.co_filename in _IMPORT_FILES:
            return True
        frame = frame.f_back
    return False


def keeps_its_error(cls: type[T]) -> type[T]:
    """Decorate a frozen dataclass of settings: see the module. Only a failing construction
    looks at the call stack."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    what = cls.__name__

    @functools.wraps(init)
    def build(self: Any, /, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ConfigError as exc:
            error = exc
        except TypeError as exc:  # a keyword it does not take, a positional too many
            error = _misnamed(what, names, kwargs, exc)
        else:
            return
        if not built_for_a_server(sys._getframe(1)):
            raise error from None
        _keep(self, error)

    setattr(cls, "__init__", build)  # noqa: B010  (mypy refuses assigning to __init__)
    return cls


def _keep(record: Any, error: ConfigError) -> None:
    """Keep ``error`` in ``record``; what was not set is its default, so that repr, == and
    hash still work."""
    object.__setattr__(record, _KEPT, error)
    for f in dataclasses.fields(record):
        if f.name not in record.__dict__:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else (
                None if f.default is dataclasses.MISSING else f.default)
            object.__setattr__(record, f.name, default)


def kept_record(cls: type[T], error: ConfigError) -> T:
    """A record of ``cls`` that stands for ``error`` (a whole configuration that could not
    be read while a server imported the app: :func:`giul_asgi.config.load_config`)."""
    record = object.__new__(cls)
    _keep(record, error)
    return record


def startup_error(record: object) -> ConfigError | None:
    """The error a record was made with, kept for the startup (None: it is right)."""
    return getattr(record, _KEPT, None)


def raise_kept(*records: object) -> None:
    """Raise the first error any of ``records`` was made with (what is given a record calls
    this: the middleware's settings, a Ledger, a Meter, the budgets)."""
    for record in records:
        kept = startup_error(record)
        if kept is not None:
            raise kept


class MisnamedSetting(ConfigError, TypeError):
    """A record called with a keyword it does not take (or a positional too many): a
    ConfigError that says which was meant, and the TypeError Python would have raised
    (``uvicorn --factory`` reports a factory's TypeError in one line)."""


def _misnamed(what: str, names: list[str], kwargs: dict[str, Any], exc: TypeError) -> ConfigError:
    wrong = [k for k in kwargs if k not in names]
    if not wrong:
        found = re.search(r"takes .*", str(exc))
        return MisnamedSetting(f"{what}(...): {found.group(0) if found else exc}",
                               remedy=f"give {what}'s settings by name: {', '.join(names)}")
    key = wrong[0]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    remedy = f"did you mean {close[0]}=?" if close else f"its settings are {', '.join(names)}"
    return MisnamedSetting(f"{key}= is not a {what} setting", remedy=remedy)


__all__ = ["MisnamedSetting", "built_for_a_server", "keeps_its_error", "kept_record", "raise_kept",
           "startup_error"]
