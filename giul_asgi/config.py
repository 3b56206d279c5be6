"""Nodes, tiers and routes: what an operator tells us about the fleet.

A :class:`Node` is one or more GPUs read together, with the idle floor the operator
measured (we never guess it). A :class:`Tier` is a model class with a joules-per-1k-tokens
hint used only for labelled estimates. A :class:`Route` maps requests to both. They load
from plain dicts or a TOML file, and a bad key is named in the error.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from .budgets.budget import Budget, build_budget
from .deferred import KeepsItsError, built_for_a_server, kept_record, raise_kept
from .errors import ConfigError, require_installed
from .hostshare.place import check_setting

if TYPE_CHECKING:
    from .readers.base import Reader

READER_KINDS: tuple[str, ...] = (
    "auto", "nvml", "agent", "dcgm", "dcgmi", "smi", "rapl", "amd", "simulated", "none",
)
#: Readers that read another host: they need a ``url``.
URL_READERS: tuple[str, ...] = ("agent", "dcgm")
SPLITS: tuple[str, ...] = ("time", "tokens", "phases")
#: What a node's figures cover: its cards alone, or the cards and the host's CPU and DRAM.
NODE_BOUNDARIES: tuple[str, ...] = ("gpu", "host")
FOREIGN: tuple[str, ...] = ("charge", "subtract")
#: The largest trace file a node may ask for (two are kept per node and process).
MAX_TRACE_MB = 4096.0


@dataclass(frozen=True)
class Node(metaclass=KeepsItsError):
    """A set of GPUs metered as one, with the operator's idle floor for all of them.

    ``gpus`` are NVML indices; an empty tuple means every GPU the host shows.
    ``idle_w`` is the whole node's floor in watts. With ``None`` the figures are energy
    above zero and say so (``idle_known: false``); we never invent a floor.
    ``reader`` picks how to read it: ``auto`` (NVML if it answers, else nothing), ``nvml``,
    ``dcgmi``, ``simulated`` (with no ``url``: an in-process card the node's own windows
    load; with one: the demo upstream's card) or ``none``. ``split`` is how overlapping
    requests share the node's energy: by their ``time`` in each interval, by time x
    ``tokens`` per second, or by ``phases``: time in prefill and in decode, each at its own
    rate learnt on the node (see :mod:`giul_asgi.ledger.phases`).
    ``url`` (and ``token``) say where a remote reader finds the card: a giul-agent, a
    dcgm-exporter, the demo's simulated upstream. ``options`` are the reader's own keys,
    checked when it is built. ``foreign`` is what to do with a load on the card that no
    window explains once a ramp-down (``ramp_s``) has passed: ``charge`` it to the windows
    (flagged ``contended``) or ``subtract`` the witnessed level. ``serving`` names the
    node's own inference server (a process name or PID): any other compute process on the
    card marks figures ``contended``.
    ``upstream`` is the inference server's Prometheus URL (vLLM, TGI, SGLang, TensorRT-LLM): its running
    requests are the card's whole load, so each span is shared by this gateway's part of
    it and the rest is foreign (several replicas stay right with no shared state);
    ``upstream_model`` counts only one model's requests, where the server runs others on
    other cards.
    ``workers_dir`` (or ``$GIUL_ASGI_LOAD_DIR``) moves where the host's worker processes
    share the card (their windows in flight, books, statistics and records), which they do
    by default in a per-user directory on shared memory; ``False`` or ``"off"`` shares nothing.
    ``carbon_g_per_kwh`` (a fixed grid intensity, gCO2eq/kWh) or ``carbon`` (a URL or a
    file polled every ``carbon_every_s`` from the node's reader thread: Electricity Maps'
    ``carbon-intensity/latest``, with ``carbon_token`` or ``$ELECTRICITYMAPS_TOKEN``, or a
    plain ``{"g_per_kwh": ..., "signal": ...}``) give each figure its ``carbon_grams``; a polled value
    older than ``carbon_max_age_s`` is not used (the grams are unknown). A file that does not
    exist yet is accepted (a job may write it after startup: the node says so until it does),
    but its directory must exist. See :mod:`giul_asgi.carbon`. ``pue`` (the facility's power
    usage effectiveness) multiplies every figure in joules, and says so (``pue`` in the record,
    ``X-Energy-PUE``): the facility's energy for the reader's boundary (``gpu``: the cards;
    ``cpu``: a RAPL node's package); without it the figures are the boundary's energy as read.
    ``boundary`` says what the figures cover: ``gpu`` (the cards alone) or ``host`` (the
    cards read as usual plus the host's RAPL package and DRAM zones under ``rapl_root``,
    summed per reading: ``idle_w`` is then the host's floor).
    ``trace`` (a directory) makes the node's ledger write what it saw, readings and windows
    (never request content), to at most two files of ``trace_mb`` MB each, for
    ``giul-asgi replay`` (see :mod:`giul_asgi.ledger.trace`).
    ``reader_factory`` builds a custom reader (tests, benchmarks); it is not part of the
    node's identity.
    """

    #: The node's name, in every figure and label.
    name: str = "local"
    #: NVML indices of its GPUs; ``()``: every GPU the host shows.
    gpus: tuple[int, ...] = (0,)
    #: The whole node's idle floor (W), yours, measured at rest (``giul-asgi probe --idle``);
    #: None: figures are above zero and say so (``idle_known: false``).
    idle_w: float | None = None
    #: How the card is read: ``auto``, ``nvml``, ``smi``, ``dcgm``, ``dcgmi``, ``agent``,
    #: ``rapl``, ``amd``, ``simulated``, ``none`` (see Readers).
    reader: str = "auto"
    #: The counter's update period (s) where the card cannot tell; learnt otherwise.
    period_s: float | None = None
    #: How overlapping requests share a span: by ``time``, time x ``tokens`` per second, or
    #: ``phases``: prefill and decode time at rates learnt on the node (``time`` while learning).
    split: str = "time"
    #: Where a remote reader finds the card (a giul-agent, a dcgm-exporter, the demo's upstream).
    url: str | None = None
    #: The bearer token for ``url``.
    token: str | None = None
    #: The reader's own keys, checked when it is built.
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: A load no window explains: ``charge`` it (figures say ``contended``) or ``subtract`` it.
    foreign: str = "charge"
    #: How long a card's ramp-down lasts after a request (s).
    ramp_s: float = 0.1
    #: The node's inference server (a process name or PID): another process on the card is foreign.
    serving: str | int | None = None
    #: The inference server's Prometheus URL (vLLM, TGI, SGLang, TensorRT-LLM): its load beyond
    #: ours is foreign.
    upstream: str | None = None
    #: Of the server's load, only this model's (its ``model_name`` label): a server that runs
    #: other models on other cards (None: all of it is this card's).
    upstream_model: str | None = None
    #: Where the host's processes share the card (an absolute path; default: a private place on
    #: /dev/shm); ``"off"`` (or false, no, 0) or False: share nothing (also ``$GIUL_ASGI_LOAD_DIR``).
    workers_dir: str | bool | None = None
    #: A grid intensity to poll: a URL (Electricity Maps) or a JSON file.
    carbon: str | None = None
    #: A fixed grid intensity (gCO2eq/kWh).
    carbon_g_per_kwh: float | None = None
    #: The facility's power usage effectiveness: multiplies every figure in joules (and so
    #: its carbon), and the record says so; None: the cards' energy as read.
    pue: float | None = None
    #: The token for ``carbon`` (else ``$ELECTRICITYMAPS_TOKEN``).
    carbon_token: str | None = field(default=None, repr=False)
    #: How often ``carbon`` is polled (s).
    carbon_every_s: float = 300.0
    #: A polled intensity older than this (s) is not used: the grams are unknown.
    carbon_max_age_s: float = 6 * 3600.0
    #: A directory where the ledger writes what it saw, to replay (``giul-asgi replay``):
    #: where it goes is not the node's identity, as the reader factory is not.
    trace: str | None = field(default=None, compare=False)
    #: The trace's size (MB) before it turns over (two files at most).
    trace_mb: float = field(default=16.0, compare=False)
    #: What the figures cover: ``gpu`` (the cards alone) or ``host`` (the cards, and the host's
    #: CPU package and DRAM through RAPL; ``idle_w`` is then the host's floor).
    boundary: str = "gpu"
    #: Where ``boundary="host"`` finds the RAPL zones (default ``/sys/class/powercap``).
    rapl_root: str | None = None
    #: A function ``node -> reader`` for a reader made in code (it shares the card with other
    #: processes only if the reader names it: ``card_id``, or its GPUs' UUIDs).
    reader_factory: Callable[[Node], Reader] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("node.name must be a non-empty string", remedy="name the node")
        gpus = self.gpus
        if isinstance(gpus, int):
            gpus = (gpus,)
        try:
            gpus = tuple(int(g) for g in gpus)
        except (TypeError, ValueError):
            raise ConfigError(
                f"node {self.name!r}: gpus must be a list of GPU indices, got {self.gpus!r}",
                remedy="give the GPUs' indices: gpus=(0, 1) in Python, gpus = [0, 1] in TOML",
            ) from None
        if any(g < 0 for g in gpus):
            raise ConfigError(f"node {self.name!r}: gpus must be >= 0, got {gpus!r}")
        object.__setattr__(self, "gpus", gpus)
        if self.idle_w is not None:
            idle = _number(self.idle_w, f"node {self.name!r}: idle_w")
            if idle < 0:
                raise ConfigError(
                    f"node {self.name!r}: idle_w must be >= 0 W, got {idle}",
                    remedy="measure the node at rest (giul-asgi probe) and give that figure",
                )
            object.__setattr__(self, "idle_w", idle)
        check_choice(f"node {self.name!r}: reader", self.reader, READER_KINDS,
                     remedy="'auto' (NVML if it answers), or 'simulated' to try it without a GPU")
        check_choice(f"node {self.name!r}: split", self.split, SPLITS,
                     remedy='"time" (the default), "tokens" (time x tokens per second) or "phases" '
                            "(prefill and decode at their own learnt rates)")
        if self.period_s is not None:
            period = _number(self.period_s, f"node {self.name!r}: period_s")
            if period <= 0:
                raise ConfigError(f"node {self.name!r}: period_s must be > 0, got {period}")
            object.__setattr__(self, "period_s", period)
        check_choice(f"node {self.name!r}: foreign", self.foreign, FOREIGN,
                     remedy="'charge' it to the windows open (the default) or 'subtract' it")
        ramp = _number(self.ramp_s, f"node {self.name!r}: ramp_s")
        if ramp < 0:
            raise ConfigError(f"node {self.name!r}: ramp_s must be >= 0 s, got {ramp}")
        object.__setattr__(self, "ramp_s", ramp)
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"node {self.name!r}: options must be a table of keys")
        check_setting(self.workers_dir)
        for key in ("url", "token", "upstream", "upstream_model"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"node {self.name!r}: {key} must be a non-empty string")
        for key in ("url", "upstream"):
            value = getattr(self, key)
            if value is not None and not value.startswith(("http://", "https://")):
                raise ConfigError(
                    f"node {self.name!r}: {key} must start with http:// or https://, got {value!r}"
                )
        if self.upstream_model is not None and self.upstream is None:
            raise ConfigError(f"node {self.name!r}: upstream_model counts one model of the upstream's load, "
                              "and no upstream is given", remedy='add upstream = "http://host:port/metrics"')
        if self.upstream is not None:  # unread, it was silent while replicas charged the card twice
            require_installed("prometheus_client", f"node {self.name!r}: upstream",
                              "pip install 'giul-asgi[prometheus]' (its parser reads the server's "
                              "metrics), or leave upstream unset", "prometheus-client")
        if self.reader in URL_READERS and self.url is None and self.reader_factory is None:
            raise ConfigError(
                f"node {self.name!r}: reader={self.reader!r} reads a card elsewhere and needs a url",
                remedy=f"add url = \"http://host:port\": the {self.reader} endpoint of the GPU host",
            )
        if self.serving is not None and (
            isinstance(self.serving, bool) or not isinstance(self.serving, str | int)
        ):
            raise ConfigError(
                f"node {self.name!r}: serving must be a process name or a PID, got {self.serving!r}"
            )
        check_choice(f"node {self.name!r}: boundary", self.boundary, NODE_BOUNDARIES,
                     remedy="gpu (the cards alone) or host (the cards, CPU package and DRAM)")
        if self.boundary == "host" and self.reader in ("rapl", "none") and self.reader_factory is None:
            raise ConfigError(
                f"node {self.name!r}: boundary='host' adds the host's RAPL zones to the cards' "
                f"reader, and reader={self.reader!r} reads no card",
                remedy="name the cards' reader (nvml, dcgm, ...), or leave boundary='gpu'",
            )
        if self.rapl_root is not None and (not isinstance(self.rapl_root, str) or not self.rapl_root):
            raise ConfigError(f"node {self.name!r}: rapl_root must be a directory path",
                              remedy="leave it out for /sys/class/powercap")
        _check_carbon(self)
        _check_trace(self)


def _check_trace(node: Node) -> None:
    """Where a node's trace goes (see :mod:`giul_asgi.ledger.trace`): a directory that
    exists and this process may write, and a bound on its files."""
    name = node.name
    mb = _number(node.trace_mb, f"node {name!r}: trace_mb")
    if not 0.01 <= mb <= MAX_TRACE_MB:
        raise ConfigError(
            f"node {name!r}: trace_mb must be 0.01 to {MAX_TRACE_MB:g} MB a file, got {mb:g}",
            remedy="two files of this size are kept per node and process; 16 MB holds about "
                   "an hour of readings")
    object.__setattr__(node, "trace_mb", mb)
    if node.trace is not None:
        object.__setattr__(node, "trace", check_trace_dir(f"node {name!r}: trace", node.trace))


def check_trace_dir(what: str, target: Any) -> str:
    """A trace directory (a node's, or the middleware's for all its nodes): one that exists
    and this process may write. Returns it as a string."""
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{what} must be a directory path, got {target!r}",
                          remedy='trace = "/var/log/giul" (a directory that exists)')
    if not Path(target).is_dir():
        raise ConfigError(f"{what}: directory {target!r} does not exist",
                          remedy=f"create it (mkdir -p {target}) or point trace at one that exists")
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: directory {target!r} is not writable by this process",
                          remedy="give the server's user write access, or choose another directory")
    return target


def _check_carbon(node: Node) -> None:
    """The carbon keys of a node (see :mod:`giul_asgi.carbon`): each mistake said once, here."""
    from .carbon import MAX_G_PER_KWH, MAX_PUE

    name = node.name
    if node.carbon is not None and node.carbon_g_per_kwh is not None:
        raise ConfigError(
            f"node {name!r}: give carbon (a source to poll) or carbon_g_per_kwh (a fixed "
            "intensity), not both", remedy="keep the one you mean")
    if node.carbon_g_per_kwh is not None:
        g = _number(node.carbon_g_per_kwh, f"node {name!r}: carbon_g_per_kwh")
        if not 0 <= g <= MAX_G_PER_KWH:
            raise ConfigError(
                f"node {name!r}: carbon_g_per_kwh must be 0 to {MAX_G_PER_KWH:g} gCO2eq/kWh, got {g:g}",
                remedy="give the grid's intensity in grams per kWh (grids range about 10 to 1,200)")
        object.__setattr__(node, "carbon_g_per_kwh", g)
    if node.carbon is not None:
        target = node.carbon
        if isinstance(target, os.PathLike):
            target = os.fspath(target)
        if not isinstance(target, str) or not target:
            raise ConfigError(f"node {name!r}: carbon must be a URL or a file path, got {target!r}",
                              remedy='carbon = "https://api.electricitymap.org/v3/carbon-intensity/'
                                     'latest?zone=DE" or "/run/carbon.json"')
        if "://" in target:
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(
                    f"node {name!r}: carbon URL must be http(s)://host/..., got {target!r}",
                    remedy="give a file as a plain path, without file://")
        elif not Path(target).parent.is_dir():
            raise ConfigError(
                f"node {name!r}: carbon file {target!r}: its directory does not exist",
                remedy="fix the path (the file itself may be written after startup)")
        if node.reader == "none" and node.reader_factory is None:
            raise ConfigError(
                f"node {name!r}: carbon {target!r} is polled by the node's reader thread, and "
                "reader='none' runs none", remedy="give a fixed carbon_g_per_kwh for this node")
        object.__setattr__(node, "carbon", target)
    if node.carbon_token is not None:
        if not isinstance(node.carbon_token, str) or not node.carbon_token:
            raise ConfigError(f"node {name!r}: carbon_token must be a non-empty string",
                              remedy="give the provider's token, or leave it out")
        if node.carbon is None or "://" not in node.carbon:
            raise ConfigError(f"node {name!r}: carbon_token is sent to a carbon URL, and there is none",
                              remedy="set carbon to the provider's URL, or drop the token")
    if node.pue is not None:
        pue = _number(node.pue, f"node {name!r}: pue")
        if not 1.0 <= pue <= MAX_PUE:
            raise ConfigError(
                f"node {name!r}: pue must be 1 to {MAX_PUE:g}, got {pue:g}",
                remedy="PUE is the facility's energy over the IT equipment's (1.1 to 2.5 in "
                       "practice); leave it out for the card's energy alone")
        object.__setattr__(node, "pue", pue)
    for key in ("carbon_every_s", "carbon_max_age_s"):
        value = _number(getattr(node, key), f"node {name!r}: {key}")
        if value <= 0:
            raise ConfigError(f"node {name!r}: {key} must be > 0 s, got {value:g}",
                              remedy="leave it out for the default (300 s and 6 h)")
        object.__setattr__(node, key, value)
    if node.carbon_max_age_s < node.carbon_every_s:
        raise ConfigError(
            f"node {name!r}: carbon_max_age_s ({node.carbon_max_age_s:g} s) is shorter than "
            f"carbon_every_s ({node.carbon_every_s:g} s): every value would expire before the next poll",
            remedy="poll more often or keep values longer (defaults: 300 s and 6 h)")


@dataclass(frozen=True)
class Tier(metaclass=KeepsItsError):
    """A class of model; the hint prices a token when nothing could measure it."""

    #: The tier's name, in every figure and label.
    name: str = "default"
    #: Joules per 1,000 tokens, for an estimate where nothing could be measured (labelled so).
    joules_per_1k_hint: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("tier.name must be a non-empty string")
        hint = _number(self.joules_per_1k_hint, f"tier {self.name!r}: joules_per_1k_hint")
        if hint < 0:
            raise ConfigError(f"tier {self.name!r}: joules_per_1k_hint must be >= 0")
        object.__setattr__(self, "joules_per_1k_hint", hint)


@dataclass(frozen=True)
class Route(metaclass=KeepsItsError):
    """Requests whose route template (or path) matches ``pattern`` go to ``node``/``tier``.

    ``pattern`` is an exact template or path (``/v1/models/{id}``), a glob with ``*``
    (``/v1/*``), or a compiled regular expression. ``node`` and ``tier`` are names or objects.
    """

    #: A route template or path (``/v1/models/{id}``), a glob (``/v1/*``) or a compiled regex.
    pattern: str | re.Pattern[str]
    #: The node (name or object) its requests run on (None: the first).
    node: str | Node | None = None
    #: Their tier (name or object).
    tier: str | Tier | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str | re.Pattern) or self.pattern == "":
            raise ConfigError(
                f"route.pattern must be a path, a glob or a compiled regex, got {self.pattern!r}"
            )


@dataclass(frozen=True)
class Config:
    nodes: tuple[Node, ...] = ()
    tiers: tuple[Tier, ...] = ()
    routes: tuple[Route, ...] = ()
    #: ``[[budget]]`` tables (``EnergyMiddleware(..., budgets=config.budgets)``).
    budgets: tuple[Budget, ...] = ()


def _number(value: Any, what: str) -> float:
    key = what.rsplit(": ", 1)[-1]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number, got {value!r}",
                          remedy=f"give {key} an int or a float, not a {type(value).__name__} "
                                 "(in TOML, without quotes)")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{what} must be finite, got {value!r}", remedy=f"give {key} a finite number")
    return number


R = TypeVar("R")


def settings_list(name: str, value: Any, kind: type[R], example: str) -> list[R]:
    """The middleware's ``nodes=``, ``tiers=`` or ``routes=``: a list of ``kind``, each made
    right (the error one was made with while a server imported the app is raised here, so
    that the startup fails with its line: :mod:`giul_asgi.deferred`)."""
    if value is None:
        return []
    if isinstance(value, kind | Mapping | str | bytes | set | frozenset) or not isinstance(value, Iterable):
        # A set too: its order (the first node is the default) would differ between workers.
        raise ConfigError(f"{name}= takes a list of {kind.__name__}(...), got {_shown(value)}",
                          remedy=f"write {name}=[{example}]")
    items = list(value)
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise ConfigError(f"{name}[{i}] is {_shown(item)}, not a {kind.__name__}(...)",
                              remedy=f"write {name}=[{example}], or read a TOML file's tables with "
                                     "load_config(path)")
        raise_kept(item, getattr(item, "node", None), getattr(item, "tier", None))
    return items


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_choice(what: str, value: Any, choices: Iterable[str], *, remedy: str = "") -> str:
    """``value`` if it is one of ``choices``; else a ConfigError naming the one meant (a
    close spelling, case aside) and ``remedy``."""
    known = tuple(choices)
    if isinstance(value, str) and value in known:
        return value
    close: list[str] = []
    if isinstance(value, str):
        close = [c for c in known if c.lower() == value.strip().lower()]
        close = close or difflib.get_close_matches(value.lower(), known, n=1, cutoff=0.6)
    meant = f"did you mean {what.rsplit(': ', 1)[-1]}={close[0]!r}? " if close else ""
    raise ConfigError(f"{what}={value!r} is not one of {', '.join(known)}",
                      remedy=f"{meant}{remedy}".strip() or f"use one of {', '.join(known)}")


def _build(cls: type, raw: Any, where: str) -> Any:
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of keys, got {type(raw).__name__}")
    allowed = {f.name for f in fields(cls)} - {"reader_factory"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1, cutoff=0.6)
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}",
            remedy=f"did you mean {close[0]!r}?" if close else f"allowed keys: {sorted(allowed)}",
        )
    if cls is Node and "gpus" in raw and isinstance(raw["gpus"], list):
        raw = {**raw, "gpus": tuple(raw["gpus"])}
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(source: str | Path | Mapping[str, Any]) -> Config:
    """Read ``[[node]]``, ``[[tier]]``, ``[[route]]`` and ``[[budget]]`` tables from a TOML
    file or a dict.
    A configuration that cannot be read while a server imports the app is one node that
    keeps the error, which the middleware given it fails the startup with
    (:mod:`giul_asgi.deferred`); called by a person, it raises."""
    try:
        return _load_config(source)
    except ConfigError as error:
        if isinstance(source, str | Path) and not error.message.startswith("config file "):
            error = error.about(str(source))  # which file, where there is one (a stranger's trial)
        if not built_for_a_server(sys._getframe(1)):
            raise error from None
        return Config(nodes=(kept_record(Node, error),))


def _load_config(source: str | Path | Mapping[str, Any]) -> Config:
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            data: Mapping[str, Any] = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {str(path)!r} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    else:
        data = source
    unknown = sorted(set(data) - {"node", "tier", "route", "budget"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["node", "tier", "route", "budget"], n=1)
        raise ConfigError(
            f"unknown top-level key {unknown[0]!r}",
            remedy=(f"did you mean [[{close[0]}]]? " if close else "")
            + "use [[node]], [[tier]], [[route]], [[budget]]",
        )

    def tables(key: str) -> Iterable[Any]:
        value = data.get(key, [])
        if isinstance(value, Mapping):
            return [value]
        if not isinstance(value, list):
            raise ConfigError(f"{key!r} must be a list of tables")
        return value

    nodes = tuple(_build(Node, t, f"node[{i}]") for i, t in enumerate(tables("node")))
    tiers = tuple(_build(Tier, t, f"tier[{i}]") for i, t in enumerate(tables("tier")))
    routes = tuple(_build(Route, t, f"route[{i}]") for i, t in enumerate(tables("route")))
    budgets = tuple(build_budget(t, f"budget[{i}]") for i, t in enumerate(tables("budget")))
    _check_unique("node", [n.name for n in nodes])
    _check_unique("tier", [t.name for t in tiers])
    names = {n.name for n in nodes}
    tier_names = {t.name for t in tiers}
    for i, route in enumerate(routes):
        for what, name, declared in (("node", route.node, names), ("tier", route.tier, tier_names)):
            if isinstance(name, str) and name not in declared:
                close = difflib.get_close_matches(name, sorted(declared), n=1, cutoff=0.6)
                raise ConfigError(f"route[{i}].{what}: no {what} named {name!r}",
                                  remedy=(f"did you mean {close[0]!r}? " if close else "")
                                  + f"declare it in a [[{what}]] table or fix the route")
    return Config(nodes=nodes, tiers=tiers, routes=routes, budgets=budgets)


def _check_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"two {kind}s are named {name!r}", remedy="names must be unique")
        seen.add(name)
