"""Rolling statistics per route, node, tier and method, in memory bounded by labels.

Every metered request is recorded once, with its settled figure, whatever became of the
response (``ok``, ``error``, ``disconnect``, ``cancelled``, ``incomplete``). A figure whose
``joules`` is unknown (``None``) is counted in the request count and the method mix, never
as 0 J in a sum or a quantile.

A record goes into one *series*: its full key ``(route, node, tier, method)``. The groups
that ``/energy`` reports (per route, per node, per tier, per method, and the totals) are
merges of those series, made when someone reads (reads are rare, records are not). Each
series keeps, per finite window (``1m``, ``15m``, ``1h`` by default), a ring of at most
``points`` slots, each a whole number of steps (``step_s``, 10 s by default) wide; a
record adds into the current slot of each ring. A slot that falls out of the longest
window is merged into the series' ``base`` cell, so "since start" is ``base`` plus the
longest ring. Memory is bounded by series x slots x occupied sketch bins, never by the
number of requests.

A cell holds counters and three DDSketch quantile sketches (joules, joules per token,
seconds) with the library's logarithmic mapping, as a dict of occupied bins. Sketches
merge exactly (bins add), so a window is the merge of its slots, a group the merge of its
series, and several worker processes merge the same way.

A window ``w`` covers the last ``w`` seconds to within one slot (a slot is at most
``w / points``): the newest slot is partial, the oldest one is dropped whole. Slots are
aligned on wall-clock time (``time.time()``), so workers' slots line up.

Each series also keeps since-start counters per outcome, with a log-bucketed histogram of
joules per request, for the Prometheus and OpenTelemetry exporters: counters, never
averages.

Recording is O(1) (a few dict updates under one lock) and never raises: a record that
cannot be counted increments ``dropped``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ddsketch.mapping import LogarithmicMapping

from .errors import ConfigError

SCHEMA = "giul-asgi/energy/1"
_K = TypeVar("_K")
GROUPS: tuple[str, ...] = ("route", "node", "tier", "method")
OUTCOMES: tuple[str, ...] = ("ok", "error", "disconnect", "cancelled", "incomplete")
METHOD_MIX: tuple[str, ...] = ("measured", "estimated", "simulated", "unknown")
OTHER = "<other>"
NONE = "<none>"
UNMATCHED = "<unmatched>"
#: Relative accuracy of every quantile: a p50 of 100 J means 99 to 101 J.
ACCURACY = 0.01
_MAPPING = LogarithmicMapping(ACCURACY)
# The mapping's own key(), inlined (same expression, same floats: a test checks it): one
# call less per value, measured 0.3 us per record of the three.
_MULT = _MAPPING._multiplier
_OFFSET = _MAPPING._offset
_log = math.log
_ceil = math.ceil
#: Which sketch an encoded bin belongs to: encoded = 3 * ddsketch key + which.
J, JPT, SEC = 0, 1, 2
#: Joules-per-request histogram bounds for Prometheus/OTEL: log-spaced, 3 per decade.
JOULE_BUCKETS: tuple[float, ...] = tuple(
    float(f"{10 ** (e / 3):.3g}") for e in range(-6, 16)
)  # 0.01 J .. 100 kJ
_SECONDS_FLOOR = 1e-6
_WINDOW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class EnergyLike(Protocol):
    """The fields of :class:`giul_asgi.energy.Energy` the statistics read."""

    joules: float | None
    method: str
    node: str | None
    tier: str | None
    route: str | None
    seconds: float
    tokens: int | None
    contended: bool | None


def parse_window(text: str) -> float | None:
    """Seconds in a window name (``"90s"``, ``"15m"``, ``"1h"``); ``None`` for ``"all"``."""
    if text == "all":
        return None
    match = _WINDOW_RE.match(text) if isinstance(text, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(
            f"window {text!r} is not a duration",
            remedy='write it as a number and a unit (s, m, h, d), such as "15m", or "all"',
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def status_class(status: int | None) -> str:
    if status is None or not isinstance(status, int) or not 100 <= status <= 599:
        return "none"
    return f"{status // 100}xx"


# -- sketches -------------------------------------------------------------------------------


def sketch_key(value: float) -> int:
    """The DDSketch key of a positive value (``LogarithmicMapping(ACCURACY).key``)."""
    return int(_ceil(_log(value, 2) * _MULT) + _OFFSET)


def quantiles(bins: Mapping[int, int], which: int, qs: Sequence[float]) -> list[float | None]:
    """Quantiles of one sketch of a cell, by DDSketch's rule: the value of the bin where
    the running count first exceeds ``q * (count - 1)``, through the library's mapping."""
    items = sorted((e // 3, c) for e, c in bins.items() if e % 3 == which)
    count = sum(c for _, c in items)
    if not count:
        return [None] * len(qs)
    out: list[float | None] = []
    for q in qs:
        rank, running, key = q * (count - 1), 0, items[-1][0]
        for key, c in items:  # noqa: B007 (the key where it stops is the answer)
            running += c
            if running > rank:
                break
        out.append(float(_MAPPING.value(key)))
    return out


# -- cells ----------------------------------------------------------------------------------


class Cell:
    """What a group of requests cost, in one slot of time.

    ``bins`` holds the three sketches' occupied bins (encoded key -> count, see :data:`J`):
    a slot holds a few to a few hundred requests, so a dense range would be mostly zeros.
    """

    __slots__ = (
        "bins", "contended", "joules", "known", "methods", "outcomes", "requests",
        "seconds", "statuses", "tok_joules", "tok_requests", "tok_tokens", "tokens",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.known = 0  # requests whose joules are known
        self.joules = 0.0  # sum over known figures only
        self.tokens = 0
        self.tok_requests = 0  # requests with both joules and tokens known
        self.tok_joules = 0.0
        self.tok_tokens = 0
        self.seconds = 0.0
        self.contended = 0
        self.outcomes: dict[str, int] = {}
        self.statuses: dict[str, int] = {}
        self.methods: dict[str, int] = {}
        self.bins: dict[int, int] = {}

    def add(
        self, joules: float | None, tokens: int | None, seconds: float, method: str,
        contended: bool, outcome: str, status: str,
        keys: tuple[int | None, int | None, int] | None = None,
    ) -> None:
        """Count one request. ``keys`` are the encoded bins of (joules, joules per token,
        seconds), computed once by the caller for every ring a record updates."""
        if keys is None:
            keys = sketch_keys(joules, tokens, seconds)
        self.requests += 1
        d = self.outcomes
        d[outcome] = d.get(outcome, 0) + 1
        d = self.statuses
        d[status] = d.get(status, 0) + 1
        d = self.methods
        d[method] = d.get(method, 0) + 1
        if contended:
            self.contended += 1
        if tokens:
            self.tokens += tokens
        kj, kjpt, ks = keys
        bins = self.bins
        if joules is not None and kj is not None:
            self.known += 1
            self.joules += joules
            bins[kj] = bins.get(kj, 0) + 1
            if tokens and kjpt is not None:
                self.tok_requests += 1
                self.tok_joules += joules
                self.tok_tokens += tokens
                bins[kjpt] = bins.get(kjpt, 0) + 1
        self.seconds += seconds
        bins[ks] = bins.get(ks, 0) + 1

    def merge(self, other: Cell) -> None:
        if not other.requests:
            return
        self.requests += other.requests
        self.known += other.known
        self.joules += other.joules
        self.tokens += other.tokens
        self.tok_requests += other.tok_requests
        self.tok_joules += other.tok_joules
        self.tok_tokens += other.tok_tokens
        self.seconds += other.seconds
        self.contended += other.contended
        _add_counts(self.outcomes, other.outcomes)
        _add_counts(self.statuses, other.statuses)
        _add_counts(self.methods, other.methods)
        _add_counts(self.bins, other.bins)

    def copy(self) -> Cell:
        cell = Cell()
        cell.merge(self)
        return cell

    def summary(self) -> dict[str, Any]:
        """The documented per-label figures (docs/energy-schema.md, ``Summary``)."""
        n, known = self.requests, self.known
        p50, p90, p99 = quantiles(self.bins, J, (0.5, 0.9, 0.99))
        (jpt_p50,) = quantiles(self.bins, JPT, (0.5,))
        s50, s99 = quantiles(self.bins, SEC, (0.5, 0.99))
        jpt_agg = self.tok_joules / self.tok_tokens if self.tok_tokens else None
        mix = {m: self.methods.get(m, 0) for m in METHOD_MIX}
        for method, count in self.methods.items():
            mix.setdefault(method, count)
        return {
            "requests": n,
            "joules": {
                "known": known,
                "sum": _num(self.joules) if known else None,
                "mean": _num(self.joules / known) if known else None,
                "p50": _num(p50),
                "p90": _num(p90),
                "p99": _num(p99),
            },
            "tokens": self.tokens,
            "joules_per_token": {"p50": _num(jpt_p50), "aggregate": _num(jpt_agg)},
            "tokens_per_joule": {
                "p50": _num(1.0 / jpt_p50) if jpt_p50 else None,
                "aggregate": _num(1.0 / jpt_agg) if jpt_agg else None,
            },
            "seconds": {
                "sum": _num(self.seconds),
                "p50": _num(s50),
                "p99": _num(s99),
            },
            "outcomes": {o: self.outcomes.get(o, 0) for o in OUTCOMES} | {
                o: c for o, c in self.outcomes.items() if o not in OUTCOMES
            },
            "statuses": dict(sorted(self.statuses.items())),
            "methods": mix,
            "method_shares": {
                **{m: _num(c / n) if n else None for m, c in mix.items()},
                "contended": _num(self.contended / n) if n else None,
            },
        }

    def point(self) -> tuple[int, float | None, float | None, float | None, float | None]:
        """One point of a time series: requests, joules, p50, p90, joules per token p50."""
        p50, p90 = quantiles(self.bins, J, (0.5, 0.9))
        (jpt,) = quantiles(self.bins, JPT, (0.5,))
        return self.requests, self.joules if self.known else None, p50, p90, jpt

    def state(self) -> list[Any]:
        return [
            self.requests, self.known, self.joules, self.tokens, self.tok_requests,
            self.tok_joules, self.tok_tokens, self.seconds, self.contended, self.outcomes,
            self.statuses, self.methods, [x for kv in self.bins.items() for x in kv],
        ]

    @classmethod
    def from_state(cls, state: Sequence[Any]) -> Cell:
        cell = cls()
        (
            cell.requests, cell.known, cell.joules, cell.tokens, cell.tok_requests,
            cell.tok_joules, cell.tok_tokens, cell.seconds, cell.contended,
        ) = (
            int(state[0]), int(state[1]), float(state[2]), int(state[3]), int(state[4]),
            float(state[5]), int(state[6]), float(state[7]), int(state[8]),
        )
        cell.outcomes = {str(k): int(v) for k, v in state[9].items()}
        cell.statuses = {str(k): int(v) for k, v in state[10].items()}
        cell.methods = {str(k): int(v) for k, v in state[11].items()}
        flat = state[12]
        cell.bins = {int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        return cell


def sketch_keys(
    joules: float | None, tokens: int | None, seconds: float,
) -> tuple[int | None, int | None, int]:
    """The encoded bins of a record's joules, joules per token and seconds."""
    kj = 3 * int(_ceil(_log(joules, 2) * _MULT) + _OFFSET) if joules is not None else None
    kjpt = (3 * int(_ceil(_log(joules / tokens, 2) * _MULT) + _OFFSET) + JPT
            if joules is not None and tokens else None)
    s = seconds if seconds > _SECONDS_FLOOR else _SECONDS_FLOOR
    return kj, kjpt, 3 * int(_ceil(_log(s, 2) * _MULT) + _OFFSET) + SEC


def _add_counts(mine: dict[_K, int], theirs: dict[_K, int]) -> None:
    if not mine:
        mine.update(theirs)
        return
    get = mine.get
    for key, count in theirs.items():
        mine[key] = get(key, 0) + count


def _num(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


# -- rings ----------------------------------------------------------------------------------


class Ring:
    """The slots of one finite window for one series: slot index -> cell, oldest first."""

    __slots__ = ("_closed", "_closed_key", "cell", "current", "n", "slots", "width")

    def __init__(self, width: int, n: int) -> None:
        self.width = width  # steps per slot
        self.n = n  # slots in the window
        self.slots: dict[int, Cell] = {}
        self.current = -1  # the slot ``cell`` is, where records go
        self.cell = Cell()
        self._closed: Cell | None = None
        self._closed_key: tuple[int, int, int] | None = None

    def open(self, slot: int, spill: Cell | None) -> Cell:
        """The cell of ``slot`` (created if new); slots past the window go to ``spill``."""
        cell = self.slots.get(slot)
        if cell is None:
            cell = self.slots[slot] = Cell()
            if slot < max(self.slots):  # a clock stepped back
                self.slots = dict(sorted(self.slots.items()))
                self.invalidate()
        self.current, self.cell = slot, cell
        self.prune(max(self.slots), spill)
        return cell

    def prune(self, newest: int, spill: Cell | None) -> None:
        oldest = newest - self.n + 1
        while self.slots:
            first = next(iter(self.slots))
            if first >= oldest:
                break
            cell = self.slots.pop(first)
            if spill is not None:
                spill.merge(cell)

    def window(self, now_step: int, spill: Cell | None) -> Cell:
        """The merge of the slots in the window ending at ``now_step``."""
        newest = now_step // self.width
        self.prune(newest, spill)
        closed = [s for s in self.slots if s < newest]
        key = (closed[0] if closed else newest, newest, len(closed))
        if self._closed_key != key or self._closed is None:
            merged = Cell()
            for slot in closed:
                merged.merge(self.slots[slot])
            self._closed, self._closed_key = merged, key
        out = self._closed.copy()
        current = self.slots.get(newest)
        if current is not None:
            out.merge(current)
        return out

    def invalidate(self) -> None:
        self._closed, self._closed_key = None, None


class Series:
    """One full key's rings (one per finite window), its base (what left the longest
    ring: with it, since start) and its since-start counters per outcome."""

    __slots__ = ("base", "counters", "key", "longest", "rings")

    def __init__(self, key: tuple[str, str, str, str], geometry: Iterable[tuple[int, int]]) -> None:
        self.key = key
        self.rings = [Ring(*g) for g in geometry]
        self.longest = max(self.rings, key=lambda r: r.width * r.n) if self.rings else None
        self.base = Cell()
        # outcome -> [requests, known, joules, tokens, histogram buckets]
        self.counters: dict[str, list[Any]] = {}

    def spill(self, ring: Ring) -> Cell | None:
        return self.base if ring is self.longest else None

    def window(self, index: int | None, step: int) -> Cell:
        """The merge of ring ``index``'s window at ``step``; ``None``: since start."""
        if index is None:
            return self.since_start(step)
        ring = self.rings[index]
        return ring.window(step, self.spill(ring))

    def since_start(self, step: int) -> Cell:
        window = self.longest.window(step, self.base) if self.longest is not None else None
        cell = self.base.copy()  # after the window, which moves old slots into base
        if window is not None:
            cell.merge(window)
        return cell


# -- the statistics -------------------------------------------------------------------------


class EnergyStats:
    """Rolling statistics fed by settled figures.

    ``windows`` are durations (``"1m"``, ``"15m"``, ``"1h"``) and ``"all"``; ``step_s`` is
    the finest slot; each finite window keeps at most ``points`` slots; ``max_labels``
    bounds each group, ``<other>`` included (a new label past it counts under ``<other>``).
    """

    def __init__(
        self,
        windows: Iterable[str] = ("1m", "15m", "1h", "all"),
        *,
        step_s: float = 10.0,
        points: int = 30,
        max_labels: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        names = tuple(windows)
        if not names:
            raise ConfigError("EnergyStats needs at least one window", remedy='pass ("1m", "all")')
        if not (isinstance(step_s, int | float) and step_s > 0):
            raise ConfigError(f"step_s={step_s!r} must be a positive number of seconds",
                              remedy="use 10")
        if max_labels < 2 or points < 1:
            raise ConfigError("max_labels must be at least 2 (one is <other>), points at least 1",
                              remedy="use the defaults")
        self.step_s = float(step_s)
        self.points = points
        self.max_labels = max_labels
        self.clock = clock
        self.windows = names
        self._geometry: dict[str, tuple[int, int] | None] = {}
        for name in names:
            seconds = parse_window(name)
            if seconds is None:
                self._geometry[name] = None
                continue
            steps = max(1, round(seconds / self.step_s))
            width = max(d for d in range(1, steps + 1) if steps % d == 0 and d * points <= max(steps, points))
            self._geometry[name] = (width, steps // width)
        self._lock = threading.Lock()
        finite = [name for name in names if self._geometry[name] is not None]
        #: window name -> index of its ring in every series (None: since start)
        self._ring: dict[str, int | None] = {
            name: (finite.index(name) if name in finite else None) for name in names
        }
        self._lock = threading.Lock()
        # (route, node, tier, method) -> Series; each part bounded by max_labels per group
        self._series: dict[tuple[str, str, str, str], Series] = {}
        self._names: dict[str, set[str]] = {g: set() for g in GROUPS}
        # (ring index, slot) -> group -> name -> point, for closed slots (they no longer change)
        self._points: dict[tuple[int, int], dict[str, dict[str, tuple[Any, ...]]]] = {}
        # node -> samples (t, measured_j, charged_j, unattributed_j, reads), one per step
        self._nodes: dict[str, list[tuple[float, Any, Any, Any, Any]]] = {}
        self.started_at = clock()
        self.dropped = 0

    # -- recording ------------------------------------------------------------------------

    def record(self, energy: EnergyLike, *, outcome: str, status: int | None) -> None:
        """Count one request from its settled figure. O(1), thread-safe, never raises."""
        try:
            joules = energy.joules
            if joules is not None and not (joules > 0 and math.isfinite(joules)):
                joules = None  # a fabricated zero or a NaN is not a figure
            tokens = energy.tokens if isinstance(energy.tokens, int) and energy.tokens > 0 else None
            seconds = float(energy.seconds or 0.0)
            if not math.isfinite(seconds) or seconds < 0:
                seconds = 0.0
            method = energy.method if energy.method in METHOD_MIX else "unknown"
            contended = energy.contended is True
            outcome = outcome if outcome in OUTCOMES else "incomplete"
            status_s = status_class(status)
            key = (energy.route or UNMATCHED, energy.node or NONE, energy.tier or NONE, method)
            keys = sketch_keys(joules, tokens, seconds)
            with self._lock:
                step = int(self.clock() // self.step_s)
                series = self._series.get(key) or self._new_series(key)
                for ring in series.rings:
                    slot = step // ring.width
                    cell = ring.cell if slot == ring.current else ring.open(slot, series.spill(ring))
                    cell.add(joules, tokens, seconds, method, contended, outcome, status_s, keys)
                if not series.rings:  # only "all": nothing rolls
                    series.base.add(joules, tokens, seconds, method, contended, outcome, status_s, keys)
                counter = series.counters.get(outcome)
                if counter is None:
                    counter = series.counters[outcome] = [0, 0, 0.0, 0, [0] * (len(JOULE_BUCKETS) + 1)]
                counter[0] += 1
                if tokens:
                    counter[3] += tokens
                if joules is not None:
                    counter[1] += 1
                    counter[2] += joules
                    counter[4][bisect.bisect_left(JOULE_BUCKETS, joules)] += 1
        except Exception:
            self.dropped += 1

    def _new_series(self, key: tuple[str, str, str, str]) -> Series:
        """The series of ``key``, each part past its group's ``max_labels`` as ``<other>``."""
        bounded = []
        for group, name in zip(GROUPS, key, strict=True):
            names = self._names[group]
            if name not in names:
                if len(names) >= self.max_labels - 1 and name != OTHER:
                    name = OTHER
                names.add(name)
            bounded.append(name)
        folded: tuple[str, str, str, str] = tuple(bounded)  # type: ignore[assignment]
        series = self._series.get(folded)
        if series is None:
            geometry = [g for g in self._geometry.values() if g is not None]
            series = self._series[folded] = Series(folded, geometry)
        return series

    def observe_nodes(self, totals: Iterable[Any]) -> None:
        """Sample ledger totals (measured, charged, unattributed joules) for the power
        series: at most one sample per step per node, the latest kept. Never raises."""
        try:
            now = self.clock()
            span = max((g[0] * g[1] for g in self._geometry.values() if g), default=1) * self.step_s
            with self._lock:
                for t in totals:
                    name = str(getattr(t, "node", None) or NONE)
                    samples = self._nodes.setdefault(name, [])
                    sample = (now, _f(getattr(t, "measured_j", None)),
                              _f(getattr(t, "charged_j", None)), _f(getattr(t, "unattributed_j", None)),
                              _f(getattr(t, "reads", None)))
                    if samples and int(samples[-1][0] // self.step_s) == int(now // self.step_s):
                        samples[-1] = sample
                    else:
                        samples.append(sample)
                    while samples and samples[0][0] < now - span - self.step_s:
                        samples.pop(0)
        except Exception:
            self.dropped += 1


    # -- reading --------------------------------------------------------------------------

    def window_seconds(self, window: str) -> float | None:
        if window not in self._geometry:
            raise ConfigError(
                f"unknown window {window!r}", remedy=f"use one of {', '.join(self.windows)}"
            )
        g = self._geometry[window]
        return None if g is None else g[0] * g[1] * self.step_s

    def snapshot(
        self, window: str | None = None, *, route: str | None = None, node: str | None = None,
        series: bool = True,
    ) -> dict[str, Any]:
        """The documented JSON (docs/energy-schema.md) for one window, without ledgers.

        ``route``/``node`` keep only that row in its section (and its series); the other
        sections and the totals are the whole host's.
        """
        window = window or self.default_window
        self.window_seconds(window)  # validates
        with self._lock:
            step = int(self.clock() // self.step_s)
            cells: dict[str, dict[str, Cell]] = {g: {} for g in GROUPS}
            totals = Cell()
            index = self._ring[window]
            for key, s in self._series.items():
                cell = s.window(index, step)
                totals.merge(cell)
                for group, name in zip(GROUPS, key, strict=True):
                    mine = cells[group].get(name)
                    if mine is None:
                        cells[group][name] = cell.copy()
                    else:
                        mine.merge(cell)
            points = self._series_points(window, step) if series else None
            nodes = {k: list(v) for k, v in self._nodes.items()}
        keep = {"route": route, "node": node}
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "generated_at": self.clock(),
            "started_at": self.started_at,
            "window": window,
            "window_s": self.window_seconds(window),
            "windows": list(self.windows),
            "step_s": self.step_s,
            "filters": {"route": route, "node": node},
            "totals": totals.summary(),
        }
        for group in GROUPS:
            want = keep.get(group)
            out[group + "s"] = {
                name: cell.summary() for name, cell in sorted(cells[group].items())
                if want is None or name == want
            }
        if points is not None:
            out["series"] = self._series_json(points, nodes, window, step, keep)
        out["dropped"] = self.dropped
        return out

    @property
    def default_window(self) -> str:
        finite = [w for w in self.windows if self._geometry[w] is not None]
        return "15m" if "15m" in finite else (finite[0] if finite else self.windows[0])

    def _series_points(self, window: str, step: int) -> dict[str, Any]:
        """Per group label, slot -> point, over the window's ring (the longest for "all").
        A closed slot's points are computed once and kept until it leaves the ring."""
        finite = [g for g in self._geometry.values() if g is not None]
        index = self._ring[window]
        if index is None:
            if not finite:
                return {"width": 1, "groups": {}}
            index = max(range(len(finite)), key=lambda i: finite[i][0] * finite[i][1])
        width, n = finite[index]
        newest = step // width
        slots = range(newest - n + 1, newest + 1)
        for gone in [k for k in self._points if k[0] == index and k[1] < slots[0]]:
            del self._points[gone]
        groups: dict[str, dict[str, dict[int, tuple[Any, ...]]]] = {g: {} for g in GROUPS}
        for slot in slots:
            cached = self._points.get((index, slot))
            if cached is None:
                merged: dict[str, dict[str, Cell]] = {g: {} for g in GROUPS}
                for series_key, s in self._series.items():
                    ring = s.rings[index]
                    ring.prune(newest, s.spill(ring))
                    cell = ring.slots.get(slot)
                    if cell is None or not cell.requests:
                        continue
                    for group, name in zip(GROUPS, series_key, strict=True):
                        mine = merged[group].get(name)
                        if mine is None:
                            merged[group][name] = mine = Cell()
                        mine.merge(cell)
                cached = {g: {name: c.point() for name, c in m.items()} for g, m in merged.items()}
                if slot < newest:
                    self._points[(index, slot)] = cached
            for group, table in cached.items():
                for name, point in table.items():
                    groups[group].setdefault(name, {})[slot] = point
        return {"width": width, "n": n, "groups": groups}

    def _series_json(
        self, points: dict[str, Any], nodes: Mapping[str, list[tuple[float, Any, Any, Any, Any]]],
        window: str, step: int, keep: Mapping[str, str | None],
    ) -> dict[str, Any]:
        width = points["width"]
        n = points.get("n", 1)
        newest = step // width
        slots = list(range(newest - n + 1, newest + 1))
        slot_s = width * self.step_s
        out: dict[str, Any] = {"slot_s": slot_s, "t": [s * slot_s for s in slots]}
        for group, table in points["groups"].items():
            want = keep.get(group)
            section: dict[str, Any] = {}
            for name, pts in sorted(table.items()):
                if want is not None and name != want:
                    continue
                cols: dict[str, list[Any]] = {
                    "requests": [], "joules": [], "p50": [], "p90": [], "jpt_p50": []
                }
                for s in slots:
                    p = pts.get(s)
                    cols["requests"].append(p[0] if p else 0)
                    for name_, i in (("joules", 1), ("p50", 2), ("p90", 3), ("jpt_p50", 4)):
                        cols[name_].append(_num(p[i]) if p else None)
                section[name] = cols
            out[group + "s"] = section
        start = slots[0] * slot_s
        power: dict[str, Any] = {}
        for name, samples in sorted(nodes.items()):
            if keep.get("node") not in (None, name):
                continue
            col: dict[str, list[Any]] = {"t": [], "measured_w": [], "charged_w": [],
                                         "unattributed_w": []}
            for a, b in itertools.pairwise(samples):
                dt = b[0] - a[0]
                if b[0] < start or dt <= 0:
                    continue
                col["t"].append(b[0])
                for key, i in (("measured_w", 1), ("charged_w", 2), ("unattributed_w", 3)):
                    col[key].append(_num((b[i] - a[i]) / dt) if b[i] is not None and a[i] is not None
                                    and b[i] >= a[i] else None)
            power[name] = col
        out["power"] = power
        return out

    def view(self) -> EnergyStats:
        """What a reader reports: these statistics (a HostStats answers the host's)."""
        return self

    def node_power(self) -> dict[str, float | None]:
        """Above-idle watts per node between its last two samples (None if unknown)."""
        return {name: rates[0] for name, rates in self.node_rates().items()}

    def node_rates(self) -> dict[str, tuple[float | None, float | None]]:
        """(above-idle watts, reads per second) per node from its last two samples."""
        out: dict[str, tuple[float | None, float | None]] = {}
        with self._lock:
            items = [(k, v[-2:]) for k, v in self._nodes.items()]
        for name, last in items:
            if len(last) < 2 or last[1][0] <= last[0][0]:
                out[name] = (None, None)
                continue
            (t0, m0, _, _, r0), (t1, m1, _, _, r1) = last
            dt = t1 - t0
            watts = (m1 - m0) / dt if m0 is not None and m1 is not None and m1 >= m0 else None
            reads = (r1 - r0) / dt if r0 is not None and r1 is not None and r1 >= r0 else None
            out[name] = (_num(watts), _num(reads))
        return out

    def copy_nodes_from(self, other: EnergyStats) -> None:
        """Take ``other``'s node samples (a merged view reports the answering worker's)."""
        with other._lock:
            nodes = {k: list(v) for k, v in other._nodes.items()}
        with self._lock:
            self._nodes = nodes

    def counters(self) -> list[tuple[tuple[str, str, str, str, str], int, int, float, int, list[int]]]:
        """Since-start counters per (route, node, tier, method, outcome): requests, known,
        joules, tokens and the joules histogram (per :data:`JOULE_BUCKETS`, last is +Inf)."""
        with self._lock:
            return [((*s.key, outcome), v[0], v[1], v[2], v[3], list(v[4]))
                    for s in self._series.values() for outcome, v in s.counters.items()]


    # -- state, for several workers -------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything mergeable, JSON-ready: what a worker writes for the others to read."""
        with self._lock:
            step = int(self.clock() // self.step_s)
            rows = []
            for s in self._series.values():
                for ring in s.rings:
                    ring.prune(step // ring.width, s.spill(ring))
                rows.append([
                    *s.key, s.base.state(),
                    [[[slot, c.state()] for slot, c in r.slots.items()] for r in s.rings],
                    {outcome: [*v[:4], v[4]] for outcome, v in s.counters.items()},
                ])
            return {
                "schema": SCHEMA,
                "step_s": self.step_s,
                "geometry": [list(g) if g else None for g in self._geometry.values()],
                "started_at": self.started_at,
                "dropped": self.dropped,
                "series": rows,
            }

    def merge_state(self, state: Mapping[str, Any]) -> None:
        """Add another worker's :meth:`state` into these statistics (same configuration)."""
        if state.get("schema") != SCHEMA or float(state.get("step_s", -1)) != self.step_s or \
                state.get("geometry") != [list(g) if g else None for g in self._geometry.values()]:
            raise ConfigError(
                "a worker's statistics were written with another configuration",
                remedy="give every worker the same windows and step_s, and clear the directory",
            )
        with self._lock:
            step = int(self.clock() // self.step_s)
            self.started_at = min(self.started_at, float(state["started_at"]))
            self.dropped += int(state.get("dropped", 0))
            for row in state["series"]:
                series = self._new_series(tuple(str(p) for p in row[:4]))  # type: ignore[arg-type]
                series.base.merge(Cell.from_state(row[4]))
                for ring, slots in zip(series.rings, row[5], strict=True):
                    for slot, data in slots:
                        cell = Cell.from_state(data)
                        mine = ring.slots.get(int(slot))
                        if mine is None:
                            ring.slots[int(slot)] = cell
                        else:
                            mine.merge(cell)
                    ring.slots = dict(sorted(ring.slots.items()))
                    ring.prune(step // ring.width, series.spill(ring))
                    ring.invalidate()
                for outcome, v in row[6].items():
                    counter = series.counters.setdefault(
                        str(outcome), [0, 0, 0.0, 0, [0] * (len(JOULE_BUCKETS) + 1)])
                    counter[0] += int(v[0])
                    counter[1] += int(v[1])
                    counter[2] += float(v[2])
                    counter[3] += int(v[3])
                    counter[4] = [a + int(b) for a, b in zip(counter[4], v[4], strict=True)]
            self._points.clear()

    def empty_like(self) -> EnergyStats:
        """New, empty statistics with this configuration and clock."""
        return EnergyStats(self.windows, step_s=self.step_s, points=self.points,
                           max_labels=self.max_labels, clock=self.clock)


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


__all__ = [
    "ACCURACY",
    "GROUPS",
    "JOULE_BUCKETS",
    "OUTCOMES",
    "SCHEMA",
    "Cell",
    "EnergyStats",
    "parse_window",
    "quantiles",
    "sketch_key",
    "status_class",
]
