"""The one Energy record, and the one function that grades a raw share into it.

The ledger hands back a :class:`Share`: raw joules above idle, what part of them is not yet
reported by the card, how far they can be trusted, and how the card was shared. The
:class:`~giul_asgi.meter.Meter` grades it with :func:`grade`, so the rules live here alone:

1. Charged above idle: the ledger has already taken ``idle_w`` off; ``idle_watts`` says
   which floor was used, or ``None`` when the operator gave none (``idle_known`` false).
2. No fabricated zeros: a share of <= 0 J is a failed measurement. It becomes an estimate
   (tokens x the tier's hint, ``method="estimated"``) or ``unknown`` with ``joules=None``.
3. Labelled: ``method``, ``backend`` and ``source`` on every record; a simulated card grades
   to ``simulated``, never ``measured``. A figure more than half interpolated (the card has
   not reported that part, or never will), or made while the node's reader is failing, is
   ``estimated`` (backend and source kept: they say what the rest was measured with) and
   says in ``error`` what it was estimated from and why; a simulated card's stays
   ``simulated`` (an interpolation of a simulation is still a simulation) and says so too.
4. Conservation is the ledger's job; the record says how the card was shared
   (``concurrency``, ``split``) and whether a foreign load was seen (``contended``).
5. Two bases (after OpenCost's ``cost_basis``): ``joules`` is above idle, what the request
   caused; ``allocated_joules`` adds its share of the idle floor while it ran (the ledger
   shares a span's idle floor among the windows open in it as it shares the rest). Where
   ``joules`` is unknown so is ``allocated_joules``; where it is estimated, so is this, by
   the same method label.
6. The boundary said (after Google's narrow vs comprehensive accounting): ``boundary`` is
   what the reader's energy covers, ``gpu`` (the card(s) alone), ``cpu`` (a CPU node's RAPL
   package) or ``host`` (the cards with the host's CPU package and DRAM); where the node sets
   a ``pue``, every figure in joules is multiplied by it (the facility's energy for the
   boundary) and ``pue`` says so. The ledger's books stay the reader's energy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Method = Literal["measured", "estimated", "simulated", "unknown"]
METHODS: tuple[str, ...] = ("measured", "estimated", "simulated", "unknown")
BACKENDS: tuple[str, ...] = (
    "nvml_counter", "nvml_power", "smi", "agent", "dcgm", "rapl", "amd", "simulated", "none",
)
SOURCES: tuple[str, ...] = ("local", "remote", "none")
#: What a figure's energy covers: the card(s) alone, a CPU node's package, or the host.
BOUNDARIES: tuple[str, ...] = ("gpu", "cpu", "host")
#: Which token count a record's ``tokens`` is: the default is what the model generated.
TOKEN_KINDS: tuple[str, ...] = ("output", "input", "total")
#: A request's token count past this is none: a usage object's 2**64 - 1 (a server that wrote
#: -1 unsigned) made a worker's own statistics refuse themselves, and /energy answer 500.
MAX_TOKENS = 2**32
#: A provisional figure more interpolated than this says so in its ``error``.
MOSTLY_INTERPOLATED = 0.5


@dataclass(frozen=True, slots=True)
class Provenance:
    """Who measured, from where, with which idle floor: constant for a node's reader."""

    method: Method  # what a successful reading is: "measured" or "simulated"
    backend: str
    source: str
    idle_watts: float | None
    #: The node reads a MIG board: which slices it stands for, and that the energy is the
    #: board's (:mod:`giul_asgi.readers.mig`); None when not on MIG.
    mig: str | None = None
    #: What the reader's energy covers (:data:`BOUNDARIES`).
    boundary: str = "gpu"
    #: The node's power usage effectiveness: figures in joules are multiplied by it (None:
    #: not set, the boundary's energy as read).
    pue: float | None = None


@dataclass(frozen=True, slots=True)
class Carbon:
    """What a kWh drawn by a node emits, and how we know: grams = joules x pue x g_per_kwh
    / 3.6e6. ``g_per_kwh`` is None where it is unknown, or too old to be used."""

    g_per_kwh: float | None
    pue: float = 1.0
    #: Where the intensity comes from: ``static``, ``electricitymaps``, ``file``, ...
    source: str = "static"
    #: ``average`` (Electricity Maps) or ``marginal`` (WattTime); None when not said.
    signal: str | None = None
    #: How old the intensity is, in seconds (None: a fixed figure).
    age_s: float | None = None

    def grams(self, joules: float | None) -> float | None:
        if joules is None or self.g_per_kwh is None:
            return None
        return joules * self.pue * self.g_per_kwh / 3.6e6


