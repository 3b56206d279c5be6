"""A node's trace, and replay through the same tape and book (issue 17 item 4).

The live ledger runs on a card that knows the truth (benchmarks/truecard.py, written
without looking at the ledger), on a virtual clock; its settled figures are kept by request
id; the trace it wrote is replayed and every id must agree within 1e-9 (relative). Bad
traces are fed as they happen: a last line cut while being written, garbage lines, an empty
file, a missing one, rotated files.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from apps import RecordingStats, drive, settled_records
from truecard import TrueCard, TrueReader

from giul_asgi import EnergyMiddleware, Ledgers
from giul_asgi.cli import main
from giul_asgi.config import Node, Tier
from giul_asgi.errors import ConfigError
from giul_asgi.hostshare.rows import process_start
from giul_asgi.ledger import Ledger, TokenSplit
from giul_asgi.ledger.trace import rotated, trace_stem
from giul_asgi.meter import Meter
from giul_asgi.readers.simulated import SimulatedCard, SimulatedReader
from giul_asgi.replay import AGREES, load, render, replay

IDLE = 70.0
ROUTES = ("/v1/chat/completions", "/v1/embeddings")
TIERS = (Tier("small"), Tier("large"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Traffic:
    """A ledger on a true card with overlapping requests (random watts, lengths, tokens,
    routes, tiers, a few stages and abandons), read every ~10 ms of virtual time."""

    def __init__(self, directory: Path, *, seed: int = 0, gauge: str = "counter",
                 split: str = "time", trace_mb: float = 16.0, tenant: str | None = None) -> None:
        self.clock = Clock()
        self.card = TrueCard(idle_w=IDLE, clock=self.clock, seed=seed)
        self.reader = TrueReader(self.card, gauge)  # type: ignore[arg-type]
        node = Node("card-0", idle_w=IDLE, split=split, trace=str(directory), trace_mb=trace_mb)
        self.ledger = Ledger(node, self.reader, poll=False)
        self.rng = random.Random(seed)
        self.meters: list[Meter] = []
        self.tenant = tenant

    def run(self, seconds: float) -> None:
        rng, card = self.rng, self.card
        running: list[tuple[Meter, Any]] = []
        end = self.clock.now + seconds
        while self.clock.now < end:
            if rng.random() < 0.15:
                meter = Meter(self.ledger, rng.choice(TIERS), route=rng.choice(ROUTES))
                if self.tenant is not None:
                    meter.bind(tenant=self.tenant)
                meter.open()
                running.append((meter, card.start_job(rng.uniform(40.0, 260.0))))
                self.meters.append(meter)
            for meter, job in list(running):
                if rng.random() < 0.05:
                    meter.mark("prefill")
                if rng.random() < 0.12:
                    card.stop_job(job)
                    meter.tokens(rng.choice([None, rng.randint(1, 600)]))
                    meter.close()
                    running.remove((meter, job))
            self.clock.now += 0.01 * rng.uniform(0.5, 1.5)
            self.ledger.ingest(self.reader.read())
        for meter, job in running:
            card.stop_job(job)
            meter.close()
        for _ in range(60):  # the counter steps past every window and its ramp-down
            self.clock.now += 0.01
            self.ledger.ingest(self.reader.read())

    def stop(self) -> dict[str, float | None]:
        """Stop the ledger (the trace's last write) and return the live settled joules by id."""
        self.ledger.stop()
        figures = {}
        for meter in self.meters:
            energy = meter.figure()
            assert energy.settled
            figures[meter.id] = energy.joules
        return figures


def agree(live: dict[str, float | None], rows: list[dict[str, Any]]) -> float:
    """The largest relative difference between live and replayed joules; every id once."""
    assert sorted(live) == sorted(row["id"] for row in rows)
    worst = 0.0
    for row in rows:
        a, b = live[row["id"]], row["joules"]
        assert (a is None) == (b is None), row
        if a is not None and b is not None:
            worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
    return worst


@pytest.mark.parametrize(("gauge", "split"), [("counter", "time"), ("counter", "tokens"),
                                              ("instant", "time"), ("every_read", "tokens")])
def test_replay_with_the_live_split_reproduces_every_settled_figure(
    tmp_path: Path, gauge: str, split: str,
) -> None:
    traffic = Traffic(tmp_path, seed=3, gauge=gauge, split=split)
    traffic.run(6.0)
    live = traffic.stop()
    assert len(live) > 50 and sum(j is not None for j in live.values()) > 40
    result = replay(load(tmp_path))
    assert agree(live, result.rows) <= AGREES
    assert all(row["source"] == "replay" for row in result.rows)
    agreement = result.agreement
    assert agreement["same_split"] and agreement["within"] == agreement["compared"] > 40
    live_books = result.loaded.live_books
    assert live_books is not None
    for key in ("measured_j", "charged_j", "unattributed_j"):
        assert result.books[key] == pytest.approx(live_books[key], rel=1e-9, abs=1e-9)
    # Conserved in the replay too: charged + unattributed + in flight == measured.
    books = result.books
    assert abs(books["measured_j"] - books["charged_j"] - books["unattributed_j"]
               - books["in_flight_j"]) <= 1e-9 * books["measured_j"]


def test_another_split_is_compared_per_route_and_tier(tmp_path: Path) -> None:
    traffic = Traffic(tmp_path, seed=5)
    traffic.run(6.0)
    live = traffic.stop()
    result = replay(load(tmp_path), split="tokens")
    assert result.split == "tokens" and result.live_split == "time"
    assert not result.agreement["same_split"]
    groups = {(g["route"], g["tier"]): g for g in result.groups}
    assert set(groups) == {(r, t.name) for r in ROUTES for t in TIERS}
    assert sum(g["requests"] for g in groups.values()) == len(live)
    # A token split moves joules between requests: some differ from live, and the books
    # still balance.
    assert agree_some_differ(live, result.rows)
    books = result.books
    assert abs(books["measured_j"] - books["charged_j"] - books["unattributed_j"]
               - books["in_flight_j"]) <= 1e-9 * books["measured_j"]
    text = render(result)
    assert "by route and tier: split tokens against live time" in text
    assert "/v1/embeddings" in text and "large" in text


def agree_some_differ(live: dict[str, float | None], rows: list[dict[str, Any]]) -> bool:
    return any(
        live[row["id"]] is not None and row["joules"] is not None
        and abs(live[row["id"]] - row["joules"]) > 1e-3 * row["joules"]  # type: ignore[operator]
        for row in rows
    )


def test_a_different_idle_floor_charges_less_above_it(tmp_path: Path) -> None:
    traffic = Traffic(tmp_path, seed=6)
    traffic.run(3.0)
    traffic.stop()
    base = replay(load(tmp_path))
    higher = replay(load(tmp_path), idle_w=IDLE + 20.0)
    assert higher.idle_w == IDLE + 20.0
    assert higher.books["measured_j"] < base.books["measured_j"] - 10.0


def test_the_request_path_only_appends_and_no_secret_is_written(tmp_path: Path) -> None:
    traffic = Traffic(tmp_path, seed=1, tenant="sk-live-0123456789abcdef")
    traffic.run(1.0)
    trace = traffic.ledger._trace
    assert trace is not None
    # Nothing has reached the disk: the request path appended to the buffer only.
    assert len(trace.buffer) > 10 and not list(tmp_path.iterdir())
    traffic.stop()
    text = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "sk-live" not in text and "0123456789abcdef" not in text
    assert "tenant" not in text and "key:" not in text
    kinds = {json.loads(line)[0] for line in text.splitlines() if line.startswith("[")}
    assert kinds >= {"at", "r", "o", "c", "z", "s"}


def test_rotated_files_are_bounded_and_replayed_in_order(tmp_path: Path) -> None:
    # 20 kB a file: the run writes several times that, so the oldest parts are dropped.
    traffic = Traffic(tmp_path, seed=2, trace_mb=0.02)
    traffic.run(8.0)
    traffic.stop()
    current = tmp_path / f"{trace_stem('card-0')}.jsonl"
    files = sorted(tmp_path.iterdir())
    assert files == sorted([current, rotated(current, 1)])
    assert all(f.stat().st_size < 2 * 20_000 for f in files)
    result = replay(load(current))
    assert result.loaded.files == [rotated(current, 1), current]  # oldest first
    assert result.loaded.continues
    assert any("rotated away" in note for note in result.loaded.notes)
    assert result.rows and result.agreement["compared"] > 0


def test_a_trace_that_rotated_once_replays_whole(tmp_path: Path) -> None:
    # Two parts, nothing dropped: the second part's repeated header and reader are not a
    # new reader, and the figures are the live ones.
    (tmp_path / "probe").mkdir()
    probe = Traffic(tmp_path / "probe", seed=4)
    probe.run(4.0)
    probe.stop()
    size = sum(p.stat().st_size for p in (tmp_path / "probe").iterdir())
    out = tmp_path / "out"
    out.mkdir()
    traffic = Traffic(out, seed=4, trace_mb=(size * 0.7) / 1e6)
    traffic.run(4.0)
    live = traffic.stop()
    result = replay(load(out))
    assert len(result.loaded.files) == 2 and not result.loaded.continues
    assert agree(live, result.rows) <= AGREES


def _trace(tmp_path: Path, seed: int = 7) -> tuple[Path, dict[str, float | None]]:
    traffic = Traffic(tmp_path, seed=seed)
    traffic.run(2.0)
    live = traffic.stop()
    return tmp_path / f"{trace_stem('card-0')}.jsonl", live


def test_a_last_line_cut_short_is_skipped_and_said(tmp_path: Path) -> None:
    path, _ = _trace(tmp_path)
    whole = replay(load(path))
    text = path.read_text()
    path.write_text(text[: len(text) - 7])  # the books line, cut mid-write
    loaded = load(path)
    assert loaded.truncated and loaded.skipped == 0 and loaded.live_books is None
    assert any("cut short" in note for note in loaded.notes)
    result = replay(loaded)
    assert [r["joules"] for r in result.rows] == [r["joules"] for r in whole.rows]


def test_garbage_lines_are_skipped_counted_and_said(tmp_path: Path, capsys: Any) -> None:
    path, live = _trace(tmp_path)
    lines = path.read_text().splitlines()
    garbage = ["not json at all", '["r", "yesterday", 1.0, null, null]', '["zz", 1]',
               "{\"unknown\": 1}", '["o", 1.0]', "[]", '["c", 1.0, 2, true, null, null, null]']
    mixed: list[str] = []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 50 == 10 and garbage:
            mixed.append(garbage.pop())
    assert not garbage
    path.write_text("\n".join(mixed) + "\n")
    loaded = load(path)
    assert loaded.skipped == 7 and not loaded.truncated
    assert agree(live, replay(loaded).rows) <= AGREES
    assert main(["replay", str(path)]) == 0
    captured = capsys.readouterr()
    assert "7 line(s) were not trace events: skipped" in captured.err
    assert "source: replay" in captured.out and "agreement with live" in captured.out


def test_upstream_samples_of_an_earlier_version_replay_and_say_so(tmp_path: Path) -> None:
    """Upstream samples now say their scrape's time (``["up", t, running, spread_s]``); an
    earlier version's ``["up", t, running]`` still replays, with a note; nonsense is skipped
    or taken as no spread, never a crash."""
    path, _ = _trace(tmp_path)
    lines = path.read_text().splitlines()
    t = next(json.loads(line)[1] for line in lines if line.startswith('["r"'))
    extra = [f'["up", {t}, 0.0]', f'["up", {t}, 0.0, -0.5, 1.0]', f'["up", {t}, 0.0, "wide", 0.0]']
    path.write_text("\n".join([lines[0], *extra, *lines[1:]]) + "\n")
    loaded = load(path)
    assert loaded.skipped == 1
    assert any("no scrape time" in note for note in loaded.notes)
    assert replay(loaded).rows


def test_an_empty_trace_a_missing_one_and_not_a_trace_exit_2_with_a_remedy(
    tmp_path: Path, capsys: Any,
) -> None:
    empty = tmp_path / f"{trace_stem('x')}.jsonl"
    empty.write_text("")
    assert main(["replay", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "is empty" in err and "->" in err
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no trace at" in err and "Node(trace=DIR)" in err
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n[1, 2]\n')
    assert main(["replay", str(other)]) == 2
    assert "no trace header" in capsys.readouterr().err
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    assert main(["replay", str(lonely)]) == 2
    assert "0 traces" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        load(tmp_path / "nope.jsonl")
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"giul_trace": 1, "node": "n", "ramp_s": "fast", "split": "time"}\n'
                       '["o", 1.0, 7]\n["c", 1.5, 7, null, "id-1", "/", null]\n')
    assert main(["replay", str(damaged)]) == 2
    assert "header does not describe a node" in capsys.readouterr().err
    future = tmp_path / "future.jsonl"
    future.write_text('{"giul_trace": 9, "node": "n"}\n')
    assert main(["replay", str(future)]) == 2
    assert "trace version 9" in capsys.readouterr().err


def test_replay_json_and_split_options(tmp_path: Path, capsys: Any) -> None:
    path, live = _trace(tmp_path, seed=8)
    assert main(["replay", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "replay" and doc["split"] == "time"
    assert {r["id"] for r in doc["requests"]} == set(live)
    assert doc["agreement"]["within"] == doc["agreement"]["compared"]
    assert set(doc["books"]) >= {"measured_j", "charged_j", "unattributed_j"}
    assert main(["replay", str(path), "--split", "tokens", "--idle-w", "65"]) == 0
    assert "by route and tier" in capsys.readouterr().out
    assert main(["replay", str(path), "--split", "weight"]) == 2
    assert main(["replay", str(path), "--idle-w", "-3"]) == 2


def test_trace_settings_are_checked_at_build(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as error:
        Node("n", trace=str(tmp_path / "missing"))
    assert "mkdir" in error.value.remedy
    afile = tmp_path / "a-file"
    afile.write_text("")
    with pytest.raises(ConfigError, match="does not exist"):
        Node("n", trace=str(afile))
    with pytest.raises(ConfigError, match="trace_mb"):
        Node("n", trace=str(tmp_path), trace_mb=0)
    with pytest.raises(ConfigError, match="trace_mb"):
        Node("n", trace=str(tmp_path), trace_mb="16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="directory path"):
        Node("n", trace=3)  # type: ignore[arg-type]
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="not writable"):
            Node("n", trace=str(locked))
    with pytest.raises(ConfigError, match="trace"):
        EnergyMiddleware(lambda *a: None, trace=str(tmp_path / "missing"))
    assert Node("n", trace=tmp_path).trace == str(tmp_path)  # type: ignore[arg-type]
    # Where a trace goes is not the node's identity: the same node, traced or not.
    assert Node("n", trace=str(tmp_path)) == Node("n")


def test_a_trace_that_cannot_be_written_costs_the_trace_not_the_ledger(tmp_path: Path) -> None:
    target = tmp_path / "gone"
    target.mkdir()
    traffic = Traffic(target, seed=9)
    target.rmdir()  # the directory vanished after startup
    traffic.run(1.0)
    trace = traffic.ledger._trace
    assert trace is not None
    trace.write()
    assert trace.broken is not None and len(trace.buffer) == 0
    traffic.run(0.5)
    trace.write()
    assert len(trace.buffer) == 0  # dropped, not held
    live = traffic.stop()
    assert any(j is not None for j in live.values())


def test_a_token_split_live_ledger_reproduces(tmp_path: Path) -> None:
    # A ledger given its split as an object (not by the node's name) writes that split.
    clock = Clock()
    card = TrueCard(idle_w=IDLE, clock=clock, seed=11)
    reader = TrueReader(card)
    ledger = Ledger(Node("card-0", idle_w=IDLE, trace=str(tmp_path)), reader,
                    split=TokenSplit(), poll=False)
    meters = []
    for i in range(20):
        a, b = Meter(ledger, route="/a"), Meter(ledger, route="/b")
        a.open()
        b.open()
        ja, jb = card.start_job(100.0), card.start_job(150.0)
        for _ in range(8 + i % 5):
            clock.now += 0.01
            ledger.ingest(reader.read())
        card.stop_job(ja)
        card.stop_job(jb)
        a.tokens(50 + i)
        b.tokens(300)
        a.close()
        b.close()
        meters += [a, b]
    for _ in range(40):
        clock.now += 0.01
        ledger.ingest(reader.read())
    ledger.stop()
    live = {m.id: m.figure().joules for m in meters}
    result = replay(load(tmp_path))
    assert result.live_split == "tokens" and agree(live, result.rows) <= AGREES


@pytest.mark.anyio
@pytest.mark.parametrize("kept", [False, True])
async def test_the_middleware_traces_every_node_and_replay_agrees_on_the_real_clock(
    tmp_path: Path, kept: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real path: the reader thread reads a simulated card and writes the trace; the
    # requests close on the event loop. One setting for all nodes. ``kept``: the node starts
    # from a prior an earlier worker of the server kept; the trace says so, and replay
    # starts from it too.
    if kept:
        from giul_asgi.hostshare.priors import KeptPrior
        from giul_asgi.ledger.prior import First, Prior, Window

        taught = Prior(0.1, lambda: 0.02)
        for i in range(20):
            w = Window(0.0, 0.0)
            w.t_close, w.share, w.measured_s = 0.03, 4.0 + 0.1 * (i % 4), 0.03
            w.first = First(reported=0.0, guess=4.0, scale=4.0)
            taught.learn_settled(w, 0.1)
        monkeypatch.setattr(KeptPrior, "load", lambda self: taught.state())
    card = SimulatedCard(idle_w=60.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim", idle_w=60.0, period_s=0.02,
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))
    stats = RecordingStats()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        job = card.start_job(150.0)
        try:
            await asyncio.sleep(0.03)
        finally:
            card.stop_job(job)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = EnergyMiddleware(app, nodes=[node], ledgers=Ledgers(), stats=stats,
                                  trace=str(tmp_path))
    assert middleware.router.nodes["sim"].trace == str(tmp_path)
    await middleware.start()
    for _ in range(12):
        await drive(middleware, path="/v1/chat/completions")
    records = await settled_records(stats, 12, timeout=20.0)
    assert len(records) == 12
    deadline = time.monotonic() + 20.0  # the reader thread writes every 0.5 s
    while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert list(tmp_path.iterdir()), "the reader thread wrote nothing"
    await middleware.aclose()
    live = {r.energy.id: r.energy.joules for r in records}
    loaded = load(tmp_path)
    assert any(event[0] == "pr" for event in loaded.events) == kept
    result = replay(loaded)
    rows = {row["id"]: row for row in result.rows}
    assert set(live) <= set(rows)
    for ident, joules in live.items():
        replayed = rows[ident]["joules"]
        assert (joules is None) == (replayed is None)
        if joules is not None:
            assert abs(replayed - joules) <= AGREES * joules
    assert all(row["method"] == "simulated" for row in rows.values() if row["joules"] is not None)


def test_two_ledgers_of_one_node_in_one_process_write_two_traces(tmp_path: Path) -> None:
    first, second = Traffic(tmp_path, seed=12), Traffic(tmp_path, seed=13)
    first.run(1.0)
    second.run(1.0)
    live_first, live_second = first.stop(), second.stop()
    stem = trace_stem("card-0")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}-2.jsonl", f"{stem}.jsonl"]
    assert agree(live_first, replay(load(tmp_path / f"{stem}.jsonl")).rows) <= AGREES
    assert agree(live_second, replay(load(tmp_path / f"{stem}-2.jsonl")).rows) <= AGREES
    with pytest.raises(ConfigError, match="2 traces"):
        load(tmp_path)  # which one: the operator says


def test_a_buffer_the_reader_thread_did_not_empty_in_time_is_bounded_and_said(tmp_path: Path) -> None:
    from giul_asgi.ledger.trace import Trace

    trace = Trace(tmp_path, {"node": "n", "split": "time"}, max_bytes=1_000_000, max_buffer=100)
    for i in range(1_000):  # the request path never waits: the oldest events go
        trace.note(("o", float(i), i))
    assert len(trace.buffer) == 100
    trace.close()
    loaded = load(tmp_path)
    assert loaded.lost == 1 and len(loaded.events) == 100
    assert any("lost events" in note for note in loaded.notes)


# -- the trace's files: private, bounded, never left open (issue 20 items 5-6, issue 21 item 9) --

def _fds_on(path: Path) -> list[str]:
    """This process's descriptors open on ``path`` (from /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
    return found


def test_nothing_the_trace_opens_outlives_a_write_and_an_unstopped_trace_collects_silently(
    tmp_path: Path,
) -> None:
    from giul_asgi.ledger.trace import Trace

    trace = Trace(tmp_path, {"node": "sim", "split": "time", "pid": os.getpid()}, max_bytes=1_000_000)
    trace.note(("o", 1.0, 1))
    trace.write()
    path = trace.path
    assert path.exists() and _fds_on(path) == []  # written, and closed again
    trace.note(("c", 2.0, 1, None, None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ResourceWarning would fail whichever test runs next
        del trace  # never stopped: a ledger a test forgot
        gc.collect()
    assert _fds_on(path) == []


def test_a_planted_link_at_the_trace_path_is_never_followed_and_costs_the_trace_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    aimed = elsewhere / "cron-job"  # a link to a file that does not exist yet: open(.., "a") makes it
    traces = tmp_path / "traces"
    traces.mkdir()
    stem = trace_stem("card-0")
    (traces / f"{stem}.jsonl").symlink_to(aimed)  # planted where our trace goes
    traffic = Traffic(traces, seed=5)
    traffic.run(0.5)
    trace = traffic.ledger._trace
    assert trace is not None
    trace.write()
    assert not aimed.exists() and trace.broken is None
    assert trace.path.name == f"{stem}-2.jsonl" and not trace.path.is_symlink()  # a name of its own
    # A link swapped in between two writes (each write opens the file again) is refused.
    precious = elsewhere / "precious"
    precious.write_text("keep me\n")
    trace.path.unlink()
    trace.path.symlink_to(precious)
    traffic.run(0.5)
    with caplog.at_level(logging.ERROR, logger="giul_asgi.ledger"):
        trace.write()
    assert precious.read_text() == "keep me\n"
    assert trace.broken is not None and "symbolic link" in trace.broken
    assert any("cannot be written" in r.getMessage() for r in caplog.records)
    live = traffic.stop()
    assert any(j is not None for j in live.values())  # the ledger's figures are whole


def _one_lifetime(directory: str, node: str) -> None:
    from giul_asgi.ledger.trace import Trace

    trace = Trace(directory, {"node": node, "split": "time", "pid": os.getpid()}, max_bytes=1_000_000)
    trace.note(("o", 1.0, 1))
    trace.close({"measured_j": 1.0})


def test_a_trace_directory_under_worker_churn_holds_the_live_and_the_newest_dead(tmp_path: Path) -> None:
    from giul_asgi.ledger.trace import KEEP_DEAD, Trace

    ctx = mp.get_context("spawn")
    keep = tmp_path / "giul-trace-notes.txt"
    keep.write_text("the operator's file: not a trace")
    foreign = tmp_path / "giul-trace-x-1.jsonl"
    foreign.write_text("no header: not one of ours to judge\n")
    lifetimes = 8
    for i in range(lifetimes):  # workers recycled one after another, each tracing the node
        proc = ctx.Process(target=_one_lifetime, args=(str(tmp_path), "sim"))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        time.sleep(0.01 * (i % 2))  # distinct mtimes, whatever the file system's resolution
    live = Trace(tmp_path, {"node": "sim", "split": "time", "pid": os.getpid()}, max_bytes=1_000_000)
    live.note(("o", 1.0, 1))
    live.write()  # a new worker begins its trace: the dead ones beyond the bound go
    traces = sorted(p.name for p in tmp_path.glob("giul-trace-sim-*.jsonl"))
    assert len(traces) == KEEP_DEAD + 1 and live.path.name in traces
    assert keep.exists() and foreign.exists()
    # The newest dead are the ones kept.
    kept_pids = sorted(json.loads(p.read_text().splitlines()[0])["pid"]
                       for p in tmp_path.glob("giul-trace-sim-*.jsonl") if p != live.path)
    assert len(kept_pids) == KEEP_DEAD
    live.close()


def test_a_trace_of_a_reused_pid_is_a_dead_processs_and_rotated_parts_go_with_it(tmp_path: Path) -> None:
    from giul_asgi.ledger.trace import prune

    header = {"giul_trace": 1, "node": "sim", "pid": os.getpid(), "start": "1", "part": 0}
    old = tmp_path / "giul-trace-sim-old.jsonl"
    old.write_text(json.dumps(header) + "\n")
    part = tmp_path / "giul-trace-sim-old.1.jsonl"
    part.write_text(json.dumps({**header, "part": 1}) + "\n")
    mine = tmp_path / "giul-trace-sim-live.jsonl"
    mine.write_text(json.dumps({**header, "start": process_start(os.getpid())}) + "\n")
    assert prune(tmp_path, 0) == 2  # our pid, but not our start: a process before us
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]


def test_building_a_traced_ledger_touches_no_file_and_the_loop_never_writes_the_trace(
    tmp_path: Path,
) -> None:
    # Starlette builds the middleware stack (and so the ledgers) on the event loop at the
    # first ASGI call; aclose() stops them off it. An audit hook sees every open, listing,
    # rename and removal under the trace directory and the thread that made it.
    card = SimulatedCard(idle_w=60.0, cap_w=700.0, counter_period=0.02)
    node = Node("sim", idle_w=60.0, period_s=0.02, trace=str(tmp_path),
                reader_factory=lambda _n: SimulatedReader(card, period=0.02))

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def serve() -> None:
        with _FileCalls(tmp_path) as calls:
            calls.loop_thread = threading.get_ident()
            middleware = EnergyMiddleware(app, nodes=[node], ledgers=Ledgers())
            await middleware.start()
            for _ in range(3):
                await drive(middleware, path="/v1/chat/completions")
            deadline = time.monotonic() + 20.0
            while not calls.seen and time.monotonic() < deadline:  # the reader thread's write
                await asyncio.sleep(0.05)
            await middleware.aclose()
        assert calls.seen, "the audit hook saw no trace file at all"
        assert calls.on_loop == [], calls.on_loop

    asyncio.run(serve())
    assert list(tmp_path.glob("giul-trace-sim-*.jsonl"))


_AUDITED = ("open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.truncate",
            "os.chmod", "os.link", "os.symlink")
_watch: list[_FileCalls] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _watch or event not in _AUDITED or not args:
        return
    target = args[0]
    if isinstance(target, int):
        return
    with contextlib.suppress(TypeError):
        text = os.fsdecode(target)
        for calls in _watch:
            if text.startswith(str(calls.root)):
                calls.seen.append((event, text))
                if threading.get_ident() == calls.loop_thread:
                    calls.on_loop.append((event, text))


sys.addaudithook(_audit)  # once per process; it does nothing unless a test watches


class _FileCalls:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.loop_thread = -1
        self.seen: list[tuple[str, str]] = []
        self.on_loop: list[tuple[str, str]] = []

    def __enter__(self) -> _FileCalls:
        _watch.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _watch.remove(self)


# -- replay: odd lines said where they are; a directory of traces (issue 20 item 7, 21 item 7) --

def test_a_deeply_nested_line_is_skipped_and_said_with_its_file_and_line(tmp_path: Path, capsys: Any) -> None:
    path, live = _trace(tmp_path, seed=14)
    lines = path.read_text().splitlines()
    lines.insert(3, "[" * 200_000 + "]" * 200_000)  # valid JSON, deeper than any parser's stack
    lines.insert(5, '{"a": ' * 100_000 + "1" + "}" * 100_000)
    path.write_text("\n".join(lines) + "\n")
    loaded = load(path)
    assert loaded.skipped == 2
    assert loaded.skipped_at[0] == f"{path}:4 (nested too deeply to be a trace event)"
    assert loaded.skipped_at[1] == f"{path}:6 (nested too deeply to be a trace event)"
    assert agree(live, replay(loaded).rows) <= AGREES
    assert main(["replay", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}:4 (nested too deeply" in err and "RecursionError" not in err


def test_replay_of_a_directory_replays_every_trace_in_it(tmp_path: Path, capsys: Any) -> None:
    # Four workers of one server leave four traces: giul-asgi replay DIR takes them all.
    first, second = Traffic(tmp_path, seed=15), Traffic(tmp_path, seed=16)
    first.run(1.0)
    second.run(1.0)
    live = {**first.stop(), **second.stop()}
    assert len(list(tmp_path.glob("giul-trace-*.jsonl"))) == 2
    assert main(["replay", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("replay of ") == 2 and out.count("agreement with live") == 2
    assert main(["replay", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "replay" and len(doc["traces"]) == 2
    replayed = {row["id"]: row["joules"] for trace in doc["traces"] for row in trace["requests"]}
    assert set(replayed) == set(live)
    assert all(t["agreement"]["within"] == t["agreement"]["compared"] for t in doc["traces"])
    # One that cannot be replayed (a worker that had written nothing yet) is said; the others are.
    (tmp_path / f"{trace_stem('card-0', 999_999)}.jsonl").write_text("")
    assert main(["replay", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("replay of ") == 2 and "is empty" in captured.err
    for p in tmp_path.glob("giul-trace-*.jsonl"):
        p.write_text("")
    assert main(["replay", str(tmp_path)]) == 2
    assert "none of the 3 trace(s)" in capsys.readouterr().err


def test_forty_worker_lifetimes_never_leave_more_than_the_bound(tmp_path: Path) -> None:
    """Under churn (gunicorn --max-requests), each new worker begins its trace and prunes: the
    directory never holds more than the live one and KEEP_DEAD dead ones, with their parts."""
    from giul_asgi.ledger.trace import FILES, KEEP_DEAD

    ctx = mp.get_context("fork")  # 40 lifetimes: fork is what gunicorn does, and quick
    most = 0
    for i in range(40):
        proc = ctx.Process(target=_one_lifetime, args=(str(tmp_path), "sim"))
        with warnings.catch_warnings():  # 3.12+: a fork beside threads is said; the child only writes
            warnings.simplefilter("ignore", DeprecationWarning)
            proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        if i % 3 == 0:
            time.sleep(0.01)  # distinct mtimes now and then, whatever the file system's resolution
        most = max(most, len(list(tmp_path.glob("giul-trace-*"))))
    assert most <= (KEEP_DEAD + 1) * FILES, most
    assert len(list(tmp_path.glob("giul-trace-sim-*.jsonl"))) == KEEP_DEAD + 1


@pytest.mark.anyio
async def test_replay_says_what_a_seat_at_the_cards_table_received_not_a_measured_zero(
    tmp_path: Path,
) -> None:
    # The in-process simulated card sits at a card table (its holder reads it and shares each
    # span): a stranger's replay printed "live books: measured 0 J, charged 1023.05 J".
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.15)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    node = Node(f"seat-{os.getpid()}-{time.monotonic_ns()}", idle_w=70.0, reader="simulated")
    stats = RecordingStats()
    middleware = EnergyMiddleware(app, nodes=[node], ledgers=Ledgers(), stats=stats,
                                  trace=str(tmp_path))
    await middleware.start()
    for _ in range(6):
        await drive(middleware, path="/v1/chat/completions")
    assert len(await settled_records(stats, 6, timeout=20.0)) == 6
    await middleware.aclose()
    loaded = load(tmp_path)
    live = loaded.live_books
    assert live is not None and live["charged_j"] > 0
    line = next(x for x in render(replay(loaded)).splitlines() if x.startswith("live books"))
    if live["measured_j"] == 0:
        # received = charged + forfeit, summed in another order: equal to rounding at least
        assert live["received_j"] >= live["charged_j"] * (1 - 1e-9) and "received" in line, line
    assert "measured 0 J" not in line, line
