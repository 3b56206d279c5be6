"""The reader gets its readings at the counter's steps while the event loop runs Python flat
out (issue 22 item 2), and the GIL's switch interval it runs under is said and put back.

The saturated loop is real (2 ms slices of Python with ``await asyncio.sleep(0)`` between, as
a busy gateway's loop does) and so is the reader thread; what is asserted is a count of the
counter's steps read and the windows' figures, never a speed, with a wide margin: 24-25 of
24-25 steps, ten runs in ten, on a 2-core machine at load 1 and at load 8-10. The reader as it
was (ten reads a period at random phases, CPython's 5 ms switch interval) read 1-2 of 24-25
at load 1, 4 runs in 4 (at load 9 it read 23-25: a loaded machine hides the starvation).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import time
from pathlib import Path

import pytest

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.readers.base import Reading
from giul_asgi.readers.nvml import NvmlReader
from giul_asgi.switch import CPYTHON_S, ENV, INTERVAL_S, STARTING_S, Switch, configured

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_nvml import FakeGpu, FakeNvml, LiveGpu

STEP_S = 0.05
SLICE_S = 0.002
WINDOW_S = 0.3


class ReleasingNvml(FakeNvml):
    """The counter read as the real library reads it: the register's value, then the rest of
    the driver call with the GIL let go (ctypes), 20 us."""

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        value = super().nvmlDeviceGetTotalEnergyConsumption(gpu)
        time.sleep(20e-6)
        return value


class Recording(NvmlReader):
    """NvmlReader that keeps every reading it gives."""

    readings: list[Reading]

    def read(self) -> Reading:
        reading = super().read()
        self.readings.append(reading)
        return reading


async def _saturated(ledger: Ledger, seconds: float) -> tuple[float, float, list[tuple[Energy, Energy]]]:
    """Windows of WINDOW_S one after another while the loop runs Python flat out beside them;
    (start, end, each window's first and settled figures)."""
    stop = asyncio.Event()

    async def saturate() -> None:
        while not stop.is_set():
            until = time.perf_counter() + SLICE_S
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(0)

    busy = asyncio.create_task(saturate())
    start = time.monotonic()
    meters = []
    while time.monotonic() - start < seconds - WINDOW_S:
        meter = Meter(ledger)
        meter.open()
        await asyncio.sleep(WINDOW_S)
        meter.close()
        meters.append((meter, meter.figure()))
    end = time.monotonic()
    figures = [(first, await meter.settled(timeout=20.0)) for meter, first in meters]
    stop.set()
    await busy
    return start, end, figures


def test_a_saturated_loop_leaves_the_reader_its_reads_at_every_step() -> None:
    gpu = LiveGpu(watts=150.0, step_s=STEP_S, processes=[])
    reader = Recording((0,), nvml=ReleasingNvml([gpu]))
    reader.readings = []
    ledger = Ledger(Node("saturated", idle_w=60.0, period_s=0.1), reader)
    ledger.ensure_started()
    try:
        deadline = time.monotonic() + 20.0
        while ledger.tape is None or ledger.tape.steps.period is None:  # the schedule is learnt
            assert time.monotonic() < deadline, "the reader never learnt the counter's period"
            time.sleep(0.05)
        start, end, figures = asyncio.run(_saturated(ledger, 1.5))
    finally:
        ledger.stop(5.0)
    seen = {r.joules for r in reader.readings if r.ok and start <= r.t <= end}
    steps = math.floor(end / STEP_S) - math.floor(start / STEP_S)
    assert len(seen) >= 0.8 * steps, f"{len(seen) - 1} of {steps} steps read beside the saturated loop"
    assert figures and all(first.joules is not None for first, _ in figures), figures
    assert all(settled.joules is not None and settled.settled for _, settled in figures), figures


class Interval:
    def __init__(self, value: float = CPYTHON_S) -> None:
        self.value = value
        self.puts: list[float] = []

    def get(self) -> float:
        return self.value

    def put(self, value: float) -> None:
        self.value = round(value * 1e6) * 1e-6  # as CPython keeps it: whole microseconds
        self.puts.append(value)

    def switch(self, env: dict[str, str] | None = None) -> Switch:
        """A switch over this interval, with ``env`` as the process's environment."""
        return Switch(self.get, self.put, env=env if env is not None else {})


def test_the_switch_interval_is_lowered_while_readers_run_and_said(caplog: pytest.LogCaptureFixture) -> None:
    interval = Interval()
    switch = interval.switch()
    with caplog.at_level(logging.INFO, logger="giul_asgi.poller"):
        switch.join("a")
        switch.join("b")
    # Set once, by the first; the starting interval until both have read.
    assert interval.puts == [INTERVAL_S, STARTING_S] and switch.lowered == STARTING_S
    assert caplog.text.count(ENV) == 1 and "GIL switch interval is 0.001 s (CPython's 0.005)" in caplog.text
    assert f"(pid {os.getpid()})" in caplog.text  # under uvicorn --workers, which worker says so
    switch.started()
    assert interval.value == pytest.approx(STARTING_S)  # "b" has not read yet
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S) and switch.lowered == INTERVAL_S
    switch.leave()
    assert interval.value == pytest.approx(INTERVAL_S)  # another reader still runs
    switch.leave()
    assert interval.value == pytest.approx(CPYTHON_S) and switch.lowered is None


