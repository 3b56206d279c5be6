"""The node's books over time, one sample a step, taken by the ledger's own reader thread.

/energy's power series used to be sampled when someone read /energy: two reads five minutes
apart made a chart of two points, and the watts between two reads a millisecond apart were
noise. The ledger's reader thread runs whether or not anyone reads (once started it reads
the card at least once a second, idle or not, and runs its chores after each read), so it
takes the samples: at its first lap in each wall-clock step of ``STEP_S`` seconds, the
host's books (measured, charged and unattributed joules since start, and reads) with the
wall-clock time. Above-idle power between two samples is their difference over their time;
/energy folds the samples into its statistics (:class:`~giul_asgi.stats.nodes.NodeSamples`),
which several workers merge step by step.

Bounded: the last ``SAMPLES`` samples (one hour at 5 s), a deque; older steps are kept by
the statistics, which fold in the samples at every read of /energy or /metrics.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: Seconds between samples (aligned on wall-clock time, as the statistics' steps are).
STEP_S = 5.0
#: Samples kept: an hour.
SAMPLES = 720
#: How often the reader thread looks whether a step has passed (seconds; a chore's period).
LOOK_EVERY_S = 0.5

Sample = tuple[float, float | None, float | None, float | None, float | None]


class History:
    """``(t, measured_j, charged_j, unattributed_j, reads)``, one a step, oldest first."""

    __slots__ = ("_lock", "_samples", "_step", "clock", "step_s")

    def __init__(self, step_s: float = STEP_S, samples: int = SAMPLES,
                 clock: Callable[[], float] = time.time) -> None:
        self.step_s = step_s
        self.clock = clock
        self._samples: deque[Sample] = deque(maxlen=samples)
        self._step: int | None = None
        self._lock = threading.Lock()

    def sample(self, books: Callable[[], Any]) -> bool:
        """Take one sample of ``books()`` (ledger totals) if this step has none yet; returns
        whether it did. Called on the reader thread; cheap when the step has its sample."""
        now = self.clock()
        step = int(now // self.step_s)
        if step == self._step:
            return False
        totals = books()
        sample: Sample = (now, _f(totals, "measured_j"), _f(totals, "charged_j"),
                          _f(totals, "unattributed_j"), _f(totals, "reads"))
        with self._lock:
            self._samples.append(sample)
            self._step = step
        return True

    def chore(self, books: Callable[[], Any]) -> Callable[[], None]:
        """What the reader thread runs every ``LOOK_EVERY_S``: :meth:`sample` of ``books``."""

        def look() -> None:
            self.sample(books)

        return look

    def samples(self) -> list[Sample]:
        """A copy of the samples, oldest first."""
        with self._lock:
            return list(self._samples)


def _f(totals: Any, name: str) -> float | None:
    value = getattr(totals, name, None)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


__all__ = ["LOOK_EVERY_S", "SAMPLES", "STEP_S", "History", "Sample"]
