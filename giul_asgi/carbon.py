"""Where a node's carbon intensity comes from, how old it is, and what to say when it fails.

A figure's carbon is ``joules x pue x g/kWh / 3.6e6`` (:meth:`giul_asgi.energy.Carbon.grams`).
The joules are measured per request; the intensity is the grid's, and changes by the hour.
A node states it one of two ways (:class:`~giul_asgi.config.Node`):

- ``carbon_g_per_kwh=...``: a fixed figure (source ``static``);
- ``carbon=URL or path``: polled. The answer is Electricity Maps' ``carbon-intensity/latest``
  JSON (``carbonIntensity`` in gCO2eq/kWh, ``datetime``: an *average* signal; source
  ``electricitymaps``), or a plain ``{"g_per_kwh": ..., "signal": "average" | "marginal"}``
  (optionally ``"datetime"``; source ``file`` or ``url``).

The request path reads one attribute: the ledger's current :class:`Carbon`, which the node's
reader thread replaces (a ledger chore, :meth:`CarbonFeed.tick`, about once a second: it
re-ages the value and expires it). The reader thread never waits on the network or the
disk itself: a tick that finds a poll due starts it in a short-lived thread and takes its
answer on a later tick. A provider that answers in 10 s would otherwise hold the card's
reads for 10 s, the watchdog would book failed readings, and the node's figures would lose
that time (tests/test_carbon.py checks the reader keeps reading under a slow provider).

Honest when it fails: a failing or slow provider keeps the last known value, labelled with
its age (``carbon_age_s``), and is retried with a doubling back-off. Past ``max_age_s`` the
intensity is ``None``: ``carbon_grams`` is null, never 0, and the reason is in
:meth:`CarbonFeed.status` (the node's ``/energy`` ledger block) and in one log line per
change of state. The age is the value's own (``datetime`` in the answer), else the file's
modification time, else when the URL answered. A value dated in the future is not fresh
forever: a little ahead (clocks apart) it counts from when it came; more than
``MAX_AHEAD_S`` ahead it is bad data, a failed poll that says so. A fetch has one budget
(``timeout_s``, 10 s) for all of it, slow headers included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from .energy import Carbon

if TYPE_CHECKING:
    from .config import Node

log = logging.getLogger("giul_asgi.carbon")

#: An intensity above this is a unit mistake (g/MWh, lb/MWh), not a grid: the dirtiest
#: grids and lignite plants are near 1,200 gCO2eq/kWh.
MAX_G_PER_KWH = 3000.0
#: A PUE above this is a mistake (facilities report 1.1 to 2.5).
MAX_PUE = 4.0
SIGNALS: tuple[str, ...] = ("average", "marginal")
#: The token for Electricity Maps when the node gives none; sent to their hosts only.
TOKEN_ENV = "ELECTRICITYMAPS_TOKEN"
ELECTRICITYMAPS_HOSTS: tuple[str, ...] = ("electricitymap.org", "electricitymaps.com")
EVERY_S = 300.0
MAX_AGE_S = 6 * 3600.0
#: How long one fetch may take, all of it: connect, headers, body.
TIMEOUT_S = 10.0
#: The first retry after a failure comes after this (or ``every_s`` if shorter), doubling
#: with each failure up to ``BACKOFF_CAP`` polls' worth.
BACKOFF_S = 10.0
BACKOFF_CAP = 4
#: An intensity answer is a few hundred bytes.
MAX_BYTES = 64 * 1024
#: How often the reader thread re-ages the value (at most; ``every_s`` if shorter).
TICK_S = 1.0
#: An answer dated this far ahead of this host's clock is bad data (a forecast taken for the
#: present, or a clock wrong here or there), never a fresh value; one dated less far ahead
#: (clocks a little apart) counts as of when it came, and ages from then.
MAX_AHEAD_S = 3600.0


class SourceError(Exception):
    """A poll that gave no usable intensity; ``remedy`` says what to check."""

    def __init__(self, message: str, remedy: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Intensity:
    """One answer of a source: what a kWh emits, from when, and what kind of figure."""

    g_per_kwh: float
    signal: str | None
    #: Epoch seconds the figure stands for.
    as_of: float
    #: ``electricitymaps``, ``file`` or ``url``.
    source: str
    zone: str | None = None
    estimated: bool | None = None


def is_url(target: str) -> bool:
    return "://" in target


def electricitymaps_host(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return any(host == h or host.endswith("." + h) for h in ELECTRICITYMAPS_HOSTS)


def token_for(url: str, token: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The ``auth-token`` to send: the node's, else ``$ELECTRICITYMAPS_TOKEN`` for
    Electricity Maps' own hosts only (an environment secret never goes to another host)."""
    if token:
        return token
    env = os.environ if env is None else env
    found = env.get(TOKEN_ENV)
    return found if found and electricitymaps_host(url) else None


