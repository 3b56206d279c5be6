"""The ``"energy"`` block in a JSON body, and the token counts in an OpenAI ``usage``.

A figure becomes a compact JSON object (the same as :meth:`Energy.as_dict`, a test holds
the two equal) and is spliced into the app's JSON object at its top level, keeping every
byte of the app's body: its key order, its whitespace, the indentation before its closing
brace. Whatever cannot be parsed or spliced safely (invalid or non-UTF-8 JSON, not an
object, nesting deeper than the parser goes, the key already taken) is left untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ..energy import MAX_TOKENS, Energy
from .headers import TEMPLATES_MAX

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


def json_number(value: float | None) -> bytes:
    """As :meth:`Energy.as_dict` writes a float: nine significant digits, null if unknown."""
    # x - x is 0.0 for a finite float and nan for inf or nan.
    return b"null" if value is None or value - value else b"%.9g" % value


@lru_cache(maxsize=4096)
def json_string(text: str | None) -> str:
    return "null" if text is None else json.dumps(text)


def _jbool(value: bool | None) -> str:
    return "null" if value is None else ("true" if value else "false")


_BLOCKS: dict[tuple[Any, ...], bytes] = {}


def _block_template(e: Energy, key: tuple[Any, ...]) -> bytes:
    def fixed(text: str) -> str:
        return text.replace("%", "%%")

    template = (
        '{"joules":%s,"allocated_joules":%s,'
        f'"method":{fixed(json_string(e.method))},"backend":{fixed(json_string(e.backend))},'
        f'"source":{fixed(json_string(e.source))},"node":{fixed(json_string(e.node))},'
        f'"tier":{fixed(json_string(e.tier))},"route":{fixed(json_string(e.route))},'
        '"seconds":%s,'
        f'"idle_watts":{json_number(e.idle_watts).decode()},'
        f'"idle_known":{_jbool(e.idle_known)},'
        '"mean_watts":%s,"tokens":%s,'
        f'"token_kind":{fixed(json_string(e.token_kind))},'
        '"joules_per_token":%s,"concurrency":%s,'
        f'"split":{fixed(json_string(e.split))},'
        '"uncertainty_joules":%s,'
        f'"settled":{_jbool(e.settled)},"stages":{{}},"contended":{_jbool(e.contended)},'
        '"foreign_watts":%s,"error":%s,"id":%s,'
        f'"tenant":{fixed(json_string(e.tenant))},'
        '"carbon_grams":%s,'
        f'"carbon_g_per_kwh":{json_number(e.carbon_g_per_kwh).decode()},'
        f'"pue":{json_number(e.pue).decode()},'
        f'"carbon_source":{fixed(json_string(e.carbon_source))},'
        f'"carbon_signal":{fixed(json_string(e.carbon_signal))},'
        '"carbon_age_s":%s,'
        f'"mig":{fixed(json_string(e.mig))},'
        f'"boundary":{fixed(json_string(e.boundary))}}}'
    ).encode()
    if len(_BLOCKS) >= TEMPLATES_MAX:
        _BLOCKS.clear()
    _BLOCKS[key] = template
    return template


def energy_json(energy: Energy) -> bytes:
    """``energy.as_dict()`` as compact JSON bytes (a test holds the two equal).

    A record without stages (nearly every one) fills a template built once per route,
    node and tier: one bytes formatting instead of a dict and ``json.dumps`` (measured
    1.9 -> 0.7 us). A record with stages takes ``as_dict``.
    """
    e = energy
    if e.stages:
        return json.dumps(e.as_dict(), separators=(",", ":")).encode()
    key = (
        e.method, e.backend, e.source, e.node, e.tier, e.route, e.idle_watts, e.idle_known,
        e.token_kind, e.split, e.settled, e.contended, e.tenant, e.carbon_g_per_kwh, e.pue,
        e.carbon_source, e.carbon_signal, e.mig, e.boundary,
    )
    template = _BLOCKS.get(key) or _block_template(e, key)
    tokens, error, energy_id = e.tokens, e.error, e.id
    return template % (
        json_number(e.joules), json_number(e.allocated_joules), json_number(e.seconds),
        json_number(e.mean_watts),
        b"null" if tokens is None else b"%d" % tokens,
        json_number(e.joules_per_token), json_number(e.concurrency),
        json_number(e.uncertainty_joules), json_number(e.foreign_watts),
        b"null" if error is None else json_string(error).encode(),
        b"null" if energy_id is None else _json_id(energy_id),
        json_number(e.carbon_grams), json_number(e.carbon_age_s),
    )


def _json_id(energy_id: str) -> bytes:
    # Our ids are hex and dashes: quoted as they are (json.dumps measured 1.5 us of 3.2).
    if energy_id.isascii() and energy_id.isprintable() and '"' not in energy_id and (
        "\\" not in energy_id
    ):
        return b'"' + energy_id.encode() + b'"'
    return json.dumps(energy_id).encode()


# -- reading bodies -----------------------------------------------------------------------
def is_mapping(obj: Any) -> bool:
    """``isinstance(obj, Mapping)``, sparing dicts (nearly every parsed body) the ABC check."""
    return type(obj) is dict or isinstance(obj, Mapping)


def usage_tokens(usage: Any, kind: str = "output") -> int | None:
    """The token count of ``kind`` in an OpenAI-style ``usage`` object, or None."""
    if not is_mapping(usage):
        return None
    for key in TOKEN_KEYS.get(kind, ()):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_TOKENS:
            return value  # (2**64 - 1 is a server's -1, not a count)
    if kind == "total":
        parts = [usage_tokens(usage, "input"), usage_tokens(usage, "output")]
        if all(p is not None for p in parts):
            return sum(p for p in parts if p is not None)
    return None


def find_usage(obj: Any) -> Any:
    """``usage`` at the top of a body, or inside a Responses API ``response`` object."""
    if not is_mapping(obj):
        return None
    usage = obj.get("usage")
    if usage is None and is_mapping(obj.get("response")):
        usage = obj["response"].get("usage")
    return usage


def parse_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None: invalid JSON, not UTF-8, not an object, or
    nested deeper than a parser goes (RecursionError is the app's data, not our crash).

    Only UTF-8 is read: ``json.loads`` also accepts UTF-16 and UTF-32 bytes, into which an
    ASCII block cannot be spliced. orjson (``giul-asgi[fast]``) parses several times
    faster; what it refuses (integers past 64 bits, NaN) the standard library decides.
    """
    if _fast_loads is not None:
        try:
            obj = _fast_loads(body)
            return obj if type(obj) is dict else None
        except ValueError:
            pass
    try:
        obj = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return obj if type(obj) is dict else None


