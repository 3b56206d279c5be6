"""The upstream's own load: what the inference server behind the gateway says it is running.

A card behind vLLM, TGI or SGLang serves requests this gateway process never sees (other
replicas, other workers, direct clients). Those servers publish their whole load in
Prometheus text: requests running now, and cumulative prompt/generation token counters.
:class:`UpstreamLoad` scrapes them, so the ledger can share an interval by *our* part of
the upstream's whole load and leave the rest unattributed as foreign, with no state shared
between gateway replicas.

Metric names (read in the servers' sources and docs):

- vLLM: ``vllm:num_requests_running`` (gauge), ``vllm:generation_tokens_total`` and
  ``vllm:prompt_tokens_total`` (counters);
- TGI: ``tgi_batch_current_size`` (gauge); tokens only as per-request histograms,
  ``tgi_request_generated_tokens`` and ``tgi_request_input_length``, whose ``_sum`` grows
  when a request *ends* (so TGI's token counters lag; running counts do not);
- SGLang: ``sglang:num_running_reqs`` (gauge), ``sglang:generation_tokens_total`` and
  ``sglang:prompt_tokens_total`` (counters);
- TensorRT-LLM's OpenAI server (``trtllm-serve``, tensorrt_llm/metrics/collector.py):
  ``trtllm_num_requests_running`` (gauge), ``trtllm_generation_tokens_total`` and
  ``trtllm_prompt_tokens_total`` (counters), which, as TGI's, grow when a request ends (its
  collector counts a request's tokens from its finished metrics). Its 1.1 releases published
  the latencies only (no running count, no tokens): there it is not found, and says so.

Where the server says how long its requests spent in each phase (vLLM's
``vllm:request_prefill_time_seconds`` and ``vllm:request_decode_time_seconds`` histograms,
TensorRT-LLM's ``trtllm_request_prefill_time_seconds`` and ``_decode_time_seconds``),
their ``_sum`` s are read too: over the token counters they give the engine's seconds per
prompt token and per generated token, which the ``phases`` split uses to cut a window
without a first-token mark (:mod:`giul_asgi.ledger.phases`).

Several models on one server: every label set is summed unless ``model`` names one (the
``model_name`` label for vLLM and SGLang, ``model_id`` where TGI sets one).

Here "upstream" names that server only; how remote readers fetch a URL is :mod:`.http`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import ConfigError, require_installed
from .http import (
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_TIMEOUT_S,
    FetchError,
    HttpPoller,
    check_url,
    parse_prometheus,
)


@dataclass(frozen=True, slots=True)
class LoadReading:
    """The upstream's whole load at ``t`` (our clock). Unknown values are None, never 0."""

    t: float
    running: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None
    #: Its requests' summed seconds in prefill and in decode (histogram sums), where it says.
    prefill_seconds_total: float | None = None
    decode_seconds_total: float | None = None
    error: str | None = None
    server: str | None = None
    #: Half the scrape's time: the server took its count within ``t`` +- this.
    spread_s: float = 0.0
    #: Requests it holds queued, not running yet (None: it does not say).
    waiting: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """Where one kind of server keeps its load."""

    server: str
    running: tuple[str, ...]
    generation: tuple[str, ...]
    prompt: tuple[str, ...]
    model_labels: tuple[str, ...]
    prefill_seconds: tuple[str, ...] = ()
    decode_seconds: tuple[str, ...] = ()
    #: Requests it holds but does not run yet (queued): they draw nothing.
    waiting: tuple[str, ...] = ()


