from __future__ import annotations

import json
import math

from giul_asgi.energy import Energy, Provenance, grade

MEASURED = Provenance(method="measured", backend="nvml_counter", source="local", idle_watts=80.0)
SIMULATED = Provenance(method="simulated", backend="simulated", source="local", idle_watts=60.0)
NO_IDLE = Provenance(method="measured", backend="nvml_counter", source="local", idle_watts=None)


def test_positive_share_is_a_measurement_with_its_provenance() -> None:
    e = grade(12.5, provenance=MEASURED, seconds=0.5, node="a", tier="t", tokens=50)
    assert (e.joules, e.method, e.backend, e.source) == (12.5, "measured", "nvml_counter", "local")
    assert e.joules_per_token == 12.5 / 50
    assert e.idle_watts == 80.0 and e.idle_known


def test_simulated_card_never_reads_as_measured() -> None:
    e = grade(3.0, provenance=SIMULATED, seconds=1.0)
    assert e.method == "simulated" and e.backend == "simulated"


def test_zero_or_negative_share_is_not_a_free_request() -> None:
    for share in (0.0, -4.2):
        e = grade(share, provenance=MEASURED, seconds=1.0)
        assert e.joules is None and e.method == "unknown"
        assert "failed measurement" in (e.error or "")


def test_failed_measurement_degrades_to_a_labelled_estimate_with_a_hint() -> None:
    e = grade(0.0, provenance=MEASURED, seconds=1.0, tokens=200, hint_per_1k=4100.0)
    assert e.method == "estimated" and e.backend == "none" and e.source == "none"
    assert math.isclose(e.joules or 0, 820.0)
    assert e.uncertainty_joules is None


def test_unknown_share_without_tokens_stays_unknown() -> None:
    e = grade(None, provenance=MEASURED, seconds=1.0, hint_per_1k=4100.0, tokens=0)
    assert e.joules is None and e.method == "unknown" and e.joules_per_token is None


def test_missing_idle_floor_is_said_not_guessed() -> None:
    e = grade(5.0, provenance=NO_IDLE, seconds=1.0)
    assert e.idle_watts is None and e.idle_known is False and e.method == "measured"


def test_as_dict_keeps_unknowns_null_and_numbers_finite() -> None:
    stage = grade(1.0, provenance=MEASURED, seconds=0.1)
    e = Energy(
        joules=None, method="unknown", mean_watts=float("nan"), seconds=float("inf"),
        stages={"retrieve": stage},
    )
    d = e.as_dict()
    assert d["joules"] is None and d["mean_watts"] is None and d["seconds"] is None
    assert d["stages"]["retrieve"]["joules"] == 1.0
    json.dumps(d, allow_nan=False)  # strict JSON: raises on NaN/inf
    expected = {
        "joules", "method", "backend", "source", "node", "tier", "route", "seconds",
        "idle_watts", "idle_known", "mean_watts", "tokens", "token_kind", "joules_per_token",
        "concurrency", "split", "uncertainty_joules", "settled", "stages", "contended", "error",
    }
    assert set(d) == expected


def test_fast_json_writer_matches_as_dict() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from giul_asgi.report import energy_json

    floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
    text = st.one_of(st.none(), st.text(max_size=12))

    @given(
        joules=floats, seconds=st.floats(0, 1e6), mean=floats, cc=floats, unc=floats,
        node=text, tier=text, route=text, error=text,
        tokens=st.one_of(st.none(), st.integers(0, 10**9)),
        settled=st.booleans(), contended=st.one_of(st.none(), st.booleans()),
    )
    def check(joules, seconds, mean, cc, unc, node, tier, route, error, tokens, settled,
              contended) -> None:  # type: ignore[no-untyped-def]
        stage = Energy(joules=joules, method="measured", node=node, seconds=seconds)
        e = Energy(
            joules=joules, method="simulated", backend="simulated", source="local", node=node,
            tier=tier, route=route, seconds=seconds, idle_watts=mean, mean_watts=mean,
            tokens=tokens, joules_per_token=joules, concurrency=cc, split="time",
            uncertainty_joules=unc, settled=settled, contended=contended, error=error,
            stages={"retrieve": stage, "gen\"\n": stage},
        )
        assert json.loads(energy_json(e)) == e.as_dict()

    check()


def test_block_template_writes_what_the_careful_writer_writes() -> None:
    """Records with no stages and no error fill a cached template: byte for byte the same
    text as the field-by-field writer, whatever the names hold (quotes, %, unicode)."""
    from hypothesis import given
    from hypothesis import strategies as st

    from giul_asgi.report import _energy_text, energy_json

    floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
    text = st.one_of(st.none(), st.text(max_size=12))

    @given(
        joules=floats, seconds=st.floats(0, 1e9), mean=floats, cc=floats, unc=floats,
        per_token=floats, idle=floats, node=text, tier=text, route=text,
        split=st.one_of(st.none(), st.sampled_from(["exclusive", "time", "tokens", "%s%%"])),
        tokens=st.one_of(st.none(), st.integers(0, 10**12)),
        settled=st.booleans(), contended=st.one_of(st.none(), st.booleans()),
        kind=st.sampled_from(["output", "input", "total"]),
    )
    def check(joules, seconds, mean, cc, unc, per_token, idle, node, tier, route, split,
              tokens, settled, contended, kind) -> None:  # type: ignore[no-untyped-def]
        e = Energy(
            joules=joules, method="measured", backend="nvml_counter", source="local",
            node=node, tier=tier, route=route, seconds=seconds, idle_watts=idle,
            idle_known=idle is not None, mean_watts=mean, tokens=tokens, token_kind=kind,
            joules_per_token=per_token, concurrency=cc, split=split, uncertainty_joules=unc,
            settled=settled, contended=contended,
        )
        for _ in range(2):  # the first call builds the template, the second reuses it
            assert energy_json(e) == _energy_text(e).encode()
        assert json.loads(energy_json(e)) == e.as_dict()

    check()


def test_tiny_figures_never_serialise_as_zero() -> None:
    from giul_asgi.report import energy_json

    e = grade(3e-9, provenance=MEASURED, seconds=1e-4)
    assert e.as_dict()["joules"] == 3e-9
    assert json.loads(energy_json(e))["joules"] == 3e-9


def test_figure_is_the_record_as_a_tuple() -> None:
    from dataclasses import fields

    from giul_asgi.energy import Figure, grade_figure

    assert Figure._fields == tuple(f.name for f in fields(Energy))
    stage = grade_figure(1.0, provenance=MEASURED, seconds=0.1)
    figure = grade_figure(
        2.0, provenance=MEASURED, seconds=0.5, node="n", tokens=4, stages={"s": stage}
    )
    energy = Energy.from_figure(figure)
    assert isinstance(energy.stages["s"], Energy)
    assert energy == grade(
        2.0, provenance=MEASURED, seconds=0.5, node="n", tokens=4,
        stages={"s": Energy.from_figure(stage)},
    )


def test_every_reader_names_a_known_backend_and_source() -> None:
    from fake_nvml import FakeGpu, FakeNvml

    from giul_asgi.energy import BACKENDS, METHODS, SOURCES
    from giul_asgi.readers import NullReader, NvmlReader, SimulatedCard, SimulatedReader

    readers = [
        NullReader(), SimulatedReader(SimulatedCard()), NvmlReader(nvml=FakeNvml([FakeGpu()])),
        NvmlReader(nvml=FakeNvml([FakeGpu(counter=False)])),
    ]
    for reader in readers:
        assert reader.backend in BACKENDS and reader.source in SOURCES
        assert reader.method in METHODS
