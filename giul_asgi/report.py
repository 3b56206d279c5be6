"""How a figure reaches the client: headers, the JSON ``energy`` block, the stream's end.

Nothing here knows about ASGI or the ledger: it turns an :class:`Energy` into bytes, and
reads token counts out of OpenAI-style ``usage`` objects.

Formats are stable: numbers are positional decimals with six significant digits (never an
exponent, never NaN or inf, never a rounded-away ``0`` for a figure that is not zero), and
an unknown figure reads ``unknown``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from .energy import Energy, Figure

TOKEN_KEYS: dict[str, tuple[str, ...]] = {
    # Chat Completions names first, then the Responses API's.
    "output": ("completion_tokens", "output_tokens"),
    "input": ("prompt_tokens", "input_tokens"),
    "total": ("total_tokens",),
}
def _orjson_loads() -> Callable[[bytes], Any] | None:
    try:
        from orjson import loads
    except ImportError:  # pragma: no cover - depends on the install
        return None
    return loads


_fast_loads = _orjson_loads()

_UNSAFE = re.compile(r"[^\x21-\x7e ]")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
#: A ``usage`` key whose value is an object. With ``include_usage`` every chunk of an OpenAI
#: stream carries ``"usage": null`` and only the last a real one. Inside a JSON string the
#: quotes are escaped, so ``"usage"`` in the bytes is always a key. The colon or the value
#: may fall on the event's next ``data:`` line.
_USAGE_OBJECT = re.compile(rb'"usage"(?:\s|data:)*:(?:\s|data:)*\{')


def number(value: float | int | None) -> str:
    """A header-safe decimal: ``unknown`` for None/NaN/inf, no exponent, no false zero."""
    if value is None:
        return "unknown"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = f"{value:.6g}"
    if "e" not in text and "n" not in text:  # the common case: already positional
        return text
    if not math.isfinite(value):
        return "unknown"
    magnitude = math.floor(math.log10(abs(value)))
    text = f"{value:.{max(0, 5 - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


@lru_cache(maxsize=1024)
def header_value(text: str | None) -> bytes:
    """A name from configuration, made safe for a header: no CR/LF or control bytes."""
    if text is None:
        return b"unknown"
    cleaned = _UNSAFE.sub("_", text).strip()
    return cleaned.encode("ascii") if cleaned else b"unknown"


def _hnum(value: float) -> bytes:
    """:func:`number` as bytes, for a float: the common cases in a C call or two."""
    if 0.0001 <= value < 999999.0 or -999999.0 < value <= -0.0001:
        return b"%.6g" % value  # never an exponent in this range
    if 1e-12 <= value < 0.0001:
        # Small and positive, as the seconds of a fast request are: what number() writes,
        # without its round trip through the exponent form.
        text: bytes = b"%.*f" % (5 - math.floor(math.log10(value)), value)
        return text.rstrip(b"0").rstrip(b".")
    return number(value).encode()  # huge, zero, negative and tiny, inf or nan


_HEADERS: dict[tuple[Any, ...], tuple[tuple[bytes, bytes], ...]] = {}
_BLOCKS: dict[tuple[Any, ...], bytes] = {}
_TEMPLATES_MAX = 4096  # names come from configuration and route templates: a few per route


def _fixed_headers(key: tuple[Any, ...]) -> tuple[tuple[bytes, bytes], ...]:
    method, backend, source, node, tier, settled = key
    fixed = (
        (b"x-energy-method", header_value(method)),
        (b"x-energy-backend", header_value(backend)),
        (b"x-energy-source", header_value(source)),
        (b"x-energy-node", header_value(node)),
        (b"x-energy-tier", header_value(tier)),
        (b"x-energy-settled", b"true" if settled else b"false"),
    )
    if len(_HEADERS) >= _TEMPLATES_MAX:
        _HEADERS.clear()
    _HEADERS[key] = fixed
    return fixed


def energy_headers(energy: Energy | Figure) -> list[tuple[bytes, bytes]]:
    """The ``X-Energy-*`` headers for a figure (lower-case names, as ASGI wants them).

    Six of the eleven are the same for every request on a route (where it ran, how it was
    measured): they are built once and reused. This runs on every metered response.
    """
    e = energy
    key = (e.method, e.backend, e.source, e.node, e.tier, e.settled)
    fixed = _HEADERS.get(key) or _fixed_headers(key)
    joules, tokens, per_token, uncertainty = (
        e.joules, e.tokens, e.joules_per_token, e.uncertainty_joules
    )
    return [
        *fixed,
        (b"x-energy-joules", b"unknown" if joules is None else _hnum(joules)),
        (b"x-energy-seconds", _hnum(e.seconds)),
        (b"x-energy-tokens", b"unknown" if tokens is None or tokens < 0 else b"%d" % tokens),
        (b"x-energy-joules-per-token", b"unknown" if per_token is None else _hnum(per_token)),
        (b"x-energy-uncertainty", b"unknown" if uncertainty is None else _hnum(uncertainty)),
    ]


ENERGY_HEADER_NAMES: tuple[bytes, ...] = tuple(
    name for name, _ in energy_headers(Energy(joules=None, method="unknown"))
)


def stream_start_headers(
    node: str | None, tier: str | None, backend: str, source: str, trailers: bool
) -> list[tuple[bytes, bytes]]:
    """What is known when a stream starts: where it runs, not yet what it cost."""
    headers = [
        (b"x-energy-node", header_value(node)),
        (b"x-energy-tier", header_value(tier)),
        (b"x-energy-backend", header_value(backend)),
        (b"x-energy-source", header_value(source)),
    ]
    if trailers:
        headers.append((b"trailer", b", ".join(n for n in ENERGY_HEADER_NAMES)))
    return headers


@lru_cache(maxsize=4096)
def _jstr(text: str | None) -> str:
    return "null" if text is None else json.dumps(text)


def _jnum(value: float | None) -> str:
    # As ``Energy.as_dict``: nine significant digits, a valid JSON number, null if unknown.
    if value is None or not math.isfinite(value):
        return "null"
    return f"{value:.9g}"


def _jbool(value: bool | None) -> str:
    return "null" if value is None else ("true" if value else "false")


@lru_cache(maxsize=1024)
def _static_text(
    method: str, backend: str, source: str, node: str | None, tier: str | None,
    route: str | None, idle: float | None, idle_known: bool, token_kind: str,
) -> tuple[str, str, str]:
    """The parts of the block that are the same for every request on a route."""
    return (
        f'"method":{_jstr(method)},"backend":{_jstr(backend)},"source":{_jstr(source)},'
        f'"node":{_jstr(node)},"tier":{_jstr(tier)},"route":{_jstr(route)},',
        f'"idle_watts":{_jnum(idle)},"idle_known":{_jbool(idle_known)},',
        f'"token_kind":{_jstr(token_kind)},',
    )


def _static_of(e: Energy | Figure) -> tuple[str, str, str]:
    return _static_text(
        e.method, e.backend, e.source, e.node, e.tier, e.route, e.idle_watts, e.idle_known,
        e.token_kind,
    )


def _energy_text(e: Energy | Figure) -> str:
    # The same object as ``Energy.as_dict()`` (a test holds them equal), written directly:
    # this runs on every JSON response, and a dict plus ``json.dumps`` costs several times more.
    head, idle, kind = _static_of(e)
    stages = (
        ",".join(f"{_jstr(k)}:{_energy_text(v)}" for k, v in e.stages.items())
        if e.stages else ""
    )
    tokens = "null" if e.tokens is None else str(int(e.tokens))
    return (
        f'{{"joules":{_jnum(e.joules)},{head}"seconds":{_jnum(e.seconds)},{idle}'
        f'"mean_watts":{_jnum(e.mean_watts)},"tokens":{tokens},{kind}'
        f'"joules_per_token":{_jnum(e.joules_per_token)},'
        f'"concurrency":{_jnum(e.concurrency)},"split":{_jstr(e.split)},'
        f'"uncertainty_joules":{_jnum(e.uncertainty_joules)},"settled":{_jbool(e.settled)},'
        f'"stages":{{{stages}}},"contended":{_jbool(e.contended)},"error":{_jstr(e.error)}}}'
    )


def _block_template(e: Energy | Figure, key: tuple[Any, ...]) -> bytes:
    head, idle, kind = _static_of(e)
    fixed = [part.replace("%", "%%") for part in (head, idle, kind)]
    template = (
        f'{{"joules":%s,{fixed[0]}"seconds":%s,{fixed[1]}"mean_watts":%s,"tokens":%s,'
        f'{fixed[2]}"joules_per_token":%s,"concurrency":%s,'
        f'"split":{_jstr(e.split).replace("%", "%%")},"uncertainty_joules":%s,'
        f'"settled":{_jbool(e.settled)},"stages":{{}},"contended":{_jbool(e.contended)},'
        f'"error":null}}'
    ).encode()
    if len(_BLOCKS) >= _TEMPLATES_MAX:
        _BLOCKS.clear()
    _BLOCKS[key] = template
    return template


def energy_json(energy: Energy | Figure) -> bytes:
    """``energy.as_dict()`` as compact JSON bytes.

    A record with no stages and no error (nearly every one) fills a template built once
    per route, node and tier: one bytes formatting instead of twenty-one fields written.
    """
    e = energy
    if e.stages or e.error is not None:
        return _energy_text(e).encode()
    key = (
        e.method, e.backend, e.source, e.node, e.tier, e.route, e.idle_watts, e.idle_known,
        e.token_kind, e.split, e.settled, e.contended,
    )
    template = _BLOCKS.get(key) or _block_template(e, key)
    j, s, w, t, p, c, u = (
        e.joules, e.seconds, e.mean_watts, e.tokens, e.joules_per_token, e.concurrency,
        e.uncertainty_joules,
    )
    # x - x is 0.0 for a finite float and nan for inf or nan: those are null, as in as_dict.
    return template % (
        b"null" if j is None or j - j else b"%.9g" % j,
        b"null" if s is None or s - s else b"%.9g" % s,
        b"null" if w is None or w - w else b"%.9g" % w,
        b"null" if t is None else b"%d" % t,
        b"null" if p is None or p - p else b"%.9g" % p,
        b"null" if c is None or c - c else b"%.9g" % c,
        b"null" if u is None or u - u else b"%.9g" % u,
    )


def _is_mapping(obj: Any) -> bool:
    """``isinstance(obj, Mapping)``, sparing dicts (nearly every parsed body) the ABC check."""
    return type(obj) is dict or isinstance(obj, Mapping)


def usage_tokens(usage: Any, kind: str = "output") -> int | None:
    """The token count of ``kind`` in an OpenAI-style ``usage`` object, or None."""
    if not _is_mapping(usage):
        return None
    for key in TOKEN_KEYS.get(kind, ()):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    if kind == "total":
        parts = [usage_tokens(usage, "input"), usage_tokens(usage, "output")]
        if all(p is not None for p in parts):
            return sum(p for p in parts if p is not None)
    return None


def find_usage(obj: Any) -> Any:
    """``usage`` at the top of a body, or inside a Responses API ``response`` object."""
    if not _is_mapping(obj):
        return None
    usage = obj.get("usage")
    if usage is None and _is_mapping(obj.get("response")):
        usage = obj["response"].get("usage")
    return usage


def parse_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (invalid JSON, not UTF-8, not an object).

    orjson, when installed (``giul-asgi[fast]``), parses several times faster; what it
    refuses (integers past 64 bits, NaN) the standard library decides.
    """
    if _fast_loads is not None:
        try:
            obj = _fast_loads(body)
            return obj if isinstance(obj, dict) else None
        except ValueError:
            pass
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def splice_object(body: bytes, obj: Mapping[str, Any], key: str, block: bytes) -> bytes | None:
    """``body`` (already parsed as ``obj``) with ``"key": block`` added at its top level;
    None when it must pass through untouched: we never overwrite the app's own ``key``."""
    if key in obj:
        return None
    end = body.rstrip()
    if not end.endswith(b"}"):
        return None
    head = end[:-1].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + _jstr(key).encode() + b":" + block + b"}" + body[len(end):]


