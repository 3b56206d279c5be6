"""What each key spent this period, across one server's workers, read with one dictionary lookup.

The request's path asks one question per budget: has this key spent its limit?
(``spent.get((budget, key), 0.0) >= limit``). Everything that makes that dictionary true
happens elsewhere:

- **at admission**, a hard budget adds its usual cost of a request (a reservation: learnt
  from the figures this worker counted; until it has one, what the other workers learnt,
  which their rows carry). While neither is known (a cold server: no worker has counted a
  figure), there is nothing to reserve, so each key has at most one request of the budget
  in flight in this worker; another meanwhile is refused for a second (:class:`Measuring`),
  and the first's figure, once counted, is the usual cost (a first figure the card has not
  reported yet holds the key until it settles, :data:`HOLD_S` at most);
- **at the request's close**, on the event loop, its first figure (the one its headers
  said; for a hard budget, at least its reservation until it settles) replaces the
  reservation in this worker's count for (budget, key, period) and in the dictionary, so
  this worker's next admission sees it at once (a lock held for a few additions: no I/O);
- **when the figure settles**, on the node's reader thread (:mod:`giul_asgi.listeners`),
  the settled figure replaces what the close counted, the same way;
- **on the budgets' thread**, this worker's counts are written as its row in the server's
  folder (:mod:`.shared`) soon after a close (at most every :data:`MIN_GAP_S`), and every
  :data:`EVERY_S` every other worker's rows (live and dead) are summed; the dictionary is
  then rebuilt as their sum plus this worker's counts and swapped in whole. The thread
  wakes at each period's end, so a new period's dictionary is in place within milliseconds.

So a worker sees its own spending at once and the others' within about ``MIN_GAP_S +
EVERY_S`` (tens of milliseconds; from :data:`NEAR` of a hard limit until it is reached,
within about ``2 x NEAR_EVERY_S``): a hard budget admits what was left, plus the
requests in flight when it was crossed (each is admitted while under budget) and those the
other workers admitted within that lag. A figure that is unknown, or <= 0 (a failed
measurement, never a free request), at close and at settling spends nothing: a reader that
fails never refuses anyone.

Where nothing can be shared (``GIUL_ASGI_LOAD_DIR=off``, no usable place, a full one) the
budgets are this worker's alone and ``/energy`` says so (``shared: false`` and why).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ..energy import Energy
from ..hostshare import ServerId, log_unshared, resolve, server_identity
from ..hostshare.place import Setting, remedy
from ..listeners import Settled
from ..tenants import NONE, OTHER
from ..wire.headers import header_number, header_value, number
from .budget import Budget
from .shared import ServerSpending, Spent

log = logging.getLogger("giul_asgi.budgets")

#: How often the budgets' thread sums the other workers' rows (seconds; four times as
#: long once nothing has changed for a second).
EVERY_S = 0.05
#: The least time between two rows of this worker (a busy worker writes at most this often).
MIN_GAP_S = 0.025
#: With nothing changed for this long, the thread looks four times less often.
QUIET_S = 1.0
#: From this share of a hard limit until it is reached, the thread writes and sums every
#: NEAR_EVERY_S: what other workers admit before they see this one's spending (and
#: reservations) is what a hard budget goes over.
NEAR = 0.5
NEAR_EVERY_S = 0.005
#: How often dead workers' rows are folded (seconds).
FOLD_S = 1.0
#: First figures kept waiting for their settled figure, at most (the oldest are forgotten).
MAX_PENDING = 100_000
#: Keys a budget counts on their own in one period in this worker; past it, ``<other>``.
MAX_KEYS = 10_000
#: Where a budget's key is in ``(tenant, route, tier)``.
_FIELD = {"tenant": 0, "route": 1, "tier": 2}
REMAINING = b"x-energy-budget-remaining"
NAME = b"x-energy-budget"
#: A request's slots: the (budget index, key) pairs it counts under.
#: Each budget a request counts in: (budget index, key, period admitted in, joules or grams
#: reserved for it at admission: a hard budget's usual cost of a request).
Slots = tuple[tuple[int, str, int, float], ...]
#: What :meth:`Budgets.admit` hands back: the slots, and the headers to add.
Admitted = tuple[Slots, tuple[tuple[bytes, bytes], ...]]
_NOTHING: Admitted = ((), ())

_instances = itertools.count()


#: How much each new figure moves a hard budget's mean cost of a request.
USUAL_WEIGHT = 0.2
#: The recent figures a hard budget's reservation is the upper decile of (beside the mean):
#: a request's cost moves with how many share the card, and the last requests before the
#: limit, with fewer beside them, cost more than the mean the crowd before them taught.
RECENT = 32
USUAL_QUANTILE = 0.9
#: Keys whose first request of a cold hard budget may be measured at once in this worker
#: (keys come from clients); past it, a new key's first request is refused for a second too.
MAX_MEASURING = MAX_KEYS
#: What a request refused while its key's first is measured is told to wait (seconds).
MEASURING_RETRY_S = 1
#: How long a key stays held after its first request closed with a figure still awaited (the
#: card had not reported; a cold card's first window often has not): until it settles, or
#: this many seconds, so a settled figure that never comes cannot hold the key for good.
HOLD_S = 2.0


class OverBudget(Exception):
    """A request of a key over a hard budget, refused before the app runs: the 429."""

    #: The error body's ``code``.
    code = "energy_budget_exceeded"

    def __init__(self, budget: Budget, key: str, spent: float, period_end: float, now: float) -> None:
        self.budget = budget
        self.key = key
        self.spent = spent
        self.period_end = period_end
        #: Whole seconds until the period ends (at least 1).
        self.retry_after = max(1, math.ceil(period_end - now))
        super().__init__(self.message)

    @property
    def left(self) -> float:
        """What is left of the budget, as ``X-Energy-Budget-Remaining`` says it."""
        return 0.0

    @property
    def what(self) -> str:
        """The budget's unit in words."""
        return "joules" if self.budget.unit == "J" else "grams of CO2e"

    @property
    def message(self) -> str:
        b, what = self.budget, self.what
        until = datetime.fromtimestamp(self.period_end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (f"Energy budget {b.name!r} for {b.per} {self.key!r} is spent: "
                f"{number(self.spent)} of {number(b.limit)} {what} used in the period ending {until}. "
                f"Retry after {self.retry_after} s.")

    def body(self) -> bytes:
        """OpenAI's error shape, so its clients raise their rate-limit error with it."""
        import json

        return json.dumps({"error": {
            "type": "energy_budget_exceeded", "message": self.message,
            "code": self.code, "param": None,
        }}).encode()

    def headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               (b"retry-after", b"%d" % self.retry_after), (REMAINING, _left(self.left)),
               (NAME, header_value(self.budget.name))]
        if self.retry_after > 60:
            # OpenAI's clients retry a 429 after a short backoff unless told not to (older
            # ones wait out a Retry-After of a minute at most, then back off by seconds):
            # retrying before the period ends is refused again.
            out.append((b"x-should-retry", b"false"))
        return out


