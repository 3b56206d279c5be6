"""What ``/energy`` serves: the documented JSON (docs/energy-schema.md), built at read time.

The statistics hand over plain values (:class:`Reading`: the window's groups, merged per
label, the series' points, the node samples); this module writes the dict. Nothing here
touches the statistics' state or lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .cell import Point, rounded
from .groups import Table, totals
from .labels import GROUPS
from .nodes import Sample

SCHEMA = "giul-asgi/energy/3"


@dataclass(frozen=True, slots=True)
class Points:
    """A window's series: slot ``newest - n + 1 .. newest``, ``width`` steps each, and per
    group and label the point of each slot that has one."""

    width: int
    n: int
    newest: int
    groups: Mapping[str, Mapping[str, Mapping[int, Point]]]


@dataclass(frozen=True, slots=True)
class Reading:
    """Everything one answer needs, taken from the statistics by a reader."""

    generated_at: float
    started_at: float
    window: str
    window_s: float | None
    windows: tuple[str, ...]
    step_s: float
    dropped: int
    table: Table  # the window's groups: group -> label -> Group
    points: Points | None
    nodes: Mapping[str, list[Sample]]


def render(reading: Reading, *, route: str | None = None, node: str | None = None,
           tenant: str | None = None) -> dict[str, Any]:
    """The documented JSON. ``route``/``node``/``tenant`` keep only that row in its section
    (and its series); the other sections and the totals are the whole host's."""
    tables = reading.table
    keep = {"route": route, "node": node, "tenant": tenant}
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "generated_at": reading.generated_at,
        "started_at": reading.started_at,
        "window": reading.window,
        "window_s": reading.window_s,
        "windows": list(reading.windows),
        "step_s": reading.step_s,
        "filters": keep,
        "totals": totals(tables).summary(),
    }
    for group in GROUPS:
        want = keep.get(group)
        out[group + "s"] = {
            name: g.summary() for name, g in sorted(tables[group].items())
            if (want is None or name == want) and g.cell.requests
        }
    if reading.points is not None:
        out["series"] = _series(reading.points, reading.nodes, reading.step_s, keep)
    out["dropped"] = reading.dropped
    return out


def _series(points: Points, nodes: Mapping[str, list[Sample]], step_s: float,
            keep: Mapping[str, str | None]) -> dict[str, Any]:
    slots = list(range(points.newest - points.n + 1, points.newest + 1))
    slot_s = points.width * step_s
    out: dict[str, Any] = {"slot_s": slot_s, "t": [s * slot_s for s in slots]}
    for group in GROUPS:
        want = keep.get(group)
        section: dict[str, Any] = {}
        for name, pts in sorted(points.groups.get(group, {}).items()):
            if want is not None and name != want:
                continue
            cols: dict[str, list[Any]] = {"requests": [], "joules": [], "p50": [], "p90": [],
                                          "jpt_p50": [], "known": [], "contended": [], "carbon_g": []}
            for s in slots:
                p = pts.get(s)
                cols["requests"].append(p[0] if p else 0)
                cols["known"].append(p[7] if p else 0)
                cols["contended"].append(p[5] if p else 0)
                for name_, i in (("joules", 1), ("p50", 2), ("p90", 3), ("jpt_p50", 4),
                                 ("carbon_g", 6)):
                    cols[name_].append(rounded(p[i]) if p else None)
            section[name] = cols
        out[group + "s"] = section
    power: dict[str, Any] = {}
    for name, samples in sorted(nodes.items()):
        if keep.get("node") not in (None, name):
            continue
        col: dict[str, list[Any]] = {"t": list(out["t"])}
        for field, i in (("measured_w", 1), ("charged_w", 2), ("unattributed_w", 3)):
            col[field] = _per_slot(samples, i, out["t"], slot_s)
        power[name] = col
    out["power"] = power
    return out


def _per_slot(samples: list[Sample], i: int, starts: list[float], slot_s: float) -> list[Any]:
    """Mean watts of field ``i`` (joules since start) in each slot: the rate between each
    two consecutive samples, weighted by the part of the slot it covers (``None`` where no
    two samples with the field known and not going backwards cover any of the slot)."""
    rates = []
    for a, b in itertools.pairwise(samples):
        x, y = a[i], b[i]
        if b.t > a.t and x is not None and y is not None and y >= x:
            rates.append((a.t, b.t, (y - x) / (b.t - a.t)))
    out: list[Any] = []
    for s0 in starts:
        s1 = s0 + slot_s
        joules = covered = 0.0
        for t0, t1, watts in rates:
            overlap = min(t1, s1) - max(t0, s0)
            if overlap > 0:
                joules += watts * overlap
                covered += overlap
        out.append(rounded(joules / covered) if covered > 0 else None)
    return out


__all__ = ["SCHEMA", "Points", "Reading", "render"]
