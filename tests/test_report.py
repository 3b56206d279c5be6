"""Formatting and parsing helpers: numbers, header safety, usage, JSON and SSE splicing."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from giul_asgi import report
from giul_asgi.report import (
    SSEScanner,
    header_value,
    inject_json,
    is_usage_chunk,
    number,
    parse_object,
    splice_event,
    sse_data,
    usage_tokens,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "unknown"), (float("nan"), "unknown"), (float("inf"), "unknown"),
        (5.2537571, "5.25376"), (1234567.89, "1234568"), (4e-10, "0.0000000004"),
        (0.000123456, "0.000123456"), (12, "12"), (0.0, "0"), (-2.5, "-2.5"),
    ],
)
def test_number_is_positional_and_never_a_false_zero(value: float | None, text: str) -> None:
    assert number(value) == text


def test_header_numbers_fast_path_agrees_with_number() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.floats(allow_nan=True, allow_infinity=True))
    def check(value: float) -> None:
        assert report._hnum(value) == number(value).encode()

    check()
    check_small = given(st.floats(min_value=1e-13, max_value=2e-4))(check.hypothesis.inner_test)
    check_small()
    for edge in (
        0.0001, 0.00009999999, 0.000099999996, 1e-12, 9.9999999e-13, 1e-5, 0.0000099999996,
        999998.9, 999999.0, 999999.4, 999999.6, -0.0001, -0.0,
    ):
        assert report._hnum(edge) == number(edge).encode()


def test_header_values_lose_control_bytes() -> None:
    assert header_value("a\r\nb\x00c\x7fd") == b"a__b_c_d"
    assert header_value(None) == b"unknown" and header_value("  ") == b"unknown"
    assert header_value("h100-a") == b"h100-a"


def test_usage_tokens_kinds_and_junk() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert usage_tokens(usage, "output") == 5 and usage_tokens(usage, "input") == 3
    assert usage_tokens(usage, "total") == 8
    assert usage_tokens({"completion_tokens": True}, "output") is None  # a bool is no count
    assert usage_tokens({"completion_tokens": -1}, "output") is None
    assert usage_tokens("lots", "output") is None


@pytest.mark.parametrize("fast", [True, False], ids=["orjson-if-installed", "stdlib"])
def test_parse_object_both_parsers(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(report, "_fast_loads", None)
    assert parse_object(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert parse_object(b"[1]") is None
    assert parse_object(b'{"a":') is None
    assert parse_object(b'{"x": "\xff"}') is None
    # Only validity and usage are read from the parse; the body's bytes are never rewritten,
    # so a parser that reads a huge integer as a float loses nothing.
    big = parse_object(b'{"big": 123456789012345678901234567890}')
    assert big is not None and big["big"] == pytest.approx(1.2345678901234568e29)


def test_inject_json_keeps_the_apps_bytes_and_key() -> None:
    assert inject_json(b'{"a":1}', "energy", b'{"j":2}') == b'{"a":1,"energy":{"j":2}}'
    assert inject_json(b"{ }\n", "energy", b"{}") == b'{"energy":{}}\n'
    assert inject_json(b'{"energy": 1}', "energy", b"{}") is None


def test_sse_scanner_across_chunks_and_done() -> None:
    scanner = SSEScanner("output")
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 7}}\n\n'
    stream = b"data: {}\n\n" + usage + b"data: [DONE]\n\n"
    seen = []
    for i in range(0, len(stream), 5):
        seen += scanner.feed(stream[i:i + 5])
    assert scanner.tokens == 7 and scanner.done and scanner.at_boundary
    assert [raw for raw, _ in seen] == [b"data: {}\n\n", usage, b"data: [DONE]\n\n"]
    assert is_usage_chunk(seen[1][1])


@pytest.mark.parametrize(
    ("chunk", "quiet"),
    [
        # include_usage: every chunk carries "usage": null, in any JSON spacing.
        (b'data: {"choices": [{"delta": {"content": "hi"}}], "usage": null}\n\n', True),
        (b'data: {"choices":[{"delta":{"content":"hi"}}],"usage" :null}\n\n', True),
        # The word in the answer's text: its quotes are escaped, so it is not a key.
        (b'data: {"choices": [{"delta": {"content": "\\"usage\\": {}"}}]}\n\n', True),
        # A usage object, however it is spaced, is something to act on.
        (b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n', False),
        (b'data: {"choices":[],"usage" :\t{"completion_tokens":3}}\n\n', False),
        (b'data: {"choices": [], "usage":\ndata: {"completion_tokens": 3}}\n\n', False),
        (b'data: {"choices": [], "usage"\ndata: : {"completion_tokens": 3}}\n\n', False),
        (b"data: [DONE]\n\n", False),
        (b'data: {"choices": []', False),  # an unfinished event
    ],
)
def test_sse_scanner_lets_chunks_without_a_usage_object_through(chunk: bytes, quiet: bool) -> None:
    assert SSEScanner("output").quiet(chunk) is quiet


@pytest.mark.parametrize("split", [False, True])
def test_sse_scanner_parses_only_the_chunk_with_usage(
    split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    real = report.sse_data
    monkeypatch.setattr(report, "sse_data", lambda raw: parsed.append(raw) or real(raw))
    scanner = SSEScanner("output")
    nulls = b'data: {"choices": [{"delta": {"content": "w"}}], "usage": null}\n\n' * 3
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
    stream = nulls + usage
    step = 7 if split else len(stream)  # split: every event arrives in pieces
    for i in range(0, len(stream), step):
        scanner.feed(stream[i:i + step])
    assert scanner.tokens == 3
    assert parsed == [usage]


def test_sse_scanner_gives_up_on_an_endless_event_but_keeps_going() -> None:
    scanner = SSEScanner("output")
    scanner.feed(b"data: " + b"x" * (SSEScanner.MAX_PARTIAL + 10))
    assert scanner.broken and scanner.feed(b"\n\n") == []


def test_crlf_events_and_multiline_data() -> None:
    scanner = SSEScanner("output")
    events = scanner.feed(b'data: {"usage": {"completion_tokens": 2},\r\ndata: "choices": []}\r\n\r\n')
    assert scanner.tokens == 2 and len(events) == 1
    assert sse_data(events[0][0]) == b'{"usage": {"completion_tokens": 2},\n"choices": []}'
    assert splice_event(events[0][0], "energy", b"{}") is None  # two data lines: left alone


def test_splice_event_single_line() -> None:
    raw = b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
    out = splice_event(raw, "energy", b'{"joules":1.5}')
    assert out is not None and out.endswith(b"\n\n")
    assert json.loads(sse_data(out))["energy"] == {"joules": 1.5}


@pytest.mark.parametrize(
    "raw",
    [
        b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n',
        b'data:{"choices":[],"usage":{"completion_tokens":2}}\r\n\r\n',
        b'event: chunk\nid: 7\ndata:  {"usage": {"completion_tokens": 2}} \n\n',
        b'data: {"usage": {"completion_tokens": 2}, "energy": "the app\'s own"}\n\n',
        b'data: {"usage": {"completion_tokens": 2},\ndata: "choices": []}\n\n',  # two lines
    ],
)
def test_splice_event_with_the_scanners_object_is_the_same_splice(raw: bytes) -> None:
    """The middleware hands over the object the scanner already parsed; the bytes out are
    those of parsing the event again, down to the app's own key left alone."""
    scanner = SSEScanner("output")
    events = scanner.feed(raw)
    assert len(events) == 1 and scanner.tokens == 2
    obj = events[0][1]
    block = b'{"joules":1.5}'
    assert splice_event(raw, "energy", block, obj) == splice_event(raw, "energy", block)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"choices": [], "usage": {"completion_tokens": 1}}, True),
        ({"usage": {"completion_tokens": 1}}, True),  # no choices at all
        (MappingProxyType({"choices": [], "usage": MappingProxyType({})}), True),
        ({"choices": [], "usage": None}, False),
        ({"choices": [{"index": 0}], "usage": {"completion_tokens": 1}}, False),
        ([{"usage": {}}], False),
        (None, False),
    ],
)
def test_is_usage_chunk(obj: object, expected: bool) -> None:
    assert is_usage_chunk(obj) is expected