class NotSpent(OverBudget):
    """A refusal while the key's budget is not spent: for a reason that passes within a
    second or two (:attr:`why` says which), so it says what is left and to retry in one."""

    def __init__(self, budget: Budget, key: str, spent: float, period_end: float, now: float) -> None:
        super().__init__(budget, key, spent, period_end, now)  # its message is this class's
        self.retry_after = MEASURING_RETRY_S

    @property
    def left(self) -> float:
        return max(0.0, self.budget.limit - self.spent)

    @property
    def why(self) -> str:
        raise NotImplementedError

    @property
    def message(self) -> str:
        b = self.budget
        return (f"Energy budget {b.name!r} for {b.per} {self.key!r} is not spent "
                f"({number(self.spent)} of {number(b.limit)} {self.what} used), but {self.why}. "
                f"Retry after {MEASURING_RETRY_S} s.")


class Measuring(NotSpent):
    """A request refused while its key's first request of a cold hard budget is measured.

    Refused rather than held until that figure comes: admission stays a synchronous lookup
    on the loop (no waiters to bound and wake, the same under asyncio and trio), a first
    request may run for minutes (a long stream) while a wait must be short, and OpenAI's
    clients retry a 429 after its ``Retry-After`` by themselves. The budget is not spent:
    the body says so, with ``code`` ``energy_budget_measuring`` (``type`` stays
    ``energy_budget_exceeded``: whatever matches a hard budget's refusals still does).
    """

    code = "energy_budget_measuring"

    def __init__(self, budget: Budget, key: str, spent: float, period_end: float, now: float, *,
                 crowded: bool = False) -> None:
        #: Whether it was refused because :data:`MAX_MEASURING` other keys' first requests are.
        self.crowded = crowded
        super().__init__(budget, key, spent, period_end, now)

    @property
    def why(self) -> str:
        whose = (f"the first requests of {MAX_MEASURING} {self.budget.per}s are" if self.crowded
                 else f"this {self.budget.per}'s first request is")
        return f"{whose} still being measured: until a request's cost is known, one runs at a time"


