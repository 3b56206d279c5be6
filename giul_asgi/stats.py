"""Rolling statistics per route, node, tier and method, in memory bounded by labels.

Every metered request is recorded once, with its settled figure, whatever became of the
response (``ok``, ``error``, ``disconnect``, ``cancelled``, ``incomplete``). A figure whose
``joules`` is unknown (``None``) is counted in the request count and the method mix, never
as 0 J in a sum or a quantile.

Memory is bounded by the number of labels, not of requests. Each label of each group
(``route``, ``node``, ``tier``, ``method``) keeps:

- a *fine* cell for the current step (``step_s``, 10 s by default), which a record updates:
  counters and three DDSketch quantile sketches (joules, joules per token, seconds);
- per finite window (``1m``, ``15m``, ``1h`` by default) a ring of at most ``points``
  slots, each a whole number of steps wide; when a step closes, its fine cell is merged
  into every ring and into the since-start cell. Sketches merge exactly (bins add), so a
  window is the merge of its slots, and several worker processes merge the same way.

A window ``w`` covers the last ``w`` seconds to within one slot (a slot is at most
``w / points``): the newest slot is partial, the oldest one is dropped whole. Slots are
aligned on wall-clock time (``time.time()``), so workers' slots line up.

Besides the per-group rings, a counter per full key ``(route, node, tier, method)`` and
outcome, with a log-bucketed histogram of joules per request, feeds the Prometheus and
OpenTelemetry exporters: counters since start, never averages.

Recording is O(1) (a handful of dict updates and sketch inserts under one lock) and never
raises: a record that cannot be counted increments ``dropped``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from ddsketch.ddsketch import BaseDDSketch
from ddsketch.mapping import LogarithmicMapping
from ddsketch.store import DenseStore

from .errors import ConfigError

SCHEMA = "giul-asgi/energy/1"
GROUPS: tuple[str, ...] = ("route", "node", "tier", "method")
OUTCOMES: tuple[str, ...] = ("ok", "error", "disconnect", "cancelled", "incomplete")
METHOD_MIX: tuple[str, ...] = ("measured", "estimated", "simulated", "unknown")
OTHER = "<other>"
NONE = "<none>"
UNMATCHED = "<unmatched>"
#: Relative accuracy of every quantile: a p50 of 100 J means 99 to 101 J.
ACCURACY = 0.01
_MAPPING = LogarithmicMapping(ACCURACY)
_key = _MAPPING.key
_EMPTY = DenseStore()  # the negative store of every sketch: values are positive
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


class Sketch:
    """A DDSketch (positive values) held as its store, so it can be written and read back.

    Values go in through the library's mapping and store; quantiles come from the library's
    ``BaseDDSketch`` over that store. Only the merge is ours: the store's own merge adds
    bin by bin in Python, and this one adds the overlapping slice in one ``map``.
    """

    __slots__ = ("store",)

    def __init__(self, state: Sequence[Any] | None = None) -> None:
        store = self.store = DenseStore()
        if state:
            min_key, bins = int(state[0]), [float(b) for b in state[1]]
            if bins:
                store.bins, store.offset = bins, min_key
                store.min_key, store.max_key = min_key, min_key + len(bins) - 1
                store.count = sum(bins)

    def add(self, value: float) -> None:
        self.store.add(_key(value))

    @property
    def count(self) -> float:
        return float(self.store.count)

    def quantile(self, q: float) -> float | None:
        if not self.store.count:
            return None
        value = BaseDDSketch(_MAPPING, self.store, _EMPTY, 0.0).get_quantile_value(q)
        return None if value is None else float(value)

    def merge(self, other: Sketch) -> None:
        src, dst = other.store, self.store
        if not src.count:
            return
        if not dst.count:
            dst.copy(src)
            return
        lo, hi = min(dst.min_key, src.min_key), max(dst.max_key, src.max_key)
        if lo < dst.offset or hi >= dst.offset + len(dst.bins):
            bins = [0.0] * (hi - lo + 1)
            a = dst.min_key - dst.offset
            bins[dst.min_key - lo:dst.max_key - lo + 1] = dst.bins[a:a + dst.max_key - dst.min_key + 1]
            dst.bins, dst.offset = bins, lo
        a, b = src.min_key - dst.offset, src.max_key - dst.offset + 1
        s = src.min_key - src.offset
        dst.bins[a:b] = map(operator.add, dst.bins[a:b], src.bins[s:s + b - a])
        dst.min_key, dst.max_key = lo, hi
        dst.count += src.count

    def state(self) -> list[Any] | None:
        store = self.store
        if not store.count:
            return None
        lo, hi = store.min_key - store.offset, store.max_key - store.offset
        return [store.min_key, store.bins[lo:hi + 1]]


# -- cells ----------------------------------------------------------------------------------


class Cell:
    """What a group of requests cost, in one slot of time."""

    __slots__ = (
        "contended", "j", "joules", "jpt", "known", "methods", "outcomes", "requests",
        "sec", "seconds", "statuses", "tok_joules", "tok_requests", "tok_tokens", "tokens",
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
        self.j = Sketch()
        self.jpt = Sketch()
        self.sec = Sketch()

    def add(
        self, joules: float | None, tokens: int | None, seconds: float, method: str,
        contended: bool, outcome: str, status: str,
        keys: tuple[int | None, int | None, int] | None = None,
    ) -> None:
        """Count one request. ``keys`` are the sketch keys of (joules, joules per token,
        seconds), computed once by the caller for the four groups a record updates."""
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
        if joules is not None and kj is not None:
            self.known += 1
            self.joules += joules
            _bump(self.j.store, kj)
            if tokens and kjpt is not None:
                self.tok_requests += 1
                self.tok_joules += joules
                self.tok_tokens += tokens
                _bump(self.jpt.store, kjpt)
        self.seconds += seconds
        _bump(self.sec.store, ks)

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
        for mine, theirs in (
            (self.outcomes, other.outcomes), (self.statuses, other.statuses),
            (self.methods, other.methods),
        ):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count
        self.j.merge(other.j)
        self.jpt.merge(other.jpt)
        self.sec.merge(other.sec)

    def copy(self) -> Cell:
        cell = Cell()
        cell.merge(self)
        return cell

    def summary(self) -> dict[str, Any]:
        """The documented per-label figures (docs/energy-schema.md, ``Summary``)."""
        n, known = self.requests, self.known
        jpt_p50 = self.jpt.quantile(0.5)
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
                "p50": _num(self.j.quantile(0.5)),
                "p90": _num(self.j.quantile(0.9)),
                "p99": _num(self.j.quantile(0.99)),
            },
            "tokens": self.tokens,
            "joules_per_token": {"p50": _num(jpt_p50), "aggregate": _num(jpt_agg)},
            "tokens_per_joule": {
                "p50": _num(1.0 / jpt_p50) if jpt_p50 else None,
                "aggregate": _num(1.0 / jpt_agg) if jpt_agg else None,
            },
            "seconds": {
                "sum": _num(self.seconds),
                "p50": _num(self.sec.quantile(0.5)),
                "p99": _num(self.sec.quantile(0.99)),
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
        return (
            self.requests, self.joules if self.known else None,
            self.j.quantile(0.5), self.j.quantile(0.9), self.jpt.quantile(0.5),
        )

    def state(self) -> list[Any]:
        return [
            self.requests, self.known, self.joules, self.tokens, self.tok_requests,
            self.tok_joules, self.tok_tokens, self.seconds, self.contended, self.outcomes,
            self.statuses, self.methods, self.j.state(), self.jpt.state(), self.sec.state(),
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
        cell.j, cell.jpt, cell.sec = Sketch(state[12]), Sketch(state[13]), Sketch(state[14])
        return cell


def sketch_keys(
    joules: float | None, tokens: int | None, seconds: float,
) -> tuple[int | None, int | None, int]:
    """The DDSketch keys of a record's joules, joules per token and seconds."""
    kj = _key(joules) if joules is not None else None
    kjpt = _key(joules / tokens) if joules is not None and tokens else None
    return kj, kjpt, _key(seconds if seconds > _SECONDS_FLOOR else _SECONDS_FLOOR)


