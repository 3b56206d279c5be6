"""EnergyStats: rolling statistics of settled figures, per label key, in bounded memory.

Every metered request is counted once, from its settled figure, whatever became of the
response. Figures arrive in batches on a ledger's reader thread (:meth:`EnergyStats.settled`,
the :class:`~giul_asgi.listeners.Listener` contract): one lock a batch, and each record goes
into one cell, its key's cell of the current step, in constant time. Windows and groups
are merged when someone reads (:meth:`snapshot`, :meth:`counters`, :meth:`state`): reads are
rare, records are not. A reader folds the past steps' cells into the windows' slots
(:mod:`.rolling`) and keeps, per window, the merge per group label of the closed slots
(:mod:`.groups`), so that the next read adds only what closed since.

Memory is bounded by keys x slots x bins, whatever the number of requests:

* keys <= ``labels.key_bound(max_keys)`` (``max_keys`` + 140: method x outcome x status
  class past the bound), each group at most ``max_labels`` names;
* cells per key <= ``Geometry.slots_per_key()``: 1 current + ``pending_steps`` past steps
  not folded yet + the rings' ``points`` + base + the since-start merge (93 with the default
  windows: 1 + 24 + 6 + 30 + 30 + 2);
* bins per cell <= ``3 * sketch.BINS`` (three sketches of 1756 bins);
* what readers keep: per window, labels x (3 x 1756) dense counts, and the closed slots'
  points (labels x ``points``);
* node samples <= nodes x (longest window's steps + 2).

:meth:`EnergyStats.size` counts them; tests/test_stats.py checks the bound at 1e5 and 1e6
records. A raw-label cache (raw labels -> key) is cleared past ``2 * max_keys`` entries.

Recording never raises: a record that cannot be counted (a field of the wrong type)
increments ``dropped``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import add
from typing import Any

from ..energy import Energy
from ..errors import ConfigError
from ..listeners import Settled
from ..tenants import DEFAULT_MAX_TENANTS, TenantPlaces
from .cell import MAX_REQUESTS, NG, NJ, Cell, Point
from .contract import Counter, LabelSums
from .groups import Sums, Table, points, table, window_table
from .labels import NONE, OTHER, Key, Labels, is_key, key_bound
from .nodes import NodeSamples, Sample
from .rolling import Geometry, Ring, Rolling
from .sketch import BINS, JOULE_BUCKETS, joule_buckets
from .snapshot import Points, Reading, render

#: Format of :meth:`EnergyStats.state` (what one worker writes for the others).
STATE_SCHEMA = "giul-asgi/stats-state/4"


class EnergyStats:
    """Rolling statistics fed by settled figures.

    ``windows`` are durations (``"1m"``, ``"15m"``, ``"1h"``) and ``"all"``; ``step_s`` is
    the finest slot; each finite window keeps at most ``points`` slots; ``max_labels``
    bounds each group, ``<other>`` included; ``max_keys`` bounds the label keys;
    ``max_tenants`` tenants, those with the most joules, keep their own label
    (:class:`~giul_asgi.tenants.TenantPlaces`), the rest count under ``<other>``.
    """

    def __init__(
        self,
        windows: Iterable[str] = ("1m", "15m", "1h", "all"),
        *,
        step_s: float = 10.0,
        points: int = 30,
        max_labels: int = 256,
        max_keys: int = 4096,
        max_tenants: int = DEFAULT_MAX_TENANTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.geometry = Geometry(tuple(windows), step_s, points)
        #: Which tenants keep their own label (under the lock, like the labels).
        self.tenants = TenantPlaces(max_tenants, other=OTHER)
        # Tenant names are bounded by the places (2 x max_tenants a worker, and <none>,
        # <other>) and by max_keys, not by max_labels: a merge of several workers' tenants
        # must keep every one, whatever order their rows come in, or a scrape could move a
        # tenant's counts to <other> and back.
        self.labels = Labels(max_labels, max_keys, max_tenant_labels=max_keys + 1)
        self.clock = clock
        self._lock = threading.Lock()  # records and the state
        self._read_lock = threading.Lock()  # readers, and the points they cache
        self._keys: dict[Key, Rolling] = {}
        self._raw: dict[tuple[Any, ...], Rolling] = {}  # raw labels -> their key's cells
        self._step = int(clock() // self.geometry.step_s)  # the latest step seen
        # What readers keep between reads (under the read lock): per ring, the merge per group
        # label of its closed slots; since start, the same; the closed slots' points.
        self._sums = [Sums() for _ in self.geometry.rings]
        self._all = Sums()
        self._points: dict[tuple[int, int], dict[str, dict[str, Point]]] = {}
        self._buckets: dict[Key, tuple[int, list[int]]] = {}  # key -> (requests, its buckets)
        span = max((w * n for w, n in self.geometry.rings), default=1) * self.geometry.step_s
        self._nodes = NodeSamples(self.geometry.step_s, span)
        self.started_at = clock()
        self.dropped = 0
        #: records taken (counted or dropped): what changed since a worker last wrote.
        self.records = 0
        #: Called under the lock with each batch's counted records ``(key, settled)`` and
        #: their step (a HostStats writes them in place, :mod:`.tail`).
        self.journal: Callable[[list[tuple[Key, Settled]], int], None] | None = None

    def renew_locks(self) -> None:
        """New locks, in a forked child: one another thread of the parent held at the fork
        stays held in the child for ever (gunicorn --preload forks a master whose writer
        thread cuts rows under them)."""
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()

    @property
    def windows(self) -> tuple[str, ...]:
        return self.geometry.names

    @property
    def step_s(self) -> float:
        return self.geometry.step_s

    @property
    def default_window(self) -> str:
        return self.geometry.default

    def window_seconds(self, window: str) -> float | None:
        return self.geometry.seconds(window)

    # -- recording ------------------------------------------------------------------------

    def settled(self, batch: Sequence[Settled]) -> None:
        """Count the figures one reading settled: one lock, one cell each. Never raises."""
        dropped = 0
        journal = self.journal
        counted: list[tuple[Key, Settled]] | None = [] if journal is not None else None
        with self._lock:
            step = self._now()
            raw = self._raw
            places = self.tenants
            for s in batch:
                try:
                    e = s.energy
                    t = e.tenant
                    labels = (e.route, e.node, e.tier, e.method, s.outcome, s.status,
                              NONE if t is None else places.label(t, e.joules))
                    rolling = raw.get(labels)
                    if rolling is None:
                        rolling = self._rolling(labels)
                    cell = rolling.cell if rolling.step == step else rolling.at(step)
                    cell.add(e.joules, e.tokens, e.seconds, e.contended, e.carbon_grams,
                             e.allocated_joules)
                    if counted is not None:
                        counted.append((rolling.key, s))  # type: ignore[arg-type]
                except Exception:
                    dropped += 1
            self.dropped += dropped
            self.records += len(batch)
            if journal is not None and counted:
                journal(counted, step)  # under the lock: in the state or after its cut, never both

    def record(self, energy: Energy, *, outcome: str, status: int | None) -> None:
        """Count one request (a batch of one)."""
        self.settled((Settled(energy, outcome, status),))

    def _now(self) -> int:
        """The current step; never before the latest one seen (a clock stepped back)."""
        step = int(self.clock() // self.geometry.step_s)
        if step > self._step:
            self._step = step
        return self._step

    def _rolling(self, labels: tuple[Any, ...]) -> Rolling:
        """The cells of raw labels' key (made on first sight), remembered for the raw labels."""
        rolling = self._key_rolling(self.labels.key(*labels))
        if len(self._raw) >= 2 * self.labels.max_keys:
            self._raw.clear()
        self._raw[labels] = rolling
        return rolling

    def _key_rolling(self, key: Key) -> Rolling:
        rolling = self._keys.get(key)
        if rolling is None:
            rolling = self._keys[key] = Rolling(self.geometry, self._step, key)
        return rolling

    def observe_nodes(self, totals: Iterable[Any]) -> None:
        """Sample ledger totals (measured, charged, unattributed joules) for the power
        series: at most one sample per step per node, the latest kept. Never raises."""
        try:
            now = self.clock()
            with self._lock:
                for t in totals:
                    self._nodes.observe(str(getattr(t, "node", None) or NONE), t, now)
        except Exception:
            self.dropped += 1

    def observe_history(self, histories: Mapping[str, Sequence[Sequence[Any]]]) -> None:
        """Fold in samples the ledgers took themselves, one a step (node name ->
        ``(t, measured_j, charged_j, unattributed_j, reads)`` each, wall-clock ``t``; see
        :mod:`giul_asgi.ledger.history`): the power series has a point a step whether or
        not anyone read /energy. Never raises."""
        try:
            now = self.clock()
            parsed = {str(name): [Sample(*(float(x) if x is not None else None for x in s))  # type: ignore[arg-type]
                                  for s in samples] for name, samples in histories.items()}
            with self._lock:
                for name, samples in parsed.items():
                    self._nodes.add(name, samples, now)
        except Exception:
            self.dropped += 1

    # -- reading --------------------------------------------------------------------------

    def _fold_all(self) -> int:
        """Under both locks: fold every key's pending cells into its slots, and take the
        slots that left their window out of the readers' sums. Returns the current step."""
        step = self._now()
        longest = self.geometry.longest
        every = self._all
        dirty = False
        for key, rolling in self._keys.items():
            if rolling.step != step:
                rolling.move(step)
            if rolling.dirty:
                dirty, rolling.dirty = True, False
            for index, left in enumerate(rolling.fold()):
                sums = self._sums[index]
                for slot, cell in left:
                    if sums.upto is not None and slot < sums.upto:
                        sums.add_cell(key, cell, -1)
                    if index == longest and every.upto is not None and slot >= every.upto:
                        every.add_cell(key, cell)  # left before a reader counted it
        if dirty:  # slots left unseen (no reader for a while): merge again from the keys
            for sums in (*self._sums, every):
                sums.reset()
            self._points.clear()
        return step

    def _closing(self, index: int, newest: int) -> dict[int, list[tuple[Key, Cell]]]:
        """Under both locks: the slots of ring ``index`` that closed since its sums were last
        brought up to date, each as its keys' cells (closed: nothing writes them any more)."""
        first = newest - self.geometry.rings[index][1] + 1
        upto = self._sums[index].upto
        return {slot: [(k, c) for k, r in self._keys.items()
                       if (c := r.rings[index].slots.get(slot)) is not None]
                for slot in range(first if upto is None else max(upto, first), newest)}

    def _close(self, index: int, newest: int,
               closing: dict[int, list[tuple[Key, Cell]]]) -> dict[int, Table]:
        """Under the read lock only (records go on): add the closing slots to ring
        ``index``'s sums and keep their points; returns their tables."""
        sums = self._sums[index]
        first = newest - self.geometry.rings[index][1] + 1
        tables = {}
        for slot, cells in closing.items():
            t = tables[slot] = table(cells)
            sums.add(t)
            self._points[(index, slot)] = points(t)
        sums.upto = newest
        for gone in [k for k in self._points if k[0] == index and k[1] < first]:
            del self._points[gone]
        return tables

    def _since_start_parts(
        self, newest: int, closing: dict[int, list[tuple[Key, Cell]]],
    ) -> list[tuple[Key, Cell]]:
        """Under both locks: what the since-start sums lack, but for the closing slots of the
        longest ring: the keys' cells of its closed slots since the sums were last brought up
        (all of them, and a copy of each key's base, when the sums were never built)."""
        every = self._all
        index = self.geometry.longest
        if index is None:
            return [(k, r.since_start()) for k, r in self._keys.items()]
        lo = -1 if every.upto is None else every.upto
        parts = [(k, r.base.copy()) for k, r in self._keys.items()] if every.upto is None else []
        for k, r in self._keys.items():
            parts += [(k, c) for slot, c in r.rings[index].slots.items()
                      if lo <= slot < newest and slot not in closing]
        return parts

    def _since_start(self, newest: int, parts: list[tuple[Key, Cell]],
                     tables: dict[int, Table]) -> Table:
        """Under the read lock only: the since-start sums, brought up to ``newest``."""
        every = self._all
        if self.geometry.longest is None:
            return table(parts)  # nothing rolls: everything, this once
        lo = -1 if every.upto is None else every.upto
        for key, cell in parts:
            every.add_cell(key, cell)
        for slot, t in tables.items():
            if slot >= lo:
                every.add(t)
        every.upto = newest
        return every.table

    def snapshot(
        self, window: str | None = None, *, route: str | None = None, node: str | None = None,
        tenant: str | None = None, series: bool = True,
    ) -> dict[str, Any]:
        """The documented JSON (docs/energy-schema.md) for one window, without ledgers.

        ``route``/``node``/``tenant`` keep only that row in its section (and its series);
        the other sections and the totals are the whole host's.
        """
        window = window or self.default_window
        window_s = self.geometry.seconds(window)  # validates
        index = self.geometry.ring_of[window]
        ring = self.geometry.longest if index is None else index
        with self._read_lock:
            with self._lock:  # only what records change, or copies of it
                step = self._fold_all()
                newest = step if ring is None else step // self.geometry.rings[ring][0]
                closing = self._closing(ring, newest) if ring is not None else {}
                parts = self._since_start_parts(newest, closing) if index is None else []
                # the open slot of each key: copies, since records go on
                opens = [(k, r.open_cell(ring)) for k, r in self._keys.items()]
                nodes = self._nodes.copy()
                dropped = self.dropped
            tables = self._close(ring, newest, closing) if ring is not None else {}
            current = table(opens)
            if index is not None:
                merged = window_table(self._sums[index].table, current)
            elif ring is not None:
                merged = window_table(self._since_start(newest, parts, tables), current)
            else:
                merged = self._since_start(newest, parts, tables)
            pts = self._series(ring, step, current) if series else None
        reading = Reading(
            generated_at=self.clock(), started_at=self.started_at, window=window,
            window_s=window_s, windows=self.windows, step_s=self.step_s, dropped=dropped,
            table=merged, points=pts, nodes=nodes,
        )
        return render(reading, route=route, node=node, tenant=tenant)

    def _series(self, ring: int | None, step: int, current: Table) -> Points:
        """A window's points: the closed slots' kept ones, and the open slot's."""
        if ring is None:
            return Points(width=1, n=1, newest=step, groups=_by_slot({step: points(current)}))
        width, n = self.geometry.rings[ring]
        newest = step // width
        by_slot = {slot: self._points.get((ring, slot), {}) for slot in range(newest - n + 1, newest)}
        by_slot[newest] = points(current)
        return Points(width=width, n=n, newest=newest, groups=_by_slot(by_slot))

    def view(self) -> EnergyStats:
        """What a reader reports: these statistics (a HostStats answers the host's)."""
        return self

    def node_power(self) -> dict[str, float | None]:
        """Above-idle watts per node between its last two samples (None if unknown)."""
        return {name: rates[0] for name, rates in self.node_rates().items()}

    def node_rates(self) -> dict[str, tuple[float | None, float | None]]:
        """(above-idle watts, reads per second) per node from its last two samples."""
        with self._lock:
            return self._nodes.rates()

    def copy_nodes_from(self, other: EnergyStats) -> None:
        """Take ``other``'s node samples (a merged view reports the answering worker's)."""
        with other._lock:
            samples = other._nodes.copy()
        with self._lock:
            self._nodes.samples = samples

    def counters(self) -> list[Counter]:
        """Since-start counters per (route, node, tier, method, outcome, tenant): requests,
        known, joules, tokens and the joules histogram (per :data:`JOULE_BUCKETS`, last is
        +Inf). Merged at read from every key's cells; exact integers, so they never go
        backwards (a tenant that loses its place keeps what it counted)."""
        merged: dict[tuple[str, str, str, str, str, str], list[Any]] = {}
        with self._read_lock:
            with self._lock:
                self._fold_all()
                parts = [(key, r.closed_since_start(), r.open_cell(None))
                         for key, r in self._keys.items()]
                # ``closed`` changes only under the lock: read what is needed of it now
                parts_now = [(key, closed.requests, closed.known, closed.nj, closed.tokens,
                              self._closed_buckets(key, closed), current)
                             for key, closed, current in parts]
            for key, n, known, nj, tokens, buckets, current in parts_now:
                six = (*key[:5], key[6])
                acc = merged.get(six)
                if acc is None:
                    acc = merged[six] = [0, 0, 0, 0, [0] * (len(JOULE_BUCKETS) + 1)]
                acc[0] += n + current.requests
                acc[1] += known + current.known
                acc[2] += nj + current.nj
                acc[3] += tokens + current.tokens
                acc[4] = list(map(add, acc[4], buckets))
                if current.known:
                    acc[4] = list(map(add, acc[4], joule_buckets(current.bins)))
        return [(six, n, known, nj / NJ, tokens, buckets)
                for six, (n, known, nj, tokens, buckets) in merged.items()]

    def carbon_counters(self) -> LabelSums:
        """Since-start grams of CO2eq per (route, node, tier, method, tenant), summed over the
        figures whose carbon is known (labels with none are left out): exact integers."""
        merged: dict[tuple[str, str, str, str, str], int] = {}
        with self._read_lock, self._lock:
            self._fold_all()
            parts = [(key, r.closed_since_start(), r.open_cell(None)) for key, r in self._keys.items()]
            sums = [((*key[:4], key[6]), closed.carbon_known + current.carbon_known,
                     closed.carbon_ng + current.carbon_ng) for key, closed, current in parts]
        for four, known, ng in sums:
            if known:
                merged[four] = merged.get(four, 0) + ng
        return {four: ng / NG for four, ng in merged.items()}

    def allocated_counters(self) -> LabelSums:
        """Since-start allocated joules (above idle plus the idle floor's share) per (route,
        node, tier, method, tenant), over the figures where they are known: exact integers."""
        merged: dict[tuple[str, str, str, str, str], int] = {}
        with self._read_lock, self._lock:
            self._fold_all()
            parts = [(key, r.closed_since_start(), r.open_cell(None)) for key, r in self._keys.items()]
            sums = [((*key[:4], key[6]), closed.alloc_known + current.alloc_known,
                     closed.alloc_nj + current.alloc_nj) for key, closed, current in parts]
        for five, known, nj in sums:
            if known:
                merged[five] = merged.get(five, 0) + nj
        return {five: nj / NJ for five, nj in merged.items()}

    def _closed_buckets(self, key: Key, closed: Cell) -> list[int]:
        """``joule_buckets`` of a key's since-start closed cell, kept until it grows."""
        kept = self._buckets.get(key)
        if kept is None or kept[0] != closed.requests:
            kept = self._buckets[key] = (closed.requests, joule_buckets(closed.bins))
        return kept[1]

    def size(self) -> dict[str, int]:
        """What the statistics hold now, to check against :meth:`bound` (the readers'
        merges per group label are bounded by labels, not counted here)."""
        with self._lock:
            per_key = [r.cells() for r in self._keys.values()]
            cells = [c for cs in per_key for c in cs]
            return {
                "keys": len(self._keys),
                "cells": len(cells),
                "most_cells_a_key": max((len(cs) for cs in per_key), default=0),
                "bins": sum(len(c.bins) for c in cells),
                "most_bins_a_cell": max((len(c.bins) for c in cells), default=0),
                "raw_labels": len(self._raw),
                "node_samples": sum(len(v) for v in self._nodes.samples.values()),
                "tenants_placed": self.tenants.size()["placed"],
                "tenant_candidates": self.tenants.size()["candidates"],
            }

    def bound(self) -> dict[str, int]:
        """The most each count of :meth:`size` can reach, whatever the number of records."""
        keys = key_bound(self.labels.max_keys)
        per_key = self.geometry.slots_per_key()
        return {"keys": keys, "cells": keys * per_key, "most_cells_a_key": per_key,
                "bins": keys * per_key * 3 * BINS, "most_bins_a_cell": 3 * BINS,
                "raw_labels": 2 * self.labels.max_keys,
                "tenants_placed": self.tenants.bound()["placed"],
                "tenant_candidates": self.tenants.bound()["candidates"]}

    # -- state, for several workers -------------------------------------------------------

    def state(self, cut: Callable[[], Any] | None = None) -> dict[str, Any]:
        """Everything mergeable, JSON-ready: what a worker writes for the others to read.
        Under the lock, only copies of what records still change (base, the open slots, the
        current cell); the closed slots, which nothing writes, are written out after it.
        ``cut()`` runs under the lock too (what it returns is the state's ``"cut"``): records
        are in this state exactly when :attr:`journal` saw them before it."""
        with self._read_lock, self._lock:
            step = self._fold_all()
            parts = [(key, r.base.copy(), [_slots(ring, step) for ring in r.rings], r.cell.copy())
                     for key, r in self._keys.items()]
            head = {
                "schema": STATE_SCHEMA,
                "geometry": self.geometry.describe(),
                "step": step,
                "started_at": self.started_at,
                "dropped": self.dropped,
            }
            if cut is not None:
                head["cut"] = cut()
        head["keys"] = [[*key, base.state(), [[[slot, c.state()] for slot, c in ring] for ring in rings],
                         cell.state()] for key, base, rings, cell in parts]
        return head

    def merge_state(self, state: Mapping[str, Any]) -> None:
        """Add another worker's :meth:`state` into these statistics (same configuration)."""
        if state.get("schema") != STATE_SCHEMA or state.get("geometry") != self.geometry.describe():
            raise ConfigError(
                "a worker's statistics were written with another configuration",
                remedy="give every worker the same windows, step_s and points, and clear the directory",
            )
        parsed = []
        for row in state["keys"]:  # parse everything before changing anything
            rings = [[(int(slot), Cell.from_state(data)) for slot, data in slots] for slots in row[8]]
            if len(rings) != len(self.geometry.rings):
                raise ValueError("a row with another number of rings")
            key = tuple(row[:7])
            if not is_key(key):
                raise ValueError(f"a row without a key: {key!r}")
            parsed.append((key, Cell.from_state(row[7]), rings, Cell.from_state(row[9])))
        their_step = _whole(state["step"], "step")
        started_at = float(state["started_at"])
        dropped = _whole(state.get("dropped", 0), "dropped")
        if not math.isfinite(started_at):
            raise ValueError(f"started_at={started_at!r} is not a time")
        with self._read_lock, self._lock:
            step = self._fold_all()
            self.started_at = min(self.started_at, started_at)
            self.dropped += dropped
            for key, base, rings, cell in parsed:
                rolling = self._key_rolling(self.labels.bounded(key))  # type: ignore[arg-type]
                rolling.base.merge(base)
                for ring, slots in zip(rolling.rings, rings, strict=True):
                    for slot, c in slots:
                        ring.add(slot, c, owned=True)  # parsed here: nobody else has it
                _put(rolling, their_step, step, cell)
                rolling.forget()
                rolling.dirty = True  # the readers' sums must be merged again
            self._buckets.clear()
            self._fold_all()

    def merge_cells(self, cells: Iterable[tuple[Key, int, Cell]]) -> None:
        """Add cells counted elsewhere, each at its key and step (another worker's figures
        settled since its last row, :mod:`.tail`). Keys are bounded here."""
        with self._read_lock, self._lock:
            step = self._fold_all()
            for key, at, cell in cells:
                if not is_key(key):
                    continue
                rolling = self._key_rolling(self.labels.bounded(key))
                _put(rolling, at, step, cell)
                rolling.forget()
                rolling.dirty = True
            self._buckets.clear()
            self._fold_all()

    def empty_like(self) -> EnergyStats:
        """New, empty statistics with this configuration and clock."""
        return EnergyStats(self.windows, step_s=self.step_s, points=self.geometry.points,
                           max_labels=self.labels.max_labels, max_keys=self.labels.max_keys,
                           max_tenants=self.tenants.max_tenants, clock=self.clock)


