"""The ``X-Energy-*`` headers: what a figure looks like in a response's head or trailers.

Numbers are positional decimals with six significant digits (never an exponent, NaN or
inf, never a rounded-away ``0`` for a figure that is not zero); an unknown figure reads
``unknown``, never ``0``. Names from configuration are made header-safe once and cached.
Nothing here knows about ASGI, the ledger or the meter: an :class:`Energy` goes in, a list
of ``(name, value)`` byte pairs comes out.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from ..energy import Energy

_UNSAFE = re.compile(r"[^\x21-\x7e ]")
#: Names come from configuration and route templates: a few per route.
TEMPLATES_MAX = 4096


def header_number(value: float | int | None) -> bytes:
    """A header-safe decimal: ``unknown`` for None/NaN/inf, no exponent, no false zero."""
    if value is None:
        return b"unknown"
    if type(value) is int:
        return b"%d" % value
    if 0.0001 <= value < 999999.0 or -999999.0 < value <= -0.0001:
        return b"%.6g" % value  # the common case, one C call: never an exponent in this range
    if not math.isfinite(value):
        return b"unknown"
    if value == 0:
        return b"0"
    magnitude = math.floor(math.log10(abs(value)))
    text: bytes = b"%.*f" % (max(0, 5 - magnitude), value)
    return text.rstrip(b"0").rstrip(b".") if b"." in text else text


def number(value: float | int | None) -> str:
    """:func:`header_number` as text."""
    return header_number(value).decode()


@lru_cache(maxsize=1024)
def header_value(text: str | None) -> bytes:
    """A name from configuration, made safe for a header: no CR/LF or control bytes."""
    if text is None:
        return b"unknown"
    cleaned = _UNSAFE.sub("_", text).strip()
    return cleaned.encode("ascii") if cleaned else b"unknown"


def id_header(energy_id: str) -> bytes:
    """A request id as a header value (ours are hex and dashes: passed as they are)."""
    if energy_id.isascii() and energy_id.isprintable():
        return energy_id.encode()
    return header_value(energy_id)


_FIXED: dict[tuple[Any, ...], tuple[tuple[bytes, bytes], ...]] = {}


def _fixed_headers(key: tuple[Any, ...]) -> tuple[tuple[bytes, bytes], ...]:
    method, backend, source, node, tier, settled, boundary, pue = key
    fixed: tuple[tuple[bytes, bytes], ...] = (
        (b"x-energy-method", header_value(method)),
        (b"x-energy-backend", header_value(backend)),
        (b"x-energy-source", header_value(source)),
        (b"x-energy-node", header_value(node)),
        (b"x-energy-tier", header_value(tier)),
        (b"x-energy-settled", b"true" if settled else b"false"),
        (b"x-energy-boundary", header_value(boundary)),
    )
    if pue is not None:  # the joules include the facility's overhead: say by how much
        fixed += ((b"x-energy-pue", header_number(pue)),)
    if len(_FIXED) >= TEMPLATES_MAX:
        _FIXED.clear()
    _FIXED[key] = fixed
    return fixed


def energy_headers(energy: Energy) -> list[tuple[bytes, bytes]]:
    """The ``X-Energy-*`` headers for a figure (lower-case names, as ASGI wants them).

    Seven or eight of them are the same for every request on a route (where it ran, how it
    was measured, its boundary and PUE): they are built once and reused, which measured 1.3
    -> 0.6 us a response.
    """
    e = energy
    key = (e.method, e.backend, e.source, e.node, e.tier, e.settled, e.boundary, e.pue)
    fixed = _FIXED.get(key) or _fixed_headers(key)
    tokens = e.tokens
    headers = [
        *fixed,
        (b"x-energy-joules", header_number(e.joules)),
        (b"x-energy-allocated-joules", header_number(e.allocated_joules)),
        (b"x-energy-seconds", header_number(e.seconds)),
        (b"x-energy-tokens", b"unknown" if tokens is None or tokens < 0 else b"%d" % tokens),
        (b"x-energy-joules-per-token", header_number(e.joules_per_token)),
        (b"x-energy-uncertainty", header_number(e.uncertainty_joules)),
    ]
    if e.id is not None:
        headers.append((b"x-energy-id", id_header(e.id)))
    if e.carbon_source is not None:  # the node has a carbon intensity configured
        headers.append((b"x-energy-carbon-grams", header_number(e.carbon_grams)))
    return headers


#: Every name :func:`energy_headers` writes, for a ``Trailer`` announcement.
ENERGY_HEADER_NAMES: tuple[bytes, ...] = tuple(
    name for name, _ in energy_headers(
        Energy(joules=None, method="unknown", id="x", carbon_source="x", pue=1.0))
)
_TRAILER = (b"trailer", b", ".join(ENERGY_HEADER_NAMES))


_WHERE: dict[tuple[Any, ...], tuple[tuple[bytes, bytes], ...]] = {}


def _where_headers(key: tuple[Any, ...]) -> tuple[tuple[bytes, bytes], ...]:
    node, tier, backend, source, boundary, pue = key
    where: tuple[tuple[bytes, bytes], ...] = (
        (b"x-energy-node", header_value(node)),
        (b"x-energy-tier", header_value(tier)),
        (b"x-energy-backend", header_value(backend)),
        (b"x-energy-source", header_value(source)),
        (b"x-energy-boundary", header_value(boundary)),
    )
    if pue is not None:  # as a figure's own headers say it
        where += ((b"x-energy-pue", header_number(pue)),)
    if len(_WHERE) >= TEMPLATES_MAX:
        _WHERE.clear()
    _WHERE[key] = where
    return where


def stream_headers(
    node: str | None, tier: str | None, backend: str, source: str, energy_id: str | None,
    trailers: bool, boundary: str = "gpu", pue: float | None = None,
) -> list[tuple[bytes, bytes]]:
    """What is known when a response starts before its end: where it runs, what its figure
    will cover (its boundary, and the PUE its joules will be multiplied by) and its id (under
    which its figure is kept), not yet what it cost; the ``Trailer`` names when trailers
    will carry the figure. Where it runs is the same for every request of a route: built
    once (6.9k -> 4.3k instructions a stream's start, callgrind)."""
    key = (node, tier, backend, source, boundary, pue)
    headers = [*(_WHERE.get(key) or _where_headers(key))]
    if energy_id is not None:
        headers.append((b"x-energy-id", id_header(energy_id)))
    if trailers:
        headers.append(_TRAILER)
    return headers


def with_vary(headers: list[tuple[bytes, bytes]], name: bytes) -> list[tuple[bytes, bytes]]:
    """``headers`` saying the response varies with request header ``name`` too (RFC 9110
    12.5.5): added to the app's last ``Vary`` (its names kept), or a ``Vary`` of its own;
    nothing where a ``Vary`` names it already or says ``*``. Changes ``headers`` in place."""
    last = -1
    wanted = name.lower()
    for i, (key, value) in enumerate(headers):
        if len(key) == 4 and key.lower() == b"vary":
            names = {part.strip().lower() for part in value.split(b",")}
            if wanted in names or b"*" in names:
                return headers
            last = i
    if last < 0:
        headers.append((b"vary", name))
    else:
        key, value = headers[last]
        headers[last] = (key, value + b", " + name if value.strip() else name)
    return headers


__all__ = [
    "ENERGY_HEADER_NAMES",
    "energy_headers",
    "header_number",
    "header_value",
    "id_header",
    "number",
    "stream_headers",
    "with_vary",
]