def inject_json(body: bytes, key: str, block: bytes) -> bytes | None:
    """Parse and splice in one step; None when the body must pass through untouched."""
    obj = parse_object(body)
    return None if obj is None else splice_object(body, obj, key, block)


class SSEScanner:
    """Watches an event stream go by, without holding it up.

    It finds the last ``usage`` the stream carried and notices ``data: [DONE]``. Events
    may be split across body messages; an unfinished event is kept (bounded) until its end.
    """

    MAX_PARTIAL = 1 << 20

    def __init__(self, token_kind: str) -> None:
        self.token_kind = token_kind
        self.tokens: int | None = None
        self.done = False
        self._partial = b""
        self.broken = False

    def feed(self, chunk: bytes) -> list[tuple[bytes, Any]]:
        """Complete events in ``chunk`` (with what came before), each with its parsed data
        when that data was a JSON object carrying ``usage``, else None."""
        if self.quiet(chunk):
            return []
        data = self._partial + chunk if self._partial else chunk
        events: list[tuple[bytes, Any]] = []
        pos = 0
        for match in _EVENT_END.finditer(data):
            raw = data[pos:match.end()]
            pos = match.end()
            events.append((raw, self._inspect(raw)))
        self._partial = data[pos:]
        if len(self._partial) > self.MAX_PARTIAL:
            self.broken = True  # not a well-formed event stream: stop looking, keep sending
            self._partial = b""
        return events

    def quiet(self, chunk: bytes) -> bool:
        """Whether ``chunk`` holds nothing to act on: whole events, no usage, no [DONE]
        (the common chunk, let through at the cost of three byte searches)."""
        return self.broken or not chunk or (
            not self._partial and chunk.endswith(b"\n\n") and b"[DONE]" not in chunk
            and (b'"usage"' not in chunk or _USAGE_OBJECT.search(chunk) is None)
        )

    @property
    def at_boundary(self) -> bool:
        return not self._partial

    def _inspect(self, raw: bytes) -> Any:
        if b"[DONE]" in raw and sse_data(raw) == b"[DONE]":
            self.done = True
            return None
        if b'"usage"' not in raw or _USAGE_OBJECT.search(raw) is None:
            return None
        obj = parse_object(sse_data(raw))
        usage = find_usage(obj)
        if usage is None:
            return None
        count = usage_tokens(usage, self.token_kind)
        if count is not None:
            self.tokens = count
        return obj


