"""Record sinks: every settled record, for offline analysis, off the request path.

A sink is a listener (:mod:`giul_asgi.listeners`): it gets the figures a reading settles,
as a batch of :class:`~giul_asgi.listeners.Settled`, on the ledger's reader thread. The
call only puts the records on a bounded queue (``put_nowait``): it never blocks and never
raises. A writer thread of the
sink's own hands records to the callback or writes them as JSON lines. When the queue is
full the record is counted in ``dropped`` (a slow disk costs records, not latency); a
clean shutdown (``close()`` or ``await aclose()``) drains the queue first, so nothing
queued is lost.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import anyio.to_thread

from ..errors import ConfigError
from ..listeners import Settled

_STOP = object()


@runtime_checkable
class RecordSink(Protocol):
    """A listener the middleware also closes at lifespan shutdown (queued records drained)."""

    def settled(self, batch: Sequence[Settled]) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


def record_dict(record: Settled) -> dict[str, Any]:
    """The sink's line: the record's fields (``Energy.as_dict()``) with what became of it."""
    out = dict(record.energy.as_dict())
    out.update({"outcome": record.outcome, "status": record.status, "time": record.t})
    return out


class QueueSink:
    """A bounded queue and a writer thread; subclasses say what to do with a batch."""

    def __init__(self, *, max_queue: int = 10_000, name: str = "giul-sink") -> None:
        if not isinstance(max_queue, int) or max_queue < 1:
            raise ConfigError(f"max_queue={max_queue!r} must be a positive integer",
                              remedy="use 10_000")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self.dropped = 0  # records lost because the queue was full
        self.written = 0
        self.errors = 0  # records the writer failed to hand over
        self.last_error: str | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def settled(self, batch: Sequence[Settled]) -> None:
        if self._closed:
            self.dropped += len(batch)
            return
        put = self._queue.put_nowait
        for record in batch:
            try:
                put(record)
            except queue.Full:
                self.dropped += 1
            except Exception:
                self.errors += 1

    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            batch = [item]
            while len(batch) < 512:
                try:
                    batch.append(q.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is _STOP for b in batch)
            records = [b for b in batch if b is not _STOP]
            if records:
                try:
                    self._write(records)
                    self.written += len(records)
                except Exception as exc:
                    self.errors += len(records)
                    self.last_error = f"{type(exc).__name__}: {exc}"
            if stop:
                self._finish()
                return

    def _write(self, records: list[Settled]) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        return None

    def close(self) -> None:
        """Write everything queued, then stop the writer. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)  # blocks only while the writer drains a full queue
        self._thread.join()

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close)


class CallbackSink(QueueSink):
    """Hands every record to ``callback(energy, outcome, status)`` on the writer thread."""

    def __init__(
        self, callback: Callable[[Any, str, int | None], None], *, max_queue: int = 10_000,
    ) -> None:
        if not callable(callback):
            raise ConfigError("CallbackSink needs a callable", remedy="pass a function")
        self.callback = callback
        super().__init__(max_queue=max_queue, name="giul-sink-callback")

    def _write(self, records: list[Settled]) -> None:
        for record in records:
            try:
                self.callback(record.energy, record.outcome, record.status)
            except Exception as exc:
                self.errors += 1
                self.written -= 1
                self.last_error = f"{type(exc).__name__}: {exc}"


class JsonLinesSink(QueueSink):
    """Appends one JSON object per record to ``path`` (``record_dict``'s fields)."""

    def __init__(self, path: str | Path, *, max_queue: int = 10_000) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot open the record sink {self.path}: {exc.strerror}",
                remedy="give a path in a writable directory",
            ) from exc
        super().__init__(max_queue=max_queue, name="giul-sink-jsonl")

    def _write(self, records: list[Settled]) -> None:
        lines = [json.dumps(record_dict(r), separators=(",", ":")) + "\n" for r in records]
        self._file.writelines(lines)
        self._file.flush()

    def _finish(self) -> None:
        self._file.close()


__all__ = ["CallbackSink", "JsonLinesSink", "QueueSink", "RecordSink", "record_dict"]
