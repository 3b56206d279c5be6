"""An event stream going by, with the energy put where OpenAI-compatible clients read it.

Sans-IO (bytes in, bytes out), so it is tested on its own. The rules it keeps:

- **Every chunk goes out at once**, as the app sent it, with two exceptions that delay no
  event a client could already dispatch: the event that can carry the answer's energy (a
  chat chunk whose ``finish_reason`` has a value, the ``usage`` chunk of
  ``include_usage``, a Responses API ``response.completed``) is held until the next event,
  and an unfinished event that is such a candidate is held until its blank line.
- **Additions only where the client is known to read them.** The first ``data:`` event
  says what the stream is: OpenAI Chat/Completions chunks, Responses API events, or
  anything else. Only the first two get the block, inside the held event's JSON when
  ``[DONE]`` (or the end) follows it. Any other stream passes untouched; its figure rides in
  trailers and at ``/energy/requests/{id}``.
- **Event ends are found at any chunk boundary** in the three line endings SSE allows
  (LF, CR, CRLF), a CRLF split over two chunks included, from the last four bytes seen.
- **Linear and bounded**: each byte is scanned once; a held event is at most
  ``max_event`` bytes, past which it passes as sent.

The common chunk never reaches :meth:`SSESplicer.feed`: the caller checks that it ends
between events (``endswith(EVENT_ENDS)``) and looks for :attr:`SSESplicer.needle` in it (one
C-level ``bytes`` search for what can end or carry the answer: a ``finish_reason`` with a
value, written as this stream's first chat chunk writes its colon); when it is not there, it
sends the chunk as it is and keeps it as :attr:`SSESplicer.tail` (:meth:`Lane.passes`). Once
the stream is known not to be OpenAI-shaped, ``needle`` is None and every chunk passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .body import (
    find_usage,
    is_mapping,
    parse_object,
    splice_object,
    splice_usage,
    usage_open,
    usage_tokens,
)

Search = Callable[[bytes], Any]

_TERMINATOR = re.compile(rb"\r\n|\r|\n")
#: What a stream is before its first byte: at an event boundary.
START = b"\n\n"
#: A chat chunk whose ``finish_reason`` has a value (a string, not ``null``).
_FINISH: Search = re.compile(rb'_reason"\s*:\s*"').search
#: The same, or a ``usage`` object (when we read tokens without holding anything).
_FINISH_OR_USAGE: Search = re.compile(rb'_reason"\s*:\s*"|"usage"\s*:\s*\{').search
#: How this stream writes a colon: after ``finish_reason`` if its first chat chunk has one,
#: else after its first key (a server writes every chunk with one serializer).
_FINISH_COLON: Search = re.compile(rb'_reason"(\s*:\s*)').search
_KEY_COLON: Search = re.compile(rb'"(\s*:\s*)').search
#: The lane's needles, each found by one ``bytes`` search (:meth:`Lane.passes`). Before
#: the first ``data:`` line nothing is known about the stream.
_UNDECIDED = b"data:"
#: The Responses API's last event.
_COMPLETED = b"response.completed"
#: Found in every chunk: the caller hands each one to :meth:`SSESplicer.feed`.
ALWAYS = b""
#: How a chunk that ends between events ends (LF, CR or CRLF pairs).
EVENT_ENDS = (b"\n\n", b"\n\r\n", b"\r\r")

CHAT, RESPONSES, OTHER = "chat", "responses", "other"


class Lane:
    """Chunks that go out as they are, without a frame of the responder's (:meth:`passes`):
    those that end between events and in which ``needle`` is not found, or every chunk when
    ``needle`` is None. ``tail`` keeps the last one, for where the stream stands."""

    def __init__(self, needle: bytes | None = None) -> None:
        self.needle = needle
        self.tail = START

    def passes(self, chunk: bytes) -> bool:
        """Whether ``chunk`` goes out as it is (the caller then keeps it as :attr:`tail`).
        The exchange's ``send`` inlines this test: a chunk costs it no other frame."""
        needle = self.needle
        return needle is None or (chunk.endswith(EVENT_ENDS) and chunk.rfind(needle) < 0)

    def passed(self, chunk: bytes) -> None:
        """Keep ``chunk``, which went out as it is, as the stream's tail (a short one joins
        the last bytes before it)."""
        self.tail = chunk if len(chunk) > 3 else self.tail[-4:] + chunk


