"""The upstream's whole load, scraped from a fake vLLM / TGI / SGLang / TensorRT-LLM /metrics
whose numbers we script."""

from __future__ import annotations

import pytest
from fixtures.metrics_server import Served, serving

from giul_asgi.errors import ConfigError
from giul_asgi.readers.upstream import LoadReading, UpstreamLoad


def vllm(running: float, gen: float, prompt: float, model: str = "meta-llama/Llama-3.1-8B-Instruct") -> str:
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} {prompt}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {gen}
"""


TGI = """# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 6
# TYPE tgi_queue_size gauge
tgi_queue_size 0
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="1"} 0
tgi_request_generated_tokens_bucket{le="+Inf"} 12
tgi_request_generated_tokens_sum 2048
tgi_request_generated_tokens_count 12
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="+Inf"} 12
tgi_request_input_length_sum 5120
tgi_request_input_length_count 12
"""

SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 4.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 8.128902e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 7.557572e+06
"""


def test_vllm_load_follows_what_the_server_says() -> None:
    served = Served(vllm(2, 100, 400))
    with serving(served):
        load = UpstreamLoad(served.url)
        first = load.read()
        served.text = vllm(5, 180, 900)
        second = load.read()
        load.close()
    assert isinstance(first, LoadReading) and first.ok and first.server == "vllm"
    assert (first.running, first.generation_tokens_total, first.prompt_tokens_total) == (2, 100, 400)
    assert first.waiting == 3  # queued, not running
    assert (second.running, second.generation_tokens_total) == (5, 180) and second.t >= first.t


def test_a_reading_says_within_what_time_the_server_took_its_count() -> None:
    """The count was taken somewhere in the scrape: its time is the scrape's middle, give or
    take half of it (what the decider counts our windows over)."""
    ticks: list[float] = []

    def clock() -> float:  # 2 ms a look: the scrape spans the first look to the last
        ticks.append(10.0 + 0.002 * len(ticks))
        return ticks[-1]

    served = Served(vllm(1, 0, 0))
    with serving(served):
        load = UpstreamLoad(served.url, clock=clock)
        reading = load.read()
        load.close()
    assert reading.ok and reading.running == 1 and len(ticks) >= 2
    assert ticks[0] <= reading.t - reading.spread_s < reading.t + reading.spread_s
    assert abs(reading.t + reading.spread_s - ticks[-1]) < 1e-9 and reading.spread_s > 0


def test_vllm_phase_times_are_read_where_it_exports_them() -> None:
    phases = """# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 1.5
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 12.25
"""
    with serving(Served(vllm(2, 100, 400, "m") + phases)) as served:
        reading = UpstreamLoad(served.url).read()
    with serving(Served(vllm(2, 100, 400))) as served:
        older = UpstreamLoad(served.url).read()
    assert (reading.prefill_seconds_total, reading.decode_seconds_total) == (1.5, 12.25)
    assert older.ok and older.prefill_seconds_total is None and older.decode_seconds_total is None


def test_several_models_are_summed_unless_one_is_named() -> None:
    second = vllm(3, 50, 10, "b").replace("# HELP", "# X").replace("# TYPE", "# Y")
    served = Served(vllm(2, 100, 400, "a") + second)
    with serving(served):
        both = UpstreamLoad(served.url).read()
        only_b = UpstreamLoad(served.url, model="b").read()
        missing = UpstreamLoad(served.url, model="c").read()
    assert both.running == 5 and both.generation_tokens_total == 150
    assert only_b.running == 3 and only_b.prompt_tokens_total == 10
    assert missing.error is not None and "model 'c'" in missing.error and missing.running is None


def test_tgi_and_sglang() -> None:
    with serving(Served(TGI)) as served:
        load = UpstreamLoad(served.url)
        tgi = load.read()
    assert (tgi.server, tgi.running, tgi.generation_tokens_total, tgi.prompt_tokens_total) == (
        "tgi", 6, 2048, 5120)
    assert any("when it ends" in n for n in load.notes)
    with serving(Served(SGLANG)) as served:
        sg = UpstreamLoad(served.url, server="sglang").read()
    assert (sg.server, sg.running, sg.generation_tokens_total) == ("sglang", 4, 7557572)


