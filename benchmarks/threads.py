"""What this process's threads did, from Linux's own books: CPU, run-queue wait, switches.

``/proc/self/task/TID/schedstat`` gives a thread's time on a CPU and its time runnable but
waiting for one (ns); ``/proc/self/task/TID/status`` its voluntary switches (it blocked: a
sleep, a lock, the GIL) and involuntary ones (preempted). A main thread that runs an event
loop flat out blocks only to wait for the GIL or a lock another thread holds, so its wall
time minus CPU minus run-queue wait is the time those waits cost it. Elsewhere than Linux
every figure is nan.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ThreadTimes:
    """One or more threads' books at an instant (or, subtracted, over a span)."""

    wall_s: float
    cpu_s: float
    queued_s: float
    voluntary: int
    involuntary: int

    def __sub__(self, before: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.wall_s - before.wall_s, self.cpu_s - before.cpu_s,
                           self.queued_s - before.queued_s, self.voluntary - before.voluntary,
                           self.involuntary - before.involuntary)


_NONE = ThreadTimes(0.0, math.nan, math.nan, 0, 0)


def thread_times(native_ids: list[int]) -> ThreadTimes:
    """The summed books of the threads with these native ids (nan where unreadable)."""
    cpu = queued = 0.0
    voluntary = involuntary = 0
    found = False
    for tid in native_ids:
        try:
            sched = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        found = True
        cpu += int(sched[0]) / 1e9
        queued += int(sched[1]) / 1e9
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    if not found:
        return ThreadTimes(time.perf_counter(), _NONE.cpu_s, _NONE.queued_s, 0, 0)
    return ThreadTimes(time.perf_counter(), cpu, queued, voluntary, involuntary)


def named_thread_times(prefix: str, *, exact: bool = False) -> ThreadTimes:
    """The books of every live thread whose name starts with ``prefix`` (is it: ``exact``)."""
    return thread_times([t.native_id for t in threading.enumerate()
                         if (t.name == prefix if exact else t.name.startswith(prefix))
                         and t.native_id is not None])


def name_os_threads(prefix: str = "giul-", every_s: float = 0.2) -> None:
    """Give this process's threads whose Python name starts with ``prefix`` that name in
    the OS too (``/proc/self/task/TID/comm``, 15 bytes), now and every ``every_s`` from a
    daemon thread: Python 3.11 does not, and :func:`process_thread_cpu` finds a server's
    reader thread from outside by it. For benchmark servers only."""

    def name() -> None:
        for thread in threading.enumerate():
            if thread.name.startswith(prefix) and thread.native_id is not None:
                with contextlib.suppress(OSError):
                    Path(f"/proc/self/task/{thread.native_id}/comm").write_text(thread.name[:15])

    def loop() -> None:
        while True:
            name()
            time.sleep(every_s)

    threading.Thread(target=loop, name="bench-thread-names", daemon=True).start()


def process_thread_cpu(pid: int, prefix: str) -> float:
    """CPU seconds (user + system) of another process's threads whose name starts with
    ``prefix`` (Linux ``/proc/PID/task/*/stat``; a thread's name is cut to 15 bytes there),
    or nan where unreadable."""
    total, found = 0.0, False
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return math.nan
    for task in tasks:
        try:
            if not (task / "comm").read_text().strip().startswith(prefix[:15]):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found = True
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total if found else math.nan


def main_thread_times() -> ThreadTimes:
    native = threading.main_thread().native_id
    return thread_times([native] if native is not None else [])


__all__ = ["ThreadTimes", "main_thread_times", "name_os_threads", "named_thread_times", "process_thread_cpu",
           "thread_times"]
