"""Reads power from one long-running ``nvidia-smi`` per node, where NVML is not importable.

Some hosts have the driver and ``nvidia-smi`` but no usable Python binding (a locked-down
image, a sidecar). Spawning ``nvidia-smi`` per reading costs tens of milliseconds; instead
one process per reader runs ``nvidia-smi --query-gpu=index,power.draw.instant,power.draw
--format=csv,noheader,nounits -lms N`` and a background thread parses its lines as they
come. ``read`` only looks at the latest line of each GPU: it never waits on the process.

``power.draw.instant`` is preferred; where a GPU prints ``[N/A]`` for it, its
``power.draw`` (averaged over about a second on H100-class cards) is used and ``notes``
says so; where the driver rejects the field altogether, the process is restarted without
it. ``[N/A]`` and ``[Not Supported]`` are unknown (None), never 0. When the process dies it
is restarted with exponential back-off; meanwhile readings go stale and become gaps.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import Literal

from ..errors import ReaderUnavailable
from .base import Kind, ReaderSpec, Reading
from .children import dying_with_us
from .options import Options

OPTIONS = ("binary", "interval_ms", "backoff_s", "backoff_max_s", "stale_s")
WITH_INSTANT = "index,power.draw.instant,power.draw"
WITHOUT_INSTANT = "index,power.draw"


def parse_value(text: str) -> float | None:
    """A CSV cell as watts; ``[N/A]``, ``[Not Supported]``, blanks and junk are None."""
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NA"):
        return None
    try:
        value = float(text.split()[0])
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class SmiReader:
    """Sums the node's GPUs' power from a long-running ``nvidia-smi`` loop.

    Options: ``binary`` (``nvidia-smi``, looked up on PATH), ``interval_ms`` (from
    ``spec.period``, else 100), ``stale_s`` (a line older than this is a gap; 3 intervals,
    at least 1 s), ``backoff_s`` (0.5) and ``backoff_max_s`` (30) for restarts.
    """

    backend = "smi"
    source = "local"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "power"

    def __init__(self, spec: ReaderSpec) -> None:
        opts = Options(spec.options, "smi", OPTIONS)
        name = opts.text("binary", "nvidia-smi") or "nvidia-smi"
        binary = shutil.which(name)
        if binary is None:
            raise ReaderUnavailable(
                f"{name} not found on PATH",
                remedy="install the NVIDIA driver utilities, give options.binary, or use reader='nvml'",
            )
        interval_ms = int(opts.number("interval_ms", (spec.period or 0.1) * 1000, minimum=1))
        self.binary = binary
        self.interval_ms = interval_ms
        self.period = interval_ms / 1000
        self.stale_s = opts.number("stale_s", max(3 * self.period, 1.0))
        self.backoff_s = opts.number("backoff_s", 0.5)
        self.backoff_max_s = opts.number("backoff_max_s", 30.0)
        self.clock: Callable[[], float] = spec.clock
        self.gpus = tuple(spec.gpus)
        self.fields = WITH_INSTANT
        self.notes: list[str] = []
        self.starts = 0
        self.last_error: str | None = None
        self._latest: dict[int, tuple[float, float | None]] = {}
        self._averaged: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="giul-smi", daemon=True)
        self._thread.start()

    def command(self) -> list[str]:
        cmd = [self.binary, f"--query-gpu={self.fields}", "--format=csv,noheader,nounits",
               "-lms", str(self.interval_ms)]
        if self.gpus:
            cmd += ["-i", ",".join(str(g) for g in self.gpus)]
        return cmd

    def _parse(self, line: str) -> None:
        cells = line.strip().split(",")
        if len(cells) != len(self.fields.split(",")):
            return
        try:
            index = int(cells[0])
        except ValueError:
            return
        instant = parse_value(cells[1]) if self.fields == WITH_INSTANT else None
        average = parse_value(cells[-1])
        watts = instant if instant is not None else average
        if instant is None and average is not None and index not in self._averaged:
            self._averaged.add(index)
            self.notes.append(f"GPU {index}: power.draw (averaged), instant power unknown")
        with self._lock:
            self._latest[index] = (self.clock(), watts)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                argv, preexec = dying_with_us(self.command())  # a stuck one outlived a killed server
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, bufsize=1, preexec_fn=preexec)
            except OSError as exc:
                self.last_error = f"could not start {self.binary}: {exc}"
            else:
                self._proc = proc
                self.starts += 1
                lines = 0
                assert proc.stdout is not None and proc.stderr is not None
                for line in proc.stdout:
                    if self._stop.is_set():
                        proc.terminate()
                        break
                    self._parse(line)
                    lines += 1
                code = proc.wait()
                stderr = proc.stderr.read()[:500].strip()
                proc.stdout.close()
                proc.stderr.close()
                if self._stop.is_set():
                    return
                if self.fields == WITH_INSTANT and "not a valid field" in stderr:
                    self.fields = WITHOUT_INSTANT
                    self.notes.append("this nvidia-smi has no power.draw.instant: reading power.draw "
                                      "(averaged)")
                    continue
                self.last_error = f"nvidia-smi exited with {code}" + (f": {stderr}" if stderr else "")
                if lines:
                    failures = 0
            failures += 1
            self._stop.wait(min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1)))

    def read(self) -> Reading:
        now = self.clock()
        with self._lock:
            latest = dict(self._latest)
        wanted = self.gpus or tuple(sorted(latest))
        if not wanted:
            return Reading(t=now, error=self.last_error or "no line from nvidia-smi yet")
        total = 0.0
        newest = -math.inf
        for gpu in wanted:
            seen = latest.get(gpu)
            if seen is None or now - seen[0] > self.stale_s:
                why = f"; {self.last_error}" if self.last_error else ""
                return Reading(t=now, error=f"no fresh nvidia-smi line for GPU {gpu}{why}")
            if seen[1] is None:
                return Reading(t=now, error=f"nvidia-smi reports no power for GPU {gpu} ([N/A])")
            total += seen[1]
            newest = max(newest, seen[0])
        return Reading(t=newest, watts=total)

    def close(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(2)
        self._thread.join(3)


__all__ = ["SmiReader", "parse_value"]

