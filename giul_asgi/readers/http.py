"""How remote readers fetch a URL: one bounded HTTP poller, and the Prometheus text they parse.

The agent reader, the dcgm-exporter reader and the upstream's load (:mod:`.upstream`) all
GET a URL from the node's reader thread. :class:`HttpPoller` is the one way they do it: one
``httpx.Client`` per reader, strict timeouts, a size cap, and exponential back-off after
failures, during which a fetch fails at once without touching the network.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import httpx

from ..errors import ConfigError

DEFAULT_TIMEOUT_S = 1.0
DEFAULT_BACKOFF_S = 0.5
DEFAULT_BACKOFF_MAX_S = 30.0
MAX_BYTES = 8 * 1024 * 1024


class FetchError(Exception):
    """A fetch that did not give a usable answer; the message says why."""


def check_url(url: str | None, reader: str) -> httpx.URL:
    if not url:
        raise ConfigError(f"reader {reader!r} needs a url", remedy="set the node's url")
    try:
        parsed = httpx.URL(url)
    except Exception:
        raise ConfigError(f"reader {reader!r}: url {url!r} is not a URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"reader {reader!r}: url must be http(s)://host[:port]/..., got {url!r}")
    return parsed


class HttpPoller:
    """GET one URL with a deadline, a size cap and back-off after failures."""

    def __init__(
        self,
        url: str | httpx.URL,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = httpx.URL(str(url))
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_bytes = max_bytes
        self.clock = clock
        headers = {"accept": "application/json, text/plain;q=0.9, */*;q=0.1"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        half = timeout_s / 2
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(connect=half, read=half, write=half / 2, pool=half / 2),
            follow_redirects=False,
            trust_env=False,  # a metrics URL on a private network: no proxy from the environment
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            transport=transport,
        )
        self.failures = 0
        self.attempts = 0
        self.last_error: str | None = None
        self.last_status: int | None = None
        self._next_try = -math.inf

    @classmethod
    def for_reader(
        cls, url: str | httpx.URL, token: str | None, opts: Any, *, timeout_s: float,
        clock: Callable[[], float], transport: httpx.BaseTransport | None,
    ) -> HttpPoller:
        """The poller of a remote reader, its timeout and back-off from the reader's options
        (``timeout_s``, ``backoff_s``, ``backoff_max_s``)."""
        return cls(
            url, token=token, timeout_s=opts.number("timeout_s", timeout_s),
            backoff_s=opts.number("backoff_s", DEFAULT_BACKOFF_S),
            backoff_max_s=opts.number("backoff_max_s", DEFAULT_BACKOFF_MAX_S),
            clock=clock, transport=transport,
        )

    def waiting(self) -> str | None:
        """Why no fetch is tried now (backing off after failures), or None."""
        left = self._next_try - self.clock()
        if left <= 0:
            return None
        return f"{self.last_error}; backing off, next try in {left:.1f} s"

    def _failed(self, error: str) -> FetchError:
        self.failures += 1
        self.last_error = error
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (self.failures - 1))
        self._next_try = self.clock() + delay
        return FetchError(error)

    def get(self) -> tuple[bytes, float, float]:
        """(body, time sent, time received) on our clock, or FetchError; bounded by the deadline."""
        waiting = self.waiting()
        if waiting is not None:
            raise FetchError(waiting)
        self.attempts += 1
        sent = self.clock()
        deadline = sent + self.timeout_s
        chunks: list[bytes] = []
        try:
            with self._client.stream("GET", self.url) as response:
                self.last_status = response.status_code
                if response.status_code != 200:
                    raise self._failed(f"HTTP {response.status_code} from {self.url}")
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise self._failed(f"answer from {self.url} exceeds {self.max_bytes} bytes")
                    if self.clock() > deadline:
                        raise self._failed(f"{self.url} took more than {self.timeout_s:g} s")
                    chunks.append(chunk)
        except FetchError:
            raise
        except httpx.HTTPError as exc:
            raise self._failed(f"{type(exc).__name__} on {self.url}: {exc or 'no detail'}") from None
        received = self.clock()
        self.failures = 0
        self.last_error = None
        self._next_try = -math.inf
        return b"".join(chunks), sent, received

    def close(self) -> None:
        self._client.close()


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name, with labels (a counter written without _total is under both names); FetchError."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                row = (dict(sample.labels), float(sample.value))
                out.setdefault(sample.name, []).append(row)
                if family.type == "counter" and sample.name == family.name + "_total":
                    # some parser versions add _total to a counter written without it (dcgm-exporter's)
                    out.setdefault(family.name, []).append(row)
    except Exception as exc:
        raise FetchError(f"not Prometheus text ({type(exc).__name__}: {exc})") from None
    return out


def help_texts(text: str) -> dict[str, str]:
    """``# HELP`` text by metric family name (the parser keeps it as ``documentation``)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return {f.name: f.documentation for f in text_string_to_metric_families(text)}
    except Exception:
        return {}


__all__ = ["FetchError", "HttpPoller", "check_url", "help_texts", "parse_prometheus"]
