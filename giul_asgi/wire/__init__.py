"""How a figure travels to the client: headers, the JSON block, the event stream.

Nothing here knows about ASGI, the ledger or the meter: an
:class:`~giul_asgi.energy.Energy` goes in, bytes come out.
"""

from .body import (
    TOKEN_KEYS,
    energy_json,
    find_usage,
    inject_json,
    json_number,
    parse_object,
    splice_object,
    usage_tokens,
)
from .headers import (
    ENERGY_HEADER_NAMES,
    energy_headers,
    header_number,
    header_value,
    number,
    stream_headers,
    with_vary,
)
from .sse import SSESplicer, energy_event, is_usage_chunk, splice_event, sse_data

__all__ = [
    "ENERGY_HEADER_NAMES",
    "TOKEN_KEYS",
    "SSESplicer",
    "energy_event",
    "energy_headers",
    "energy_json",
    "find_usage",
    "header_number",
    "header_value",
    "inject_json",
    "is_usage_chunk",
    "json_number",
    "number",
    "parse_object",
    "splice_event",
    "splice_object",
    "sse_data",
    "stream_headers",
    "usage_tokens",
    "with_vary",
]
