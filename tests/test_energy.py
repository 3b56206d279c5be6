"""The one record and the one grading function: the rules, in one place."""

from __future__ import annotations

import json
import math

from giul_asgi.energy import BACKENDS, METHODS, SOURCES, Energy, Provenance, Share, grade

MEASURED = Provenance(method="measured", backend="nvml_counter", source="local", idle_watts=80.0)
SIMULATED = Provenance(method="simulated", backend="simulated", source="local", idle_watts=60.0)
NO_IDLE = Provenance(method="measured", backend="nvml_counter", source="local", idle_watts=None)


def share(joules: float | None, provenance: Provenance = MEASURED, **kw: object) -> Share:
    fields = {"uncertainty": 0.5, "interpolated": 0.0, "settled": True, "seconds": 0.5}
    fields.update(kw)
    return Share(joules, provenance=provenance, **fields)  # type: ignore[arg-type]


def test_positive_share_is_a_measurement_with_its_provenance() -> None:
    e = grade(share(12.5), node="a", tier="t", tokens=50, id="r1")
    assert (e.joules, e.method, e.backend, e.source) == (12.5, "measured", "nvml_counter", "local")
    assert e.joules_per_token == 12.5 / 50 and e.uncertainty_joules == 0.5
    assert e.idle_watts == 80.0 and e.idle_known and e.id == "r1"


def test_simulated_card_never_reads_as_measured() -> None:
    e = grade(share(3.0, SIMULATED))
    assert e.method == "simulated" and e.backend == "simulated"


def test_zero_or_negative_share_is_not_a_free_request() -> None:
    for joules in (0.0, -4.2, float("nan")):
        e = grade(share(joules))
        assert e.joules is None and e.method == "unknown" and e.uncertainty_joules is None
        assert e.error


def test_failed_measurement_degrades_to_a_labelled_estimate_with_a_hint() -> None:
    e = grade(share(0.0), tokens=200, hint_per_1k=4100.0)
    assert e.method == "estimated" and e.backend == "none" and e.source == "none"
    assert math.isclose(e.joules or 0, 820.0) and e.uncertainty_joules is None


def test_a_first_figure_the_card_has_yet_to_report_waits_for_it_rather_than_the_hint() -> None:
    """A stranger's trial: the first figures after a start were the tier's hint, 32.8 J with no
    uncertainty, where the simulated card's settled about 8.7 J (and issue 21's: 65.6 J against
    0.5 J). The hint prices what nothing will measure; a figure the card will settle waits."""
    waiting = "not settled: the card has not reported this window yet"
    e = grade(share(None, settled=False, error=waiting), tokens=8, hint_per_1k=4100.0)
    assert e.joules is None and e.method == "unknown" and e.error == waiting
    failing = grade(share(None, settled=False, error=waiting, trouble="the reader is failing"),
                    tokens=8, hint_per_1k=4100.0)
    assert failing.method == "estimated" and math.isclose(failing.joules or 0, 32.8)
    settled = grade(share(None, error="the card never reported it"), tokens=8, hint_per_1k=4100.0)
    assert settled.method == "estimated" and math.isclose(settled.joules or 0, 32.8)


def test_unknown_share_without_tokens_stays_unknown() -> None:
    e = grade(share(None), hint_per_1k=4100.0, tokens=0)
    assert e.joules is None and e.method == "unknown" and e.joules_per_token is None


def test_a_mostly_interpolated_figure_is_an_estimate_that_says_from_what() -> None:
    # Issue 16: a first figure 89% interpolated said "measured" with "provisional" in error.
    e = grade(share(9.0, interpolated=8.0, settled=False, basis="the node's prior"))
    assert e.method == "estimated" and not e.settled
    assert (e.backend, e.source) == ("nvml_counter", "local")  # what the rest was read with
    assert e.error == (
        "estimated: 89% interpolated from the node's prior; the card has not reported it yet"
    )
    assert e.uncertainty_joules == 0.5
    half = grade(share(9.0, interpolated=4.5, settled=False))
    assert half.method == "measured" and half.error is None  # half is not "more than half"
    settled = grade(share(9.0, interpolated=6.0, settled=True, basis="the node's first spans"))
    assert settled.method == "estimated" and "67% interpolated from the node's first spans" in (
        settled.error or ""
    )


def test_a_figure_made_while_the_reader_fails_is_an_estimate_with_its_error() -> None:
    trouble = "the reader is failing: NVMLError_GpuIsLost"
    e = grade(share(9.0, interpolated=0.5, settled=False, trouble=trouble))
    assert e.method == "estimated" and e.backend == "nvml_counter"
    assert e.error == f"estimated: 6% interpolated from the node's prior; {trouble}"
    assert grade(share(9.0, interpolated=0.5, settled=False)).method == "measured"


def test_an_interpolated_simulated_figure_stays_simulated_and_says_so() -> None:
    e = grade(share(9.0, SIMULATED, interpolated=8.0, settled=False))
    assert e.method == "simulated" and e.error and e.error.startswith("simulated: 89% interpolated")
    e = grade(share(9.0, SIMULATED, interpolated=0.1, trouble="the reader is failing: gone"))
    assert e.method == "simulated" and "the reader is failing: gone" in (e.error or "")


def test_missing_idle_floor_is_said_not_guessed() -> None:
    e = grade(share(5.0, NO_IDLE))
    assert e.idle_watts is None and e.idle_known is False and e.method == "measured"


def test_contended_and_foreign_watts_travel_with_the_figure() -> None:
    e = grade(share(5.0, contended=True, foreign_watts=150.0))
    assert e.contended is True and e.foreign_watts == 150.0
    assert grade(share(5.0)).contended is None  # nobody looked


def test_as_dict_keeps_unknowns_null_and_numbers_finite() -> None:
    stage = grade(share(1.0))
    e = Energy(
        joules=None, method="unknown", mean_watts=float("nan"), seconds=float("inf"),
        stages={"retrieve": stage},
    )
    d = e.as_dict()
    assert d["joules"] is None and d["mean_watts"] is None and d["seconds"] is None
    assert d["stages"]["retrieve"]["joules"] == 1.0
    json.dumps(d, allow_nan=False)  # strict JSON: raises on NaN/inf
    assert set(d) == {f for f in Energy.__dataclass_fields__}


def test_tiny_figures_never_serialise_as_zero() -> None:
    assert Energy(joules=3e-12, method="measured").as_dict()["joules"] == 3e-12


def test_every_reader_names_a_known_backend_and_source() -> None:
    from fake_nvml import FakeGpu, FakeNvml
    from truecard import TrueCard, TrueReader

    from giul_asgi.readers import NullReader
    from giul_asgi.readers.nvml import NvmlReader

    readers = [
        NullReader(), NvmlReader((0,), nvml=FakeNvml([FakeGpu()])), TrueReader(TrueCard()),
    ]
    for reader in readers:
        assert reader.backend in BACKENDS and reader.source in SOURCES
        assert reader.method in METHODS