def shown(target: str) -> str:
    """A target for people and logs: query values that look like secrets are hidden."""
    if not is_url(target):
        return target
    parts = urlsplit(target)
    secret = ("token", "key", "auth", "secret", "password")
    query = [(k, "***" if any(s in k.lower() for s in secret) else v)
             for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))


# -- reading an answer ----------------------------------------------------------------------

def parse(body: bytes, *, where: str, default_source: str, default_as_of: float) -> Intensity:
    """An intensity from Electricity Maps' JSON or the plain form; :class:`SourceError`."""
    shape = ('Electricity Maps\' carbon-intensity/latest JSON, or {"g_per_kwh": 412, '
             '"signal": "average"}')
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SourceError(f"{where} did not answer JSON: {body[:80]!r}",
                          remedy=f"the source must serve {shape}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{where} answered JSON that is not an object",
                          remedy=f"the source must serve {shape}")
    signal: str | None
    if "carbonIntensity" in data:
        value, source, signal = data["carbonIntensity"], "electricitymaps", "average"
        what = "carbonIntensity"
    elif "g_per_kwh" in data:
        value, source, what = data["g_per_kwh"], default_source, "g_per_kwh"
        said = data.get("signal")
        if said is not None and said not in SIGNALS:
            raise SourceError(f"{where}: signal {said!r} is neither 'average' nor 'marginal'",
                              remedy="say which signal the figure is, or leave it out")
        signal = said
    else:
        raise SourceError(f"{where} answered JSON without carbonIntensity or g_per_kwh",
                          remedy=f"the source must serve {shape}")
    g = _intensity(value, f"{where}: {what}")
    as_of = default_as_of
    stamp = data.get("datetime")
    if stamp is not None:
        as_of = _epoch(stamp, where)
    zone = data.get("zone")
    estimated = data.get("isEstimated")
    return Intensity(g, signal, as_of, source, zone if isinstance(zone, str) else None,
                     estimated if isinstance(estimated, bool) else None)


def _intensity(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SourceError(f"{what} is {value!r}, not a number",
                          remedy="the provider has no figure for this zone now; check the zone")
    g = float(value)
    if not math.isfinite(g) or g < 0 or g > MAX_G_PER_KWH:
        raise SourceError(f"{what} is {value!r}: not an intensity in gCO2eq/kWh "
                          f"(0 to {MAX_G_PER_KWH:g})", remedy="check the source's unit")
    return g


def _epoch(stamp: Any, where: str) -> float:
    try:
        when = datetime.fromisoformat(str(stamp))
    except ValueError:
        raise SourceError(f"{where}: datetime {stamp!r} is not ISO 8601",
                          remedy='write it as "2026-12-01T17:00:00Z"') from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


# -- fetching -------------------------------------------------------------------------------

class UrlSource:
    """GETs the URL: one budget (``timeout_s``) for the whole fetch, headers included (a
    provider that dribbles its headers a byte at a time cannot hold a poll past it), a size
    cap, no redirects (the token must not follow one to another host), ``auth-token`` if
    given. Each fetch runs on an event loop of its own in the poll's thread: a deadline on
    the whole exchange is what httpx's per-phase timeouts cannot give (each read restarts
    them)."""

    def __init__(self, url: str, *, token: str | None, timeout_s: float, clock: Callable[[], float],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url
        self.kind = "electricitymaps" if electricitymaps_host(url) else "url"
        self.timeout_s = timeout_s
        self.clock = clock
        self._token = token
        self._transport = transport

    def fetch(self) -> Intensity:
        return asyncio.run(self._fetch())

    async def _fetch(self) -> Intensity:
        where = shown(self.url)
        headers = {"accept": "application/json"}
        if self._token:
            headers["auth-token"] = self._token
        chunks: list[bytes] = []
        late = SourceError(f"{where} did not answer within {self.timeout_s:g} s",
                           remedy="the provider is slow or unreachable from here")
        try:
            async with asyncio.timeout(self.timeout_s), httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.timeout_s), follow_redirects=False,
                transport=self._transport,
            ) as client, client.stream("GET", self.url) as response:
                if response.status_code != 200:
                    raise _http_error(response, where)
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_BYTES:
                        raise SourceError(f"{where} answered more than {MAX_BYTES} bytes",
                                          remedy="point carbon at the intensity endpoint itself")
                    chunks.append(chunk)
        except (TimeoutError, httpx.TimeoutException):
            raise late from None
        except httpx.HTTPError as exc:
            raise SourceError(f"{type(exc).__name__} on {where}: {exc or 'no detail'}",
                              remedy="check the URL and that this host can reach it") from None
        return parse(b"".join(chunks), where=where, default_source="url",
                     default_as_of=self.clock())

    def close(self) -> None:
        return None  # each fetch's client is closed with it