class Reserved(NotSpent):
    """A request refused because what this worker's requests of the key in flight reserved
    reaches the limit, though what it spent does not: their figures may leave room, so it
    asks for a second (a hostile trial: such a refusal said the budget "is spent" and to
    come back at the period's end, with ``x-should-retry: false``, while the key had room
    left once its requests closed). ``code`` ``energy_budget_reserved``."""

    code = "energy_budget_reserved"

    def __init__(self, budget: Budget, key: str, spent: float, period_end: float, now: float, *,
                 held: float) -> None:
        #: What the requests in flight reserved.
        self.held = held
        super().__init__(budget, key, spent, period_end, now)

    @property
    def why(self) -> str:
        return (f"its requests in flight hold the rest ({number(self.held)} {self.what} reserved until "
                "their figures come)")


def _left(value: float) -> bytes:
    """What is left, as a header: the wire's number, in whole units from 999,999 on (as
    the wire writes them too, but cut rather than rounded: never more than is left, and a
    third of the time it takes)."""
    if value >= 999999.0:
        return b"%d" % value
    return header_number(value) if value > 0 else b"0"


class Budgets:
    """The budgets of one middleware: admission, spending, the shared sum, their state.

    ``directory`` moves the host's place (as ``Node(workers_dir=...)``); ``server`` names the
    server (found from the inherited listener by default); ``clock`` is wall-clock time
    (``time.time``; a test's fake). :meth:`start` starts the budgets' thread (the
    middleware does at its startup, in the worker); without it nothing is shared.
    """

    def __init__(
        self, budgets: Sequence[Budget], *, directory: Setting = None, server: ServerId | None = None,
        clock: Callable[[], float] = time.time, every_s: float = EVERY_S,
    ) -> None:
        self.budgets = tuple(budgets)
        self._clock = clock
        self._every_s = every_s
        self._directory = directory
        self._server = server
        self._plan = tuple((i, _FIELD[b.per], b.key, b.limit, b.hard) for i, b in enumerate(self.budgets))
        self._period_s = tuple(b.period_s for b in self.budgets)
        self._joules = tuple(b.unit == "J" for b in self.budgets)
        self._hard = tuple(b.hard for b in self.budgets)
        self._limits = tuple(b.limit for b in self.budgets)
        self._names = tuple(header_value(b.name) for b in self.budgets)
        self._index = {b.name: i for i, b in enumerate(self.budgets)}
        now = clock()
        self._current = [int(now // p) for p in self._period_s]
        #: (budget index, key) -> spent this period, server-wide: what admission reads.
        self.spent: dict[tuple[int, str], float] = {}
        self._own: dict[tuple[int, str, int], float] = {}  # this worker's, per period
        self._refused: dict[tuple[int, str, int], float] = {}
        self._keys = [0] * len(self.budgets)  # keys of the current period, per budget
        self._others: dict[tuple[int, str], float] = {}
        self._others_refused: dict[tuple[int, str], float] = {}
        #: Requests whose figure has not settled: their slots (each with its period: a request
        #: is charged to the one it was admitted in) and per slot the first figure and what
        #: was counted for it (at least its reservation).
        self._pending: dict[str, tuple[Slots, tuple[tuple[float, float], ...]]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty = False
        self._thread: threading.Thread | None = None
        self.folder: ServerSpending | None = None
        #: Why nothing is shared (None while shared).
        self.shared_reason: str | None = "not started (the budgets' thread starts with the server)"
        self.workers = 1
        self._crossed_seen: set[tuple[int, str, int]] = set()
        self._crossed: dict[tuple[str, str], int] = {}  # server-wide counts (this worker's alone unshared)
        self._last_fold = 0.0
        self._last_read = -math.inf
        self._last_change = 0.0
        self._failed_said = False
        #: A hard budget's usual cost of one request: the larger of a moving mean of its
        #: settled figures (its first figures until one settles) and the upper decile of the
        #: last RECENT of them. Reserved at admission, so requests admitted together cannot
        #: all pass the limit, and counted until the figure settles.
        self._usual = [0.0] * len(self.budgets)
        self._mean = [0.0] * len(self.budgets)
        self._recent: list[deque[float]] = [deque(maxlen=RECENT) for _ in self.budgets]
        self._usual_settled = [False] * len(self.budgets)
        #: Whether this worker learnt its usual cost from its own figures (else it holds the
        #: other workers' mean, or nothing: a fresh worker beside warm ones, the hostile
        #: trial's wave of 40 clients, reserved nothing and passed the limit by 11 requests).
        self._usual_learnt = [False] * len(self.budgets)
        #: A key of a hard budget between NEAR of its limit and the limit: the fast pace.
        self._near = False
        #: (budget, key) of the requests admitted while the budget's usual cost was unknown
        #: (nothing to reserve), one a key: until one's figure is counted, no other of that
        #: key is admitted here, or a cold server's first wave all passes the limit. The
        #: value: until when (``time.monotonic()``): infinite while the request runs, then
        #: HOLD_S at most while its figure is awaited.
        self._measuring: dict[tuple[int, str], float] = {}
        #: When the request that holds a key in flight was admitted: one that runs past HOLD_S
        #: (a long stream) lets one more of its key in, or a tenant whose first request is a
        #: long stream would be refused for the whole of it.
        self._running: dict[tuple[int, str], float] = {}
        #: What this worker's requests in flight reserved, by (budget, key): a refusal that
        #: rests on them says so and asks for a second, not for the period's end.
        self._in_flight: dict[tuple[int, str], float] = {}
        self._purged = -math.inf
        #: A hard budget whose first figure here was unknown for good (a reader that fails,
        #: a node that cannot measure): its keys are no longer held one at a time, since no
        #: figure is coming to end it (a reader that fails never refuses anyone).
        self._blind = [False] * len(self.budgets)

    # -- the request's path ---------------------------------------------------------------------
    def admit(self, tenant: str | None, route: str, tier: str | None) -> Admitted:
        """The request's slots and headers, or :class:`OverBudget` for a key over a hard
        budget (:class:`Measuring` for a second request of a key while the budget's usual
        cost is unknown). One dictionary lookup per budget that applies (two while cold)."""
        values = (tenant or NONE, route, tier or NONE)
        spent = self.spent
        now = self._clock()
        slots: list[tuple[int, str, int, float]] = []
        tightest, left_at, share = -1, 0.0, 2.0
        try:
            for i, field, only, limit, hard in self._plan:
                key = values[field]
                if only is not None and key != only:
                    continue
                used = spent.get((i, key), 0.0)
                if used >= limit and hard:
                    used = self._refuse(i, key, used)
                reserve = self._usual[i] if hard else 0.0
                # Its period is the clock's (the dictionary's swaps within milliseconds of an
                # end): it is charged there, whenever it closes, so a new period opens empty.
                period = max(self._current[i], int(now // self._period_s[i]))
                if reserve > 0:  # counted as spent until the request's own figure replaces it
                    with self._lock:
                        self._add(i, key, period, reserve)
                        self._hold(i, key, reserve)
                        self._dirty = True
                elif hard and not self._blind[i]:  # its cost unknown: one of the key at a time
                    self._measure(i, key, used)
                slots.append((i, key, period, reserve))
                left = limit - used
                if left / limit < share or (left / limit == share and left < left_at):
                    tightest, left_at, share = i, left, left / limit
        except OverBudget:
            # A later budget refused it: the request never runs and no figure will ever
            # replace what the earlier ones reserved, which would stay spent for the period.
            self.give_back(slots)
            raise
        if tightest < 0:
            return _NOTHING
        return tuple(slots), ((REMAINING, _left(left_at)), (NAME, self._names[tightest]))

    def give_back(self, slots: Iterable[tuple[int, str, int, float]]) -> None:
        """Undo what an admission took, for a request that will never run: refused by a
        later budget, or failed (an error of ours) before its app started."""
        with self._lock:
            for i, key, period, reserved in slots:
                if reserved:
                    self._add(i, key, period, -reserved)
                    self._hold(i, key, -reserved)
                elif self._hard[i]:
                    self._measuring.pop((i, key), None)
                    self._running.pop((i, key), None)
            self._dirty = True

    def _measure(self, i: int, key: str, used: float) -> None:
        """Take the key's one place in flight while budget ``i``'s usual cost is unknown,
        or raise :class:`Measuring` (a dictionary lookup under the lock: no I/O)."""
        gate = (i, key)
        measuring = self._measuring
        went_blind = admitted = False
        with self._lock:
            until = measuring.get(gate)
            mono = time.monotonic()
            if until == math.inf and mono - self._running.get(gate, mono) > HOLD_S:
                until = None  # its request has run HOLD_S and goes on: this one may run too
            elif until is not None and until != math.inf and until <= mono:
                until = None  # its figure was awaited for HOLD_S: the key is free...
                # ...and if none came, none is coming soon (a reader stuck at its start settles
                # nothing): holding keys for it would refuse requests for as long as the reader
                # fails. Its keys are held no more, as for a figure unknown for good (a reader
                # slower than HOLD_S to settle lets a cold wave in).
                went_blind = self._blinded(i)
            # a key held past HOLD_S takes its own place again: only a new key needs room
            crowded = gate not in measuring and len(measuring) >= MAX_MEASURING and not self._purge()
            if self._blind[i]:
                measuring.pop(gate, None)
                self._running.pop(gate, None)
                admitted = True
            elif until is None and not crowded:
                measuring[gate] = math.inf
                self._running[gate] = mono
                admitted = True
            else:
                period = self._current[i]
                # a crowded key may be anyone's, and so may a key past the table's bound
                own = not crowded and ((i, key, period) in self._refused or len(self._refused) < MAX_KEYS)
                slot = (i, key if own else OTHER, period)
                self._refused[slot] = self._refused.get(slot, 0.0) + 1
                self._dirty = True
        if went_blind:
            self._said_blind(i)  # a log line, once a budget: outside the lock
        if admitted:
            return
        now = self._clock()
        raise Measuring(self.budgets[i], key, used, (period + 1) * self._period_s[i], now,
                        crowded=crowded)

    def _purge(self) -> bool:
        """Forget the keys held past HOLD_S (figures that never settled), at most once a
        second (a scan of up to MAX_MEASURING keys); whether there is room now (under the lock)."""
        mono = time.monotonic()
        if mono - self._purged >= 1.0:
            self._purged = mono
            measuring = self._measuring
            for gate in [g for g, until in measuring.items() if until <= mono]:
                del measuring[gate]
        return len(self._measuring) < MAX_MEASURING

    def _hold(self, i: int, key: str, value: float) -> None:
        """Count a reservation of this worker's requests in flight in or out (under the lock)."""
        held = self._in_flight.get((i, key), 0.0) + value
        if held > 1e-9:
            self._in_flight[(i, key)] = held
        else:
            self._in_flight.pop((i, key), None)

    def _refuse(self, i: int, key: str, used: float) -> float:
        """Raise OverBudget, unless the period the dictionary counts has just ended (the
        thread swaps it within milliseconds): then nothing of the new one is spent yet. Where
        only this worker's reservations for its requests in flight reach the limit, raise
        :class:`Reserved`: the budget is not spent, and their figures may leave room."""
        now = self._clock()
        period = int(now // self._period_s[i])
        if period > self._current[i]:
            self._wake.set()
            return 0.0
        with self._lock:
            slot = (i, key, period)
            self._refused[slot] = self._refused.get(slot, 0.0) + 1
            self._dirty = True
            held = self._in_flight.get((i, key), 0.0)
        if held > 0 and used - held < self.budgets[i].limit:
            raise Reserved(self.budgets[i], key, used - held, (period + 1) * self._period_s[i], now,
                           held=held)
        raise OverBudget(self.budgets[i], key, used, (period + 1) * self._period_s[i], now)

    def spend(self, slots: Slots, energy: Energy) -> None:
        """A request closed with its first figure: counted now (the loop's thread). Until
        its figure settles, a hard budget counts at least what it reserved: a first figure
        that is unknown, or lower than the key's usual cost, must not open a gap the
        requests behind it pass through."""
        if not slots:
            return
        j, g = energy.joules, energy.carbon_grams
        waits = energy.id is not None and not energy.settled
        counts: list[tuple[float, float]] = []
        blind: list[int] = []
        with self._lock:
            for i, key, period, reserved in slots:
                value = j if self._joules[i] else g
                first = value if value is not None and value > 0 else 0.0
                counted = max(first, reserved) if waits else first
                if reserved:  # the reservation gives way to the figure
                    self._add(i, key, period, -reserved)
                    self._hold(i, key, -reserved)
                elif self._hard[i]:  # admitted cold: the key's next request may run...
                    self._running.pop((i, key), None)
                    if not first and waits and self._usual[i] == 0.0 and (i, key) in self._measuring:
                        # ...once its figure, awaited from the card, settles (HOLD_S at most;
                        # only a key it holds: the table grows at admission alone, bounded)
                        self._measuring[(i, key)] = time.monotonic() + HOLD_S
                    else:
                        self._measuring.pop((i, key), None)
                    if not first and not waits and self._blinded(i):  # unknown for good
                        blind.append(i)
                if counted > 0:  # in the period it was admitted in, whenever it closes
                    self._add(i, key, period, counted)
                if first > 0 and (energy.settled or not self._usual_settled[i]):
                    if energy.settled and self._hard[i]:
                        self._settle_learning(i)
                    self._learn_usual(i, first)
                counts.append((first, counted))
            if waits and energy.id is not None:
                pending = self._pending
                pending[energy.id] = (slots, tuple(counts))
                if len(pending) > MAX_PENDING:
                    del pending[next(iter(pending))]
            self._dirty = True
        if not self._wake.is_set():  # once a round, not once a request
            self._wake.set()
        for i in blind:
            self._said_blind(i)

    def _blinded(self, i: int) -> bool:
        """A figure of hard budget ``i`` did not come while no usual cost is known: its keys
        are held no more (under the lock). Whether this made it so (to say once)."""
        if self._usual[i] == 0.0 and not self._blind[i]:
            self._blind[i] = True
            return True
        return False

    def _said_blind(self, i: int) -> None:
        log.warning("hard energy budget %r: a request's figure did not come (unknown for good, or "
                    "awaited longer than %g s) and no usual cost of a request is known yet, so its keys' "
                    "requests are no longer admitted one at a time while one is measured (said once); "
                    "until a figure is known, this worker reserves nothing for them",
                    self.budgets[i].name, HOLD_S)

    def _settle_learning(self, i: int) -> None:
        """A budget's first settled figure: from now on it learns from settled figures only,
        and what first figures taught is dropped, or the early ones (a cold card's, dear)
        would stay among the recent for 32 more and be reserved (under the lock)."""
        if not self._usual_settled[i]:
            self._usual_settled[i] = True
            if self._usual_learnt[i]:  # this worker's first figures taught it (not borrowed)
                self._recent[i].clear()
                self._mean[i] = 0.0

    def _learn_usual(self, i: int, value: float) -> None:
        """Learn a budget's usual cost of a request from ``value`` (under the lock)."""
        mean = self._mean[i]
        self._mean[i] = mean = value if mean == 0.0 else mean + USUAL_WEIGHT * (value - mean)
        recent = self._recent[i]
        recent.append(value)
        ranked = sorted(recent)  # at most RECENT values: about a microsecond
        self._usual[i] = max(mean, ranked[min(len(ranked) - 1, int(USUAL_QUANTILE * len(ranked)))])
        self._usual_learnt[i] = True

    def _borrow_usual(self, others: dict[str, float]) -> None:
        """Until it learns its own, a hard budget reserves what the other workers learnt."""
        with self._lock:
            for i, budget in enumerate(self.budgets):
                if self._hard[i] and not self._usual_learnt[i] and budget.name in others:
                    self._usual[i] = self._mean[i] = others[budget.name]

    def _add(self, i: int, key: str, period: int, value: float) -> None:
        """Count ``value`` (under the lock)."""
        slot = (i, key, period)
        own = self._own
        if slot not in own and period == self._current[i]:  # the bound is the current period's
            if self._keys[i] >= MAX_KEYS:
                slot = (i, OTHER, period)
                key = OTHER
            else:
                self._keys[i] += 1
        own[slot] = own.get(slot, 0.0) + value
        if period == self._current[i]:
            spent = self.spent
            spent[(i, key)] = spent.get((i, key), 0.0) + value

    # -- the reader thread --------------------------------------------------------------------
    def settled(self, batch: Sequence[Settled]) -> None:
        """Settled figures (a listener, on a reader thread): each replaces what its first
        counted; one unknown at the end leaves its first figure (nothing, if that was
        unknown too: a reader that fails never refuses anyone). A hard budget's usual cost
        is learnt from settled figures once there are any (first figures run low or high)."""
        pending = self._pending
        changed = False
        blind: list[int] = []
        with self._lock:
            if not pending:
                return
            for item in batch:
                energy = item.energy
                entry = pending.pop(energy.id, None) if energy.id is not None else None
                if entry is None:
                    continue
                slots, counts = entry
                for (i, key, period, reserved), (first, counted) in zip(slots, counts, strict=True):
                    if not reserved and self._hard[i] and self._measuring.get((i, key)) != math.inf:
                        # the key held after its first closed (not a request of it in flight):
                        # learnt from this figure below, or blind, its cost no longer holds it
                        self._measuring.pop((i, key), None)
                    last = energy.joules if self._joules[i] else energy.carbon_grams
                    if last is not None and last > 0:
                        final = last
                        if self._hard[i]:
                            self._settle_learning(i)
                            self._learn_usual(i, last)
                    else:
                        final = first  # unknown at the end: the first figure stands
                        if not first and self._hard[i] and self._blinded(i):  # unknown at both ends
                            blind.append(i)
                    if final != counted:
                        self._add(i, key, period, final - counted)
                        changed = True
            if changed:
                self._dirty = True
        if changed and not self._wake.is_set():
            self._wake.set()
        for i in blind:
            self._said_blind(i)

    # -- the budgets' thread ----------------------------------------------------------------
    def start(self) -> None:
        """Start the budgets' thread (once; in the process that serves, after any fork)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="giul-budgets", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def setup(self) -> None:
        """Find the server's folder in the host's place (file I/O: on the budgets' thread)."""
        place = resolve(self._directory)
        log_unshared(place)
        if place.path is None:
            self.shared_reason = place.reason
            if any(b.hard for b in self.budgets):
                log.warning("budgets are this worker's alone (%s): with several workers each "
                            "admits up to the whole of a hard budget's limit", place.reason)
            return
        server = self._server if self._server is not None else server_identity()
        try:
            self.folder = ServerSpending(place.path, server, tag=f"b{next(_instances)}")
            self._dirty = True  # a row at once, spent or not: the others count this worker
        except OSError as exc:
            self._unshare(f"cannot write the budgets in {place.path}: {exc.strerror or exc}", exc)
            return
        self.shared_reason = None

    def _run(self) -> None:
        try:
            self.setup()
        except Exception:  # never the server's: budgets per process, said
            log.exception("budgets could not find their shared folder; they are this worker's alone")
            self.shared_reason = "internal error finding the shared folder (see the log)"
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                if not self._failed_said:
                    self._failed_said = True
                    log.exception("budgets' thread failed a round (said once); it goes on")
            if self._stop.wait(NEAR_EVERY_S if self._near else MIN_GAP_S):
                break
            self._wake.wait(self._wait())
            self._wake.clear()
        self._final_write()

    def _every(self, mono: float) -> float:
        """The time between two sums: ``every_s``, four times that when all is quiet,
        NEAR_EVERY_S near a hard limit."""
        if self._near:
            return NEAR_EVERY_S
        return self._every_s if mono - self._last_change < QUIET_S else 4 * self._every_s

    def _wait(self) -> float:
        """Until the next sum, or the next period's start if sooner; a close wakes the
        thread before (to write its row)."""
        mono, now = time.monotonic(), self._clock()
        ends = min((c + 1) * p for c, p in zip(self._current, self._period_s, strict=True))
        return max(0.0, min(self._every(mono) - (mono - self._last_read), ends - now + 0.0005))

    def tick(self, *, read: bool = False) -> None:
        """One round: write this worker's row if it changed, sum the others' rows every
        ``every_s`` (or now: ``read``), swap the dictionary, count crossings, fold the dead
        now and then."""
        now, mono = self._clock(), time.monotonic()
        current = [int(now // p) for p in self._period_s]
        with self._lock:
            rolled = current != self._current
            if rolled:
                self._prune(current)
            dirty, self._dirty = self._dirty, False
            own = self._named(self._own) if dirty or rolled else None
            refused = self._named(self._refused) if own is not None else None
            usual = {b.name: self._usual[i] for i, b in enumerate(self.budgets)
                     if b.name is not None and self._hard[i] and self._usual_learnt[i]}
        folder = self.folder
        since = {b.name: current[i] for i, b in enumerate(self.budgets) if b.name is not None}
        if dirty or rolled:
            self._last_change = mono
        if folder is not None:
            try:
                if own is not None and refused is not None:
                    folder.write(own, refused, usual)
                fold = mono - self._last_fold > FOLD_S
                if read or rolled or fold or mono - self._last_read >= 0.9 * self._every(mono):
                    self._last_read = mono
                    found = folder.read(since, again=rolled, alive_too=fold)
                    if found.changed:
                        self._last_change = mono
                        self._others = self._indexed(found.spent)
                        self._others_refused = self._indexed(found.refused)
                        self.workers = 1 + found.live
                        self._crossed = found.crossed
                        self._borrow_usual(found.usual)
                if fold:
                    self._last_fold = mono
                    if folder.fold(since):
                        self._last_read = -math.inf  # the folder changed: sum it next round
            except OSError as exc:
                self._unshare(f"cannot write or read the budgets in {folder.folder}: "
                              f"{exc.strerror or exc}", exc)
        elif rolled:
            self._others, self._others_refused = {}, {}
        with self._lock:
            spent = dict(self._others)
            for (i, key, period), value in self._own.items():
                if period == current[i]:
                    spent[(i, key)] = spent.get((i, key), 0.0) + value
            self.spent = spent
            self._current = current
            totals = list(spent.items())  # the loop adds to ``spent`` from now on
        limits = self._limits
        self._near = any(self._hard[i] and NEAR * limits[i] <= value < limits[i] for (i, _), value in totals)
        self._crossings(totals, current)

    def _prune(self, current: list[int]) -> None:
        """Forget this worker's counts of periods that are over (under the lock)."""
        for table in (self._own, self._refused):
            for slot in [s for s in table if s[2] < current[s[0]]]:
                del table[slot]
        self._keys = [0] * len(self.budgets)
        for i, _key, period in self._own:
            if period == current[i]:
                self._keys[i] += 1
        self._crossed_seen = {s for s in self._crossed_seen if s[2] >= current[s[0]]}

    def _named(self, table: dict[tuple[int, str, int], float]) -> Spent:
        names = [b.name or "" for b in self.budgets]
        return {(names[i], key, period): value for (i, key, period), value in table.items()}

    def _indexed(self, table: Spent) -> dict[tuple[int, str], float]:
        out: dict[tuple[int, str], float] = {}
        for (name, key, _period), value in table.items():
            i = self._index.get(name)
            if i is not None:
                out[(i, key)] = out.get((i, key), 0.0) + value
        return out

    def _crossings(self, totals: list[tuple[tuple[int, str], float]], current: list[int]) -> None:
        """Log and count each (budget, key) that reached its limit this period, once
        server-wide: whichever worker claims it first."""
        for (i, key), value in totals:
            budget = self.budgets[i]
            slot = (i, key, current[i])
            if value < budget.limit or slot in self._crossed_seen:
                continue
            self._crossed_seen.add(slot)
            folder = self.folder
            name = budget.name or ""
            if folder is not None:
                try:
                    crossed = folder.claim(name, key, current[i])
                    if crossed is None:
                        continue
                    self._crossed = crossed
                except OSError as exc:
                    log.warning("budget %r: cannot count its crossing in %s: %s", name, folder.folder,
                                exc.strerror or exc)
                    continue
            else:
                self._crossed[(name, key)] = self._crossed.get((name, key), 0) + 1
            end = datetime.fromtimestamp((current[i] + 1) * budget.period_s, UTC)
            what = ("its requests are refused (429) until then" if budget.hard
                    else "soft: its requests go on")
            log.warning("energy budget %r crossed for %s %r: %s of %s %s spent in the period ending "
                        "%s; %s", name, budget.per, key, number(value), number(budget.limit),
                        "J" if budget.unit == "J" else "g CO2e", end.strftime("%Y-%m-%dT%H:%M:%SZ"), what)

    def _unshare(self, reason: str, exc: BaseException | None = None) -> None:
        """From now on, this worker's budgets are its own: said once, loudly."""
        self.shared_reason = reason
        folder, self.folder = self.folder, None
        if folder is not None:
            folder.close()
        self._others, self._others_refused = {}, {}
        self.workers = 1
        log.warning("budgets are this worker's alone from now on: %s -> %s. Until then each worker "
                    "admits up to each budget's whole limit, and /energy says shared: false",
                    reason, remedy(exc))

    def _final_write(self) -> None:
        folder = self.folder
        if folder is None:
            return
        with self._lock:
            own, refused = self._named(self._own), self._named(self._refused)
        with contextlib.suppress(OSError):
            folder.write(own, refused)  # the row stays: a dead worker's spending counts
        folder.close()
        self.folder = None
        self.shared_reason = "stopped (the server shut down)"

    def close(self) -> None:
        """Stop the thread; this worker's last counts are written (its row stays, folded
        once it is dead: what it spent counts until its period ends)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    # -- what /energy and Prometheus show -------------------------------------------------------
    def exceeded(self) -> dict[tuple[str, str], int]:
        """How many times each (budget, key) was crossed since the server started."""
        return dict(self._crossed)

    def snapshot(self, *, max_keys: int = 100) -> dict[str, Any]:
        """Each budget's state this period: limit, spent, remaining per key (the
        ``max_keys`` that spent most), when the period ends."""
        now = self._clock()
        with self._lock:  # the loop adds to the dictionary: a copy, not a view
            spent = dict(self.spent)
            refused = dict(self._others_refused)
            for (i, key, period), n in self._refused.items():
                if period == self._current[i]:
                    refused[(i, key)] = refused.get((i, key), 0.0) + n
        crossed = self.exceeded()
        items = []
        for i, budget in enumerate(self.budgets):
            period = int(now // budget.period_s)
            mine = period == self._current[i]
            keys = sorted(((k, v) for (j, k), v in spent.items() if j == i and mine),
                          key=lambda kv: -kv[1])
            shown = {}
            for key, value in keys[:max_keys]:
                shown[key] = {"spent": value, "remaining": max(0.0, budget.limit - value),
                              "over": value >= budget.limit,
                              "refused": int(refused.get((i, key), 0))}
            items.append({
                "name": budget.name, "unit": budget.unit, "limit": budget.limit, "per": budget.per,
                "key": budget.key, "period_s": budget.period_s, "hard": budget.hard,
                "period_start": period * budget.period_s, "period_end": (period + 1) * budget.period_s,
                "keys": shown, "keys_more": max(0, len(keys) - max_keys),
                "exceeded": {k: n for (name, k), n in sorted(crossed.items()) if name == budget.name},
            })
        return {"shared": self.folder is not None, "shared_reason": self.shared_reason,
                "workers": self.workers, "items": items}


__all__ = ["EVERY_S", "HOLD_S", "MAX_KEYS", "MAX_MEASURING", "NAME", "REMAINING", "Admitted", "Budgets",
           "Measuring", "NotSpent", "OverBudget", "Reserved", "Slots"]
