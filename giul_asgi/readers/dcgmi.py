"""Reads a node's GPUs from the local DCGM host engine by streaming ``dcgmi dmon``.

Where DCGM runs but no dcgm-exporter does (or its 30 s collection is too coarse), one
``dcgmi dmon -e 155,156 -d <ms>`` per node streams each GPU's power (field 155,
``DCGM_FI_DEV_POWER_USAGE``, W) and total energy (field 156,
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ since the driver loaded) every ``<ms>``. Its
output, line by line::

    #Entity   POWER        TOTEC
    ID        W            mJ
    GPU 0     63.412       123456789
    GPU 1     N/A          123000456

A header (``#Entity`` with the fields' short names) and a units line (``ID ...``) come first
and may come again; each sample is one row per GPU; ``N/A`` is a value the engine does not
have, never a zero. A thread reads the rows as they come and keeps the latest complete sample
(every GPU of the node once); :meth:`DcgmiReader.read` answers from it at once, so the
poller never waits on the pipe. The counter (TOTEC) is read where every GPU gives it, else
the power (POWER), which the tape integrates.

When ``dcgmi`` dies mid-run it is started again after a back-off (doubling, bounded), and
reads are failed readings meanwhile, saying why. A ``dcgmi`` that stops printing without
exiting (a wedged host engine) is the same failure: no sample for ``stale_s`` (none within
``start_timeout_s`` of a launch) and its process group is ended and started again.

No ``dcgmi`` outlives the server that started it, however the server ends: each is started
in a process group of its own (ended whole on close and restart) and, on Linux, through a
tiny wrapper that asks the kernel for ``SIGKILL`` when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``) before it execs ``dcgmi``. A server
killed with -9 takes its dmon with it, even a silent one that would never meet a broken
pipe. Errors are typed, each with its remedy (the
three the seed's reader contract names, plus a stream that fails):
:class:`HostEngineUnavailable` (``nv-hostengine`` not reachable), :class:`WatchHeldByExporter`
(dcgm-exporter already holds the watch), :class:`FieldsNotReserved` (the engine would not
watch the fields), :class:`DmonStreamError` (no ``dcgmi``, or a stream that exits, hangs or
prints garbage). At build they are raised; later they are the failed readings' text.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import ReaderUnavailable
from .base import Kind, ReaderSpec, Reading
from .children import dying_with_us
from .options import Options

FIELDS = "155,156"  # DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ)
POWER, ENERGY = "POWER", "TOTEC"
DEFAULT_INTERVAL_MS = 100
OPTIONS = ("dcgmi", "host", "interval_ms", "start_timeout_s", "backoff_s", "backoff_max_s", "kind",
           "stale_s")
#: Lines of output kept to explain a failure.
KEEP_LINES = 8
#: A line longer than this is not dmon output (read on without holding it).
MAX_LINE = 64 * 1024
class DcgmiError(ReaderUnavailable):
    """``dcgmi dmon`` could not give this node's fields."""


class HostEngineUnavailable(DcgmiError):
    """``nv-hostengine`` is not reachable on its socket (or at ``options["host"]``)."""


class WatchHeldByExporter(DcgmiError):
    """Another DCGM client (dcgm-exporter, as a rule) already holds the watch."""


class FieldsNotReserved(DcgmiError):
    """The host engine would not watch fields 155 and 156 for us."""


class DmonStreamError(DcgmiError):
    """The ``dcgmi dmon`` stream is missing, exited, hung or printed what is not dmon output."""


_HOST_ENGINE = re.compile(
    r"host ?engine|unable to establish a connection|connection to the specified host|"
    r"unable to connect|connection (refused|invalid)", re.IGNORECASE)
_IN_USE = re.compile(r"in use|already (being )?watch|another (client|consumer|process)|dcgm-exporter",
                     re.IGNORECASE)
_WATCH = re.compile(r"set(ting)? (the )?watch|watch(es)? (failed|could not)|reserve|"
                    r"not (a )?valid field|unknown field|field .*not supported|insufficient permission|"
                    r"requires root|not supported", re.IGNORECASE)