def _http_error(response: httpx.Response, where: str) -> SourceError:
    status = response.status_code
    remedy = {
        401: f"give the Electricity Maps token: Node(carbon_token=...) or ${TOKEN_ENV}",
        403: "the token is refused for this zone or endpoint: check its plan",
        404: "check the URL (Electricity Maps: https://api.electricitymap.org/v3/"
             "carbon-intensity/latest?zone=DE)",
        429: "the provider limits the rate: poll less often (carbon_every_s)",
    }.get(status, "the provider failed; it is retried with a back-off")
    if 300 <= status < 400:
        remedy = f"give the final URL ({response.headers.get('location', '?')}): redirects are not followed"
    retry = response.headers.get("retry-after")
    retry_s = float(retry) if retry is not None and retry.strip().isdigit() else None
    return SourceError(f"HTTP {status} from {where}", remedy=remedy, retry_after_s=retry_s)


class FileSource:
    """Reads a JSON file (written by a job of the operator's): its modification time is the
    figure's time unless the JSON says ``datetime``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.kind = "file"

    def fetch(self) -> Intensity:
        where = str(self.path)
        try:
            with self.path.open("rb") as f:
                mtime = os.fstat(f.fileno()).st_mtime
                body = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            raise SourceError(f"{where} does not exist", remedy='write it ({"g_per_kwh": 412, '
                              '"signal": "average"}) or fix the path') from None
        except OSError as exc:
            raise SourceError(f"{where} cannot be read: {exc.strerror or exc}",
                              remedy="check the file's permissions") from None
        if len(body) > MAX_BYTES:
            raise SourceError(f"{where} is larger than {MAX_BYTES} bytes",
                              remedy="the file holds one intensity, a few hundred bytes")
        return parse(body, where=where, default_source="file", default_as_of=mtime)

    def close(self) -> None:
        return None


# -- the feed -------------------------------------------------------------------------------

class CarbonFeed:
    """A polled intensity: :meth:`tick` (the reader thread) returns the current
    :class:`Carbon`, starting polls when due and taking their answers; :meth:`status` says
    how it is going, for ``/energy``.

    ``clock`` is wall-clock time (ages are against the answers' own datetimes).
    """

    def __init__(
        self, target: str, *, pue: float = 1.0, token: str | None = None,
        every_s: float = EVERY_S, max_age_s: float = MAX_AGE_S, timeout_s: float = TIMEOUT_S,
        node: str = "", clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.target = target
        self.pue = pue
        self.every_s = every_s
        self.max_age_s = max_age_s
        self.node = node
        self.clock = clock
        self.source: UrlSource | FileSource = (
            UrlSource(target, token=token_for(target, token), timeout_s=timeout_s, clock=clock,
                      transport=transport)
            if is_url(target) else FileSource(target))
        #: How often the reader thread should call :meth:`tick`.
        self.tick_s = min(TICK_S, every_s)
        self.last: Intensity | None = None
        self.polls = 0
        self.errors = 0
        self.failures = 0  # in a row
        self.last_error: str | None = None
        self.remedy: str | None = None
        self.state = "starting"
        self._next = -math.inf
        self._thread: threading.Thread | None = None
        self._started_at = 0.0
        self._answer: Intensity | SourceError | None = None
        #: How far ahead of this host's clock the last answer was dated (None: not ahead).
        self.ahead_s: float | None = None
        self.current = Carbon(None, pue, self.source.kind, self._signal(), None)

    def _signal(self) -> str | None:
        return "average" if self.source.kind == "electricitymaps" else None

    # -- the reader thread ----------------------------------------------------------------
    def tick(self) -> Carbon:
        """Take a finished poll's answer, start a due one, and return the current value."""
        now = self.clock()
        thread = self._thread
        if thread is not None and not thread.is_alive():
            self._thread = None
            answer, self._answer = self._answer, None
            if answer is not None:
                self._take(answer, now)
        if self._thread is None and now >= self._next:
            self._start(now)
        self.current = self._carbon(now)
        self._say(now)
        return self.current

    def _start(self, now: float) -> None:
        self.polls += 1
        self._started_at = now
        self._next = math.inf  # set again when the answer is taken
        self._thread = threading.Thread(target=self._poll, name=f"giul-carbon-{self.node}",
                                        daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        # The fetch thread: one assignment hands the answer over (the GIL orders it before
        # the thread ends, which is what tick() checks).
        try:
            self._answer = self.source.fetch()
        except SourceError as exc:
            self._answer = exc
        except Exception as exc:  # a bug in a fetch is a failed poll, never the reader's
            self._answer = SourceError(f"{type(exc).__name__}: {exc}")

    def _take(self, answer: Intensity | SourceError, now: float) -> None:
        if isinstance(answer, Intensity):
            answer = self._dated(answer, now)
        if isinstance(answer, Intensity):
            self.last = answer
            self.failures = 0
            self.last_error = self.remedy = None
            self._next = now + self.every_s
            return
        self.errors += 1
        self.failures += 1
        self.last_error, self.remedy = answer.message, answer.remedy or None
        delay = min(BACKOFF_CAP * self.every_s,
                    min(BACKOFF_S, self.every_s) * 2 ** (self.failures - 1))
        if answer.retry_after_s is not None:
            delay = max(delay, min(answer.retry_after_s, 3600.0))
        self._next = now + delay

    def _dated(self, answer: Intensity, now: float) -> Intensity | SourceError:
        """An answer dated in the future: clamped to now (a little ahead), refused (far)."""
        ahead = answer.as_of - now
        self.ahead_s = ahead if ahead > 0 else None
        if ahead <= 0:
            return answer
        when = datetime.fromtimestamp(answer.as_of, UTC).isoformat(timespec="seconds")
        if ahead > MAX_AHEAD_S:
            return SourceError(
                f"{shown(self.target)} answered a value dated {when}, {_duration(ahead)} ahead of this "
                f"host's clock: bad data, not used (more than {_duration(MAX_AHEAD_S)} ahead)",
                remedy="check the provider's datetime (a forecast?), the file's modification time, and "
                       "this host's clock (timedatectl)")
        log.info("node %r: carbon intensity from %s is dated %s, %s ahead of this host's clock: "
                 "counted as of now, and aged from now", self.node, shown(self.target), when,
                 _duration(ahead))
        return dataclasses.replace(answer, as_of=now)

    def _carbon(self, now: float) -> Carbon:
        last = self.last
        if last is None:
            return Carbon(None, self.pue, self.source.kind, self._signal(), None)
        age = max(0.0, now - last.as_of)
        g = last.g_per_kwh if age <= self.max_age_s else None
        return Carbon(g, self.pue, last.source, last.signal, age)

    def _say(self, now: float) -> None:
        """Keep ``state`` and log once per change of it."""
        last, carbon = self.last, self.current
        if last is None:
            state = "failing" if self.last_error else "starting"
        elif carbon.g_per_kwh is None:
            state = "expired"
        else:
            state = "stale" if self.last_error else "ok"
        if state == self.state:
            return
        self.state = state
        what = f"node {self.node!r}: carbon intensity from {shown(self.target)}"
        if state == "ok":
            assert last is not None
            log.info("%s: %.4g gCO2eq/kWh (%s, %s signal), %.0f s old", what, last.g_per_kwh,
                     last.source, last.signal or "unsaid", carbon.age_s or 0.0)
        elif state == "stale":
            assert last is not None
            log.warning("%s is failing (%s%s); the last value, %.4g g/kWh, is used until it is "
                        "%s old", what, self.last_error, _arrow(self.remedy), last.g_per_kwh,
                        _duration(self.max_age_s))
        elif state == "expired":
            log.warning("%s: %s; carbon figures are unknown until a newer value comes",
                        what, self.reason(now))
        elif state == "failing":
            log.warning("%s: no value yet: %s%s; carbon figures are unknown", what,
                        self.last_error, _arrow(self.remedy))

    def reason(self, now: float | None = None) -> str | None:
        """Why the intensity is unknown now, in words (None when it is known)."""
        if self.current.g_per_kwh is not None:
            return None
        last = self.last
        if last is None:
            return (f"no value yet: {self.last_error}" if self.last_error
                    else "not read yet (polled from the node's reader thread)")
        now = self.clock() if now is None else now
        why = (f"the last value ({last.g_per_kwh:.4g} g/kWh, of "
               f"{datetime.fromtimestamp(last.as_of, UTC).isoformat(timespec='seconds')}) is "
               f"{_duration(now - last.as_of)} old, past carbon_max_age_s "
               f"({_duration(self.max_age_s)})")
        return f"{why}; the source fails: {self.last_error}" if self.last_error else why

    def status(self) -> dict[str, Any]:
        """How the feed is doing, JSON-ready (``/energy``: ``nodes.*.ledger.carbon``)."""
        now = self.clock()
        carbon, last = self.current, self.last
        in_flight = self._thread is not None
        return {
            "source": carbon.source, "target": shown(self.target), "state": self.state,
            "g_per_kwh": carbon.g_per_kwh, "last_g_per_kwh": last.g_per_kwh if last else None,
            "signal": carbon.signal, "pue": self.pue,
            "as_of": last.as_of if last else None, "age_s": carbon.age_s,
            "zone": last.zone if last else None, "estimated": last.estimated if last else None,
            "ahead_s": self.ahead_s,
            "every_s": self.every_s, "max_age_s": self.max_age_s,
            "polls": self.polls, "errors": self.errors, "last_error": self.last_error,
            "remedy": self.remedy, "reason": self.reason(now),
            "next_poll_in_s": None if in_flight or math.isinf(self._next) else max(0.0, self._next - now),
            # a poll that never ends (a hung network file system) shows here, growing
            "poll_in_flight_s": now - self._started_at if in_flight else None,
        }

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout``) for a poll in flight to end; whether none is in flight.
        Its answer is taken by the next :meth:`tick`."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        self.source.close()


def static_status(carbon: Carbon) -> dict[str, Any]:
    """:meth:`CarbonFeed.status` of a fixed intensity."""
    return {
        "source": carbon.source, "target": None, "state": "static",
        "g_per_kwh": carbon.g_per_kwh, "last_g_per_kwh": carbon.g_per_kwh,
        "signal": carbon.signal, "pue": carbon.pue, "as_of": None, "age_s": None, "zone": None,
        "estimated": None, "ahead_s": None, "every_s": None, "max_age_s": None, "polls": 0, "errors": 0,
        "last_error": None, "remedy": None, "reason": None, "next_poll_in_s": None,
        "poll_in_flight_s": None,
    }


def carbon_of(node: Node) -> tuple[Carbon | None, CarbonFeed | None]:
    """A node's carbon: its fixed :class:`Carbon`, or the first value of a feed that the
    node's reader thread ticks; ``(None, None)`` where the node has no carbon configured."""
    pue = node.pue if node.pue is not None else 1.0
    if node.carbon_g_per_kwh is not None:
        return Carbon(node.carbon_g_per_kwh, pue, "static"), None
    if node.carbon is None:
        return None, None
    feed = CarbonFeed(str(node.carbon), pue=pue, token=node.carbon_token,
                      every_s=node.carbon_every_s, max_age_s=node.carbon_max_age_s,
                      node=node.name)
    return feed.current, feed


def _arrow(remedy: str | None) -> str:
    return f" -> {remedy}" if remedy else ""


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


__all__ = [
    "EVERY_S",
    "MAX_AGE_S",
    "MAX_G_PER_KWH",
    "MAX_PUE",
    "SIGNALS",
    "TOKEN_ENV",
    "CarbonFeed",
    "FileSource",
    "Intensity",
    "SourceError",
    "UrlSource",
    "carbon_of",
    "parse",
    "static_status",
    "token_for",
]
