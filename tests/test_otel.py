"""OpenTelemetry: span attributes (absent stays absent) and metrics, with in-memory exporters."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from giul_asgi.energy import Energy
from giul_asgi.exporters.otel import energy_attributes, otel_recorder
from giul_asgi.listeners import Settled


def test_a_recording_span_carries_the_energy_and_unknowns_stay_absent() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = otel_recorder(MeterProvider())
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request"):
        span = recorder.current_span()
        assert span is not None
    known = Energy(12.5, "measured", "nvml_counter", "local", node="gpu0", tier="8b", tokens=40,
                   uncertainty_joules=0.3, settled=True, contended=False)
    with tracer.start_as_current_span("request") as span:
        recorder.annotate(span, known)
    with tracer.start_as_current_span("unknown") as span:
        recorder.annotate(span, Energy(None, "unknown", tokens=None, contended=None))
    recorder.annotate(None, known)  # no span: nothing
    a, b, *_ = [s for s in exporter.get_finished_spans() if s.attributes]
    attrs = dict(a.attributes or {})
    assert attrs["giul.energy.joules"] == 12.5 and attrs["giul.energy.method"] == "measured"
    assert attrs["giul.energy.backend"] == "nvml_counter" and attrs["giul.energy.source"] == "local"
    assert attrs["giul.energy.node"] == "gpu0" and attrs["giul.energy.tier"] == "8b"
    assert attrs["giul.energy.uncertainty_joules"] == 0.3 and attrs["giul.energy.settled"] is True
    assert attrs["giul.energy.contended"] is False and attrs["gen_ai.usage.output_tokens"] == 40
    assert "gen_ai.usage.input_tokens" not in attrs
    other = dict(b.attributes or {})
    assert "giul.energy.joules" not in other and "giul.energy.contended" not in other
    assert "gen_ai.usage.output_tokens" not in other and other["giul.energy.method"] == "unknown"
    inputs = energy_attributes(Energy(1.0, "measured", tokens=7, token_kind="input"))
    assert inputs["gen_ai.usage.input_tokens"] == 7 and "gen_ai.usage.output_tokens" not in inputs
    assert "gen_ai.usage.input_tokens" not in energy_attributes(Energy(1.0, "measured", tokens=7,
                                                                       token_kind="total"))


def test_metrics_match_what_was_recorded() -> None:
    reader = InMemoryMetricReader()
    recorder = otel_recorder(MeterProvider(metric_readers=[reader]))
    for _ in range(5):
        recorder.settled([Settled(
            Energy(2.0, "measured", node="gpu0", tier="8b", route="/v1/chat", tokens=3), "ok", 200)])
    unknown = Energy(None, "unknown", node="gpu0", tier="8b", route="/v1/chat")
    recorder.settled([Settled(unknown, "error", 500)])
    recorder.settled([Settled(object(), "ok", 200)])  # type: ignore[arg-type]
    assert recorder.errors == 1
    data = reader.get_metrics_data()
    assert data is not None
    found = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    energy = found["giul.energy"]
    assert energy.unit == "J" and sum(p.value for p in energy.data.data_points) == 10.0
    assert sum(p.value for p in found["giul.requests"].data.data_points) == 6
    assert sum(p.value for p in found["giul.requests.unknown_energy"].data.data_points) == 1
    assert sum(p.value for p in found["giul.tokens"].data.data_points) == 15
    [hist] = found["giul.request.energy"].data.data_points
    assert hist.count == 5 and hist.sum == 10.0 and hist.explicit_bounds[0] == 0.01
