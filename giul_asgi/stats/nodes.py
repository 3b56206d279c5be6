"""Samples of each node's ledger totals, for the power series and the watts on /energy.

The ledgers keep since-start joules (measured, charged to requests, unattributed). A ledger
samples its own books once a step on its reader thread (:mod:`giul_asgi.ledger.history`),
whether or not anyone reads /energy; /energy folds those samples in (:meth:`NodeSamples.add`)
and samples a ledger that keeps none when it is read (:meth:`NodeSamples.observe`). At most
one sample a step per node (the latest kept), over the longest window: their differences
give above-idle watts over time. Bounded by nodes x (steps of the longest window + 2).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class Sample(NamedTuple):
    t: float
    measured_j: float | None
    charged_j: float | None
    unattributed_j: float | None
    reads: float | None


class NodeSamples:
    """node name -> samples, oldest first (not thread-safe: the statistics lock it)."""

    __slots__ = ("samples", "span_s", "step_s")

    def __init__(self, step_s: float, span_s: float) -> None:
        self.step_s = step_s
        self.span_s = span_s  # how far back samples are kept
        self.samples: dict[str, list[Sample]] = {}

    def observe(self, name: str, totals: Any, now: float) -> None:
        samples = self.samples.setdefault(name, [])
        sample = Sample(now, _f(getattr(totals, "measured_j", None)),
                        _f(getattr(totals, "charged_j", None)),
                        _f(getattr(totals, "unattributed_j", None)), _f(getattr(totals, "reads", None)))
        if samples and int(samples[-1].t // self.step_s) == int(now // self.step_s):
            samples[-1] = sample
        else:
            samples.append(sample)
        while samples and samples[0].t < now - self.span_s - self.step_s:
            samples.pop(0)

    def add(self, name: str, samples: list[Sample], now: float) -> None:
        """Fold in samples taken elsewhere (a ledger's history), one a step, the latest kept."""
        if not samples:
            return
        mine = self.samples.get(name, [])
        by_step = {int(s.t // self.step_s): s for s in mine}
        for s in samples:
            step = int(s.t // self.step_s)
            kept = by_step.get(step)
            if kept is None or kept.t < s.t:
                by_step[step] = s
        oldest = now - self.span_s - self.step_s
        self.samples[name] = [by_step[k] for k in sorted(by_step) if by_step[k].t >= oldest]

    def copy(self) -> dict[str, list[Sample]]:
        return {k: list(v) for k, v in self.samples.items()}

    def rates(self) -> dict[str, tuple[float | None, float | None]]:
        """(above-idle watts, reads per second) per node between its last two samples."""
        out: dict[str, tuple[float | None, float | None]] = {}
        for name, samples in self.samples.items():
            last = samples[-2:]
            if len(last) < 2 or last[1].t <= last[0].t:
                out[name] = (None, None)
                continue
            a, b = last
            out[name] = (_rate(a.measured_j, b.measured_j, b.t - a.t), _rate(a.reads, b.reads, b.t - a.t))
        return out


def _rate(a: float | None, b: float | None, dt: float) -> float | None:
    if a is None or b is None or b < a:
        return None
    value = (b - a) / dt
    return float(f"{value:.6g}") if math.isfinite(value) else None


def _f(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


__all__ = ["NodeSamples", "Sample"]