@dataclass(slots=True)
class Share:
    """A window's raw share of its node's energy, as the ledger's book holds it now.

    ``joules`` is None when the window cannot be measured (no reader, nothing to fill a gap
    from). ``interpolated`` is the part of ``joules`` the card has not reported (yet, or
    ever: time before its first step, a gap where its reader failed), filled from
    ``basis`` (in words: "the node's prior"); ``uncertainty`` covers both parts.
    ``trouble`` says why the card is not reporting, while its reader fails or after a reset.
    """

    joules: float | None
    uncertainty: float
    interpolated: float
    settled: bool
    provenance: Provenance
    seconds: float
    mean_watts: float | None = None
    concurrency: float | None = None
    split: str = "exclusive"
    contended: bool | None = None
    foreign_watts: float | None = None
    error: str | None = None
    trouble: str | None = None
    basis: str | None = None
    #: The window's part of the idle floor while it ran (None: nothing shared it yet).
    idle_joules: float | None = None


@dataclass(slots=True)
class Energy:
    """What one request (or one stage of it) cost, and how we know.

    ``joules`` is the energy above idle charged to this window, or ``None`` when it is not
    known: never ``0.0`` standing in for "unknown". A slotted dataclass, not frozen: one is
    built per response, and a frozen one costs a ``object.__setattr__`` per field.
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
    #: How the card's energy was shared: ``exclusive``, ``time``, ``tokens``, ``time+tokens``.
    split: str | None = None
    uncertainty_joules: float | None = None
    settled: bool = True
    stages: Mapping[str, Energy] = field(default_factory=dict)
    #: A foreign load was seen on the card; ``None`` only when nobody could look.
    contended: bool | None = None
    #: The foreign load's above-idle watts, as witnessed between windows.
    foreign_watts: float | None = None
    #: Why a measurement is missing, partial or mostly interpolated, in words.
    error: str | None = None
    #: The request's id (``X-Energy-Id``), under which its settled record can be fetched.
    id: str | None = None
    #: Who the request was for: a name, or a short stable hash of a key (never the key).
    tenant: str | None = None
    #: What the joules emitted (joules x pue x carbon_g_per_kwh / 3.6e6), or None.
    carbon_grams: float | None = None
    carbon_g_per_kwh: float | None = None
    pue: float | None = None
    #: ``static``, ``electricitymaps``, ``file``, ... (None: no carbon configured).
    carbon_source: str | None = None
    #: ``average`` or ``marginal``.
    carbon_signal: str | None = None
    #: How old the intensity was when the figure was made (seconds).
    carbon_age_s: float | None = None
    #: On a MIG board: the slices the node stands for and that the energy is the whole
    #: board's (a slice cannot be metered alone); None when not on MIG.
    mig: str | None = None
    #: ``joules`` plus the request's share of the idle floor while it ran (the basis that
    #: adds up to all the card drew); None when ``joules`` is.
    allocated_joules: float | None = None
    #: What the energy covers: ``gpu`` (the card(s) alone), ``cpu`` (a CPU node's RAPL
    #: package) or ``host`` (the cards with the host's CPU package and DRAM).
    boundary: str = "gpu"

    @property
    def known(self) -> bool:
        return self.joules is not None

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready. Unknown stays ``None`` (null); floats are finite."""
        return {
            "joules": _num(self.joules),
            "allocated_joules": _num(self.allocated_joules),
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
            "foreign_watts": _num(self.foreign_watts),
            "error": self.error,
            "id": self.id,
            "tenant": self.tenant,
            "carbon_grams": _num(self.carbon_grams),
            "carbon_g_per_kwh": _num(self.carbon_g_per_kwh),
            "pue": _num(self.pue),
            "carbon_source": self.carbon_source,
            "carbon_signal": self.carbon_signal,
            "carbon_age_s": _num(self.carbon_age_s),
            "mig": self.mig,
            "boundary": self.boundary,
        }


def _num(value: float | None) -> float | None:
    # Nine significant digits, not a fixed number of decimals: a tiny figure that is not
    # zero must never serialise as 0.
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.9g}")


def _estimated(share: Share, joules: float, what: str) -> str:
    """What a figure was estimated from, and why, in words."""
    basis = share.basis or "the node's prior"
    why = f"{what}: {min(1.0, share.interpolated / joules):.0%} interpolated from {basis}"
    if share.trouble:
        why += f"; {share.trouble}"
    elif not share.settled:
        why += "; the card has not reported it yet"
    return why if share.error is None else f"{why}; {share.error}"


