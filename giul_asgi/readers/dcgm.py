"""Reads a node's GPUs from a dcgm-exporter ``/metrics`` URL.

Clusters that run NVIDIA's GPU Operator already have dcgm-exporter on every GPU node. It
publishes ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (cumulative energy) and
``DCGM_FI_DEV_POWER_USAGE`` (W) per GPU, labelled ``gpu`` (index), ``UUID`` (``uuid`` with
some flags), ``modelName``, ``Hostname`` (``hostname`` since dcgm-exporter #655) and, under
MIG, one series per GPU instance (``GPU_I_PROFILE``, ``GPU_I_ID``) that repeat the board's
values: energy and power are board-level, so the reader counts each board once and says so.

The unit of the energy counter changed: the long-standing default collectors say
``Total energy consumption since boot (in mJ).``; newer ones report joules. We take the
unit from the metric's own HELP text (or OpenMetrics unit); failing that we do not guess
silently: we compare how fast the counter rises with ``DCGM_FI_DEV_POWER_USAGE`` over two
scrapes, pick mJ or J only when the ratio is unambiguous (near 1000 or near 1), and write
what we did in ``notes``. Until then readings are gaps. ``options["energy_unit"]`` fixes it.

dcgm-exporter collects every 30 s by default (``--collect-interval`` 30000 ms), so this is
a reader for long windows and fleet totals; ``period`` is that interval, and the tape's
uncertainty follows from it. Readings are stamped at the midpoint of our request, since the
exposition carries no timestamps: the sample itself may be up to one interval older.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import httpx

from .base import Kind, ReaderSpec, Reading
from .http import (
    FetchError,
    HttpPoller,
    check_url,
    help_texts,
    parse_prometheus,
)
from .options import Options

ENERGY = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption")
POWER = ("DCGM_FI_DEV_POWER_USAGE", "dcgm_power_usage")
DEFAULT_INTERVAL_S = 30.0
OPTIONS = ("timeout_s", "backoff_s", "backoff_max_s", "uuids", "hostname", "energy_unit",
           "interval_s", "kind", "mig_slices")
_UNIT_RE = re.compile(r"\(in\s+(mJ|J|millijoules?|joules?)\)|\b(millijoules?|joules?)\b", re.IGNORECASE)
_SCALE = {"mj": 1e-3, "millijoule": 1e-3, "millijoules": 1e-3, "j": 1.0, "joule": 1.0, "joules": 1.0}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def unit_from_help(text: str | None) -> float | None:
    """Joules per counter unit from a HELP text, or None when it names no unit."""
    if not text:
        return None
    match = _UNIT_RE.search(text)
    if match is None:
        return None
    word = (match.group(1) or match.group(2)).lower()
    return _SCALE.get(word)


class DcgmReader:
    """Scrapes one dcgm-exporter and sums the node's GPUs (by index, or by UUID).

    ``spec.url`` is the exporter (``http://node:9400``; ``/metrics`` is added when no path is
    given), ``spec.gpus`` the indices (empty: every GPU the exporter shows). Options:
    ``uuids`` (match by UUID instead), ``hostname`` (keep series of that host only),
    ``energy_unit`` (``auto`` | ``mJ`` | ``J``), ``interval_s`` (the exporter's collection
    interval, 30), ``kind`` (``counter`` | ``power``), ``mig_slices`` (``GPU_I_ID`` values the
    node stands for; noted, since readings stay board-level), ``timeout_s``, ``backoff_s``,
    ``backoff_max_s``.
    """

    backend = "dcgm"
    source = "remote"
    method: Literal["measured", "simulated"] = "measured"

    def __init__(self, spec: ReaderSpec, *, transport: httpx.BaseTransport | None = None) -> None:
        opts = Options(spec.options, "dcgm", OPTIONS)
        url = check_url(spec.url, "dcgm")
        if url.path in ("", "/"):
            url = url.copy_with(path="/metrics")
        self.url = str(url)
        self.remedy = (f"check that dcgm-exporter serves {self.url} to this host "
                       f"(giul-asgi probe --no-local --dcgm {self.url})")
        self.clock: Callable[[], float] = spec.clock
        self.gpus = tuple(spec.gpus)
        self.uuids = opts.texts("uuids")
        self.hostname = opts.text("hostname", None)
        self.mig_slices = opts.ints("mig_slices")
        interval = opts.number("interval_s", DEFAULT_INTERVAL_S)
        self.period = spec.period or interval
        unit = opts.choice("energy_unit", ("auto", "mJ", "J"), "auto")
        self._scale: float | None = {"mJ": 1e-3, "J": 1.0}.get(unit)
        self._previous: tuple[float, float, float | None] | None = None  # (t, raw, watts)
        self.notes: list[str] = [
            f"dcgm-exporter collects every {interval:g} s: figures suit long windows and totals"
        ]
        if self.mig_slices is not None:
            self.notes.append(f"the node stands for MIG instances {list(self.mig_slices)}: "
                              "dcgm-exporter's energy and power are the whole board's")
        self.mig = False
        self._poller = HttpPoller.for_reader(
            url, spec.token, opts, timeout_s=2.0, clock=self.clock, transport=transport
        )
        forced = opts.raw.get("kind")
        wanted = opts.choice("kind", ("counter", "power"), "counter")
        self.kind: Kind = "power" if wanted == "power" else "counter"
        if forced is None:
            first = self._scrape()
            if isinstance(first, str):
                self.notes.append(f"exporter not reachable at start ({first}): readings are gaps until it is")
            else:
                samples, _ = first
                if self._boards(samples, ENERGY) is None and self._boards(samples, POWER) is not None:
                    self.kind = "power"
                    self.notes.append("no DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION at this exporter: reading "
                                      "DCGM_FI_DEV_POWER_USAGE, a sample every collection interval")

    def _scrape(self) -> tuple[Samples, dict[str, str]] | str:
        try:
            body, _sent, _received = self._poller.get()
        except FetchError as exc:
            return str(exc)
        text = body.decode("utf-8", errors="replace")
        try:
            samples = parse_prometheus(text)
        except FetchError as exc:
            return f"{self.url}: {exc}"
        return samples, help_texts(text)

    def _keep(self, labels: dict[str, str]) -> bool:
        host = labels.get("hostname", labels.get("Hostname"))
        if self.hostname is not None and host != self.hostname:
            return False
        if self.uuids is not None:
            return (labels.get("UUID") or labels.get("uuid")) in self.uuids
        if self.gpus:
            return labels.get("gpu") in {str(g) for g in self.gpus}
        return True

    def _boards(self, samples: Samples, names: tuple[str, ...]) -> dict[str, list[float]] | None:
        """Values per board (one key per GPU, MIG instances folded in), or None when absent."""
        for name in names:
            rows = samples.get(name)
            if not rows:
                continue
            boards: dict[str, list[float]] = {}
            for labels, value in rows:
                if not self._keep(labels):
                    continue
                key = labels.get("UUID") or labels.get("uuid") or labels.get("gpu") or "?"
                boards.setdefault(key, []).append(value)
                if "GPU_I_ID" in labels and not self.mig:
                    self.mig = True
                    self.notes.append("MIG instances share the board: energy counted once per board, "
                                      "never divided among slices")
            return boards or None
        return None

    def _wanted(self) -> int | None:
        if self.uuids is not None:
            return len(self.uuids)
        return len(self.gpus) if self.gpus else None

    def _unit(self, helps: dict[str, str], raw: float, watts: float | None, t: float) -> float | None:
        if self._scale is not None:
            return self._scale
        for name in ENERGY:
            scale = unit_from_help(helps.get(name))
            if scale is not None:
                self._scale = scale
                self.notes.append(f"energy unit {'mJ' if scale < 1 else 'J'}, from the exporter's help text")
                return scale
        previous, self._previous = self._previous, (t, raw, watts)
        if previous is None or watts is None or previous[2] is None:
            return None
        dt, draw = t - previous[0], raw - previous[1]
        mean_w = (watts + previous[2]) / 2
        if dt <= 0 or draw <= 0 or mean_w <= 0:
            return None
        ratio = draw / dt / mean_w
        for scale, name in ((1e-3, "mJ"), (1.0, "J")):
            if 1 / 3 < ratio * scale < 3:
                self._scale = scale
                self.notes.append(
                    f"energy unit guessed as {name} from magnitude: the counter rose {draw / dt:.4g} per s "
                    f"while DCGM_FI_DEV_POWER_USAGE read {mean_w:.4g} W (set energy_unit to be sure)")
                return scale
        return None

    def read(self) -> Reading:
        scraped = self._scrape()
        t = self.clock()
        if isinstance(scraped, str):
            return Reading(t=t, error=scraped)
        samples, helps = scraped
        names = ENERGY if self.kind == "counter" else POWER
        boards = self._boards(samples, names)
        if boards is None:
            hint = " (set kind='power' to read DCGM_FI_DEV_POWER_USAGE)" if self.kind == "counter" else ""
            return Reading(t=t, error=f"no {names[0]} for the node's GPUs at {self.url}{hint}")
        wanted = self._wanted()
        if wanted is not None and len(boards) < wanted:
            return Reading(t=t, error=f"the exporter shows {len(boards)} of the node's {wanted} GPUs")
        if self.kind == "power":
            return Reading(t=t, watts=sum(sum(v) / len(v) for v in boards.values()))
        raw = sum(max(v) for v in boards.values())
        power = self._boards(samples, POWER)
        watts = sum(sum(v) / len(v) for v in power.values()) if power else None
        scale = self._unit(helps, raw, watts, t)
        if scale is None:
            return Reading(t=t, error="energy unit unknown: the help text names none and the counter has not "
                                      "yet moved against DCGM_FI_DEV_POWER_USAGE (set energy_unit)")
        return Reading(t=t, joules=raw * scale)

    def close(self) -> None:
        self._poller.close()


__all__ = ["DcgmReader", "unit_from_help"]

