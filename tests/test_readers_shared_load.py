"""Worker processes sharing their window-seconds per node through one directory (real processes)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import pytest

from giul_asgi.errors import ConfigError
from giul_asgi.shared_load import SharedLoad


def worker(directory: str, integral: float, open_now: int, ready: Any, stop: str) -> None:
    table = SharedLoad(directory)
    table.publish({"gpu0": (integral, open_now), "gpu1": (1.0, 0)}, t=100.0)
    ready.set()
    deadline = time.monotonic() + 30
    while not os.path.exists(stop) and time.monotonic() < deadline:  # a file, not an Event:
        time.sleep(0.01)  # a killed waiter would wedge a shared Event for the survivors
    table.close()


@pytest.fixture
def ctx() -> Any:
    return mp.get_context("spawn")


def start(ctx: Any, directory: Path, integral: float, open_now: int, stop: Path) -> Any:
    ready = ctx.Event()
    proc = ctx.Process(target=worker, args=(str(directory), integral, open_now, ready, str(stop)),
                       daemon=True)
    proc.start()
    assert ready.wait(30)
    return proc


def test_others_sum_live_workers_extrapolated_and_keep_the_dead_frozen(ctx: Any, tmp_path: Path) -> None:
    table = tmp_path / "table"
    stop_a, stop_b = tmp_path / "stop-a", tmp_path / "stop-b"
    a = start(ctx, table, 10.0, 2, stop_a)
    b = start(ctx, table, 5.0, 0, stop_b)
    me = SharedLoad(table)
    me.publish({"gpu0": (99.0, 1)}, t=100.0)
    try:
        assert me.others("gpu0", t=100.0) == pytest.approx(15.0)  # my own row is not counted
        assert me.others("gpu0", t=101.0) == pytest.approx(17.0)  # a had 2 windows open for 1 s more
        assert me.others("gpu1", t=101.0) == pytest.approx(2.0)
        assert me.others("unknown-node", t=100.0) == 0.0
        a.kill()
        a.join(10)
        after = me.others("gpu0", t=102.0)
        assert after == pytest.approx(12.0 + 5.0)  # a frozen at its last seen value, never dropped
        files = sorted(p.name for p in table.iterdir())
        assert len(files) == 3  # a's file kept through the grace period
        stop_b.touch()
        b.join(10)
        assert me.others("gpu0", t=103.0) == pytest.approx(12.0 + 5.0)  # b left cleanly: frozen too
    finally:
        stop_a.touch()
        stop_b.touch()
        for p in (a, b):
            p.join(10)
        me.close()


def test_dead_files_are_cleaned_after_the_grace_period(tmp_path: Path) -> None:
    dead = tmp_path / "giul-load-999999-1.json"
    dead.write_text('{"pid": 999999, "start": "1", "t": 0.0, "nodes": {"n": [4.0, 0]}}')
    (tmp_path / "giul-load-junk.json").write_text("{not json")
    me = SharedLoad(tmp_path, grace_s=10.0)
    assert me.others("n", t=5.0) == 0.0 and dead.exists()  # never seen alive: nothing to keep
    assert me.others("n", t=20.0) == 0.0 and not dead.exists()


def test_a_reused_pid_is_not_the_dead_worker(tmp_path: Path) -> None:
    mine = tmp_path / f"giul-load-{os.getpid()}-0.json"  # our pid, but another start time
    row = f'{{"pid": {os.getpid()}, "start": "0", "t": {time.monotonic()}, "nodes": {{"n": [3.0, 0]}}}}'
    mine.write_text(row)
    assert SharedLoad(tmp_path).others("n") == 0.0


def test_no_directory_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GIUL_ASGI_LOAD_DIR", raising=False)
    with pytest.raises(ConfigError, match="GIUL_ASGI_LOAD_DIR"):
        SharedLoad()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot use"):
        SharedLoad(blocker / "sub")
    monkeypatch.setenv("GIUL_ASGI_LOAD_DIR", str(tmp_path / "env"))
    assert SharedLoad().directory == tmp_path / "env"
