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
import inspect
import re
import sys
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


class KeepsItsError(type):
    """The metaclass of a frozen dataclass of settings: see the module. The record is made
    here, so a subclass keeps its error too, one a user declares with ``@dataclass`` (which
    writes an ``__init__`` of its own) included. Only a failing construction looks at the
    call stack."""

    def __call__(cls: type[T], *args: Any, **kwargs: Any) -> T:
        try:
            record: T = super().__call__(*args, **kwargs)  # type: ignore[misc]
            return record
        except ConfigError as exc:
            error = exc
        except TypeError as exc:  # a keyword it does not take, a positional too many
            names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
            error = _misnamed(cls.__name__, names, kwargs, exc, _named(names, args, kwargs))
        if not built_for_a_server(sys._getframe(1)):
            raise error from None
        return kept_record(cls, error, args, kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        """The record's own (``help()`` and editors would read the ``__call__`` above)."""
        init = inspect.signature(cls.__init__)  # type: ignore[misc]
        return init.replace(parameters=list(init.parameters.values())[1:])


def kept_record(cls: type[T], error: ConfigError, args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None) -> T:
    """A record of ``cls`` that stands for ``error``, with the values it was given where they
    name a setting and defaults elsewhere, so that repr, == and hash still work (also a whole
    configuration that could not be read: :func:`giul_asgi.config.load_config`)."""
    record = object.__new__(cls)
    object.__setattr__(record, _KEPT, error)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    given = dict(zip((f.name for f in fields), args, strict=False)) | (kwargs or {})  # too many: kept
    for f in fields:
        if f.name in given and _hashable(given[f.name]):  # a list of GPUs: the record's hash
            value = given[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None if f.default is dataclasses.MISSING else f.default
        object.__setattr__(record, f.name, value)
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


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class MisnamedSetting(ConfigError, TypeError):
    """A record called with a keyword it does not take (or a positional too many): a
    ConfigError that says which was meant, and the TypeError Python would have raised
    (``uvicorn --factory`` reports a factory's TypeError in one line)."""


def _named(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """`` 'h100-a'`` where the record is named (a Node, a Tier, a Route's pattern), else ``""``:
    a stranger's trial could not tell which of its nodes a misnamed setting was in."""
    given = dict(zip(names, args, strict=False)) | kwargs
    for key in ("name", "pattern"):
        if isinstance(given.get(key), str):
            return f" {given[key]!r}"
    return ""


def _misnamed(what: str, names: list[str], kwargs: dict[str, Any], exc: TypeError,
              named: str = "") -> ConfigError:
    wrong = [k for k in kwargs if k not in names]
    if not wrong:
        found = re.search(r"takes .*", str(exc))
        return MisnamedSetting(f"{what}(...): {found.group(0) if found else exc}",
                               remedy=f"give {what}'s settings by name: {', '.join(names)}")
    key = wrong[0]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    remedy = f"did you mean {close[0]}=?" if close else f"its settings are {', '.join(names)}"
    return MisnamedSetting(f"{what}{named}: {key}= is not a {what} setting", remedy=remedy)


__all__ = ["KeepsItsError", "MisnamedSetting", "built_for_a_server", "kept_record", "raise_kept",
           "startup_error"]