def event_ends(tail: bytes, chunk: bytes) -> list[int]:
    """Offsets in ``chunk`` just past each blank line (an event's end), given ``tail``,
    the last bytes (up to four) of the stream before it."""
    base = len(tail)
    ends: list[int] = []
    prev = -1
    for match in _TERMINATOR.finditer(tail + chunk):
        start, end = match.span()
        if start == prev and end > base:
            ends.append(end - base)
        prev = end
    return ends


def at_boundary(tail: bytes) -> bool:
    """Whether a stream ending in ``tail`` ends between events."""
    prev = last_blank = -1
    for match in _TERMINATOR.finditer(tail):
        start, end = match.span()
        if start == prev:
            last_blank = end
        prev = end
    return last_blank == len(tail)


def sse_data(raw: bytes) -> bytes:
    """The data of one event (its ``data:`` lines joined by newlines)."""
    lines = []
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines)


def energy_event(block: bytes, event: str = "energy") -> bytes:
    """An SSE event an EventSource listens for with ``addEventListener("energy", ...)``."""
    return b"event: " + event.encode() + b"\ndata: " + block + b"\n\n"


def splice_event(
    raw: bytes, key: str, block: bytes, obj: dict[str, Any] | None = None,
    usage: bytes | None = None,
) -> bytes | None:
    """One ``data:`` JSON-object event with ``"key": block`` added (and ``usage``'s fields
    added to its ``usage`` object, where it has one), or None if it cannot be (several data
    lines, not an object, the key taken). ``obj``: the data, if parsed."""
    lines = raw.splitlines(keepends=True)
    data_lines = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    if len(data_lines) != 1:
        return None
    i = data_lines[0]
    line = lines[i]
    body = line.rstrip(b"\r\n")
    prefix = b"data: " if body.startswith(b"data: ") else b"data:"
    data = body[len(prefix):]
    if obj is None:
        obj = parse_object(data)
    injected = None if obj is None else splice_object(data, obj, key, block)
    if injected is None:
        return None
    if usage is not None and usage_open(obj):
        injected = splice_usage(injected, usage) or injected
    lines[i] = prefix + injected + line[len(body):]
    return b"".join(lines)


def is_usage_chunk(obj: Any) -> bool:
    """The last chunk a chat stream sends with ``include_usage``: usage and no choices."""
    return is_mapping(obj) and is_mapping(obj.get("usage")) and obj.get("choices") in ([], None)


def _finishes(obj: dict[str, Any]) -> bool:
    choices = obj.get("choices")
    return type(choices) is list and any(
        is_mapping(choice) and isinstance(choice.get("finish_reason"), str) for choice in choices
    )


def _might_be_done(partial: bytes) -> bool:
    """Whether an unfinished event could still turn out to be ``data: [DONE]``."""
    text = partial.lstrip(b"\r\n")
    for form in (b"data: [DONE]", b"data:[DONE]"):
        if form.startswith(text[: len(form)]) and (
            len(text) <= len(form) or not text[len(form):].strip(b"\r\n ")
        ):
            return True
    return False


