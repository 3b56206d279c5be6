"""Formatting and parsing: numbers, headers, the JSON block, usage, and the SSE splicer on
its own (bytes in, bytes out), fed well-formed and hostile streams."""

from __future__ import annotations

import json
import re
from types import MappingProxyType
from typing import Any

import pytest
from apps import CountingPattern
from hypothesis import given, settings
from hypothesis import strategies as st

from giul_asgi.energy import Energy
from giul_asgi.wire import (
    SSESplicer,
    energy_event,
    energy_headers,
    energy_json,
    header_number,
    header_value,
    inject_json,
    is_usage_chunk,
    number,
    parse_object,
    splice_event,
    sse_data,
    usage_tokens,
)
from giul_asgi.wire import body as wire_body
from giul_asgi.wire import sse as wire_sse

BLOCK = b'{"joules":1.5}'


def chunk(content: str | None, finish: str | None = None, *, compact: bool = True,
          usage_null: bool = False) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage_null:
        obj["usage"] = None
    separators = (",", ":") if compact else (", ", ": ")
    return b"data: " + json.dumps(obj, separators=separators).encode() + b"\n\n"


USAGE = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


def run(splicer: SSESplicer, pieces: list[bytes], block: bytes | None = BLOCK,
        event: bool = True) -> bytes:
    """Drive a splicer as the SSE responder does: a chunk its search finds nothing in goes
    as it is; others are fed; resume when waiting; close at the end."""
    out = b""
    for piece in pieces:
        if splicer.passes(piece):
            splicer.passed(piece)
            out += piece
            continue
        out += splicer.feed(piece)
        if splicer.waiting:
            out += splicer.resume(block)
    return out + splicer.close(block, event=event)


def events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


# -- numbers and headers --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "unknown"), (float("nan"), "unknown"), (float("inf"), "unknown"),
        (5.2537571, "5.25376"), (1234567.89, "1234568"), (4e-10, "0.0000000004"),
        (0.000123456, "0.000123456"), (12, "12"), (0.0, "0"), (-2.5, "-2.5"),
        (-0.0, "0"), (1e-5, "0.00001"),
    ],
)
def test_number_is_positional_and_never_a_false_zero(value: float | None, text: str) -> None:
    assert number(value) == text


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_header_number_is_a_plain_decimal_close_to_the_value(value: float) -> None:
    text = header_number(value)
    if value != value or value in (float("inf"), float("-inf")):
        assert text == b"unknown"
        return
    assert re.fullmatch(rb"-?\d+(\.\d+)?", text), text
    if value != 0:
        assert float(text) != 0  # never a rounded-away zero
        assert float(text) == pytest.approx(value, rel=1e-5)


def test_header_values_lose_control_bytes() -> None:
    assert header_value("a\r\nb\x00c\x7fd") == b"a__b_c_d"
    assert header_value(None) == b"unknown" and header_value("  ") == b"unknown"
    assert header_value("h100-a") == b"h100-a"


def test_headers_say_unknown_never_zero_and_carry_the_id() -> None:
    e = Energy(joules=None, method="unknown", node="n\r\n", id="42-a\n")
    headers = dict(energy_headers(e))
    assert headers[b"x-energy-joules"] == b"unknown" and headers[b"x-energy-tokens"] == b"unknown"
    assert headers[b"x-energy-node"] == b"n__"
    assert headers[b"x-energy-id"] == b"42-a_"  # not a header injection
    assert b"x-energy-id" not in dict(energy_headers(Energy(joules=1.0, method="measured")))


floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
texts = st.one_of(st.none(), st.text(max_size=12))


