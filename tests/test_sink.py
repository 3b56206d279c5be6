"""Record sinks: off the request path, bounded, and nothing queued lost at shutdown."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.exporters.sink import CallbackSink, JsonLinesSink, RecordSink
from giul_asgi.listeners import Settled


def test_a_json_lines_sink_writes_every_record_by_close(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    sink = JsonLinesSink(path, max_queue=100_000)
    assert isinstance(sink, RecordSink)
    for i in range(5000):
        sink.settled([Settled(Energy(float(i + 1), "measured", id=str(i), route="/r"), "ok", 200)])
    sink.close()
    sink.close()  # idempotent
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 5000 and sink.written == 5000 and sink.dropped == 0
    assert lines[0]["joules"] == 1.0 and lines[0]["outcome"] == "ok" and lines[0]["status"] == 200
    assert {line["id"] for line in lines} == {str(i) for i in range(5000)}


@pytest.mark.anyio
async def test_aclose_flushes_too(tmp_path: Path) -> None:
    sink = JsonLinesSink(tmp_path / "r.jsonl")
    for i in range(300):
        sink.settled([Settled(Energy(None, "unknown", id=str(i)), "disconnect", None)])
    await sink.aclose()
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 300 and json.loads(lines[0])["joules"] is None


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    release = threading.Event()
    seen: list[str] = []

    def slow(energy: Energy, outcome: str, status: int | None) -> None:
        release.wait(5)
        seen.append(energy.id or "")

    sink = CallbackSink(slow, max_queue=10)
    for i in range(100):  # the writer holds at most one batch; the queue holds 10
        sink.settled([Settled(Energy(1.0, "measured", id=str(i)), "ok", 200)])
    assert sink.dropped > 0
    release.set()
    sink.close()
    assert len(seen) + sink.dropped == 100
    sink.settled([Settled(Energy(1.0, "measured"), "ok", 200)])  # after close: counted, not raised
    assert len(seen) + sink.dropped == 101


def test_a_failing_callback_is_counted_not_raised() -> None:
    def bad(energy: Energy, outcome: str, status: int | None) -> None:
        raise ValueError("disk full")

    sink = CallbackSink(bad)
    sink.settled([Settled(Energy(1.0, "measured"), "ok", 200)])
    sink.close()
    assert sink.errors == 1 and sink.written == 0 and "disk full" in (sink.last_error or "")


def test_bad_sinks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot open"):
        JsonLinesSink(tmp_path / "missing" / "r.jsonl")
    with pytest.raises(ConfigError):
        CallbackSink(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CallbackSink(print, max_queue=0)
