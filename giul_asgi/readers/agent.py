"""Reads a node's GPUs through a giul-agent on the GPU host (schema ``giul-agent/1``).

The gateway and the card are on different hosts, so two clocks are in play. Every answer
carries the agent's ``time.monotonic()`` (``now``) and each GPU's read time (``t``) on that
clock. From each round trip we estimate ``offset = agent_now - midpoint(send, receive)``
and keep the estimate from the shortest round trip (its error is at most half that round
trip); the kept estimate ages by a drift allowance so a later, slightly slower round trip
can replace a very old one, and a jump far beyond the round trip (agent host rebooted)
starts afresh. A reading is then placed at its own time, ``t - offset``, on our clock.

A dead agent costs readings, never requests: ``read`` returns an error :class:`Reading`
after at most its timeout, and while backing off after failures it returns one at once.
Figures from an agent whose payload says ``"simulated": true`` are labelled simulated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal

import httpx

from ..errors import ReaderUnavailable
from .base import Kind, ReaderSpec, Reading
from .http import FetchError, HttpPoller, check_url
from .options import Options

SCHEMA = "giul-agent/1"
OPTIONS = ("timeout_s", "backoff_s", "backoff_max_s", "kind", "expect_simulated")
#: Allowance for two hosts' monotonic clocks drifting apart (s/s): 100 ppm.
DRIFT = 1e-4
#: An offset that moves more than this beyond the round trip means the agent's clock restarted.
JUMP_S = 1.0
POLL_HINT_S = 0.1


class ClockAlignment:
    """Agent time -> our time, from the round trip with the smallest error bound so far."""

    def __init__(self) -> None:
        self.offset: float | None = None
        self.rtt: float | None = None
        self._at = 0.0
        self.resets = 0

    def bound(self, now: float) -> float:
        if self.rtt is None:
            return math.inf
        return self.rtt / 2 + DRIFT * max(0.0, now - self._at)

    def update(self, sent: float, received: float, agent_now: float) -> None:
        rtt = max(0.0, received - sent)
        offset = agent_now - (sent + received) / 2
        if self.offset is not None and abs(offset - self.offset) > JUMP_S + rtt + self.bound(received):
            self.offset = None  # the agent's clock restarted (host reboot): start afresh
            self.resets += 1
        if self.offset is None or rtt / 2 <= self.bound(received):
            self.offset, self.rtt, self._at = offset, rtt, received

    def to_ours(self, agent_t: float) -> float:
        return agent_t - (self.offset or 0.0)


class AgentReader:
    """Polls one agent and sums the node's GPUs into one counter (or one power gauge).

    ``spec.url`` is the agent (``http://gpu-host:9431``; ``/readings`` is added), ``spec.token``
    its bearer token, ``spec.gpus`` the agent's GPU indices to sum (empty: all it serves).
    Options: ``timeout_s`` (1.0), ``backoff_s`` (0.5), ``backoff_max_s`` (30), ``kind``
    (``counter`` | ``power``; by default what the agent's first answer offers),
    ``expect_simulated`` (the node stands for a simulated card: figures are labelled simulated
    from the start, and an agent that does not say ``"simulated": true`` gives only gaps).
    """

    backend = "agent"
    source = "remote"

    def __init__(self, spec: ReaderSpec, *, transport: httpx.BaseTransport | None = None) -> None:
        opts = Options(spec.options, "agent", OPTIONS)
        url = check_url(spec.url, "agent")
        if not url.path.rstrip("/").endswith("/readings"):
            url = url.copy_with(path=url.path.rstrip("/") + "/readings")
        self.url = str(url)
        self.expect_simulated = opts.flag("expect_simulated", False)
        self.remedy = (  # the demo's simulated upstream serves the agent's schema itself
            f"check that the simulated upstream at {self.url} runs and answers in time (a busy "
            "machine delays it; figures fill from the node's rate meanwhile)" if self.expect_simulated
            else f"check that giul-agent runs at {self.url} and that this host reaches it "
                 f"(giul-asgi probe --no-local --agent {self.url})")
        self.spec = spec
        self.clock: Callable[[], float] = spec.clock
        self.period = spec.period or POLL_HINT_S
        self.gpus = tuple(spec.gpus)
        self.method: Literal["measured", "simulated"] = "simulated" if self.expect_simulated else "measured"
        self.notes: list[str] = []
        self.host: str | None = None
        self.alignment = ClockAlignment()
        self._poller = HttpPoller.for_reader(
            url, spec.token, opts, timeout_s=1.0, clock=self.clock, transport=transport
        )
        forced = opts.raw.get("kind")
        wanted = opts.choice("kind", ("counter", "power"), "counter")
        self.kind: Kind = "power" if wanted == "power" else "counter"
        first = self._fetch()
        if isinstance(first, str):
            if self._poller.last_status in (401, 403):
                self.close()
                raise ReaderUnavailable(
                    f"the agent at {self.url} refused our token (HTTP {self._poller.last_status})",
                    remedy="give the node the agent's token (token = ...), or none if it has none",
                )
            self.notes.append(f"agent not reachable at start ({first}): readings are gaps until it is")
        elif forced is None:
            gpus = self._selected(first)
            if not isinstance(gpus, str) and not all(g.get("energy_j") is not None for g in gpus) \
                    and all(g.get("power_w") is not None for g in gpus):
                self.kind = "power"
                self.notes.append("the agent's GPUs give no energy counter: reading instant power")

    def _fetch(self) -> dict[str, Any] | str:
        try:
            body, sent, received = self._poller.get()
        except FetchError as exc:
            return str(exc)
        try:
            payload = json.loads(body)
        except ValueError:
            return f"the agent at {self.url} answered something that is not JSON"
        if not isinstance(payload, dict) or payload.get("schema") != SCHEMA:
            return f"the agent at {self.url} does not speak {SCHEMA}"
        now = payload.get("now")
        if not isinstance(now, int | float) or not math.isfinite(now):
            return f"the agent at {self.url} sent no valid 'now'"
        if payload.get("host") != self.host:
            if self.host is not None:
                self.alignment = ClockAlignment()  # another host behind the URL: its own clock
            self.host = payload.get("host")
        self.alignment.update(sent, received, float(now))
        if payload.get("simulated") is True:
            self.method = "simulated"
        elif self.expect_simulated:
            return f"the agent at {self.url} reads a real card, but this node expects a simulated one"
        payload["_received"] = received
        return payload

    def _selected(self, payload: dict[str, Any]) -> list[dict[str, Any]] | str:
        gpus = payload.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
            return "the agent's answer has no gpus list"
        if not self.gpus:
            return gpus or "the agent serves no GPU"
        by_index = {g.get("index"): g for g in gpus}
        missing = [i for i in self.gpus if i not in by_index]
        if missing:
            return f"the agent serves no GPU {missing[0]} (it has {sorted(by_index, key=str)})"
        return [by_index[i] for i in self.gpus]

    def gpu_readings(self) -> dict[int, Reading] | str:
        """Each of the node's GPUs read on its own, at its own time on our clock (probe times
        each card's counter: a sum of cards steps at both cards' phases), or why not."""
        payload = self._fetch()
        if isinstance(payload, str):
            return payload
        gpus = self._selected(payload)
        if isinstance(gpus, str):
            return gpus
        out: dict[int, Reading] = {}
        for i, g in enumerate(gpus):
            index = g.get("index")
            key = index if isinstance(index, int) else i
            t = g.get("t")
            when = self.alignment.to_ours(float(t)) if isinstance(t, int | float) else payload["_received"]
            energy, power = g.get("energy_j"), g.get("power_w")
            out[key] = Reading(
                t=when,
                joules=float(energy) if isinstance(energy, int | float) else None,
                watts=float(power) if isinstance(power, int | float) else None,
                error=str(g["error"]) if g.get("error") else None,
            )
        return out

    def read(self) -> Reading:
        payload = self._fetch()
        if isinstance(payload, str):
            return Reading(t=self.clock(), error=payload)
        received = payload["_received"]
        gpus = self._selected(payload)
        if isinstance(gpus, str):
            return Reading(t=received, error=gpus)
        key = "energy_j" if self.kind == "counter" else "power_w"
        total = 0.0
        times = []
        for g in gpus:
            if g.get("error"):
                return Reading(t=received, error=f"agent GPU {g.get('index')}: {g['error']}")
            value, t = g.get(key), g.get("t")
            if not isinstance(value, int | float) or not isinstance(t, int | float):
                return Reading(t=received, error=f"agent GPU {g.get('index')} gives no {key}")
            total += float(value)
            times.append(float(t))
        t_ours = min(received, self.alignment.to_ours(max(times)))
        if self.kind == "counter":
            return Reading(t=t_ours, joules=total)
        return Reading(t=t_ours, watts=total)

    def close(self) -> None:
        self._poller.close()


__all__ = ["AgentReader", "ClockAlignment"]

