"""The Energy record and the rules that grade a candidate figure into one.

Every figure this library emits passes through :func:`grade`, so the rules live in
exactly one place:

1. Charged above idle: the ledger has already taken ``idle_w`` off; ``idle_watts`` says
   which floor was used, or ``None`` when the operator gave none (then the figure is
   energy above zero, and ``idle_known`` is false).
2. No fabricated zeros: a measured share of <= 0 J is a failed measurement. It becomes an
   estimate (tokens x the tier's hint) or ``unknown`` with ``joules=None``, never 0.0.
3. Labelled provenance: ``method``, ``backend`` and ``source`` on every record; a simulated
   card grades to ``method="simulated"``, never ``measured``.
4. Conservation is the ledger's job; the record says how the card was shared
   (``concurrency``, ``split``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

Method = Literal["measured", "estimated", "simulated", "unknown"]
METHODS: tuple[str, ...] = ("measured", "estimated", "simulated", "unknown")
BACKENDS: tuple[str, ...] = (
    "nvml_counter", "nvml_power", "smi", "agent", "dcgm", "rapl", "amd", "simulated", "none",
)
SOURCES: tuple[str, ...] = ("local", "remote", "none")
#: Which token count a record's ``tokens`` is: the default is what the model generated.
TOKEN_KINDS: tuple[str, ...] = ("output", "input", "total")


@dataclass(frozen=True, slots=True)
class Energy:
    """What one request (or one stage of it) cost, and how we know.

    ``joules`` is the energy above idle charged to this window, or ``None`` when it is not
    known. It is never ``0.0`` standing in for "unknown".
    """

    joules: float | None
    method: Method
    backend: str = "none"
    source: str = "none"
    node: str | None = None
    tier: str | None = None
    route: str | None = None
    seconds: float = 0.0
    idle_watts: float | None = None
    idle_known: bool = False
    #: The node's mean draw over the window: all requests together, not this one's share.
    mean_watts: float | None = None
    tokens: int | None = None
    token_kind: str = "output"
    joules_per_token: float | None = None
    #: Mean number of windows in flight on the node during this one (1.0 when alone).
    concurrency: float | None = None
    #: How the card's energy was shared: ``exclusive``, ``time`` or ``tokens``.
    split: str | None = None
    uncertainty_joules: float | None = None
    settled: bool = True
    stages: Mapping[str, Energy] = field(default_factory=lambda: _NO_STAGES)
    #: A foreign process was seen on the card; ``None`` when nobody looked.
    contended: bool | None = None
    #: Why a measurement is missing or partial, in words an operator can act on.
    error: str | None = None

    @property
    def known(self) -> bool:
        return self.joules is not None

    @classmethod
    def from_figure(cls, figure: Figure) -> Energy:
        """The record for a :class:`Figure` (the same fields, in the same order)."""
        if not figure.stages:
            return cls(*figure[:18], _NO_STAGES, figure.contended, figure.error)
        stages = {
            name: cls.from_figure(stage) if isinstance(stage, Figure) else stage
            for name, stage in figure.stages.items()
        }
        return cls(*figure[:18], stages, figure.contended, figure.error)

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready. Unknown stays ``None`` (null); floats are finite."""
        return {
            "joules": _num(self.joules),
            "method": self.method,
            "backend": self.backend,
            "source": self.source,
            "node": self.node,
            "tier": self.tier,
            "route": self.route,
            "seconds": _num(self.seconds),
            "idle_watts": _num(self.idle_watts),
            "idle_known": self.idle_known,
            "mean_watts": _num(self.mean_watts),
            "tokens": self.tokens,
            "token_kind": self.token_kind,
            "joules_per_token": _num(self.joules_per_token),
            "concurrency": _num(self.concurrency),
            "split": self.split,
            "uncertainty_joules": _num(self.uncertainty_joules),
            "settled": self.settled,
            "stages": {name: stage.as_dict() for name, stage in self.stages.items()},
            "contended": self.contended,
            "error": self.error,
        }


def _num(value: float | None) -> float | None:
    # Nine significant digits, not a fixed number of decimals: a tiny figure that is not
    # zero must never serialise as 0.
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.9g}")


