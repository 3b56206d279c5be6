"""The nvidia-smi stream reader against a fake `nvidia-smi` on PATH that prints CSV and sometimes dies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from giul_asgi.errors import ConfigError, ReaderUnavailable
from giul_asgi.readers.base import Reader, ReaderSpec, Reading
from giul_asgi.readers.registry import READERS
from giul_asgi.readers.smi import SmiReader, parse_value

FAKE = Path(__file__).parent / "fixtures" / "fake-smi"


@pytest.fixture(autouse=True)
def fake_smi_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKE}:{os.environ['PATH']}")


def first_ok(reader: SmiReader, timeout: float = 10.0) -> Reading:
    deadline = time.monotonic() + timeout
    reading = reader.read()
    while not reading.ok and time.monotonic() < deadline:
        time.sleep(0.02)
        reading = reader.read()
    return reading


def test_instant_power_summed_over_the_nodes_gpus() -> None:
    reader = READERS["smi"](ReaderSpec(gpus=(0, 1), period=0.02))
    try:
        reading = first_ok(reader)  # type: ignore[arg-type]
    finally:
        reader.close()
    assert isinstance(reader, Reader)
    assert (reader.kind, reader.backend, reader.source) == ("power", "smi", "local")
    assert reading.watts == pytest.approx(100.0 + 110.0)
    assert "-lms" in reader.command() and "20" in reader.command()  # type: ignore[attr-defined]


def test_na_instant_falls_back_to_power_draw_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_MODE", "na")
    reader = SmiReader(ReaderSpec(gpus=(1,), period=0.02))
    try:
        reading = first_ok(reader)
    finally:
        reader.close()
    assert reading.watts == pytest.approx(105.0)
    assert any("averaged" in n for n in reader.notes)


def test_a_driver_without_the_instant_field_is_restarted_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_MODE", "noinstant")
    reader = SmiReader(ReaderSpec(gpus=(0,), period=0.02))
    try:
        reading = first_ok(reader)
    finally:
        reader.close()
    assert reading.watts == pytest.approx(95.0) and reader.fields == "index,power.draw"
    assert any("no power.draw.instant" in n for n in reader.notes)


def test_no_power_at_all_is_a_gap_never_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_MODE", "allna")
    reader = SmiReader(ReaderSpec(gpus=(0,), period=0.02))
    try:
        deadline = time.monotonic() + 10
        reading = reader.read()
        while "[N/A]" not in (reading.error or "") and time.monotonic() < deadline:
            time.sleep(0.02)
            reading = reader.read()
    finally:
        reader.close()
    assert reading.watts is None and "[N/A]" in (reading.error or "")


def test_a_dying_process_is_restarted_with_back_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    monkeypatch.setenv("FAKE_SMI_DIE_AFTER", "2")
    monkeypatch.setenv("FAKE_SMI_STARTS", str(starts))
    reader = SmiReader(ReaderSpec(gpus=(0,), period=0.01, options={"backoff_s": 0.01, "backoff_max_s": 0.05}))
    try:
        deadline = time.monotonic() + 10
        def count() -> int:
            return len(starts.read_text().splitlines()) if starts.exists() else 0

        while count() < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first_ok(reader).ok
    finally:
        reader.close()
    assert len(starts.read_text().splitlines()) >= 3
    assert reader.last_error is not None and "exited with 1" in reader.last_error


def test_stale_lines_become_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_DIE_AFTER", "1")
    clock = [0.0]
    reader = SmiReader(ReaderSpec(gpus=(0,), period=0.01, clock=lambda: clock[0],
                                  options={"backoff_s": 60.0, "stale_s": 1.0}))
    try:
        assert first_ok(reader).ok
        clock[0] += 5.0  # the process died and is backing off: nothing new
        reading = reader.read()
    finally:
        reader.close()
    assert reading.error is not None and "no fresh nvidia-smi line for GPU 0" in reading.error


def test_missing_binary_and_bad_options() -> None:
    with pytest.raises(ReaderUnavailable, match="not found on PATH"):
        SmiReader(ReaderSpec(options={"binary": "no-such-nvidia-smi"}))
    with pytest.raises(ConfigError, match="'interval_ms' must be > 1"):
        SmiReader(ReaderSpec(options={"interval_ms": 0}))
    with pytest.raises(ConfigError, match="unknown option 'loop'"):
        SmiReader(ReaderSpec(options={"loop": 1}))


@pytest.mark.parametrize(
    ("text", "value"),
    [(" 412.61", 412.61), ("[N/A]", None), ("N/A", None), ("[Not Supported]", None), ("", None),
     ("69.84 W", 69.84), ("nan", None), ("-3", None), ("junk", None)],
)
def test_parse_value(text: str, value: float | None) -> None:
    assert parse_value(text) == value


SERVER = """
import time
from giul_asgi.readers.base import ReaderSpec
from giul_asgi.readers.smi import SmiReader
reader = SmiReader(ReaderSpec(gpus=(0,), period=0.05))
print("reading", flush=True)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_no_stuck_nvidia_smi_outlives_a_server_killed_with_sigkill(tmp_path: Path) -> None:
    """A healthy nvidia-smi dies of a broken pipe once its server is gone; one stuck in the
    driver never writes again and lived on under pid 1 (a hostile trial). It dies with its
    server, as dmon does."""
    pids = tmp_path / "pids"
    env = {**os.environ, "FAKE_SMI_PIDS": str(pids), "FAKE_SMI_HANG": "2",
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)  # not our group: only its own death counts
    smi: list[int] = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "reading"
        deadline = time.monotonic() + 20
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        smi = [int(x) for x in pids.read_text().split()]
        time.sleep(0.5)  # it has printed all it will: no pipe to break
        assert all(_alive(pid) for pid in smi)
        server.kill()
        server.wait(20)
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in smi) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in smi), f"nvidia-smi {smi} outlived its server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(20)
        if server.stdout is not None:
            server.stdout.close()
        for pid in smi:
            with contextlib.suppress(OSError):
                if b"nvidia-smi" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
