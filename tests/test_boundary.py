"""The boundary said: every figure says what its energy covers (``gpu``, ``cpu``, ``host``)
and, where the node sets one, the PUE its joules are multiplied by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_ledger import IDLE, Run

from giul_asgi.config import Node
from giul_asgi.energy import Energy, Provenance, Share, grade
from giul_asgi.wire.body import energy_json
from giul_asgi.wire.formats import NEURALWATT
from giul_asgi.wire.headers import ENERGY_HEADER_NAMES, energy_headers


def figure(node: Node, seed: int = 7) -> Energy:
    run = Run(node, seed=seed)
    run.advance(0.3)
    meter, _ = run.request(0.25, 90.0)
    run.advance(0.5)
    return meter.figure(tokens=10)


def test_the_cards_alone_by_default_in_the_record_headers_and_block() -> None:
    e = figure(Node("n", idle_w=IDLE))
    assert e.boundary == "gpu" and e.pue is None
    headers = dict(energy_headers(e))
    assert headers[b"x-energy-boundary"] == b"gpu" and b"x-energy-pue" not in headers
    block = json.loads(energy_json(e))
    assert block["boundary"] == "gpu" and block == e.as_dict()
    assert b"x-energy-boundary" in ENERGY_HEADER_NAMES and b"x-energy-pue" in ENERGY_HEADER_NAMES


def test_a_pue_multiplies_every_figure_in_joules_and_says_so() -> None:
    card = figure(Node("n", idle_w=IDLE))
    facility = figure(Node("n", idle_w=IDLE, pue=1.25))  # the same truth, the same schedule
    assert facility.pue == 1.25 and facility.boundary == "gpu"
    for field in ("joules", "allocated_joules", "uncertainty_joules", "joules_per_token"):
        assert getattr(facility, field) == pytest.approx(1.25 * getattr(card, field), rel=1e-12), field
    assert facility.mean_watts == card.mean_watts and facility.idle_watts == card.idle_watts  # the card's
    assert dict(energy_headers(facility))[b"x-energy-pue"] == b"1.25"
    # The Neuralwatt block: the facility's power too, so our share of it is the same.
    a, b = json.loads(NEURALWATT.block(card)), json.loads(NEURALWATT.block(facility))
    assert b["avg_power_watts"] == pytest.approx(1.25 * a["avg_power_watts"])
    assert b["attribution_ratio"] == pytest.approx(a["attribution_ratio"])


def test_carbon_counts_the_pue_once() -> None:
    provenance = Provenance("measured", "nvml_counter", "local", IDLE, pue=1.5)
    from giul_asgi.energy import Carbon

    e = grade(Share(10.0, 0.1, 0.0, True, provenance, 0.5), carbon=Carbon(400.0, 1.5))
    assert e.joules == 15.0 and e.pue == 1.5
    assert e.carbon_grams == pytest.approx(15.0 * 400.0 / 3.6e6)  # joules x intensity: pue in once
    plain = grade(Share(10.0, 0.1, 0.0, True, Provenance("measured", "nvml_counter", "local", IDLE), 0.5),
                  carbon=Carbon(400.0))
    assert plain.joules == 10.0 and plain.pue == 1.0  # carbon without a PUE: the card's, factor 1


def test_an_unknown_figure_stays_unknown_under_a_pue() -> None:
    e = grade(Share(None, 0.0, 0.0, True, Provenance("measured", "none", "none", IDLE, pue=1.2), 0.5))
    assert e.joules is None and e.allocated_joules is None and e.uncertainty_joules is None


def test_a_rapl_node_says_its_energy_is_the_cpus(tmp_path: Path) -> None:
    from giul_asgi.readers.base import ReaderSpec
    from giul_asgi.readers.rapl import RaplReader

    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("1000000\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    reader = RaplReader(ReaderSpec(options={"root": str(tmp_path)}))
    assert reader.boundary == "cpu"
    from giul_asgi.ledger import Ledger

    ledger = Ledger(Node("cpu", reader="rapl", idle_w=20.0), reader, poll=False)
    ledger.attach(reader)
    assert ledger.provenance.boundary == "cpu"


def test_a_pue_alone_is_a_setting_now() -> None:
    assert Node("n", pue=1.3).pue == 1.3
