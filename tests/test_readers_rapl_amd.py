"""RAPL against a powercap tree in tmp, and the AMD reader against a fake amdsmi."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.fake_amdsmi import FakeAmdGpu, FakeAmdSmi

from giul_asgi.errors import ConfigError, ReaderUnavailable
from giul_asgi.readers.amd import AmdReader
from giul_asgi.readers.base import Reader, ReaderSpec
from giul_asgi.readers.rapl import RaplReader
from giul_asgi.readers.registry import READERS


def zone(path: Path, name: str, energy: int, max_range: int = 262_143_328_850) -> Path:
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range}\n")
    return path


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    root = tmp_path / "powercap"
    p0 = zone(root / "intel-rapl:0", "package-0", 1_000_000, max_range=10_000_000)
    zone(p0 / "intel-rapl:0:0", "core", 700_000)
    zone(p0 / "intel-rapl:0:1", "dram", 50_000)
    p1 = zone(root / "intel-rapl:1", "package-1", 2_000_000)
    zone(p1 / "intel-rapl:1:0", "dram", 60_000)
    zone(root / "intel-rapl:2", "psys", 9_000_000)
    zone(root / "intel-rapl-mmio:0", "package-0", 1_000_000)
    return root


def set_energy(path: Path, value: int) -> None:
    (path / "energy_uj").write_text(f"{value}\n")


def test_packages_only_never_their_sub_zones_or_psys(powercap: Path) -> None:
    reader = READERS["rapl"](ReaderSpec(options={"root": str(powercap)}))
    assert isinstance(reader, Reader) and (reader.kind, reader.backend) == ("counter", "rapl")
    assert reader.read().joules == pytest.approx(3.0)  # 1 J + 2 J; core, dram, psys, mmio left out
    set_energy(powercap / "intel-rapl:0" / "intel-rapl:0:0", 900_000)  # core moved: not added
    set_energy(powercap / "intel-rapl:0", 1_500_000)
    assert reader.read().joules == pytest.approx(3.5)


def test_dram_as_its_own_domain_and_package_selection(powercap: Path) -> None:
    dram = RaplReader(ReaderSpec(options={"root": str(powercap), "domain": "dram"}))
    assert dram.read().joules == pytest.approx(0.11)
    one = RaplReader(ReaderSpec(options={"root": str(powercap), "packages": [1]}))
    assert one.read().joules == pytest.approx(2.0)


def test_wrap_at_max_energy_range(powercap: Path) -> None:
    reader = RaplReader(ReaderSpec(options={"root": str(powercap), "packages": [0]}))
    set_energy(powercap / "intel-rapl:0", 9_900_000)
    assert reader.read().joules == pytest.approx(9.9)
    set_energy(powercap / "intel-rapl:0", 400_000)  # wrapped at 10 J: 0.1 + 0.4 J more
    assert reader.read().joules == pytest.approx(10.4)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_is_unavailable_with_the_reason(powercap: Path) -> None:
    (powercap / "intel-rapl:0" / "energy_uj").chmod(0o000)
    with pytest.raises(ReaderUnavailable, match=r"root only since Linux 5\.10") as info:
        RaplReader(ReaderSpec(options={"root": str(powercap)}))
    assert "container" in info.value.remedy


def test_permission_denied_simulated_for_root(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.read_text

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ReaderUnavailable, match="CVE-2020-8694"):
        RaplReader(ReaderSpec(options={"root": str(powercap)}))


def test_missing_tree_no_zone_bad_options(tmp_path: Path, powercap: Path) -> None:
    with pytest.raises(ReaderUnavailable, match="no powercap tree"):
        RaplReader(ReaderSpec(options={"root": str(tmp_path / "none")}))
    with pytest.raises(ReaderUnavailable, match="no RAPL package zone"):
        RaplReader(ReaderSpec(options={"root": str(powercap), "packages": [7]}))
    with pytest.raises(ConfigError, match="'domain' must be one of"):
        RaplReader(ReaderSpec(options={"root": str(powercap), "domain": "core"}))


def test_a_zone_vanishing_mid_run_is_an_error_reading(powercap: Path) -> None:
    reader = RaplReader(ReaderSpec(options={"root": str(powercap)}))
    (powercap / "intel-rapl:1" / "energy_uj").unlink()
    reading = reader.read()
    assert reading.error is not None and not reading.ok


def test_amd_counter_in_microjoule_ticks_summed() -> None:
    gpus = [FakeAmdGpu(ticks=1_000_000, resolution_uj=15.3),
            FakeAmdGpu(ticks=10, resolution_uj=1e6, old_key=True)]
    reader = AmdReader(ReaderSpec(gpus=(0, 1)), amdsmi=FakeAmdSmi(gpus))
    assert isinstance(reader, Reader) and (reader.kind, reader.backend) == ("counter", "amd")
    assert reader.read().joules == pytest.approx(15.3 + 10.0)
    gpus[0].ticks += 1_000_000
    assert reader.read().joules == pytest.approx(30.6 + 10.0)


def test_amd_power_where_no_counter_and_na_is_never_zero() -> None:
    gpu = FakeAmdGpu(energy=False, power=512)
    reader = AmdReader(ReaderSpec(), amdsmi=FakeAmdSmi([gpu]))
    assert reader.kind == "power" and reader.read().watts == 512.0
    gpu.power = "N/A"
    reading = reader.read()
    assert reading.watts is None and reading.error is not None


def test_amd_errors() -> None:
    fake = FakeAmdSmi([FakeAmdGpu(energy=False, power="N/A")])
    with pytest.raises(ReaderUnavailable, match="neither energy nor power"):
        AmdReader(ReaderSpec(), amdsmi=fake)
    assert fake.shutdowns == 1
    with pytest.raises(ReaderUnavailable, match="would not start"):
        AmdReader(ReaderSpec(), amdsmi=FakeAmdSmi(init_fails=True))
    with pytest.raises(ReaderUnavailable, match="GPU index 2"):
        AmdReader(ReaderSpec(gpus=(2,)), amdsmi=FakeAmdSmi())
    gpu = FakeAmdGpu()
    reader = AmdReader(ReaderSpec(), amdsmi=FakeAmdSmi([gpu]))
    gpu.fail = True
    assert reader.read().error is not None


def test_amd_without_amdsmi_installed_says_how_to_get_it() -> None:
    with pytest.raises(ReaderUnavailable, match="amdsmi module is not installed"):
        READERS["amd"](ReaderSpec())