def grade(
    share: Share,
    *,
    node: str | None = None,
    tier: str | None = None,
    route: str | None = None,
    tokens: int | None = None,
    token_kind: str = "output",
    hint_per_1k: float = 0.0,
    stages: Mapping[str, Energy] | None = None,
    id: str | None = None,
    tenant: str | None = None,
    carbon: Carbon | None = None,
) -> Energy:
    """The rules, in one place: a raw share in, an honestly labelled record out."""
    provenance = share.provenance
    valid_tokens = tokens if tokens is not None and tokens > 0 else None
    joules = share.joules
    method: Method = provenance.method
    backend, source = provenance.backend, provenance.source
    uncertainty: float | None = share.uncertainty
    mean_watts = share.mean_watts
    error = share.error
    if joules is None or not (joules > 0 and math.isfinite(joules)):
        if joules is not None and error is None:
            error = (f"measured {joules:.6g} J above idle: a failed measurement, not a free request"
                     if share.settled else
                     # a first figure is the part read so far and the prior's guess for the rest,
                     # which its learnt bias can take to nothing ("a failed measurement" there
                     # puzzled a stranger whose card drew 200 W for every window)
                     f"first figure {joules:.6g} J (the part read so far and the node's guess for the "
                     "rest): none to give until the card reports it")
            if share.trouble:
                error = f"{error}; {share.trouble}"
        # The hint prices what nothing will measure: a node that cannot, a failed reader, a
        # figure settled unknown. A first figure whose card has yet to report waits for it
        # (unknown, and why): a hint there was 4x to 100x what settled, with no uncertainty.
        awaited = not share.settled and share.trouble is None
        if valid_tokens is not None and hint_per_1k > 0 and not awaited:
            joules = hint_per_1k * valid_tokens / 1000.0
            method, backend, source, mean_watts = "estimated", "none", "none", None
            why = f" ({error})" if error else ""
            error = (f"estimated from the tier's hint: {valid_tokens} tokens x {hint_per_1k:g} J per "
                     f"1,000, no uncertainty{why}")
        else:
            joules, method = None, "unknown"
        uncertainty = None
    else:
        mostly = share.interpolated > MOSTLY_INTERPOLATED * joules
        if method == "measured" and (mostly or share.trouble):
            method = "estimated"
            error = _estimated(share, joules, "estimated")
        elif (mostly or share.trouble) and error is None:
            error = _estimated(share, joules, method)
    # The node's PUE multiplies every figure in joules (the boundary's energy at the facility).
    pue = provenance.pue
    factor = pue if pue is not None else 1.0
    charged = joules * factor if joules is not None else None
    per_token = charged / valid_tokens if charged is not None and valid_tokens else None
    energy = Energy(
        charged, method, backend, source, node, tier, route, share.seconds,
        provenance.idle_watts, provenance.idle_watts is not None, mean_watts, tokens,
        token_kind, per_token, share.concurrency, share.split,
        uncertainty * factor if uncertainty is not None else None, share.settled,
        stages if stages is not None else {}, share.contended, share.foreign_watts, error, id,
        tenant,
    )
    if carbon is not None:
        energy.carbon_grams = carbon.grams(joules)  # x carbon.pue: the node's PUE, once
        energy.carbon_g_per_kwh, energy.pue = carbon.g_per_kwh, carbon.pue
        energy.carbon_source, energy.carbon_signal = carbon.source, carbon.signal
        energy.carbon_age_s = carbon.age_s
    if pue is not None:
        energy.pue = pue
    if provenance.mig is not None:
        energy.mig = provenance.mig
    if joules is not None:
        energy.allocated_joules = (joules + _idle_part(share, provenance.idle_watts)) * factor
    if provenance.boundary != "gpu":
        energy.boundary = provenance.boundary
    return energy


def _idle_part(share: Share, idle_w: float | None) -> float:
    """The window's share of the idle floor: as the ledger shared it, else (nothing shared
    it: no reading) idle_w x its time over the windows in flight beside it."""
    if share.idle_joules is not None:
        return share.idle_joules
    if not idle_w:
        return 0.0
    return idle_w * share.seconds / max(1.0, share.concurrency or 1.0)


__all__ = [
    "BACKENDS",
    "BOUNDARIES",
    "MAX_TOKENS",
    "METHODS",
    "SOURCES",
    "TOKEN_KINDS",
    "Carbon",
    "Energy",
    "Method",
    "Provenance",
    "Share",
    "grade",
]