def classify(output: str, host: str | None) -> DcgmiError | None:
    """The typed error that ``dcgmi``'s own words describe, or None when they name none."""
    where = f"at {host}" if host else "on this host's socket"
    text = " ".join(output.split())
    if _HOST_ENGINE.search(output):
        return HostEngineUnavailable(
            f"dcgmi could not reach the DCGM host engine {where}: {text}",
            remedy="start it (sudo systemctl start nvidia-dcgm, or nv-hostengine), or set the node's "
                   "options.host to where one runs")
    if _IN_USE.search(output):
        return WatchHeldByExporter(
            f"another DCGM client, dcgm-exporter as a rule, already holds the watch: {text}",
            remedy="read that exporter instead (reader='dcgm', url='http://host:9400/metrics'), or stop "
                   "its profiling collectors")
    if _WATCH.search(output):
        return FieldsNotReserved(
            f"the DCGM host engine would not watch fields {FIELDS} for us: {text}",
            remedy="check the fields exist here (dcgmi dmon -l; 156 needs Volta or newer) and that this "
                   "user may watch them; else use reader='nvml'")
    return None


@dataclass(frozen=True, slots=True)
class Sample:
    """One complete sample: every GPU of the node once, summed."""

    t: float
    joules: float | None
    watts: float | None


class DmonParser:
    """``dcgmi dmon`` lines in, complete samples out; garbage and errors kept for the record."""

    def __init__(self, gpus: tuple[int, ...]) -> None:
        self.wanted: set[int] | None = set(gpus) or None  # None: learnt from the first sample
        self.columns: list[str] | None = None
        self._rows: dict[int, tuple[float | None, float | None]] = {}
        self.others: deque[str] = deque(maxlen=KEEP_LINES)  # lines that were not rows
        self.garbage = 0

    def feed(self, line: str, t: float) -> Sample | None:
        text = line.strip()
        if not text:
            return None
        if text.startswith("#"):
            names = text.lstrip("#").split()
            if names and names[0].lower() == "entity":
                self.columns = names[1:]
                return None
        if text.split()[0] == "ID":
            return None  # the units line
        row = self._row(text)
        if row is None:
            self.garbage += 1
            self.others.append(text)
            return None
        gpu, values = row
        if gpu in self._rows:  # a GPU again before the sample was whole: a new sample began
            if self.wanted is None:
                self.wanted = set(self._rows)
            self._rows = {}
        if self.wanted is not None and gpu not in self.wanted:
            return None
        self._rows[gpu] = values
        if self.wanted is None or set(self._rows) != self.wanted:
            return None
        rows, self._rows = self._rows, {}
        energy = [e for e, _ in rows.values()]
        power = [w for _, w in rows.values()]
        return Sample(
            t,
            None if None in energy else sum(e for e in energy if e is not None) / 1000.0,
            None if None in power else sum(w for w in power if w is not None),
        )

    def _row(self, text: str) -> tuple[int, tuple[float | None, float | None]] | None:
        parts = text.split()
        if self.columns is None or len(parts) != 2 + len(self.columns) or parts[0] != "GPU":
            return None
        try:
            gpu = int(parts[1])
            values = dict(zip(self.columns, (_value(v) for v in parts[2:]), strict=True))
        except ValueError:
            return None
        if ENERGY not in values or POWER not in values:
            return None
        return gpu, (values[ENERGY], values[POWER])


def _value(text: str) -> float | None:
    if text.upper() in ("N/A", "NA"):
        return None
    value = float(text)
    if value != value or value < 0:
        raise ValueError(text)
    return value


