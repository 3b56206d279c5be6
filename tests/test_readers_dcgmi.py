"""The dcgmi dmon reader: dmon's lines parsed, its failures typed with remedies, restarts.

The command is tests/fake_dcgmi.py behind a ``dcgmi`` wrapper on a temporary PATH: it prints
dmon's header, units line and GPU rows on a real clock, and fails as DCGM does. Every wait is
for a condition with a generous bound, so the tests hold on a busy machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from giul_asgi.config import Node
from giul_asgi.errors import ReaderUnavailable
from giul_asgi.ledger import Ledger
from giul_asgi.readers.base import ReaderSpec
from giul_asgi.readers.dcgmi import (
    DcgmiReader,
    DmonParser,
    DmonStreamError,
    FieldsNotReserved,
    HostEngineUnavailable,
    WatchHeldByExporter,
    classify,
)
from giul_asgi.readers.registry import READERS

FAKE = Path(__file__).with_name("fake_dcgmi.py")
WAIT_S = 20.0


@pytest.fixture
def dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Path]]:
    """Put a ``dcgmi`` on PATH that runs the fake in the given mode(s); returns its args log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "dcgmi"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    args = tmp_path / "args.txt"

    def use(mode: str) -> Path:
        monkeypatch.setenv("FAKE_DCGMI_MODE", mode)
        monkeypatch.setenv("FAKE_DCGMI_STATE", str(tmp_path / "launches"))
        monkeypatch.setenv("FAKE_DCGMI_ARGS", str(args))
        return args

    yield use


def _until(predicate: Callable[[], bool], bound: float = WAIT_S) -> bool:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _spec(gpus: tuple[int, ...] = (0,), **options: object) -> ReaderSpec:
    return ReaderSpec(gpus=gpus, options={"interval_ms": 50, "start_timeout_s": WAIT_S, **options})


# -- parsing -----------------------------------------------------------------------------------

def test_the_parser_sums_whole_samples_and_keeps_what_is_not_a_row() -> None:
    parser = DmonParser((0, 1))
    lines = [
        "#Entity   POWER             TOTEC             ",
        "ID        W                 mJ                ",
        "GPU 0     63.412            1000000           ",
        "GPU 1     70.000            2000000           ",
        "GPU 2     10.000            5                 ",  # not the node's
        "GPU 0     64.000            1006000           ",
        "something else entirely",
        "GPU 1     N/A               2007000           ",
    ]
    out = [parser.feed(line, float(i)) for i, line in enumerate(lines)]
    samples = [s for s in out if s is not None]
    assert len(samples) == 2
    assert samples[0].joules == pytest.approx(3000.0) and samples[0].watts == pytest.approx(133.412)
    assert samples[0].t == 3.0
    assert samples[1].joules == pytest.approx(3013.0) and samples[1].watts is None  # N/A is unknown
    assert parser.garbage == 1 and list(parser.others) == ["something else entirely"]


def test_the_parser_learns_every_gpu_when_none_is_named_and_restarts_a_broken_sample() -> None:
    parser = DmonParser(())
    feed = ["#Entity POWER TOTEC", "ID W mJ", "GPU 0 1 1000", "GPU 1 1 1000", "GPU 0 1 2000"]
    assert [parser.feed(line, 0.0) for line in feed] == [None] * 5  # the set is known at the repeat
    assert parser.feed("GPU 1 1 3000", 1.0) is not None
    assert parser.feed("GPU 1 1 4000", 2.0) is None  # GPU 0's row went missing: start again
    sample = parser.feed("GPU 0 2 5000", 3.0)
    assert sample is not None and sample.joules == pytest.approx(9.0)
    # Rows before any header, or with the wrong width or a bad number, are not rows.
    fresh = DmonParser((0,))
    assert fresh.feed("GPU 0 1 1000", 0.0) is None and fresh.garbage == 1
    fresh.feed("#Entity POWER TOTEC", 0.0)
    for bad in ("GPU 0 1", "GPU x 1 1", "GPU 0 one 1", "GPU 0 -5 1", "GPU-I 0 1 1"):
        assert fresh.feed(bad, 0.0) is None
    assert fresh.garbage == 6