def _put(rolling: Rolling, at: int, step: int, cell: Cell) -> None:
    """Add a cell counted at step ``at`` to ``rolling`` (whose step is ``step``): the
    current cell, or a past step's, merged with what that step holds already."""
    if not cell.requests:
        return
    if at >= step:
        rolling.cell.merge(cell)
        return
    mine = rolling.pending.get(at)
    if mine is not None:
        mine.merge(cell)  # several rows, or a row and a tail, in one step: add, never replace
        return
    rolling.pending[at] = cell
    if len(rolling.pending) > 1 and next(reversed(rolling.pending)) != at:
        rolling.pending = dict(sorted(rolling.pending.items()))


def _whole(value: Any, what: str) -> int:
    """A count from another worker's row: a whole number, not negative (a bool, a float,
    NaN or a string is a damaged row)."""
    if type(value) is not int or not 0 <= value < MAX_REQUESTS:
        raise ValueError(f"{what}={value!r} is not a count")
    return value


def _slots(ring: Ring, step: int) -> list[tuple[int, Cell]]:
    """A ring's slots: the closed ones as they are (nothing writes them), the open one copied."""
    newest = step // ring.width
    return [(slot, cell.copy() if slot >= newest else cell) for slot, cell in ring.slots.items()]


def _by_slot(
    by_slot: Mapping[int, Mapping[str, Mapping[str, Point]]],
) -> dict[str, dict[str, dict[int, Point]]]:
    """slot -> group -> label -> point, as group -> label -> slot -> point."""
    out: dict[str, dict[str, dict[int, Point]]] = {}
    for slot, groups in by_slot.items():
        for group, by_name in groups.items():
            section = out.setdefault(group, {})
            for name, point in by_name.items():
                section.setdefault(name, {})[slot] = point
    return out


__all__ = ["JOULE_BUCKETS", "STATE_SCHEMA", "EnergyStats"]
