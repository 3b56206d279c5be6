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


class HostRig:
    """A truth card and a host CPU in a powercap tree (20 W at rest, 30 W more while a job
    runs), read by a node with ``boundary="host"``, on a virtual clock."""

    CPU_IDLE, CPU_BUSY = 20.0, 30.0

    def __init__(self, root: Path) -> None:
        from test_ledger import Clock
        from truecard import TrueCard, TrueReader

        from giul_asgi.ledger import Ledger
        from giul_asgi.ledger.sources import host_reader

        for name, sub in (("package-0", "intel-rapl:0"), ("dram", "intel-rapl:0/intel-rapl:0:0")):
            (root / sub).mkdir(parents=True)
            (root / sub / "name").write_text(name + "\n")
            (root / sub / "energy_uj").write_text("0\n")
            (root / sub / "max_energy_range_uj").write_text("262143328850\n")
        self.package = root / "intel-rapl:0" / "energy_uj"
        self.dram = root / "intel-rapl:0" / "intel-rapl:0:0" / "energy_uj"
        self.clock = Clock()
        self.card = TrueCard(idle_w=IDLE, clock=self.clock, seed=11)
        self.node = Node("h", idle_w=IDLE + self.CPU_IDLE + 2.0, boundary="host", rapl_root=str(root))
        self.reader = host_reader(self.node, TrueReader(self.card))
        self.ledger = Ledger(self.node, self.reader, poll=False)
        self.cpu_j = 0.0
        self.busy = False

    def advance(self, seconds: float) -> None:
        end = self.clock.now + seconds
        while self.clock.now < end:
            dt = min(0.01, end - self.clock.now)
            self.clock.now += dt
            self.cpu_j += (self.CPU_IDLE + (self.CPU_BUSY if self.busy else 0.0)) * dt
            self.package.write_text(f"{int(self.cpu_j * 1e6)}\n")
            self.dram.write_text(f"{int(2.0 * (self.clock.now - 100.0) * 1e6)}\n")  # 2 W, flat
            self.ledger.ingest(self.reader.read())


def test_a_host_node_adds_the_cpu_package_and_dram_and_says_host(tmp_path: Path) -> None:
    from giul_asgi.meter import Meter

    rig = HostRig(tmp_path)
    assert rig.reader.boundary == "host" and rig.reader.backend == "nvml_counter+rapl"
    assert rig.reader.card_id is not None and rig.reader.card_id.startswith("host:")
    rig.advance(0.5)
    meter = Meter(rig.ledger)
    meter.open()
    job = rig.card.start_job(100.0)
    rig.busy = True
    rig.advance(0.4)
    rig.card.stop_job(job)
    rig.busy = False
    meter.close()
    rig.advance(0.6)
    e = meter.figure()
    assert e.settled and e.boundary == "host" and e.backend == "nvml_counter+rapl"
    truth = job.truth(rig.card.ramp_up, rig.card.tau) + HostRig.CPU_BUSY * 0.4
    assert e.joules == pytest.approx(truth, rel=0.1)
    assert dict(energy_headers(e))[b"x-energy-boundary"] == b"host"


def test_a_host_part_that_fails_fails_the_reading_never_the_cards_alone(tmp_path: Path) -> None:
    rig = HostRig(tmp_path)
    rig.advance(0.1)
    rig.package.write_text("not a number\n")
    reading = rig.reader.read()
    assert not reading.ok and "rapl" in (reading.error or "")


def test_host_needs_a_cards_reader_and_the_hosts_rapl(tmp_path: Path) -> None:
    from truecard import TrueCard, TrueReader

    from giul_asgi.errors import ConfigError, ReaderUnavailable
    from giul_asgi.ledger.sources import host_reader

    with pytest.raises(ConfigError, match="did you mean"):
        Node("n", boundary="Host")
    with pytest.raises(ConfigError, match="reads no card"):
        Node("n", reader="rapl", boundary="host")
    card = TrueCard(idle_w=IDLE)
    with pytest.raises(ReaderUnavailable, match="needs the host's RAPL zones"):
        host_reader(Node("n", boundary="host", rapl_root=str(tmp_path / "none")), TrueReader(card))
    (tmp_path / "intel-rapl:0").mkdir()
    for name, value in (("name", "package-0"), ("energy_uj", "0"), ("max_energy_range_uj", "100")):
        (tmp_path / "intel-rapl:0" / name).write_text(value + "\n")
    with pytest.raises(ReaderUnavailable, match="power reader"):
        host_reader(Node("n", boundary="host", rapl_root=str(tmp_path)), TrueReader(card, "instant"))


def test_opentelemetry_says_the_boundary_and_the_pue() -> None:
    from giul_asgi.exporters.otel import energy_attributes

    attrs = energy_attributes(Energy(2.0, "measured", boundary="host", pue=1.2))
    assert attrs["giul.energy.boundary"] == "host" and attrs["giul.energy.pue"] == 1.2
    assert "giul.energy.pue" not in energy_attributes(Energy(2.0, "measured"))


@pytest.mark.anyio
@pytest.mark.parametrize("pue", [None, 1.3])
async def test_a_streams_start_says_the_boundary_as_a_json_answer_does(pue: float | None) -> None:
    """A stream's start goes out before its figure: it still says what the figure will
    cover (``X-Energy-Boundary``) and the PUE its joules will carry, as the JSON answer's
    headers do."""
    from dataclasses import replace

    from apps import busy_node, drive, fresh, header, start_of

    node, _card = busy_node()
    node = replace(node, pue=pue)

    def app_of(media: bytes, body: bytes) -> object:
        async def app(scope: dict, receive: object, send: object) -> None:
            await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                        "headers": [(b"content-type", media)]})
            await send({"type": "http.response.body", "body": body})  # type: ignore[operator]

        return app

    wanted_pue = None if pue is None else b"1.3"
    for media, body in ((b"application/json", b'{"id": "x"}'), (b"text/event-stream", b"data: {}\n\n"),
                        (b"application/octet-stream", b"bytes")):
        mw = fresh(app_of(media, body), node)
        try:
            start = start_of(await drive(mw))
            assert header(start, b"x-energy-boundary") == b"gpu", media
            assert header(start, b"x-energy-pue") == wanted_pue, media
        finally:
            await mw.aclose()