def splice_object(body: bytes, obj: Mapping[str, Any], key: str, block: bytes) -> bytes | None:
    """``body`` (already parsed as ``obj``) with ``"key": block`` added as its last member,
    every other byte kept (the whitespace before the closing brace included); None when it
    must pass through untouched: we never overwrite the app's own ``key``."""
    if key in obj:
        return None
    end = len(body.rstrip())
    if body[end - 1:end] != b"}":
        return None
    close = end - 1
    head = body[:close].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + json_string(key).encode() + b":" + block + body[len(head):]


#: A JSON string (escapes included) or a structural character: what a walk over a body's
#: top levels needs to see, found by one C-level scan per token.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:]')
#: Where an OpenAI ``usage`` object sits: Chat Completions, then the Responses API.
USAGE_PATHS: tuple[tuple[bytes, ...], ...] = ((b'"usage"',), (b'"response"', b'"usage"'))


def find_object(body: bytes, path: tuple[bytes, ...]) -> int | None:
    """Where the object at ``path`` (quoted keys, from the top) closes in ``body``: the
    offset of its ``}``, or None. Strings are skipped whole, so a key inside a string or a
    deeper object never matches."""
    depth, want, key, after_colon = 0, 0, b"", False
    for match in _TOKEN.finditer(body):
        token = match.group()
        if token == b"{" or token == b"[":
            if after_colon and want < len(path) and depth == want + 1 and key == path[want] and (
                token == b"{"
            ):
                want += 1
            depth += 1
        elif token == b"}" or token == b"]":
            if token == b"}" and want == len(path) and depth == want + 1:
                return match.start()
            depth -= 1
            if depth < want + 1 and want:
                return None  # the object we were inside closed without it
        elif token == b":":
            after_colon = True
            continue
        else:
            key = token
        after_colon = False
    return None


def splice_usage(body: bytes, fields: bytes) -> bytes | None:
    """``body`` with ``fields`` (``"k":v`` pairs) added at the end of its OpenAI ``usage``
    object, every other byte kept; None where it has none."""
    for path in USAGE_PATHS:
        close = find_object(body, path)
        if close is not None:
            head = body[:close].rstrip()
            sep = b"" if head.endswith(b"{") else b","
            return head + sep + fields + body[len(head):]
    return None


def usage_open(obj: Any) -> bool:
    """The body has a ``usage`` object without our fields in it (never overwritten)."""
    usage = find_usage(obj)
    return is_mapping(usage) and "energy_joules" not in usage


def usage_fields(energy: Energy) -> bytes:
    """What goes into ``usage`` for tools that log it as it is: the joules (and grams)."""
    out = b'"energy_joules":' + json_number(energy.joules)
    if energy.carbon_source is not None:
        out += b',"carbon_grams":' + json_number(energy.carbon_grams)
    return out


def inject_json(body: bytes, key: str, block: bytes) -> bytes | None:
    """Parse and splice in one step; None when the body must pass through untouched."""
    obj = parse_object(body)
    return None if obj is None else splice_object(body, obj, key, block)


__all__ = [
    "TOKEN_KEYS",
    "energy_json",
    "find_usage",
    "inject_json",
    "is_mapping",
    "json_number",
    "json_string",
    "parse_object",
    "splice_object",
    "splice_usage",
    "usage_fields",
    "usage_open",
    "usage_tokens",
]
