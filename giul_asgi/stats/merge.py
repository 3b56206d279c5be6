"""How one server's statistics become one: its workers' rows, tails and dead row merged at read.

Each worker of a server writes its own state (:mod:`.host`, :mod:`.folder`, :mod:`.tail`);
whoever answers ``/energy`` or ``/metrics`` merges them here, after the model of
prometheus_client's multiprocess collector: values written per process, merged when read.
Every worker merges in the same order (the dead row, then the rows by name, its own in its
place), with the tenants labelled as the server's register says, so that every worker gives
the same answer. A row that makes no sense is skipped and said once (``folder.odd``); a dead
worker's answers that never settled count as requests of unknown energy.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from .cell import Cell
from .folder import Other, ServerFolder
from .labels import NONE, OTHER, Key, status_class
from .nodes import Sample
from .stats import EnergyStats
from .tail import Generation

#: What a row that makes no sense raises while it is merged (it is then skipped).
NONSENSE = (ConfigError, KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError)

Samples = dict[str, list[Sample]]


def merge_server(stats: EnergyStats, folder: ServerFolder | None, dead: dict[str, Any] | None,
                 others: list[Other], own: dict[str, Any] | None) -> tuple[EnergyStats, list[Samples], int]:
    """``dead`` (the dead row), ``others`` and ``own`` (this worker's state) merged into an
    empty copy of ``stats``; and the node samples, and how many of the others live."""
    merged = stats.empty_like()
    if folder is not None:
        names = _tenants(dead.get("state") if dead is not None else None)
        for other in others:
            names |= _tenants(other.row.get("state"))
            names |= {k[6] for g in other.gens for (k, _) in g.cells}
        names |= _tenants(own)
        merged.labels.allowed_tenants = folder.admit(names, stats.tenants.max_labels)
    samples: list[Samples] = []
    _merge_dead(merged, folder, dead, samples)
    mine = folder.rows.name if folder is not None else ""
    live: set[str] = set()
    for other in sorted(others, key=lambda o: o.name):
        if own is not None and mine < other.name:
            merged.merge_state(own)
            own = None
        if _merge_other(merged, folder, other, samples) and other.alive:
            live.add(process_of(other))
    if own is not None:
        merged.merge_state(own)
    return merged, samples, len(live)


def process_of(other: Other) -> str:
    """The process another row is of (its pid): a worker that runs two middlewares (an app
    imported twice, as ``__mp_main__`` and ``main``) writes two rows, and is one worker (a
    hostile review read ``workers: 3`` for two)."""
    return other.name.split("-", 1)[0]


def _merge_other(merged: EnergyStats, folder: ServerFolder | None, other: Other,
                 samples: list[Samples]) -> bool:
    """Add another worker (its row, its tail after it, and if dead its answers that never
    settled) into ``merged``; False where its row makes no sense (skipped)."""
    data = other.row
    try:
        state = data["state"]
        nodes = _parse_samples(data.get("nodes", {}))
        merged.merge_state(state)
    except NONSENSE as exc:
        if folder is not None:
            folder.odd(other.name, f"{type(exc).__name__}: {exc}")
        return False
    samples.append(nodes)
    merged.merge_cells([(k, at, c.copy()) for g in other.gens for (k, at), c in g.cells.items()])
    if not other.alive:
        # At the row's top level; in its state's cut where the worker ran the code before
        # 2026-12-06 (a reload that keeps the server's socket has old workers and new).
        cut = state.get("cut")
        pending = data.get("pending", cut.get("pending") if isinstance(cut, dict) else None)
        merged.merge_cells(_unsettled(pending, other.gens, merged.step_s))
    return True


def _merge_dead(merged: EnergyStats, folder: ServerFolder | None, dead: dict[str, Any] | None,
                samples: list[Samples]) -> None:
    if dead is None or dead.get("state") is None:
        return
    try:
        nodes = _parse_samples(dead.get("nodes", {}))
        merged.merge_state(dead["state"])
        samples.append(nodes)
    except NONSENSE as exc:
        if folder is not None:
            folder.odd("dead.json", f"{type(exc).__name__}: {exc}")


def _tenants(state: Any) -> set[str]:
    """The tenant labels in a state (its keys' last name), where it has any."""
    try:
        return {str(row[6]) for row in state["keys"]}
    except (TypeError, KeyError, IndexError):
        return set()


def _unsettled(pending: Any, gens: list[Generation], step_s: float) -> list[tuple[Key, int, Cell]]:
    """A dead worker's answers that never settled: requests of unknown energy."""
    answers: dict[str, Any] = dict(pending) if isinstance(pending, dict) else {}
    for g in gens:
        answers.update(g.answered)
    for g in gens:
        for settled in g.settled:
            answers.pop(settled, None)
    cells: list[tuple[Key, int, Cell]] = []
    for labels in answers.values():
        try:
            t, route, node, tier, outcome, status, tenant = labels
            if not (isinstance(t, float | int) and math.isfinite(t)):
                continue
            key: Key = (str(route or "<unmatched>"), str(node or NONE), str(tier or NONE), "unknown",
                        outcome if isinstance(outcome, str) else "incomplete",
                        status_class(status), NONE if tenant is None else OTHER)
            cell = Cell()
            cell.add(None, None, 0.0, None)
            cells.append((key, int(t // step_s), cell))
        except (TypeError, ValueError):
            continue
    return cells


def _parse_samples(nodes: Any) -> dict[str, list[Sample]]:
    """A row's node samples; raises ValueError on one that makes no sense."""
    if not isinstance(nodes, dict):
        raise ValueError("nodes is not an object")
    out: dict[str, list[Sample]] = {}
    for name, items in nodes.items():
        parsed = []
        for item in items:
            t, *values = item
            if not (isinstance(t, float | int) and math.isfinite(t)) or len(values) != 4:
                raise ValueError(f"a node sample without a time: {item!r}")
            parsed.append(Sample(float(t), *(float(v) if isinstance(v, float | int) and math.isfinite(v)
                                             else None for v in values)))
        out[str(name)] = parsed
    return out


def samples_of(stats: EnergyStats) -> dict[str, list[Sample]]:
    with stats._lock:
        return stats._nodes.copy()


def merge_samples(per_worker: list[dict[str, list[Sample]]], step: float) -> dict[str, list[Sample]]:
    """Every worker's samples of the host's node books, one per step (the latest): each
    worker samples when it answers, so together they draw the series none has alone."""
    merged: dict[str, dict[int, Sample]] = {}
    for samples in per_worker:
        for name, items in samples.items():
            slots = merged.setdefault(name, {})
            for item in items:
                slot = int(item.t // step)
                if slot not in slots or slots[slot].t < item.t:
                    slots[slot] = item
    return {name: [slots[k] for k in sorted(slots)] for name, slots in merged.items()}


__all__ = ["NONSENSE", "Samples", "merge_samples", "merge_server", "process_of", "samples_of"]
