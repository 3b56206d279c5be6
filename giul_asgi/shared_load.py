"""Several gateway worker processes on one host: each one's part of the host's whole load.

``uvicorn --workers 4`` runs four processes, each with its own ledger that sees only its own
windows: each would charge the card's whole above-idle energy to its own requests, four times
over. With this table each worker publishes, per node, its cumulative *window-seconds*
integral (the integral over time of how many of its windows were open) and how many are open
now; :meth:`SharedLoad.others` sums the other live workers' integrals, extrapolated to the
asked time, so the ledger can share an interval by its own part of the host's whole load.

One small JSON file per worker in a shared directory (``directory=`` or
``$GIUL_ASGI_LOAD_DIR``), replaced atomically (write a temporary file, then ``os.replace``).
``time.monotonic()`` is one clock for every process of a Linux host, so the figures line up.
Workers are named by pid and process start time, so a reused pid is never mistaken for a dead
worker. A dead worker's last integral is kept (frozen) by every reader that saw it, so the
others' integral never goes backwards; its file is removed after ``grace_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import ConfigError

ENV = "GIUL_ASGI_LOAD_DIR"
PREFIX = "giul-load-"
GRACE_S = 60.0


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    return start is None or process_start(pid) in (None, start)


class SharedLoad:
    """This worker's row in the host's table of window-seconds per node, and the others' sum."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        value = directory if directory is not None else os.environ.get(ENV)
        if not value:
            raise ConfigError("no directory for the workers' shared load",
                              remedy=f"pass directory= or set ${ENV} to a directory every worker can write")
        self.directory = Path(value)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use {self.directory} for the workers' shared load: {exc}") from None
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.name = f"{PREFIX}{self.pid}-{self.start or 'x'}.json"
        self.grace_s = grace_s
        self.clock = clock
        self._seen: dict[str, dict[str, float]] = {}  # file -> node -> last extrapolated integral
        self._retired: dict[str, float] = {}  # node -> frozen integrals of workers now gone

    def publish(self, nodes: Mapping[str, tuple[float, int]], t: float | None = None) -> None:
        """Write this worker's ``{node: (window-seconds integral, windows open now)}`` as of ``t``."""
        row = {"pid": self.pid, "start": self.start, "t": self.clock() if t is None else t,
               "nodes": {k: [float(v[0]), int(v[1])] for k, v in nodes.items()}}
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(row, fh)
            os.replace(tmp, self.directory / self.name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def others(self, node: str, t: float | None = None) -> float | None:
        """The other workers' window-seconds integral for ``node`` at ``t``; None if nobody could look."""
        now = self.clock() if t is None else t
        try:
            names = [p.name for p in self.directory.iterdir() if p.name.startswith(PREFIX)]
        except OSError:
            return None
        total = 0.0
        present = set()
        for name in names:
            if name == self.name:
                continue
            path = self.directory / name
            try:
                row = json.loads(path.read_text())
                pid, start = int(row["pid"]), row.get("start")
                row_t = float(row["t"])
                nodes = {k: (float(v[0]), int(v[1])) for k, v in row["nodes"].items()}
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours: skip this time
            if not alive(pid, start):
                self._retire(name)
                if now - row_t > self.grace_s:
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            present.add(name)
            age = max(0.0, now - row_t)
            before = self._seen.get(name, {})
            values = {k: max(before.get(k, 0.0), integral + open_now * age)  # never backwards
                      for k, (integral, open_now) in nodes.items()}
            self._seen[name] = values
            total += values.get(node, 0.0)
        for name in list(self._seen):
            if name not in present and name not in names:
                self._retire(name)
        return total + self._retired.get(node, 0.0)

    def _retire(self, name: str) -> None:
        last = self._seen.pop(name, None)
        for node, value in (last or {}).items():
            self._retired[node] = self._retired.get(node, 0.0) + value

    def close(self) -> None:
        """Leave the table (the others keep this worker's last integral, frozen)."""
        with contextlib.suppress(OSError):
            (self.directory / self.name).unlink()


__all__ = ["SharedLoad"]