@settings(max_examples=200)
@given(
    joules=floats, seconds=st.floats(0, 1e9), mean=floats, cc=floats, unc=floats,
    per_token=floats, idle=floats, foreign=floats, node=texts, tier=texts, route=texts,
    error=texts, energy_id=texts,
    split=st.one_of(st.none(), st.sampled_from(["exclusive", "time", "tokens", "%s%%"])),
    tokens=st.one_of(st.none(), st.integers(0, 10**12)),
    settled=st.booleans(), contended=st.one_of(st.none(), st.booleans()),
    kind=st.sampled_from(["output", "input", "total"]), staged=st.booleans(),
)
def test_the_fast_block_is_as_dict(
    joules: float | None, seconds: float, mean: float | None, cc: float | None,
    unc: float | None, per_token: float | None, idle: float | None, foreign: float | None,
    node: str | None, tier: str | None, route: str | None, error: str | None,
    energy_id: str | None, split: str | None, tokens: int | None, settled: bool,
    contended: bool | None, kind: str, staged: bool,
) -> None:
    stage = Energy(joules=joules, method="measured", node=node, seconds=seconds)
    e = Energy(
        joules=joules, method="measured", backend="nvml_counter", source="local", node=node,
        tier=tier, route=route, seconds=seconds, idle_watts=idle, idle_known=idle is not None,
        mean_watts=mean, tokens=tokens, token_kind=kind, joules_per_token=per_token,
        concurrency=cc, split=split, uncertainty_joules=unc, settled=settled,
        stages={"retrieve": stage, 'q"\n': stage} if staged else {}, contended=contended,
        foreign_watts=foreign, error=error, id=energy_id,
    )
    for _ in range(2):  # the first call builds the template, the second reuses it
        assert json.loads(energy_json(e)) == e.as_dict()


def test_energy_event_is_one_event() -> None:
    assert energy_event(BLOCK) == b"event: energy\ndata: " + BLOCK + b"\n\n"


# -- bodies ---------------------------------------------------------------------------------
def test_usage_tokens_kinds_and_junk() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert usage_tokens(usage, "output") == 5 and usage_tokens(usage, "input") == 3
    assert usage_tokens(usage, "total") == 8
    assert usage_tokens({"input_tokens": 2, "output_tokens": 4}, "total") == 6
    assert usage_tokens({"completion_tokens": True}, "output") is None  # a bool is no count
    assert usage_tokens({"completion_tokens": -1}, "output") is None
    assert usage_tokens("lots", "output") is None