class DcgmiReader:
    """One ``dcgmi dmon`` per node, its GPUs summed into one counter (or one power gauge).

    ``spec.gpus`` are DCGM's GPU ids (empty: every GPU dmon shows), ``spec.period`` the
    sampling interval when ``interval_ms`` is not given. Options: ``dcgmi`` (the executable,
    ``dcgmi`` on PATH), ``host`` (the host engine, default the local socket), ``interval_ms``
    (100), ``start_timeout_s`` (5: the first sample must come by then), ``backoff_s`` (0.5)
    and ``backoff_max_s`` (30) between restarts, ``stale_s`` (no sample for this long is a
    failed read; 1 s + 5 intervals), ``kind`` (``counter`` | ``power``; by default the
    counter where every GPU gives it).
    """

    backend = "dcgm"
    source = "local"
    method: Literal["measured", "simulated"] = "measured"

    def __init__(self, spec: ReaderSpec) -> None:
        opts = Options(spec.options, "dcgmi", OPTIONS)
        executable = opts.text("dcgmi", "dcgmi") or "dcgmi"
        self.host = opts.text("host", None)
        default_ms = spec.period * 1000.0 if spec.period else DEFAULT_INTERVAL_MS
        self.interval_ms = max(1, round(opts.number("interval_ms", default_ms)))
        self.period = self.interval_ms / 1000.0
        self.poll_s = self.period / 2  # samples come once a period: reading faster learns nothing
        self.start_timeout_s = opts.number("start_timeout_s", 5.0)
        self.backoff_s = opts.number("backoff_s", 0.5)
        self.backoff_max_s = opts.number("backoff_max_s", 30.0)
        self.stale_s = opts.number("stale_s", 1.0 + 5 * self.period)
        forced = opts.raw.get("kind")
        wanted_kind = opts.choice("kind", ("counter", "power"), "counter")
        self.clock: Callable[[], float] = spec.clock
        self.gpus = tuple(spec.gpus)
        found = shutil.which(executable)
        if found is None:
            raise DmonStreamError(
                f"{executable!r} is not an executable on PATH",
                remedy="install DCGM (datacenter-gpu-manager) or name the executable in options.dcgmi; "
                       "or use reader='dcgm' (dcgm-exporter) or reader='nvml'")
        self.command = [found, "dmon", "-e", FIELDS, "-d", str(self.interval_ms)]
        if self.gpus:
            self.command += ["-i", ",".join(str(g) for g in self.gpus)]
        if self.host:
            self.command += ["--host", self.host]
        target = f"{self.host or 'the local host engine'}, GPUs {list(self.gpus) or 'all'}"
        self.remedy = f"check the DCGM host engine ({target}) and `{' '.join(self.command)}` by hand"
        self.notes: list[str] = [f"streaming `{' '.join(self.command)}`"]
        self.restarts = 0
        self._lock = threading.Lock()
        self._latest: Sample | None = None
        self._error: str | None = None
        self._failure: DcgmiError | None = None  # why the stream last ended, typed
        self._closed = threading.Event()
        self._first = threading.Event()  # a sample came, or the first run ended
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._pump, name="giul-dcgmi", daemon=True)
        self._thread.start()
        if not self._first.wait(self.start_timeout_s):
            self.close()
            raise DmonStreamError(
                f"`{' '.join(self.command)}` printed no sample within {self.start_timeout_s:g} s",
                remedy="run it by hand: a host engine that hangs, or GPU ids it does not have (dcgmi "
                       "discovery -l)")
        with self._lock:
            first, failure = self._latest, self._failure
        if first is None:
            self.close()
            raise failure or DmonStreamError(f"`{' '.join(self.command)}` gave no sample")
        self.kind: Kind
        if forced is not None:
            self.kind = "power" if wanted_kind == "power" else "counter"
        elif first.joules is None and first.watts is not None:
            self.kind = "power"
            self.notes.append("no total energy (field 156) from every GPU: reading power (field 155)")
        else:
            self.kind = "counter"

    # -- the stream -------------------------------------------------------------------------
    def _pump(self) -> None:
        """Run dmon, parse it line by line, and start it again after a back-off when it ends
        or falls silent."""
        backoff = self.backoff_s
        while not self._closed.is_set():
            parser = DmonParser(self.gpus)
            got = silent = False
            try:
                proc = _launch(self.command)
            except OSError as exc:
                failure: DcgmiError = DmonStreamError(f"could not start dcgmi: {exc}", remedy=self.remedy)
            else:
                self._proc = proc
                try:
                    got, silent = self._follow(proc, parser)
                finally:
                    _end(proc)  # silent, closed, or exited: nothing of its group stays behind
                    if proc.stdout is not None:
                        proc.stdout.close()
                code = _wait(proc)
                self._proc = None
                if self._closed.is_set():
                    return
                said = "\n".join(parser.others)
                if silent:
                    failure = DmonStreamError(
                        f"`{' '.join(self.command)}` printed no sample for {self.stale_s:g} s (silent, "
                        "not exited): ended it" if got else
                        f"`{' '.join(self.command)}` printed no sample within {self.start_timeout_s:g} s",
                        remedy=self.remedy)
                else:
                    failure = classify(said, self.host) or DmonStreamError(
                        f"dcgmi dmon exited (status {code})"
                        + (f" after printing {parser.garbage} line(s) that are not dmon output, the last: "
                           f"{parser.others[-1]!r}" if parser.others else ""),
                        remedy=self.remedy)
            if got:
                backoff = self.backoff_s
            with self._lock:
                self._failure = failure
                self._error = f"{failure.message}; restarting in {backoff:g} s -> {failure.remedy}"
            self._first.set()
            self.restarts += 1
            if self._closed.wait(backoff):
                return
            backoff = min(backoff * 2, self.backoff_max_s)

    def _follow(self, proc: subprocess.Popen[bytes], parser: DmonParser) -> tuple[bool, bool]:
        """Read dmon until it exits or falls silent: (whether a sample came, whether silent).
        No sample within ``start_timeout_s`` of the launch, or ``stale_s`` after the last, is
        silence; the pipe is watched with a bound, never read blindly."""
        stdout = proc.stdout
        if stdout is None:
            return False, False
        fd = stdout.fileno()
        got = False
        last = time.monotonic()
        pending = b""
        with selectors.DefaultSelector() as watch:
            watch.register(fd, selectors.EVENT_READ)
            while not self._closed.is_set():
                left = last + (self.stale_s if got else self.start_timeout_s) - time.monotonic()
                if left <= 0:
                    return got, True
                if not watch.select(min(left, 0.5)):
                    continue
                chunk = os.read(fd, 65536)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop() if chunk else b""
                if len(pending) > MAX_LINE:
                    lines.append(pending[:200])
                    pending = b""
                for line in lines:
                    sample = parser.feed(line.decode("utf-8", errors="replace"), self.clock())
                    if sample is None:
                        continue
                    got = True
                    last = time.monotonic()
                    with self._lock:
                        self._latest, self._error = sample, None
                    self._first.set()
                if not chunk:
                    return got, False  # it exited (or closed its output)
        return got, False

    # -- the reader ----------------------------------------------------------------------------
    def read(self) -> Reading:
        now = self.clock()
        with self._lock:
            sample, error = self._latest, self._error
        if error is not None:
            return Reading(t=now, error=error)
        if sample is None:
            return Reading(t=now, error="dcgmi dmon has given no sample yet")
        if now - sample.t > self.stale_s:
            return Reading(t=now, error=f"dcgmi dmon has printed no sample for {now - sample.t:.1f} s")
        if self.kind == "counter":
            if sample.joules is None:
                return Reading(t=sample.t, error="a GPU reported N/A for total energy (field 156)")
            return Reading(t=sample.t, joules=sample.joules)
        if sample.watts is None:
            return Reading(t=sample.t, error="a GPU reported N/A for power (field 155)")
        return Reading(t=sample.t, watts=sample.watts)

    def close(self) -> None:
        self._closed.set()
        proc = self._proc
        if proc is not None:
            _end(proc)
            _wait(proc)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)


def _launch(command: list[str]) -> subprocess.Popen[bytes]:
    """Start ``command`` in a process group of its own, killed when this process dies
    (:mod:`.children`)."""
    argv, preexec = dying_with_us(command)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, bufsize=0, start_new_session=True,
                            preexec_fn=preexec)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Ask dmon's whole process group to end (it is the group's leader, not reaped yet: its
    pid, and so the group's id, cannot have been reused)."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)


def _wait(proc: subprocess.Popen[bytes], timeout: float = 2.0) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout)
    return None


__all__ = [
    "DcgmiError",
    "DcgmiReader",
    "DmonParser",
    "DmonStreamError",
    "FieldsNotReserved",
    "HostEngineUnavailable",
    "WatchHeldByExporter",
    "classify",
]