def _bump(store: DenseStore, key: int) -> None:
    # DenseStore.add, with the in-range case inlined (the common one).
    if store.min_key <= key <= store.max_key:
        store.bins[key - store.offset] += 1.0
        store.count += 1.0
    else:
        store.add(key)


def _num(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


# -- rings ----------------------------------------------------------------------------------


class Ring:
    """The slots of one finite window for one label: slot index -> cell, oldest first."""

    __slots__ = ("_closed", "_closed_key", "_points", "n", "slots", "width")

    def __init__(self, width: int, n: int) -> None:
        self.width = width  # steps per slot
        self.n = n  # slots in the window
        self.slots: dict[int, Cell] = {}
        self._points: dict[int, tuple[Any, ...]] = {}
        self._closed: Cell | None = None
        self._closed_key: tuple[int, int, int] | None = None

    def add_step(self, step: int, cell: Cell) -> None:
        slot = step // self.width
        mine = self.slots.get(slot)
        if mine is None:
            self.slots[slot] = cell if self.width == 1 else cell.copy()
        else:
            mine.merge(cell)
        self._points.pop(slot, None)
        self._prune(slot)

    def _prune(self, newest: int) -> None:
        oldest = newest - self.n + 1
        for slot in [s for s in self.slots if s < oldest]:
            del self.slots[slot]
            self._points.pop(slot, None)

    def window(self, now_step: int) -> Cell:
        """The merge of the slots in the window ending at ``now_step`` (fine cell apart)."""
        newest = now_step // self.width
        oldest = newest - self.n + 1
        inside = [s for s in self.slots if oldest <= s <= newest]
        closed = [s for s in inside if s < newest]
        key = (oldest, newest, len(closed))
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

    def points(self, now_step: int) -> dict[int, tuple[Any, ...]]:
        """Slot index -> point, for the slots in the window (closed ones cached)."""
        newest = now_step // self.width
        oldest = newest - self.n + 1
        out: dict[int, tuple[Any, ...]] = {}
        for slot, cell in self.slots.items():
            if slot < oldest or slot > newest:
                continue
            point = self._points.get(slot)
            if point is None:
                point = cell.point()
                if slot < newest:
                    self._points[slot] = point
            out[slot] = point
        return out

    def invalidate(self) -> None:
        self._points.clear()
        self._closed, self._closed_key = None, None


class Label:
    """One label's fine cell, its rings (one per finite window) and its since-start cell."""

    __slots__ = ("all", "fine", "fine_step", "rings")

    def __init__(self, rings: list[Ring], step: int) -> None:
        self.fine = Cell()
        self.fine_step = step
        self.rings = rings
        self.all = Cell()

    def advance(self, step: int) -> None:
        """Close the fine cell if its step has passed, into every ring and the total."""
        if step <= self.fine_step:
            return
        fine = self.fine
        if fine.requests:
            for ring in self.rings:
                ring.add_step(self.fine_step, fine)
            self.all.merge(fine)
            self.fine = Cell()
        self.fine_step = step


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
        self._groups: dict[str, dict[str, Label]] = {g: {} for g in GROUPS}
        # (route, node, tier, method, outcome) -> [requests, known, joules, tokens, buckets...]
        self._counters: dict[tuple[str, str, str, str, str], list[Any]] = {}
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
            route = energy.route or UNMATCHED
            node = energy.node or NONE
            tier = energy.tier or NONE
            keys = sketch_keys(joules, tokens, seconds)
            with self._lock:
                step = int(self.clock() // self.step_s)
                for group, name in (("route", route), ("node", node), ("tier", tier),
                                    ("method", method)):
                    label = self._label(group, name, step)
                    if step > label.fine_step:
                        label.advance(step)
                    label.fine.add(joules, tokens, seconds, method, contended, outcome, status_s, keys)
                key = (route, node, tier, method, outcome)
                counter = self._counters.get(key)
                if counter is None:
                    key = self._bounded_key(key)
                    counter = self._counters.setdefault(key, [0, 0, 0.0, 0, [0] * (len(JOULE_BUCKETS) + 1)])
                counter[0] += 1
                if tokens:
                    counter[3] += tokens
                if joules is not None:
                    counter[1] += 1
                    counter[2] += joules
                    counter[4][bisect.bisect_left(JOULE_BUCKETS, joules)] += 1
        except Exception:
            self.dropped += 1

    def _label(self, group: str, name: str, step: int) -> Label:
        table = self._groups[group]
        label = table.get(name)
        if label is None:
            if len(table) >= self.max_labels - 1 and name != OTHER:
                name = OTHER
                label = table.get(name)
            if label is None:
                rings = [Ring(*g) for g in self._geometry.values() if g is not None]
                label = table[name] = Label(rings, step)
        return label

    def _bounded_key(self, key: tuple[str, str, str, str, str]) -> tuple[str, str, str, str, str]:
        # A label that its group folded into <other> is <other> in the counters too.
        return (  # type: ignore[return-value]
            *(part if part in self._groups[group] else OTHER
              for group, part in zip(GROUPS, key[:4], strict=True)),
            key[4],
        )

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
            cells: dict[str, dict[str, Cell]] = {}
            for group, table in self._groups.items():
                cells[group] = {}
                for name, label in table.items():
                    label.advance(step)
                    cells[group][name] = self._window_cell(label, window, step)
            points = self._series(window, step) if series else None
            nodes = {k: list(v) for k, v in self._nodes.items()}
        totals = Cell()
        for cell in cells["method"].values():
            totals.merge(cell)
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

    def _window_cell(self, label: Label, window: str, step: int) -> Cell:
        geometry = self._geometry[window]
        if geometry is None:
            cell = label.all.copy()
        else:
            index = [g for g in self._geometry.values() if g is not None].index(geometry)
            cell = label.rings[index].window(step)
        cell.merge(label.fine)
        return cell

    def _series(self, window: str, step: int) -> dict[str, Any]:
        geometry = self._geometry[window]
        finite = [g for g in self._geometry.values() if g is not None]
        if geometry is None:
            geometry = max(finite, key=lambda g: g[0] * g[1]) if finite else None
        if geometry is None:
            return {"width": 1, "groups": {}}
        index = finite.index(geometry)
        width = geometry[0]
        groups: dict[str, dict[str, dict[int, tuple[Any, ...]]]] = {}
        for group, table in self._groups.items():
            groups[group] = {}
            for name, label in table.items():
                pts = label.rings[index].points(step)
                if label.fine.requests:
                    slot = label.fine_step // width
                    if slot in pts:
                        merged = label.rings[index].slots[slot].copy()
                        merged.merge(label.fine)
                        pts[slot] = merged.point()
                    else:
                        pts[slot] = label.fine.point()
                groups[group][name] = pts
        return {"width": width, "n": geometry[1], "groups": groups}

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
            return [(k, v[0], v[1], v[2], v[3], list(v[4])) for k, v in self._counters.items()]

    # -- state, for several workers -------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything mergeable, JSON-ready: what a worker writes for the others to read."""
        with self._lock:
            step = int(self.clock() // self.step_s)
            groups: dict[str, Any] = {}
            for group, table in self._groups.items():
                groups[group] = {}
                for name, label in table.items():
                    label.advance(step)
                    groups[group][name] = {
                        "fine": [label.fine_step, label.fine.state()],
                        "rings": [[[s, c.state()] for s, c in r.slots.items()] for r in label.rings],
                        "all": label.all.state(),
                    }
            return {
                "schema": SCHEMA,
                "step_s": self.step_s,
                "geometry": [list(g) if g else None for g in self._geometry.values()],
                "started_at": self.started_at,
                "dropped": self.dropped,
                "groups": groups,
                "counters": [[*k, *v[:4], v[4]] for k, v in self._counters.items()],
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
            for group, table in state["groups"].items():
                for name, data in table.items():
                    label = self._label(group, name, step)
                    label.advance(step)
                    other = Label([Ring(r.width, r.n) for r in label.rings], int(data["fine"][0]))
                    other.fine = Cell.from_state(data["fine"][1])
                    for ring, slots in zip(other.rings, data["rings"], strict=True):
                        ring.slots = {int(s): Cell.from_state(c) for s, c in slots}
                    other.all = Cell.from_state(data["all"])
                    other.advance(step)
                    for mine, theirs in zip(label.rings, other.rings, strict=True):
                        for slot, cell in theirs.slots.items():
                            if slot in mine.slots:
                                mine.slots[slot].merge(cell)
                            else:
                                mine.slots[slot] = cell
                        if mine.slots:
                            mine.slots = dict(sorted(mine.slots.items()))
                            mine._prune(max(mine.slots))
                        mine.invalidate()
                    label.all.merge(other.all)
                    label.fine.merge(other.fine)
            for row in state["counters"]:
                key = self._bounded_key(tuple(str(p) for p in row[:5]))  # type: ignore[arg-type]
                counter = self._counters.setdefault(key, [0, 0, 0.0, 0, [0] * (len(JOULE_BUCKETS) + 1)])
                counter[0] += int(row[5])
                counter[1] += int(row[6])
                counter[2] += float(row[7])
                counter[3] += int(row[8])
                counter[4] = [a + int(b) for a, b in zip(counter[4], row[9], strict=True)]

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
    "status_class",
]