@pytest.mark.parametrize("fast", [True, False], ids=["orjson-if-installed", "stdlib"])
def test_parse_object_both_parsers(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(wire_body, "_fast_loads", None)
    assert parse_object(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert parse_object(b"[1]") is None
    assert parse_object(b'{"a":') is None
    assert parse_object(b'{"x": "\xff"}') is None
    # Only validity and usage are read from the parse; the body's bytes are never rewritten,
    # so a parser that reads a huge integer as a float loses nothing.
    big = parse_object(b'{"big": 123456789012345678901234567890}')
    assert big is not None and big["big"] == pytest.approx(1.2345678901234568e29)


@pytest.mark.parametrize("fast", [True, False], ids=["orjson-if-installed", "stdlib"])
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"])
def test_parse_object_reads_utf8_only(
    encoding: str, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json.loads accepts UTF-16/32 bytes; an ASCII block spliced into them corrupts them."""
    if not fast:
        monkeypatch.setattr(wire_body, "_fast_loads", None)
    assert parse_object('{"a": 1}'.encode(encoding)) is None


@pytest.mark.parametrize("fast", [True, False], ids=["orjson-if-installed", "stdlib"])
def test_parse_object_survives_deep_nesting(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fast:
        monkeypatch.setattr(wire_body, "_fast_loads", None)
    deep = b'{"usage": {"completion_tokens": 1}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert parse_object(deep) is None  # RecursionError is the app's data, not our crash


def test_inject_json_keeps_the_apps_bytes_and_key() -> None:
    assert inject_json(b'{"a":1}', "energy", b'{"j":2}') == b'{"a":1,"energy":{"j":2}}'
    assert inject_json(b"{ }\n", "energy", b"{}") == b'{"energy":{} }\n'
    assert inject_json(b'{"energy": 1}', "energy", b"{}") is None


def test_splice_event_single_line_only() -> None:
    raw = b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
    out = splice_event(raw, "energy", BLOCK)
    assert out is not None and out.endswith(b"\n\n")
    assert json.loads(sse_data(out))["energy"] == {"joules": 1.5}
    two_lines = b'data: {"usage": {"completion_tokens": 2},\r\ndata: "choices": []}\r\n\r\n'
    assert splice_event(two_lines, "energy", BLOCK) is None


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


# -- the splicer: well-formed streams -------------------------------------------------------
def test_ordinary_chunks_pass_as_the_same_object() -> None:
    splicer = SSESplicer()
    for piece in (chunk("a"), chunk("b", usage_null=True), chunk("c", compact=False)):
        assert splicer.feed(piece) is piece
    assert not splicer.holding


@pytest.mark.parametrize("compact", [True, False])
def test_plain_stream_energy_rides_on_the_finish_chunk(compact: bool) -> None:
    finish = chunk(None, "stop", compact=compact)
    splicer = SSESplicer()
    assert splicer.feed(chunk("a", compact=compact)) == chunk("a", compact=compact)
    assert splicer.feed(finish) == b""  # held until the next event
    assert splicer.feed(DONE) == b"" and splicer.waiting
    out = splicer.resume(BLOCK)
    first, done = events(out)
    obj = json.loads(sse_data(first))
    assert obj["energy"] == {"joules": 1.5}
    assert {k: v for k, v in obj.items() if k != "energy"} == json.loads(sse_data(finish))
    assert done == DONE and splicer.spliced
    # For EventSource clients, after, where the operator asks for it.
    assert splicer.close(BLOCK, event=True) == energy_event(BLOCK)


@pytest.mark.parametrize("compact", [True, False])
def test_the_lane_finds_the_finish_as_the_stream_writes_its_colon(compact: bool) -> None:
    # The lane's one bytes search is learnt from the first chat chunk: a server that writes
    # '"finish_reason": "stop"' still has its finish chunk held and the energy spliced in.
    splicer = SSESplicer()
    first, later = chunk("a", compact=compact), chunk("b", compact=compact)
    assert splicer.feed(first) == first
    assert splicer.needle == (b'_reason":"' if compact else b'_reason": "')
    assert splicer.passes(later)  # a common chunk takes the lane
    finish = chunk(None, "stop", compact=compact)
    assert not splicer.passes(finish)
    out = run(splicer, [later, finish, DONE])
    passed, spliced, done = events(out)[:3]
    assert passed == later and json.loads(sse_data(spliced))["energy"] == {"joules": 1.5}
    assert done == DONE


def test_include_usage_energy_rides_on_the_usage_chunk() -> None:
    finish = chunk(None, "stop", usage_null=True)
    out = run(SSESplicer(), [chunk("a", usage_null=True), finish, USAGE, DONE])
    parsed = events(out)
    assert parsed[0] == chunk("a", usage_null=True) and parsed[1] == finish  # released as sent
    usage = json.loads(sse_data(parsed[2]))
    assert usage["energy"] == {"joules": 1.5} and usage["usage"]["completion_tokens"] == 3
    assert parsed[3] == DONE and parsed[4] == energy_event(BLOCK)


def test_usage_chunks_with_null_usage_are_never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    real = wire_body.parse_object
    monkeypatch.setattr(wire_sse, "parse_object", lambda raw: parsed.append(raw) or real(raw))
    splicer = SSESplicer()
    finish = chunk(None, "stop", usage_null=True)
    run(splicer, [chunk("w", usage_null=True)] * 5 + [finish, USAGE, DONE])
    # The first event says what the stream is; then only the finish and usage chunks.
    assert splicer.tokens == 3 and len(parsed) == 3


def test_a_held_event_not_followed_by_done_goes_unchanged() -> None:
    finish = chunk(None, "stop")
    later = chunk("late")
    splicer = SSESplicer()
    assert splicer.feed(finish) == b""
    assert splicer.feed(later) == finish + later
    # And the next event's first bytes are enough to know it is not [DONE].
    splicer = SSESplicer()
    splicer.feed(finish)
    assert splicer.feed(later[:10]) == finish


def test_comments_between_the_finish_and_done_keep_it_held() -> None:
    out = run(SSESplicer(), [chunk(None, "stop"), b": keep-alive\n\n", DONE])
    first, comment, done = events(out)[:3]
    assert "energy" in json.loads(sse_data(first))
    assert comment == b": keep-alive\n\n" and done == DONE


def test_crlf_events_as_sse_starlette_writes_them() -> None:
    finish = chunk(None, "stop").replace(b"\n\n", b"\r\n\r\n")
    out = run(SSESplicer(), [finish, b"data: [DONE]\r\n\r\n"])
    first = out.split(b"\r\n\r\n")[0]
    assert json.loads(sse_data(first))["energy"] == {"joules": 1.5}


def test_responses_api_completed_event_gets_the_energy_at_the_end() -> None:
    completed = (
        b'event: response.completed\ndata: {"type":"response.completed","response":'
        b'{"id":"r","usage":{"input_tokens":4,"output_tokens":9}}}\n\n'
    )
    splicer = SSESplicer()
    out = run(splicer, [b'event: response.created\ndata: {"type":"response.created"}\n\n',
                        completed])
    assert splicer.tokens == 9
    last = next(e for e in events(out) if b"response.completed" in e)
    assert json.loads(sse_data(last))["energy"] == {"joules": 1.5}


def test_the_apps_own_energy_key_and_multiline_events_are_left_alone() -> None:
    own = b'data: {"choices":[{"finish_reason":"stop"}],"energy":"mine"}\n\n'
    two = b'data: {"choices":[{"finish_reason":"stop"}],\ndata: "x": 1}\n\n'
    for held in (own, two):
        splicer = SSESplicer()
        assert run(splicer, [held, DONE]) == held + DONE + energy_event(BLOCK)
        assert not splicer.spliced


def test_switched_off_nothing_is_held_or_added() -> None:
    pieces = [chunk("a"), chunk(None, "stop"), USAGE, DONE]
    splicer = SSESplicer(splice=False)
    assert run(splicer, pieces, event=False) == b"".join(pieces)
    assert splicer.tokens == 3


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=40), st.booleans(), st.booleans())
def test_any_split_of_the_stream_gives_the_same_bytes(
    cuts: list[int], usage: bool, crlf: bool
) -> None:
    """However the upstream's bytes are cut (a proxy re-chunks them), the output is that of
    the stream fed whole: same splice, same events, nothing lost or reordered."""
    pieces = [chunk("a"), chunk("b"), chunk(None, "stop")] + ([USAGE] if usage else []) + [DONE]
    whole = b"".join(pieces)
    if crlf:
        whole = whole.replace(b"\n\n", b"\r\n\r\n")
    expected = run(SSESplicer(), [whole])
    cut_pieces, pos = [], 0
    for size in cuts:
        cut_pieces.append(whole[pos:pos + size])
        pos += size
    cut_pieces.append(whole[pos:])
    assert run(SSESplicer(), cut_pieces) == expected
    assert b'"energy":{"joules":1.5}' in expected


# -- the splicer: hostile streams -----------------------------------------------------------
def test_an_event_that_never_ends_is_scanned_once_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8000 lines of 100 bytes and no blank line: the old scanner rejoined and rescanned its
    partial buffer on every chunk (24 s of CPU, and every other request waited)."""
    counting = CountingPattern(wire_sse._TERMINATOR)
    monkeypatch.setattr(wire_sse, "_TERMINATOR", counting)
    lines = [b"data: " + b"x" * 93 + b"\r\n" for _ in range(8000)]
    splicer = SSESplicer()
    out = b""
    for line in lines:
        out += splicer.feed(line)
        assert splicer._open_size <= splicer.max_event  # the buffer stays bounded
    out += splicer.close(BLOCK)
    stream = b"".join(lines)
    assert out == stream  # byte for byte, and no event glued onto the unfinished one
    assert counting.scanned <= 2 * len(stream)  # linear: each byte searched about once


def test_a_last_event_without_its_blank_line_gets_nothing_glued_on() -> None:
    pieces = [chunk("a"), b"data: last"]
    out = run(SSESplicer(), pieces)
    assert out == b"".join(pieces)  # not b"data: lastevent: energy..."


def test_a_deeply_nested_usage_event_passes_byte_for_byte() -> None:
    deep = (b'data: {"choices":[],"usage":{"completion_tokens":1,"x":'
            + b"[" * 50_000 + b"]" * 50_000 + b"}}\n\n")
    splicer = SSESplicer()
    out = run(splicer, [chunk("a"), deep, DONE])
    assert out == chunk("a") + deep + DONE + energy_event(BLOCK)


def test_flush_gives_back_everything_held_unchanged() -> None:
    splicer = SSESplicer()
    assert splicer.feed(chunk("a")) == chunk("a")
    assert splicer.feed(USAGE) == b"" and splicer.holding
    assert splicer.feed(b"data: [DO") == b""
    assert splicer.flush() == USAGE + b"data: [DO"
    assert not splicer.holding


def test_held_event_and_done_in_one_chunk_and_what_follows() -> None:
    after = b"data: {}\n\n"
    splicer = SSESplicer()
    out = splicer.feed(chunk("a") + USAGE + DONE + after)
    assert out == chunk("a") and splicer.waiting
    rest = splicer.resume(BLOCK)
    parsed = events(rest)
    assert "energy" in json.loads(sse_data(parsed[0]))
    assert parsed[1:] == [DONE, after]