def test_dcgms_own_words_map_to_typed_errors_with_remedies() -> None:
    engine = classify("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.",
                      None)
    assert isinstance(engine, HostEngineUnavailable) and "nvidia-dcgm" in engine.remedy
    held = classify("Error setting watches. Result: the affected resource is in use.", "gpu-7")
    assert isinstance(held, WatchHeldByExporter) and "reader='dcgm'" in held.remedy
    denied = classify("Error: Failed to set watches for the field group. Return: Not Supported", None)
    assert isinstance(denied, FieldsNotReserved) and "dcgmi dmon -l" in denied.remedy
    assert classify("segfault", None) is None
    assert all(isinstance(e, ReaderUnavailable) for e in (engine, held, denied))


# -- the stream ---------------------------------------------------------------------------------

def test_streams_the_nodes_gpus_summed_with_the_command_asked_for(dcgmi: Callable[[str], Path]) -> None:
    args = dcgmi("ok")
    reader = READERS["dcgmi"](_spec((0, 1)))
    try:
        assert isinstance(reader, DcgmiReader)
        assert reader.kind == "counter" and reader.backend == "dcgm" and reader.method == "measured"
        assert args.read_text().split() == ["dmon", "-e", "155,156", "-d", "50", "-i", "0,1"]
        first = reader.read()
        assert first.ok and first.joules is not None
        assert first.joules > (123_456_789 + 124_456_789) / 1000.0  # both GPUs' mJ, summed, in J
        assert _until(lambda: (reader.read().joules or 0) > (first.joules or 0))
        # The header comes again every 10 samples: the reader reads on through it.
        seen = reader.read().joules or 0
        assert _until(lambda: (reader.read().joules or 0) > seen + 12 * 0.05 * 125)
        assert reader.restarts == 0
    finally:
        reader.close()


def test_a_dmon_that_dies_mid_run_is_a_failed_read_that_says_why_then_restarts(
    dcgmi: Callable[[str], Path],
) -> None:
    dcgmi("die:4,hostengine,ok")
    reader = DcgmiReader(_spec(backoff_s=0.3))
    try:
        errors: list[str] = []

        def failing() -> bool:
            reading = reader.read()
            if reading.error:
                errors.append(reading.error)
            return bool(errors) and reading.ok

        assert _until(failing), errors
        assert any("exited (status 1)" in e and "restarting" in e for e in errors), errors
        assert any("host engine" in e and "nvidia-dcgm" in e for e in errors), errors  # its remedy too
        assert reader.restarts >= 2
    finally:
        reader.close()


@pytest.mark.parametrize(("mode", "error", "words"), [
    ("hostengine", HostEngineUnavailable, "could not reach the DCGM host engine"),
    ("inuse", WatchHeldByExporter, "already holds the watch"),
    ("reserve", FieldsNotReserved, "would not watch fields 155,156"),
    ("garbage", DmonStreamError, "not dmon output, the last: '%%%% 12 ab'"),
], ids=["host-engine", "exporter-holds-the-watch", "fields-not-reserved", "garbage"])
def test_failures_at_start_are_typed_errors_with_remedies(
    dcgmi: Callable[[str], Path], mode: str, error: type[ReaderUnavailable], words: str,
) -> None:
    dcgmi(mode)
    with pytest.raises(error) as caught:
        DcgmiReader(_spec())
    assert words in caught.value.message, caught.value.message
    assert caught.value.remedy


def test_a_dmon_that_hangs_or_is_missing_fails_its_start(dcgmi: Callable[[str], Path]) -> None:
    dcgmi("hang")
    started = time.monotonic()
    with pytest.raises(DmonStreamError, match="printed no sample within 1 s"):
        DcgmiReader(_spec(start_timeout_s=1.0))
    assert time.monotonic() - started < WAIT_S  # the hung child was ended, not waited for
    with pytest.raises(DmonStreamError, match="not an executable on PATH") as caught:
        DcgmiReader(_spec(dcgmi="/nonexistent/dcgmi"))
    assert "datacenter-gpu-manager" in caught.value.remedy


def test_a_gpu_without_total_energy_is_read_as_power(dcgmi: Callable[[str], Path]) -> None:
    dcgmi("na")
    reader = DcgmiReader(_spec((0, 1)))
    try:
        assert reader.kind == "power" and "field 155" in reader.notes[-1]
        reading = reader.read()
        assert reading.watts is not None and 125.0 <= reading.watts <= 129.0
    finally:
        reader.close()
    forced = DcgmiReader(_spec((0, 1), kind="counter"))
    try:
        assert forced.kind == "counter"
        assert "N/A for total energy" in (forced.read().error or "")
    finally:
        forced.close()


