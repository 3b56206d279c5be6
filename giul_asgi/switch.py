"""The GIL's switch interval, 1 ms while a node's reader thread runs, so a busy loop cannot
keep it from its reads.

CPython hands the GIL to a waiting thread when its holder lets it go, or when the waiter has
waited a whole switch interval (5 ms by default) with no hand-over meanwhile and asks for
it. An event loop running Python flat out lets the GIL go at every poll of its selector and
takes it straight back: more often than the interval, it starts the waiter's wait again each
time, and the waiter has the GIL only when it wins a race it mostly loses. Every read the
reader thread makes is such a wait twice over (its wake-up, and the driver call's return:
ctypes lets the GIL go for it), and building the reader a dozen more. Beside a loop running
2 ms slices of Python on a 2-core machine at load 1.5-3 (benchmarks/results/
attribution-2026-12-02-reads.md), the reader went unread for up to 14 s at a time: 0-96% of
300 ms windows got a first figure and charged/caused was 0.17-1.97 (main's reader, no run in
ten within the targets), 0-100% and 0.19-1.03 with reads paced on the counter's steps alone
(:mod:`giul_asgi.ledger.pace`: 3 runs in ten); with the interval at 1 ms as well, the reader had the GIL back
within 2 ms at p90 and 10 ms at worst, and every window had its figures, 1.00 of what was
caused charged, ten runs in ten. Reading fewer times makes fewer such waits; only the
interval bounds each.

Nothing narrower than the process exists, so the setting is the process's. A library must
not change it behind the user's back, so it is said, once, in the log, and documented; it is
made only where the application has not chosen its own (the interval is CPython's default
when the first reader thread starts), put back when the last reader stops (unless changed
meanwhile), and ``GIUL_ASGI_SWITCH_INTERVAL=off`` leaves it alone (the reader then reads
when the loop lets it); a number of seconds is the interval to set instead. It is lowered at
the start rather than on evidence of a starved reader because the start is when the reader
needs the GIL most (NVML's start and probes) and a starved thread cannot say it is starved
until it has the GIL. What it costs: where several threads want the GIL at once, they change
hands every 1 ms rather than 5; a thread alone with the GIL is never asked to let it go.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping

from .errors import ConfigError

log = logging.getLogger("giul_asgi.poller")

ENV = "GIUL_ASGI_SWITCH_INTERVAL"
_OFF = frozenset({"off", "no", "false", "0"})
#: The interval set while reader threads run (s).
INTERVAL_S = 0.001
#: The interval while a reader thread starts, until its first read (s), where the default is
#: set: its start is a hundred hand-overs of the GIL (NVML's start, the card's table: the
#: place resolved, files made, mapped and locked), each a wait of up to the interval beside
#: a loop running Python flat out. At 1 ms the table alone took 125 ms (2 ms beside a quiet
#: loop) and a fresh process's first 333 ms request was unknown at its close in 2 runs of 4;
#: at 0.2 ms, 3-8 ms and 4 of 4 (benchmarks/results/attribution-2026-12-06f-start.md). The
#: same while another of our threads makes such a run of hand-overs (:meth:`Switch.hurried`).
STARTING_S = 0.0002
#: CPython's own: an interval other than this is the application's choice, and is kept.
CPYTHON_S = 0.005


def check_environment(env: Mapping[str, str] = os.environ) -> None:
    """A ``GIUL_ASGI_SWITCH_INTERVAL`` that is neither off nor seconds between 0 and 1 is a
    bad setting: it stops the middleware's startup (elsewhere the default is used, warned)."""
    text = (env.get(ENV) or "").strip().lower()
    if text and text not in _OFF and _seconds(text) is None:
        # Only "off" is suggested: "fast" was asked if it meant "false", the very opposite.
        close = difflib.get_close_matches(text, ["off"], n=1, cutoff=0.6)
        meant = f"did you mean {ENV}={close[0]}? " if close else ""
        raise ConfigError(f"{ENV}={text!r} is neither off nor seconds between 0 and 1",
                          remedy=f"{meant}unset it (the default is {INTERVAL_S:g} s), give seconds such "
                                 "as 0.002, or off to leave CPython's interval alone")


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1 else None


def configured(env: Mapping[str, str] = os.environ) -> float | None:
    """The interval to set: ``INTERVAL_S``, the environment's, or None (off)."""
    text = (env.get(ENV) or "").strip().lower()
    if not text:
        return INTERVAL_S
    if text in _OFF:
        return None
    value = _seconds(text)
    if value is None:
        log.warning("%s=%r is neither off nor seconds between 0 and 1: using %g s", ENV, text, INTERVAL_S)
        return INTERVAL_S
    return value


