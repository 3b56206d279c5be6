"""The groups /energy shows (per route, node, tier, method, tenant), merged from keys at read time.

A key's cells hold one (route, node, tier, method, outcome, status class). A group label
(a route, say) is the merge of every key that has it. Merging every key's whole window at
every read would cost keys x bins x groups each time; instead the reader keeps, per window,
:class:`Sums`: the merge per group label of the closed slots in the window, brought up to
date at each read by adding the slots that closed since and subtracting the ones that left
(counts subtract exactly). A read then merges only the open slot of each key.

A group's bins are dense :class:`~giul_asgi.stats.sketch.Counts`: adding a key's bins is
one list index each, and its quantiles are a C-level running sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .cell import Cell, Point, summary
from .labels import GROUP_INDEX, GROUPS, Key
from .sketch import JPT, Counts, J

#: group -> label -> Group
Table = dict[str, dict[str, "Group"]]


class Group:
    """One group label's merge of keys: their counters and bins (in ``cell``, or dense in
    ``counts`` for the merges kept between reads, which take and give back many keys), and
    the outcome, status class and method counts of the keys merged into it."""

    __slots__ = ("cell", "counts", "methods", "outcomes", "statuses")

    def __init__(self, *, dense: bool = False) -> None:
        self.cell = Cell()  # with ``counts``, counters only
        self.counts = Counts() if dense else None
        self.outcomes: dict[str, int] = {}
        self.statuses: dict[str, int] = {}
        self.methods: dict[str, int] = {}

    def add(self, key: Key, cell: Cell, sign: int = 1) -> None:
        """Add one key's cell (``sign=-1``: take it back out; dense groups only)."""
        if self.counts is None:
            self.cell.merge(cell)
        else:
            self.cell.merge_counters(cell, sign)
            self.counts.add(cell.bins, sign)
        n = sign * cell.requests
        self.methods[key[3]] = self.methods.get(key[3], 0) + n
        self.outcomes[key[4]] = self.outcomes.get(key[4], 0) + n
        self.statuses[key[5]] = self.statuses.get(key[5], 0) + n

    def merge(self, other: Group) -> None:
        """Add ``other`` (dense or not) into this group."""
        if self.counts is None:
            if other.counts is not None:
                raise ValueError("a dense group goes into a dense one")
            self.cell.merge(other.cell)
        else:
            self.cell.merge_counters(other.cell)
            if other.counts is None:
                self.counts.add(other.cell.bins)
            else:
                self.counts.merge(other.counts)
        for mine, theirs in ((self.methods, other.methods), (self.outcomes, other.outcomes),
                             (self.statuses, other.statuses)):
            for name, n in theirs.items():
                mine[name] = mine.get(name, 0) + n

    def dense_copy(self) -> Group:
        if self.counts is None:
            out = Group(dense=True)
            out.merge(self)
            return out
        out = Group.__new__(Group)
        out.cell = self.cell.copy()
        out.counts = self.counts.copy()
        out.outcomes, out.statuses, out.methods = (
            dict(self.outcomes), dict(self.statuses), dict(self.methods))
        return out

    def quantiles(self, sketch: int, qs: Sequence[float]) -> list[float | None]:
        if self.counts is None:
            return self.cell.quantiles(sketch, qs)
        return self.counts.quantiles(sketch, qs)

    def count(self, sketch: int) -> int:
        """How many values one sketch holds (what its quantiles rest on)."""
        return self.cell.count(sketch) if self.counts is None else self.counts.count(sketch)

    def summary(self) -> dict[str, Any]:
        return summary(self.cell, self.quantiles, {k: v for k, v in self.statuses.items() if v},
                       self.outcomes, self.methods, count_of=self.count)

    def point(self) -> Point:
        """One point of a time series (:data:`~giul_asgi.stats.cell.Point`)."""
        p50, p90 = self.quantiles(J, (0.5, 0.9))
        (jpt,) = self.quantiles(JPT, (0.5,))
        cell = self.cell
        return (cell.requests, cell.joules, p50, p90, jpt, cell.contended, cell.carbon_grams,
                cell.known)


def table(cells: Iterable[tuple[Key, Cell]]) -> Table:
    """Per group, label -> the merge of the keys' cells that have it."""
    out: Table = {g: {} for g in GROUPS}
    by_group = [out[g] for g in GROUPS]
    for key, cell in cells:
        if cell.requests:
            for i, groups in zip(GROUP_INDEX, by_group, strict=True):
                group = groups.get(key[i])
                if group is None:
                    group = groups[key[i]] = Group()
                group.add(key, cell)
    return out


def window_table(closed: Table, current: Table) -> Table:
    """A new table: the closed slots' merges (dense) and the open slot's, label by label."""
    out: Table = {g: {} for g in GROUPS}
    for group in GROUPS:
        mine = out[group]
        for name, g in closed[group].items():
            if g.cell.requests:
                mine[name] = g.dense_copy()
        for name, g in current[group].items():
            if name in mine:
                mine[name].merge(g)
            else:
                mine[name] = g
    return out


def totals(t: Table) -> Group:
    """Every key once: the merge of the method group (the fewest labels)."""
    out = Group(dense=True)
    for group in t["method"].values():
        out.merge(group)
    return out


def points(t: Table) -> dict[str, dict[str, Point]]:
    return {g: {name: group.point() for name, group in by_name.items() if group.cell.requests}
            for g, by_name in t.items()}


class Sums:
    """One window's closed slots, merged per group label (dense), as of slot ``upto``
    (exclusive); ``upto`` is ``None`` until a reader builds it, and again when the slots
    changed unseen."""

    __slots__ = ("table", "upto")

    def __init__(self) -> None:
        self.table: Table = {g: {} for g in GROUPS}
        self.upto: int | None = None

    def add(self, t: Table) -> None:
        """Add a slot's table."""
        for group in GROUPS:
            mine = self.table[group]
            for name, g in t[group].items():
                if name in mine:
                    mine[name].merge(g)
                else:
                    mine[name] = g.dense_copy()

    def add_cell(self, key: Key, cell: Cell, sign: int = 1) -> None:
        """Add one key's cell to its labels (``sign=-1``: take it back out)."""
        if not cell.requests:
            return
        for i, group in zip(GROUP_INDEX, GROUPS, strict=True):
            by_name = self.table[group]
            mine = by_name.get(key[i])
            if mine is None:
                mine = by_name[key[i]] = Group(dense=True)
            mine.add(key, cell, sign)

    def reset(self) -> None:
        self.table = {g: {} for g in GROUPS}
        self.upto = None


__all__ = ["Group", "Sums", "Table", "points", "table", "totals", "window_table"]