SERVERS: dict[str, ServerMetrics] = {
    "vllm": ServerMetrics("vllm", ("vllm:num_requests_running",), ("vllm:generation_tokens_total",),
                          ("vllm:prompt_tokens_total",), ("model_name",),
                          ("vllm:request_prefill_time_seconds_sum",),
                          ("vllm:request_decode_time_seconds_sum",), ("vllm:num_requests_waiting",)),
    "sglang": ServerMetrics("sglang", ("sglang:num_running_reqs",), ("sglang:generation_tokens_total",),
                            ("sglang:prompt_tokens_total",), ("model_name",),
                            waiting=("sglang:num_queue_reqs",)),
    "tgi": ServerMetrics("tgi", ("tgi_batch_current_size",), ("tgi_request_generated_tokens_sum",),
                         ("tgi_request_input_length_sum",), ("model_id", "model_name"),
                         waiting=("tgi_queue_size",)),
    "trtllm": ServerMetrics("trtllm", ("trtllm_num_requests_running",), ("trtllm_generation_tokens_total",),
                            ("trtllm_prompt_tokens_total",), ("model_name",),
                            ("trtllm_request_prefill_time_seconds_sum",),
                            ("trtllm_request_decode_time_seconds_sum",)),
}


def _sum(samples: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str],
         model: str | None, labels: tuple[str, ...]) -> float | None:
    for name in names:
        if name not in samples:
            continue
        values = [v for lab, v in samples[name]
                  if model is None or any(lab.get(k) == model for k in labels)]
        if not values:
            return None
        return float(sum(values))
    return None


class UpstreamLoad:
    """Scrapes an inference server's ``/metrics`` for its whole load; :meth:`read` never raises."""

    def __init__(
        self,
        url: str,
        *,
        server: str = "auto",
        model: str | None = None,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        require_installed("prometheus_client", f"upstream {url!r}",
                          "pip install 'giul-asgi[prometheus]' (its parser reads the server's metrics)",
                          "prometheus-client")
        parsed = check_url(url, "upstream")
        if parsed.path in ("", "/"):
            parsed = parsed.copy_with(path="/metrics")
        if server != "auto" and server not in SERVERS:
            raise ConfigError(f"upstream server must be 'auto' or one of {sorted(SERVERS)}, got {server!r}")
        if not (timeout_s > 0):
            raise ConfigError(f"upstream timeout_s must be > 0, got {timeout_s!r}")
        self.url = str(parsed)
        self.server = None if server == "auto" else server
        self.model = model
        self.clock = clock
        self.notes: list[str] = []
        self._poller = HttpPoller(parsed, token=token, timeout_s=timeout_s, backoff_s=backoff_s,
                                  backoff_max_s=backoff_max_s, clock=clock, transport=transport)

    def _which(self, samples: dict[str, Any]) -> ServerMetrics | None:
        if self.server is not None:
            return SERVERS[self.server]
        for metrics in SERVERS.values():
            if any(name in samples for name in (*metrics.running, *metrics.generation)):
                self.server = metrics.server
                if metrics.server == "tgi":
                    self.notes.append("TGI counts a request's tokens when it ends: token shares lag")
                return metrics
        return None

    def read(self) -> LoadReading:
        try:
            body, sent, received = self._poller.get()
            samples = parse_prometheus(body.decode("utf-8", errors="replace"))
        except FetchError as exc:
            return LoadReading(t=self.clock(), error=str(exc), server=self.server)
        t = (sent + received) / 2
        metrics = self._which(samples)
        if metrics is None:
            return LoadReading(
                t=t, error=f"{self.url} shows no vLLM, TGI, SGLang or TensorRT-LLM load metrics")
        reading = LoadReading(
            t=t,
            running=_sum(samples, metrics.running, self.model, metrics.model_labels),
            generation_tokens_total=_sum(samples, metrics.generation, self.model, metrics.model_labels),
            prompt_tokens_total=_sum(samples, metrics.prompt, self.model, metrics.model_labels),
            prefill_seconds_total=_sum(samples, metrics.prefill_seconds, self.model, metrics.model_labels),
            decode_seconds_total=_sum(samples, metrics.decode_seconds, self.model, metrics.model_labels),
            server=metrics.server,
            spread_s=max(0.0, received - sent) / 2,
            waiting=_sum(samples, metrics.waiting, self.model, metrics.model_labels),
        )
        if reading.running is None and reading.generation_tokens_total is None:
            which = f" for model {self.model!r}" if self.model else ""
            return LoadReading(t=t, error=f"{metrics.server} metrics at {self.url} have no load{which}",
                               server=metrics.server)
        return reading

    def close(self) -> None:
        self._poller.close()


__all__ = ["SERVERS", "LoadReading", "UpstreamLoad"]