class SSESplicer(Lane):
    """One event stream's splicing state, and the lane its common chunks take. See the
    module's docstring for the rules.

    The caller sends a chunk as it is when :meth:`~Lane.passes` says so, storing it as
    :attr:`tail`; otherwise it sends what :meth:`feed` returns. When :attr:`waiting` turns true
    (``[DONE]`` followed the held event), it closes its window and sends what
    :meth:`resume` returns for the block. At the end it sends :meth:`close`'s bytes; when
    the app stops abruptly, :meth:`flush`'s.
    """

    MAX_EVENT = 256 * 1024

    def __init__(
        self, *, key: str = "energy", token_kind: str = "output", splice: bool = True,
        max_event: int = MAX_EVENT,
    ) -> None:
        super().__init__(_UNDECIDED)
        self.key = key
        self.token_kind = token_kind
        self.splice = splice
        self.max_event = max_event
        #: ``chat``, ``responses`` or ``other``, once the first ``data:`` event is seen.
        self.kind: str | None = None
        #: The last token count a ``usage`` object in the stream gave, and that object.
        self.tokens: int | None = None
        self.usage: Any = None
        #: ``[DONE]`` followed the held event: call :meth:`resume` with the block.
        self.waiting = False
        #: The energy went out inside an event.
        self.spliced = False
        self._held: bytes | None = None  # the complete event that may carry the energy
        self._held_obj: dict[str, Any] | None = None
        self._behind: list[bytes] = []  # what came after the held event, still withheld
        self._open: list[bytes] | None = None  # an unfinished event, withheld from its start
        self._open_size = 0
        self._after = b""  # from [DONE] on, while waiting
        #: A chat answer has finished: every chunk to the end is looked at (a few).
        self._ending = False
        #: What the lane looks for in a chat stream: a finish (or, not splicing, a usage
        #: object), written with the colon its first chunk uses.
        self._chat_needle = b'_reason":"' if splice else b'"usage":{'

    # -- the stream ----------------------------------------------------------------------
    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send now for ``chunk`` (the app's next piece of the stream)."""
        tail = self.tail[-4:]
        if self.waiting:
            self.tail = (tail + chunk)[-4:]
            self._after += chunk
            return b""
        self.tail = (tail + chunk)[-4:]
        out: list[bytes] = []
        pos = 0
        begins = at_boundary(tail)
        if self.kind == CHAT and not self._ending and _FINISH(chunk) is not None:
            self._ending = True
        for end in event_ends(tail, chunk):
            piece = chunk[pos:end]
            if self._open is not None:
                raw = b"".join(self._open) + piece
                self._open, self._open_size = None, 0
                self._complete(raw, out)
            elif not begins:  # the start of this event went out already: it passes
                self._pass(piece, out)
            else:
                self._complete(piece, out)
            pos, begins = end, True
            if self.waiting:  # [DONE] after the held event: the rest waits for the block
                self._after += chunk[pos:]
                return b"".join(out)
        rest = chunk[pos:]
        if rest:
            self._partial(rest, begins, out)
        self._choose_needle()
        return b"".join(out)

    def _partial(self, rest: bytes, begins: bool, out: list[bytes]) -> None:
        """The unfinished event at the end of a chunk: withheld only when it may carry the
        energy or be the ``[DONE]`` that the held event waits for."""
        if self._open is not None:
            self._open.append(rest)
            self._open_size += len(rest)
            if self._open_size > self.max_event:  # not an event we can follow: let it go
                opened, self._open, self._open_size = self._open, None, 0
                self._pass(b"".join(opened), out)
            return
        # An unfinished event cannot be dispatched yet: holding it to its end delays no
        # event. Held until the energy went out (any of them may turn out to carry it), and
        # the first, which says what the stream is.
        if self._held is not None and not (_might_be_done(rest) or b'"usage"' in rest):
            self._release(out)  # the held event waits only for [DONE] or the usage chunk
        if begins and (self.kind is None or (
            self.splice and self.kind != OTHER and not self.spliced
        )):
            self._open, self._open_size = [rest], len(rest)
            return
        self._pass(rest, out)

    def _candidate(self, data: bytes) -> bool:
        # Which events are parsed: one that may carry the energy or a token count.
        if self.kind == RESPONSES:
            return _COMPLETED in data
        return _FINISH_OR_USAGE(data) is not None

    def _complete(self, raw: bytes, out: list[bytes]) -> None:
        """One complete event none of whose bytes went out yet."""
        data = sse_data(raw)
        if not data:  # a comment or a blank line: it goes where it stands
            if self._held is not None:
                self._behind.append(raw)
            else:
                out.append(raw)
            return
        if self.kind is None:
            self.kind = _kind_of(data)
            if self.kind == CHAT:
                self._chat_needle = _chat_needle(data, self.splice)
        if data.strip() == b"[DONE]":
            if self._held is not None:
                self.waiting = True
                self._after = raw
                return
            self.needle = None  # the answer is over: the rest passes
            self._ending = False
            self._pass(raw, out)
            return
        obj = None
        if self.kind in (CHAT, RESPONSES) and self._candidate(data):
            obj = parse_object(data)
            usage = find_usage(obj)
            count = usage_tokens(usage, self.token_kind)
            if count is not None:
                self.tokens, self.usage = count, usage
        if obj is not None and self.splice and not self.spliced and self._carries(obj):
            self._release(out)
            self._held, self._held_obj = raw, obj
            return
        self._pass(raw, out)

    def _carries(self, obj: dict[str, Any]) -> bool:
        if self.kind == RESPONSES:
            return obj.get("type") == "response.completed" or is_mapping(obj.get("response"))
        return _finishes(obj) or is_usage_chunk(obj)

    def _pass(self, data: bytes, out: list[bytes]) -> None:
        """Bytes that go out unchanged, after whatever was held before them."""
        self._release(out)
        out.append(data)

    def _release(self, out: list[bytes]) -> None:
        if self._held is not None:
            out.append(self._held)
            out.extend(self._behind)
            self._held, self._held_obj, self._behind = None, None, []

    def _choose_needle(self) -> None:
        if self._held is not None or self._open is not None or self._ending:
            self.needle = ALWAYS  # every next chunk decides what is withheld
        elif self.needle is None:
            return
        elif self.kind == CHAT:
            self.needle = self._chat_needle
        elif self.kind == RESPONSES:
            self.needle = _COMPLETED
        elif self.kind == OTHER:
            self.needle = None
        else:
            self.needle = _UNDECIDED

    def _spliced_held(self, block: bytes | None, usage: bytes | None = None) -> bytes:
        held, obj = self._held, self._held_obj
        out: list[bytes] = []
        if held is not None and block is not None:
            spliced = splice_event(held, self.key, block, obj, usage)
            if spliced is not None:
                self.spliced = True
                out.append(spliced)
                out.extend(self._behind)
                self._held, self._held_obj, self._behind = None, None, []
        self._release(out)
        return b"".join(out)

    def resume(self, block: bytes | None, usage: bytes | None = None, *, before: bytes = b"") -> bytes:
        """After :attr:`waiting`: the held event with ``block`` in it (and ``usage``'s
        fields in its ``usage``), ``before`` (bytes of whole events: an SSE comment), and
        what followed (``[DONE]`` on)."""
        self.waiting = False
        out = self._spliced_held(block, usage) + before
        after, self._after = self._after, b""
        self.needle = None  # [DONE] went by: the rest passes
        self._ending = False
        return out + after

    # -- the end -------------------------------------------------------------------------
    @property
    def holding(self) -> bool:
        """Whether any of the app's bytes are withheld."""
        return self._held is not None or self._open is not None or self.waiting

    def close(
        self, block: bytes | None, *, event: bool = False, usage: bytes | None = None,
        before: bytes = b"",
    ) -> bytes:
        """The end of the stream: what is held (a held event with ``block`` in it), then
        ``before`` (ahead of a held ``[DONE]``, else at the end where it ends between
        events), then, when ``event`` and the stream ends between events, a closing
        ``event: energy``."""
        out = self._spliced_held(block, usage)
        if self.waiting:
            self.waiting = False
            out += before + self._after
            self._after = before = b""
        if self._open is not None:
            out += b"".join(self._open)
            self._open, self._open_size = None, 0
        if before and at_boundary(self.tail[-4:]):
            out += before
        if event and block is not None and at_boundary(self.tail[-4:]):
            out += energy_event(block)
        return out

    def flush(self) -> bytes:
        """Everything withheld, unchanged: the app stopped (raised, or returned mid-stream)."""
        out: list[bytes] = []
        self._release(out)
        if self._open is not None:
            out.extend(self._open)
            self._open, self._open_size = None, 0
        out.append(self._after)
        self._after, self.waiting = b"", False
        return b"".join(out)


def _chat_needle(data: bytes, splice: bool) -> bytes:
    """What the lane looks for in a chat stream whose first event's data is ``data``: a
    ``finish_reason`` with a string value when splicing, else a ``usage`` object, with the
    colon as this stream writes it (the regexes' ``\\s*`` once, here, rather than per chunk:
    measured in benchmarks/instructions.py, see the commit)."""
    found = _FINISH_COLON(data) or _KEY_COLON(data)
    colon = found.group(1) if found is not None else b":"
    return b'_reason"' + colon + b'"' if splice else b'"usage"' + colon + b"{"


def _kind_of(data: bytes) -> str:
    """What a stream is, from its first event's data."""
    obj = parse_object(data)
    if obj is None:
        return OTHER
    if type(obj.get("choices")) is list or obj.get("object") in (
        "chat.completion.chunk", "text_completion",
    ):
        return CHAT
    kind = obj.get("type")
    if isinstance(kind, str) and kind.startswith("response."):
        return RESPONSES
    return OTHER


__all__ = [
    "ALWAYS",
    "CHAT",
    "EVENT_ENDS",
    "OTHER",
    "RESPONSES",
    "Lane",
    "SSESplicer",
    "at_boundary",
    "energy_event",
    "event_ends",
    "is_usage_chunk",
    "splice_event",
    "sse_data",
]