def sse_data(raw: bytes) -> bytes:
    """The data of one event (its ``data:`` lines joined by newlines)."""
    lines = []
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines)


def is_usage_chunk(obj: Any) -> bool:
    """The last chunk a chat stream sends with ``include_usage``: usage and no choices."""
    return (
        _is_mapping(obj) and _is_mapping(obj.get("usage")) and obj.get("choices") in ([], None)
    )


def splice_event(
    raw: bytes, key: str, block: bytes, obj: Mapping[str, Any] | None = None
) -> bytes | None:
    """One ``data:`` JSON-object event with ``"key": block`` added, or None if it cannot be.
    ``obj`` is the event's data already parsed (as :class:`SSEScanner` gives it), if known."""
    lines = raw.splitlines(keepends=True)
    data_lines = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    if len(data_lines) != 1:
        return None
    i = data_lines[0]
    line = lines[i]
    body = line.rstrip(b"\r\n")
    ending = line[len(body):]
    prefix = b"data: " if body.startswith(b"data: ") else b"data:"
    data = body[len(prefix):]
    injected = (
        inject_json(data, key, block) if obj is None else splice_object(data, obj, key, block)
    )
    if injected is None:
        return None
    lines[i] = prefix + injected + ending
    return b"".join(lines)


def energy_event(
    energy: Energy | Figure, event: str = "energy", block: bytes | None = None
) -> bytes:
    """An SSE event an EventSource listens for with ``addEventListener("energy", ...)``;
    ``block`` is ``energy_json(energy)`` where the caller has already written it."""
    data = energy_json(energy) if block is None else block
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
