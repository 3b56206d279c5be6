"""The middleware's settings: one frozen value, checked once when the middleware is built.

Every setting that could later break a request, or make ``/energy`` fall through to the
app, is checked here and fails at once with :class:`~giul_asgi.errors.ConfigError` and its
remedy: a string where a number belongs (``settle_timeout="0.5"``), a negative size or
timeout, a path without its leading slash, an empty key, a token too short to be one.
A setting changes a default; none is needed to make the defaults right.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..config import check_choice, check_trace_dir
from ..energy import TOKEN_KINDS
from ..errors import ConfigError
from ..tenants import DEFAULT_MAX_TENANTS, header_name
from ..wire.formats import FORMATS

DEFAULT_MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Options:
    """How the middleware answers. Build with :meth:`build`, which checks every value."""

    #: The key of the block spliced into JSON bodies and chunks.
    energy_key: str = "energy"
    #: Splice the block into JSON object bodies (headers are added either way).
    inject_json: bool = True
    #: The largest JSON body held to splice; a larger one passes as sent.
    max_body: int = DEFAULT_MAX_BODY
    #: Close an event stream with an ``event: energy`` (only where the operator asks: a
    #: consumer that counts events or parses every ``data:`` line would see one more).
    stream_event: bool = False
    #: Put the block into an OpenAI stream's finish or usage chunk.
    usage_energy: bool = True
    #: Add ``energy_joules`` (and ``carbon_grams``) to an OpenAI ``usage`` object, JSON or
    #: streamed, so tools that log ``usage`` as it is capture the energy with no change
    #: (neuralwatt: its block's ``energy_joules`` and ``energy_kwh``, JSON answers only).
    energy_in_usage: bool = False
    #: Send the figure in HTTP trailers when the client asks and the server offers them.
    trailers: bool = True
    #: The block's shape: ``giul`` (ours), or ``neuralwatt`` (``energy_joules``, ``energy_kwh``,
    #: ... and, streamed, an SSE comment ``: energy {...}`` before ``[DONE]``), which client
    #: plugins read; a client may ask per request with ``Prefer: energy=neuralwatt``.
    energy_format: str = "giul"
    #: Which token count ``tokens`` is: output (generated), input or total.
    token_kind: str = "output"
    #: Wait this long (seconds) for the settled figure before answering; 0: answer at once.
    settle_timeout: float = 0.0
    #: Wait this long at startup for the readers to be built.
    startup_timeout: float = 0.5
    #: Where ``/energy`` is served (None: not served).
    energy_path: str | None = "/energy"
    #: Where Prometheus text is served (None: not served).
    metrics_path: str | None = None
    #: More paths never metered (paths, globs such as ``/internal/*``, templates, regexes),
    #: beside those never metered anyway (``routing.NEVER_METERED``: health checks, the
    #: framework's documents, static mounts).
    exclude: tuple[str, ...] = ()
    #: The request header whose value (hashed, never kept) names the tenant; None: none
    #: (the middleware's ``tenant=`` takes a header name or a function: one of the two, not both).
    tenant_header: str | None = None
    #: The tenants with the most joules that keep a label of their own in the statistics
    #: the middleware builds; the rest count under ``<other>``.
    max_tenants: int = DEFAULT_MAX_TENANTS
    #: A directory where every node that names none of its own writes its trace
    #: (``Node(trace=...)``, for ``giul-asgi replay``); None: no trace.
    trace: str | None = None

    @classmethod
    def build(cls, **values: Any) -> Options:
        """The options, every value checked; a bad one raises :class:`ConfigError`."""
        check_names(values)
        defaults = {name: f.default for name, f in cls.__dataclass_fields__.items()}
        key = values.get("energy_key", defaults["energy_key"])
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"energy_key={key!r} must be a non-empty string",
                              remedy='use the default "energy"')
        for name in ("inject_json", "stream_event", "usage_energy", "trailers", "energy_in_usage"):
            if name in values and not isinstance(values[name], bool):
                raise ConfigError(f"{name}={values[name]!r} must be True or False",
                                  remedy=f"pass {name}=True or {name}=False")
        if "max_body" in values:
            _count("max_body", values["max_body"], remedy="use a size in bytes, e.g. 4 * 1024 * 1024")
        for name in ("settle_timeout", "startup_timeout"):
            if name in values:
                values[name] = _seconds(name, values[name])
        if "energy_format" in values:
            check_choice("energy_format", values["energy_format"], FORMATS,
                         remedy="giul (ours, the default) or neuralwatt (what Neuralwatt's client "
                                "plugins read)")
        check_choice("token_kind", values.get("token_kind", defaults["token_kind"]), TOKEN_KINDS,
                     remedy="output (generated tokens), input or total")
        energy, metrics = values.get("energy_path", defaults["energy_path"]), values.get("metrics_path")
        for name, other in (("energy_path", metrics), ("metrics_path", energy)):
            if name in values:
                _path(name, values[name], other)
        if energy is not None and metrics is not None and (
            metrics == energy or metrics.startswith(energy + "/")
        ):
            elsewhere = _example("metrics_path", energy)
            raise ConfigError(f"metrics_path={metrics!r} lies inside energy_path={energy!r}",
                              remedy=f'serve metrics elsewhere, e.g. metrics_path="{elsewhere}"')
        if "exclude" in values:
            values["exclude"] = _patterns(values["exclude"])
        if values.get("tenant_header") is not None:
            values["tenant_header"] = header_name(values["tenant_header"])
        if "max_tenants" in values:
            _count("max_tenants", values["max_tenants"], remedy=f"use the default, {DEFAULT_MAX_TENANTS}")
            if values["max_tenants"] < 1:
                raise ConfigError("max_tenants=0 would give no tenant a label of its own",
                                  remedy="use at least 1, or leave tenant unset for no tenants")
        if values.get("trace") is not None:
            values["trace"] = check_trace_dir("trace", values["trace"])
        return cls(**values)


#: Names people reach for that are settings under another name.
ALIASES = {"token": "endpoint_token", "guard": "endpoint_guard", "bearer_token": "endpoint_token",
           "auth_token": "endpoint_token", "path": "energy_path", "metrics": "metrics_path",
           "exclude_paths": "exclude", "skip_paths": "exclude"}


def check_names(given: Iterable[str], also: Iterable[str] = ()) -> None:
    """A ConfigError naming the first unknown setting in ``given`` and the one meant, if any.

    ``also``: the names the middleware takes besides :class:`Options`' fields (``nodes``,
    ``endpoint_token``...), which are suggested too."""
    fields = set(Options.__dataclass_fields__)
    unknown = sorted(set(given) - fields)
    if not unknown:
        return
    known = sorted(fields | set(also))
    name = unknown[0]
    meant = ALIASES.get(name) if ALIASES.get(name) in known else None
    close = [meant] if meant else difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    more = f" (and {', '.join(n + '=' for n in unknown[1:])})" if unknown[1:] else ""
    remedy = (f"did you mean {close[0]}=?" if close
              else f"the settings are {', '.join(n + '=' for n in known)}")
    raise ConfigError(f"{name}= is not a middleware setting{more}", remedy=remedy)


def _count(name: str, value: Any, *, remedy: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}={value!r} must be a whole number >= 0", remedy=remedy)


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value >= 0
    ):
        raise ConfigError(f"{name}={value!r} must be a number of seconds >= 0",
                          remedy=f"pass a number of seconds, e.g. {name}=0.5 (0: do not wait)")
    return float(value)


_EXAMPLE_PATHS = {"energy_path": ("/energy", "/energy-stats"), "metrics_path": ("/metrics", "/prometheus")}


def _path(name: str, value: Any, other: Any) -> None:
    """A path the endpoint serves: ``/`` and more, no ``/`` at its end, nothing a request's
    path never holds (spaces, a query, a fragment). The remedy's example is one the checks
    take beside ``other`` (the other endpoint's path)."""
    if value is None:
        return
    if (not isinstance(value, str) or len(value) < 2 or not value.startswith("/") or value.endswith("/")
            or any(c.isspace() or c in "?#" for c in value)):
        raise ConfigError(f"{name}={value!r} must start with / and not end with one, with no "
                          "spaces, query or fragment",
                          remedy=f'use e.g. {name}="{_example(name, other)}", or None to serve nothing '
                                 'there')


def _example(name: str, other: Any) -> str:
    """A path for setting ``name`` that the checks take beside ``other``, the other
    endpoint's path: neither the same, nor one inside the other."""
    return next(p for p in _EXAMPLE_PATHS[name]
                if not isinstance(other, str) or not (p == other or p.startswith(other + "/")
                                                      or other.startswith(p + "/")))


def _patterns(value: Any) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(f"exclude={value!r} must be a list of paths or patterns",
                          remedy='pass e.g. exclude=["/health", "/static/*"]')
    items = tuple(value)
    for item in items:
        if not (isinstance(item, str) and item.startswith("/")) and not hasattr(item, "match"):
            raise ConfigError(f"exclude entry {item!r} must be a path starting with / or a regex",
                              remedy='write it as "/path", "/path/*", "/items/{id}" or re.compile(...)')
    return items


def check_callable(name: str, value: Any, *, remedy: str) -> None:
    """A hook the operator passes (``decide``, ``endpoint_guard``): callable or None."""
    if value is not None and not callable(value):
        raise ConfigError(f"{name}={value!r} must be callable", remedy=remedy)


__all__ = ["ALIASES", "DEFAULT_MAX_BODY", "Options", "check_callable", "check_names"]
