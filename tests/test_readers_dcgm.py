"""The dcgm-exporter reader against recorded exporter text served by a real local HTTP server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fixtures.metrics_server import Served, serving

from giul_asgi.errors import ConfigError
from giul_asgi.readers.base import Reader, ReaderSpec
from giul_asgi.readers.dcgm import DcgmReader, unit_from_help
from giul_asgi.readers.registry import READERS

FIXTURES = Path(__file__).parent / "fixtures"
MJ = (FIXTURES / "dcgm_default_mj.prom").read_text()
J = (FIXTURES / "dcgm_4x_joules.prom").read_text()
NO_UNIT = (FIXTURES / "dcgm_no_unit.prom").read_text()
MIG = (FIXTURES / "dcgm_mig_mj.prom").read_text()
POWER_ONLY = (FIXTURES / "dcgm_power_only.prom").read_text()
UUID1 = "GPU-9c3e7d21-8f4a-4e6b-b2d0-1a5c9e7f3b22"


def with_value(text: str, metric: str, gpu: str, value: float) -> str:
    pattern = re.compile(rf'^({metric}{{[^}}]*gpu="{gpu}"[^}}]*}}) \S+$', re.MULTILINE)
    out, n = pattern.subn(lambda m: f"{m.group(1)} {value!r}", text)
    assert n, (metric, gpu)
    return out


def test_default_counters_in_millijoules_summed_over_the_nodes_gpus() -> None:
    with serving(Served(MJ)) as served:
        reader = READERS["dcgm"](ReaderSpec(gpus=(0, 1), url=served.url))
        reading = reader.read()
        reader.close()
    assert isinstance(reader, Reader) and isinstance(reader, DcgmReader)
    assert (reader.kind, reader.backend, reader.source, reader.period) == ("counter", "dcgm", "remote", 30.0)
    assert reading.joules == pytest.approx((8388118461 + 2104337905) / 1000)
    assert any("mJ, from the exporter's help text" in n for n in reader.notes)
    assert reader.url.endswith("/metrics")


def test_newer_exporters_report_joules_with_lowercase_hostname() -> None:
    with serving(Served(J)) as served:
        reader = DcgmReader(ReaderSpec(gpus=(1,), url=served.url, options={"hostname": "gpu-node-07"}))
        reading = reader.read()
        reader.close()
    assert reading.joules == pytest.approx(2104337.905)
    assert any("unit J" in n for n in reader.notes)


def test_match_by_uuid_and_by_host() -> None:
    with serving(Served(MJ)) as served:
        by_uuid = DcgmReader(ReaderSpec(url=served.url, options={"uuids": [UUID1]}))
        other_host = DcgmReader(ReaderSpec(url=served.url, options={"hostname": "elsewhere"}))
        assert by_uuid.read().joules == pytest.approx(2104337.905)
        gap = other_host.read()
        by_uuid.close()
        other_host.close()
    assert gap.error is not None and "no DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in gap.error


def test_a_gpu_the_exporter_does_not_show_is_a_gap() -> None:
    with serving(Served(MJ)) as served:
        reader = DcgmReader(ReaderSpec(gpus=(0, 5), url=served.url))
        reading = reader.read()
        reader.close()
    assert reading.error is not None and "1 of the node's 2 GPUs" in reading.error


def test_no_unit_in_the_help_text_is_decided_from_magnitude_and_said() -> None:
    clock = [100.0]
    served = Served(NO_UNIT)
    with serving(served):
        reader = DcgmReader(ReaderSpec(gpus=(0,), url=served.url, clock=lambda: clock[0]))
        first = reader.read()
        assert first.error is not None and "energy unit unknown" in first.error
        clock[0] += 30.0  # one collection later: 412.618 W for 30 s is 12378.54 J = 12378540 mJ
        served.text = with_value(NO_UNIT, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", 8388118461 + 12378540)
        second = reader.read()
        reader.close()
    assert second.joules == pytest.approx((8388118461 + 12378540) / 1000)
    assert any("guessed as mJ from magnitude" in n for n in reader.notes)


def test_an_ambiguous_magnitude_stays_unknown() -> None:
    clock = [100.0]
    served = Served(NO_UNIT)
    with serving(served):
        reader = DcgmReader(ReaderSpec(gpus=(0,), url=served.url, clock=lambda: clock[0]))
        reader.read()
        clock[0] += 30.0  # rose 40 per s against 412 W: neither J (~412/s) nor mJ (~412000/s)
        served.text = with_value(NO_UNIT, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", 8388118461 + 1200)
        reading = reader.read()
        reader.close()
    assert reading.error is not None and "energy unit unknown" in reading.error
    assert not any("guessed" in n for n in reader.notes)


def test_the_unit_can_be_given() -> None:
    with serving(Served(NO_UNIT)) as served:
        reader = DcgmReader(ReaderSpec(gpus=(1,), url=served.url, options={"energy_unit": "mJ"}))
        assert reader.read().joules == pytest.approx(2104337.905)
        reader.close()


def test_mig_instances_count_the_board_once_and_say_so() -> None:
    with serving(Served(MIG)) as served:
        reader = DcgmReader(ReaderSpec(gpus=(0,), url=served.url, options={"mig_slices": [3]}))
        reading = reader.read()
        reader.close()
    assert reading.joules == pytest.approx(905561.234)
    assert reader.mig and any("once per board" in n for n in reader.notes)
    assert any("MIG instances [3]" in n for n in reader.notes)


def test_power_fallback_where_the_exporter_has_no_energy_field() -> None:
    with serving(Served(POWER_ONLY)) as served:
        reader = DcgmReader(ReaderSpec(gpus=(0, 1), url=served.url))
        reading = reader.read()
        reader.close()
    assert reader.kind == "power" and reading.watts == pytest.approx(412.618 + 69.845)
    assert any("DCGM_FI_DEV_POWER_USAGE" in n for n in reader.notes)


def test_mig_power_is_the_mean_of_the_boards_repeated_samples() -> None:
    with serving(Served(MIG)) as served:
        reader = DcgmReader(ReaderSpec(url=served.url, options={"kind": "power"}))
        assert reader.read().watts == pytest.approx((52.636 * 2 + 52.746) / 3)
        reader.close()


def test_exporter_down_or_broken_gives_gaps_never_exceptions() -> None:
    served = Served(MJ)
    with serving(served):
        reader = DcgmReader(ReaderSpec(url=served.url, options={"backoff_s": 0.01, "backoff_max_s": 0.01}))
        served.status = 503
        assert "HTTP 503" in (reader.read().error or "")
        served.status, served.text = 200, "this is { not prometheus"
        reader._poller._next_try = 0.0  # skip the back-off the 503 set
        assert "not Prometheus text" in (reader.read().error or "")
        reader.close()
    gone = DcgmReader(ReaderSpec(url=served.url, options={"timeout_s": 0.5}))
    assert any("not reachable" in n for n in gone.notes) and gone.read().error is not None
    gone.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [({"energy_unit": "kWh"}, "'energy_unit' must be one of"),
     ({"interval_s": 0}, "'interval_s' must be > 0"),
     ({"uuids": [1]}, "'uuids' must be a list of strings"), ({"gpu": 0}, "unknown option 'gpu'")],
)
def test_bad_options_name_the_key(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DcgmReader(ReaderSpec(url="http://127.0.0.1:9/", options=options))


@pytest.mark.parametrize(
    ("text", "scale"),
    [("Total energy consumption since boot (in mJ).", 1e-3),
     ("Total energy consumption since boot (in J).", 1.0), ("Energy in millijoules", 1e-3),
     ("Board energy.", None), (None, None)],
)
def test_unit_from_help(text: str | None, scale: float | None) -> None:
    assert unit_from_help(text) == scale