def test_the_switch_interval_is_left_alone_when_off_or_the_applications_own() -> None:
    interval = Interval()
    switch = interval.switch({ENV: "off"})
    switch.join("a")
    switch.leave()
    assert interval.puts == []
    chosen = Interval(0.01)  # the application chose its own
    switch = chosen.switch()
    switch.join("a")
    switch.leave()
    assert chosen.puts == []


def test_a_reader_starts_at_the_starting_interval_and_reads_at_the_steady_one() -> None:
    # A reader's start is a hundred hand-overs of the GIL (NVML's, the card's table): beside a
    # loop running Python flat out, each waits up to the interval.
    interval = Interval()
    switch = interval.switch()
    switch.join("a")
    assert interval.value == pytest.approx(STARTING_S)
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S)
    switch.join("b")  # a second node's reader starts later: its start hurried too
    assert interval.value == pytest.approx(STARTING_S)
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S)
    switch.leave()
    switch.leave()
    assert interval.value == pytest.approx(CPYTHON_S)
    # An interval the operator gave is kept throughout; one the application sets during the
    # start is left as it is.
    given = Interval()
    switch = given.switch({ENV: "0.002"})
    switch.join("a")
    switch.started()
    assert given.puts == [0.002]
    switch.leave()
    meanwhile = Interval()
    switch = meanwhile.switch()
    switch.join("a")
    meanwhile.value = 0.01
    switch.started()
    switch.leave()
    assert meanwhile.value == pytest.approx(0.01) and switch.lowered is None


def test_another_thread_s_run_of_hand_overs_is_hurried_and_the_steady_interval_comes_back() -> None:
    # The statistics' row writer: woken and its run of system calls hurried (each a hand-over
    # of the GIL beside a loop running Python flat out), then the reader's steady interval.
    interval = Interval()
    switch = interval.switch()
    switch.join("a")
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S)
    switch.hurry()  # the tail asked for a row
    assert interval.value == pytest.approx(STARTING_S)
    with switch.hurried():  # the row written
        assert interval.value == pytest.approx(STARTING_S)
    assert interval.value == pytest.approx(STARTING_S)  # the wake-up's hurry still holds
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S)
    with pytest.raises(RuntimeError), switch.hurried():
        raise RuntimeError("a row that failed")
    assert interval.value == pytest.approx(INTERVAL_S)
    switch.leave()
    assert interval.value == pytest.approx(CPYTHON_S)
    # No reader, or an interval the operator gave: nothing is changed.
    alone = Interval()
    with alone.switch().hurried():
        pass
    given = Interval()
    switch = given.switch({ENV: "0.002"})
    switch.join("a")
    switch.started()
    with switch.hurried():
        assert given.value == pytest.approx(0.002)
    assert alone.puts == [] and given.puts == [0.002]
    # The operator's 0.001 is theirs too, though it is the default's value (a hostile review).
    same = Interval()
    switch = same.switch({ENV: "0.001"})
    switch.join("a")
    with switch.hurried():
        assert same.value == pytest.approx(0.001)
    assert same.puts == [0.001]


def test_a_forked_child_starts_from_cpython_s_interval_with_no_counts() -> None:
    # A child forked while the parent's reader ran (or its row writer hurried) has none of
    # the parent's threads: it stayed at 0.2 ms for good (a hostile review), and at 1 ms.
    interval = Interval()
    switch = interval.switch()
    switch.join("a")
    switch.hurry()
    assert interval.value == pytest.approx(STARTING_S)
    switch.after_fork()  # what os.register_at_fork runs in the child
    assert interval.value == pytest.approx(CPYTHON_S) and switch.lowered is None
    switch.join("child")
    switch.started()
    assert interval.value == pytest.approx(INTERVAL_S)
    switch.leave()
    assert interval.value == pytest.approx(CPYTHON_S)


def test_a_change_meanwhile_is_not_undone() -> None:
    interval = Interval()
    switch = interval.switch({ENV: "0.002"})
    switch.join("a")
    assert interval.value == pytest.approx(0.002)
    interval.value = 0.01  # the application set its own meanwhile
    switch.leave()
    assert interval.value == pytest.approx(0.01)


def test_the_setting_reads_off_seconds_or_the_default() -> None:
    assert configured({}) == INTERVAL_S
    assert configured({ENV: "off"}) is None
    assert configured({ENV: "0.0005"}) == 0.0005
    assert configured({ENV: "fast"}) == INTERVAL_S
    # The middleware's build refuses what configured() warns of (test_startup: a real uvicorn).
    from giul_asgi.errors import ConfigError
    from giul_asgi.switch import check_environment

    for bad in ("fast", "2", "-0.1"):
        with pytest.raises(ConfigError, match="neither off nor seconds"):
            check_environment({ENV: bad})
    for fine in ("", "off", "0", "0.0005"):
        check_environment({ENV: fine})