def test_bad_options_are_config_errors_naming_the_key() -> None:
    from giul_asgi.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown option 'url'"):
        DcgmiReader(ReaderSpec(options={"url": "x"}))
    with pytest.raises(ConfigError, match="'interval_ms' must be a number"):
        DcgmiReader(ReaderSpec(options={"interval_ms": "fast"}))


def test_a_node_reads_through_dcgmi_with_its_ledger(dcgmi: Callable[[str], Path]) -> None:
    dcgmi("ok")
    node = Node("dcgmi-node", reader="dcgmi", idle_w=50.0, period_s=0.05, options={"start_timeout_s": WAIT_S})
    ledger = Ledger(node)
    ledger.ensure_started()
    try:
        assert _until(lambda: ledger.totals().reads >= 10 and ledger.totals().measured_j > 0)
        totals = ledger.totals()
        assert totals.backend == "dcgm" and totals.read_errors == 0
    finally:
        ledger.stop(WAIT_S)


# -- a silent dmon, and no dmon outliving its server (issue 20 item 6) ------------------------

def _gone(pid: int) -> bool:
    """The process is gone (or a zombie its new parent has not reaped yet: it runs no more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_dmon_that_stops_printing_is_ended_and_started_again(
    dcgmi: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    dcgmi("silent:3,ok")
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_DCGMI_PIDS", str(pids))
    reader = DcgmiReader(_spec(stale_s=0.5, backoff_s=0.1))
    try:
        errors: list[str] = []

        def recovered() -> bool:
            reading = reader.read()
            if reading.error:
                errors.append(reading.error)
            return bool(errors) and reading.ok

        assert _until(recovered), errors
        assert any("printed no sample for 0.5 s (silent, not exited): ended it" in e for e in errors), errors
        assert reader.restarts >= 1 and len(_pids(pids)) >= 2
        assert _until(lambda: _gone(_pids(pids)[0]))  # the silent one was ended, not left behind
    finally:
        reader.close()
    try:
        assert _until(lambda: all(_gone(pid) for pid in _pids(pids)))
    finally:
        _kill_all(_pids(pids))


def test_close_ends_dmons_whole_process_group(
    dcgmi: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    dcgmi("ok")
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_DCGMI_PIDS", str(pids))
    monkeypatch.setenv("FAKE_DCGMI_CHILD", "1")  # dmon starts a helper of its own
    reader = DcgmiReader(_spec())
    try:
        assert _until(lambda: len(_pids(pids)) == 2)
        reader.close()
        assert _until(lambda: all(_gone(pid) for pid in _pids(pids))), _pids(pids)
    finally:
        reader.close()
        _kill_all(_pids(pids))


def _kill_all(pids: list[int]) -> None:
    """Never leave a fake behind, whatever the outcome (only ours: a pid may have been reused)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"fake_dcgmi" in command or b"time.sleep(3600)" in command:
                os.kill(pid, signal.SIGKILL)


SERVER = """
import sys, time
from giul_asgi.readers.base import ReaderSpec
from giul_asgi.readers.dcgmi import DcgmiReader
reader = DcgmiReader(ReaderSpec(gpus=(0,), options={"interval_ms": 50, "start_timeout_s": 20,
                                                    "stale_s": 3600}))
print("reading", flush=True)
time.sleep(3600)
"""


def test_no_dmon_outlives_a_server_killed_with_sigkill(
    dcgmi: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A silent dmon never meets a broken pipe: only the kernel can end it with its server.
    dcgmi("silent:2")
    pids, silent = tmp_path / "pids", tmp_path / "silent"
    monkeypatch.setenv("FAKE_DCGMI_PIDS", str(pids))
    monkeypatch.setenv("FAKE_DCGMI_SILENT", str(silent))
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # not our group: only its own death counts
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "reading"
        [dmon] = _pids(pids)
        assert _until(lambda: _pids(silent) == [dmon])  # it has printed all it will: no pipe to break
        assert not _gone(dmon)
        server.kill()
        server.wait(WAIT_S)
        assert _until(lambda: _gone(dmon)), f"dmon {dmon} outlived its server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(WAIT_S)
        if server.stdout is not None:
            server.stdout.close()
        _kill_all(_pids(pids))