def test_unknown_values_are_none_never_zero() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    with serving(Served(text)) as served:
        reading = UpstreamLoad(served.url).read()
    assert reading.running == 1
    assert reading.generation_tokens_total is None and reading.prompt_tokens_total is None


def test_failures_are_readings_never_exceptions() -> None:
    served = Served("# TYPE other gauge\nother 1\n")
    with serving(served):
        load = UpstreamLoad(served.url, backoff_s=0.01, backoff_max_s=0.01)
        assert "no vLLM, TGI, SGLang or TensorRT-LLM" in (load.read().error or "")
        served.text = "{{{ not metrics"
        assert "not Prometheus text" in (load.read().error or "")
        served.status = 500
        assert "HTTP 500" in (load.read().error or "")
        load.close()
    dead = UpstreamLoad(served.url, timeout_s=0.5)
    reading = dead.read()
    assert reading.error is not None and reading.running is None
    assert "backing off" in (dead.read().error or "")
    dead.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"url": ""}, "needs a url"), ({"url": "unix:///x"}, "http"), ({"url": "http://h", "server": "ollama"},
     "'auto' or one of"), ({"url": "http://h", "timeout_s": 0}, "timeout_s")],
)
def test_bad_configuration(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        UpstreamLoad(**kwargs)


def _trtllm_metrics(*, current: bool) -> str:
    """What TensorRT-LLM's OpenAI server publishes, through prometheus_client itself: its
    MetricsCollector's names, types and labels as tensorrt_llm/metrics/collector.py makes
    them (``current``), or its 1.1 releases' latencies alone."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    registry = CollectorRegistry()
    labels = {"model_name": "Qwen/Qwen3-0.6B", "engine_type": "trtllm"}

    def histogram(name: str, values: list[float]) -> None:
        h = Histogram(name, name, labelnames=list(labels), registry=registry)
        for v in values:
            h.labels(**labels).observe(v)

    histogram("trtllm_e2e_request_latency_seconds", [1.2, 0.8])
    histogram("trtllm_time_to_first_token_seconds", [0.05, 0.04])
    if current:
        Gauge("trtllm_num_requests_running", "Number of active requests", labelnames=list(labels),
              registry=registry).labels(**labels).set(5)
        Counter("trtllm_prompt_tokens_total", "prompt tokens", labelnames=list(labels),
                registry=registry).labels(**labels).inc(4096)
        Counter("trtllm_generation_tokens_total", "generation tokens", labelnames=list(labels),
                registry=registry).labels(**labels).inc(512)
        histogram("trtllm_request_prefill_time_seconds", [0.03, 0.02])
        histogram("trtllm_request_decode_time_seconds", [1.1, 0.7])
    return generate_latest(registry).decode()


def test_tensorrt_llm_load_and_phase_times() -> None:
    """trtllm-serve's running count, token counters and prefill/decode seconds are read, found
    without being named; its 1.1 releases (latencies only) say they show no load."""
    with serving(Served(_trtllm_metrics(current=True))) as served:
        reading = UpstreamLoad(served.url).read()
    assert reading.ok and reading.server == "trtllm"
    assert (reading.running, reading.prompt_tokens_total, reading.generation_tokens_total) == (5, 4096, 512)
    assert reading.prefill_seconds_total == pytest.approx(0.05)
    assert reading.decode_seconds_total == pytest.approx(1.8)
    with serving(Served(_trtllm_metrics(current=True))) as served:
        named = UpstreamLoad(served.url, server="trtllm", model="other").read()
    assert named.error is not None and "model 'other'" in named.error
    with serving(Served(_trtllm_metrics(current=False))) as served:
        old = UpstreamLoad(served.url).read()
    assert old.error is not None and "TensorRT-LLM" in old.error
