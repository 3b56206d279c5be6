"""The GIL's switch interval, lowered once a node's reader thread is seen kept from its reads.

CPython hands the GIL to a waiting thread when its holder lets it go, or when the waiter has
waited a whole switch interval (5 ms by default) with no hand-over meanwhile and asks for
it. An event loop running Python flat out lets the GIL go at every poll of its selector and
takes it straight back: more often than the interval, it starts the waiter's wait again each
time, and the waiter has the GIL only when it wins a race it mostly loses. Every read the
reader thread makes is such a wait twice over (its wake-up, and the driver call's return:
ctypes lets the GIL go for it), so beside a saturated loop the card went unread for seconds
and windows had no figure (benchmarks/gil_race.py, 2 ms slices: a thread asking for 100 reads
a second got 43 and waited up to 0.9 s; at a 1 ms interval it got 81 and waited 26 ms at
most). Reading fewer times (:mod:`.pace`) makes fewer such waits; only the interval bounds
each.

Nothing narrower than the process exists, so the fix is the process's, and it is made only
where it is needed: once a busy reader's read lands more than ``OVERDUE_S`` after its time,
or more than ``LATE_S`` in ``TRIGGER`` of its last ``LOOK``, or a window opens while the
reader is that overdue (a reader kept from the GIL cannot say so itself), the interval goes
to ``INTERVAL_S`` (1 ms), said in one log line, and back to what it was when the last reader
stops, unless something else changed it meanwhile. An interval already as short is left
alone. A process whose loop lets its reader read keeps CPython's setting. What it costs:
where several threads want the GIL at once, they change hands every 1 ms rather than 5.

``GIUL_ASGI_SWITCH_INTERVAL=off`` leaves the interval alone whatever happens (the reader then
reads when the loop lets it); a number of seconds is the interval to set instead of 1 ms.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping

log = logging.getLogger("giul_asgi.poller")

ENV = "GIUL_ASGI_SWITCH_INTERVAL"
#: The interval set once a reader is kept waiting (s).
INTERVAL_S = 0.001
#: A read this late after its time was kept waiting past CPython's default interval (s).
LATE_S = 0.005
#: Late reads among the last ``LOOK`` that are evidence enough.
TRIGGER = 2
LOOK = 8
#: A read this late is evidence enough alone (s).
OVERDUE_S = 0.05


def configured(env: Mapping[str, str] = os.environ) -> float | None:
    """The interval to set when needed: ``INTERVAL_S``, the environment's, or None (off)."""
    text = (env.get(ENV) or "").strip().lower()
    if not text:
        return INTERVAL_S
    if text in ("off", "no", "false", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        log.warning("%s=%r is neither off nor seconds between 0 and 1: using %g s", ENV, text, INTERVAL_S)
        return INTERVAL_S
    return value


class Switch:
    """The process's switch interval, as every node's reader thread needs it."""

    def __init__(
        self,
        get: Callable[[], float] = sys.getswitchinterval,
        put: Callable[[float], None] = sys.setswitchinterval,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self._get, self._put, self._env = get, put, env
        self._lock = threading.Lock()
        self._readers = 0
        self._late: deque[bool] = deque(maxlen=LOOK)
        self._decided = False  # lowered, or found not to need it, or off
        self._set: float | None = None  # the interval this set
        self._was: float | None = None  # the interval before it

    def join(self) -> None:
        """A reader thread starts."""
        with self._lock:
            self._readers += 1

    def leave(self) -> None:
        """A reader thread stops: the last one puts the interval back (if still ours)."""
        with self._lock:
            self._readers = max(0, self._readers - 1)
            if self._readers or self._set is None or self._was is None:
                return
            if self._get() == self._set:
                self._put(self._was)
            self._set = self._was = None
            self._decided = False
            self._late.clear()

    @property
    def lowered(self) -> float | None:
        """The interval this set, while it holds (None: CPython's or the user's)."""
        return self._set

    @property
    def decided(self) -> bool:
        """Lowered, found short enough already, or turned off: nothing more to watch."""
        return self._decided

    def note(self, late_s: float, node: str) -> None:
        """A busy reader's read came ``late_s`` after its time. Cheap once decided."""
        if self._decided:
            return
        late = self._late
        late.append(late_s > LATE_S)
        if late_s > OVERDUE_S or sum(late) >= TRIGGER:
            self._lower(node, late_s)

    def overdue(self, late_s: float, node: str) -> None:
        """A window opens while the node's reader is ``late_s`` past its time."""
        if not self._decided and late_s > OVERDUE_S:
            self._lower(node, late_s)

    def _lower(self, node: str, late_s: float) -> None:
        with self._lock:
            if self._decided:
                return
            self._decided = True
            wanted = configured(self._env)
            if wanted is None:
                log.info("node %r: its reader thread is kept waiting for the GIL (a read %.0f ms late): "
                         "%s=off leaves the switch interval alone", node, late_s * 1000, ENV)
                return
            now = self._get()
            if now <= wanted:
                return
            self._was, self._set = now, wanted
            self._put(wanted)
        log.info("node %r: its reader thread is kept waiting for the GIL (a read %.0f ms late, %d of its "
                 "last %d late): the process's GIL switch interval goes from %g to %g s while readers run "
                 "(%s=off leaves it alone)", node, late_s * 1000, sum(self._late), len(self._late),
                 now, wanted, ENV)


#: The process's one: the interval is the process's.
SWITCH = Switch()

__all__ = ["ENV", "INTERVAL_S", "LATE_S", "OVERDUE_S", "SWITCH", "Switch", "configured"]