class Switch:
    """The process's switch interval, as its reader threads need it."""

    def __init__(
        self,
        get: Callable[[], float] = sys.getswitchinterval,
        put: Callable[[float], None] = sys.setswitchinterval,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self._get, self._put, self._env = get, put, env
        self._lock = threading.Lock()
        self._readers = 0
        self._starting = 0  # reader threads that have not read yet, and threads hurried
        self._set: float | None = None  # the interval this set
        self._was: float | None = None  # the interval before it
        self._steady: float | None = None  # the interval once every reader has read
        self._default = False  # the steady interval is the default (not the environment's)
        self._said = False

    @property
    def lowered(self) -> float | None:
        """The interval this set, while it holds (None: CPython's or the application's)."""
        return self._set

    def join(self, node: str) -> None:
        """A reader thread starts: the first sets the interval, where it may (the starting
        one until it has read: :meth:`started`)."""
        with self._lock:
            self._readers += 1
            self._starting += 1
            if self._set is not None:
                self._hurry()
                return
            if self._readers > 1:
                return
            wanted, now = configured(self._env), self._get()
            if wanted is None or not _same(now, CPYTHON_S) or wanted >= now:
                if wanted is not None and not _same(now, CPYTHON_S) and not self._said:
                    self._said = True
                    log.info("node %r: the GIL switch interval is the application's (%g s): left as it "
                             "is; above %g s a busy event loop can keep the reader from its reads", node,
                             now, INTERVAL_S)
                return
            self._was, self._set = now, wanted
            self._steady = wanted
            self._default = not (self._env.get(ENV) or "").strip()
            self._put(wanted)
            self._hurry()
            said, self._said = self._said, True
        if not said:
            log.info("node %r: the process's (pid %d) GIL switch interval is %g s (CPython's %g) while "
                     "readers run, so a busy event loop cannot keep the reader from its reads for long; "
                     "%s=off leaves it alone", node, os.getpid(), wanted, now, ENV)

    def started(self) -> None:
        """A reader thread has made its first read (or ended without one): once none is
        starting, the steady interval (unless the application changed it meanwhile)."""
        with self._lock:
            self._starting = max(0, self._starting - 1)
            if self._starting or self._set is None or self._steady is None or self._set == self._steady:
                return
            if _same(self._get(), self._set):
                self._put(self._steady)
                self._set = self._steady
            else:  # the application's choice since: left as it is
                self._set = self._was = self._steady = None

    def hurry(self) -> None:
        """One of our threads has a run of hand-overs of the GIL to make now (a wake-up, a
        run of system calls): the starting interval, where the default is set, until as many
        :meth:`started` as calls here."""
        with self._lock:
            self._starting += 1
            if self._set is not None:
                self._hurry()

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """:meth:`hurry` while the calling thread makes a run of system calls (the
        statistics' row written and the dead workers looked for); the steady interval after.
        Beside a loop running Python flat out the row writer's 25 calls took 50-460 ms at
        1 ms (5-30 ms of CPU), and the tail the row frees filled meanwhile."""
        self.hurry()
        try:
            yield
        finally:
            self.started()

    def _hurry(self) -> None:
        """The starting interval while a reader starts: only where the default is set (an
        interval the operator gave is kept throughout)."""
        current = self._set
        if self._starting and self._default and current is not None \
                and current != STARTING_S and _same(self._get(), current):
            self._set = STARTING_S
            self._put(STARTING_S)

    def leave(self) -> None:
        """A reader thread stops: the last puts the interval back (if still the one set)."""
        with self._lock:
            self._readers = max(0, self._readers - 1)
            if self._readers or self._set is None or self._was is None:
                return
            if _same(self._get(), self._set):
                self._put(self._was)
            self._set = self._was = self._steady = None

    def after_fork(self) -> None:
        """In a forked child (gunicorn --preload): no reader thread of the parent's runs
        here, so the parent's counts go and its interval is put back; the child's own readers
        set it again when they start (a child forked while the parent hurried stayed at 0.2
        ms for good, a hostile review)."""
        self._lock = threading.Lock()
        self._readers = self._starting = 0
        if self._set is not None and self._was is not None and _same(self._get(), self._set):
            self._put(self._was)
        self._set = self._was = self._steady = None
        self._default = False


def _same(a: float, b: float) -> bool:
    """Whether two intervals are one: CPython keeps it in whole microseconds, so 0.0002 set
    reads back as 0.00019999999999999998."""
    return abs(a - b) < 5e-7


#: The process's one: the interval is the process's.
SWITCH = Switch()
os.register_at_fork(after_in_child=SWITCH.after_fork)

__all__ = [
    "CPYTHON_S", "ENV", "INTERVAL_S", "STARTING_S", "SWITCH", "Switch", "check_environment", "configured",
]