class Figure(NamedTuple):
    """An :class:`Energy`'s fields as a plain tuple: what the request path renders.

    Building the frozen dataclass costs several times more than a tuple, and a gateway does
    it on every response; headers and the JSON block are written from this instead, and
    ``Energy.from_figure`` gives the record to whoever asks for it.
    """

    joules: float | None
    method: Method
    backend: str
    source: str
    node: str | None
    tier: str | None
    route: str | None
    seconds: float
    idle_watts: float | None
    idle_known: bool
    mean_watts: float | None
    tokens: int | None
    token_kind: str
    joules_per_token: float | None
    concurrency: float | None
    split: str | None
    uncertainty_joules: float | None
    settled: bool
    stages: Mapping[str, Any]
    contended: bool | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Provenance:
    """Who measured, from where, with which idle floor: constant for a node's reader."""

    method: Method  # what a successful reading is: "measured" or "simulated"
    backend: str
    source: str
    idle_watts: float | None


def classify(
    share: float | None, provenance: Provenance, tokens: int | None, hint_per_1k: float
) -> tuple[float | None, Method, float | None]:
    """Rules 2 and 3 in one place: (joules, method, joules per token) for a share.

    A positive finite share is a measurement (or a simulation, as the reader says). Anything
    else is not a free request: it becomes tokens x hint, labelled ``estimated``, or
    ``unknown`` with no figure at all.
    """
    valid_tokens = tokens is not None and tokens > 0
    if share is not None and share > 0 and math.isfinite(share):
        return share, provenance.method, (share / tokens if valid_tokens else None)  # type: ignore[operator]
    if valid_tokens and hint_per_1k > 0:
        joules = hint_per_1k * tokens / 1000.0  # type: ignore[operator]
        return joules, "estimated", joules / tokens  # type: ignore[operator]
    return None, "unknown", None


def grade(share: float | None, **options: Any) -> Energy:
    """Turn the ledger's share for a window into an honestly labelled :class:`Energy`.

    ``share`` is ``None`` when the window could not be measured at all (no reader, a
    counter reset or a reader error inside it, a window that never settled). ``options``
    are :func:`grade_figure`'s keywords; it applies the rules, this builds the record.
    """
    return Energy.from_figure(grade_figure(share, **options))


def grade_figure(
    share: float | None,
    *,
    provenance: Provenance,
    seconds: float,
    node: str | None = None,
    tier: str | None = None,
    route: str | None = None,
    tokens: int | None = None,
    token_kind: str = "output",
    hint_per_1k: float = 0.0,
    mean_watts: float | None = None,
    concurrency: float | None = None,
    split: str | None = None,
    uncertainty: float | None = None,
    settled: bool = True,
    stages: Mapping[str, Any] | None = None,
    contended: bool | None = None,
    error: str | None = None,
) -> Figure:
    """:func:`grade`, as a :class:`Figure`: the one place the rules are applied."""
    return grade_positional(
        share, provenance, seconds, node, tier, route, tokens, token_kind, hint_per_1k,
        mean_watts, concurrency, split, uncertainty, settled, stages, contended, error,
    )


def grade_positional(
    share: float | None,
    provenance: Provenance,
    seconds: float,
    node: str | None,
    tier: str | None,
    route: str | None,
    tokens: int | None,
    token_kind: str,
    hint_per_1k: float,
    mean_watts: float | None,
    concurrency: float | None,
    split: str | None,
    uncertainty: float | None,
    settled: bool,
    stages: Mapping[str, Any] | None,
    contended: bool | None,
    error: str | None,
) -> Figure:
    """:func:`grade_figure` with every argument in place: the request path calls this,
    since seventeen keywords cost more than the grading itself."""
    joules, method, per_token = classify(share, provenance, tokens, hint_per_1k)
    backend, source = provenance.backend, provenance.source
    if method != provenance.method:  # the measurement did not stand
        uncertainty = None
        if share is not None and error is None:
            error = f"measured {share:.6g} J above idle: a failed measurement, not a free request"
        if method == "estimated":
            backend, source, mean_watts = "none", "none", None
    return Figure(
        joules, method, backend, source, node, tier, route, seconds,
        provenance.idle_watts, provenance.idle_watts is not None, mean_watts, tokens,
        token_kind, per_token, concurrency, split, uncertainty, settled,
        stages if stages is not None else _NO_STAGES, contended, error,
    )


_NO_STAGES: Mapping[str, Energy] = MappingProxyType({})
