"""The NVML reader against a scripted pynvml, and the real pynvml on a host with no GPU."""

from __future__ import annotations

import pytest
from fake_nvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN, FakeGpu, FakeNvml

from giul_asgi import Ledger, Node, ReaderUnavailable
from giul_asgi.readers import NullReader, NvmlReader, VirtualClock, make_reader, probe_nvml


def test_counter_is_preferred_and_summed_over_the_nodes_gpus() -> None:
    nvml = FakeNvml([FakeGpu(energy_mj=1_500), FakeGpu(energy_mj=2_500)])
    reader = NvmlReader((0, 1), nvml=nvml)
    assert (reader.kind, reader.backend, reader.period) == ("counter", "nvml_counter", 0.1)
    assert reader.read().joules == pytest.approx(4.0)


def test_probed_once_then_only_the_chosen_call_is_made() -> None:
    gpu = FakeGpu()
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    gpu.calls.clear()
    for _ in range(3):
        reader.read()
    assert gpu.calls == ["counter"] * 3


def test_not_supported_counter_falls_back_to_instant_power_field() -> None:
    nvml = FakeNvml([FakeGpu(counter=False, power_mw=250_000)])
    reader = NvmlReader((0,), nvml=nvml)
    assert (reader.kind, reader.backend) == ("power", "nvml_power")
    assert reader.read().watts == pytest.approx(250.0)
    assert nvml.gpus[0].calls[-1] == "fields"


def test_then_to_the_averaged_gauge_and_says_so() -> None:
    nvml = FakeNvml([FakeGpu(counter=False, instant=False, power_mw=90_000)])
    reader = NvmlReader((0,), nvml=nvml)
    assert reader.read().watts == pytest.approx(90.0)
    assert any("averaged" in note for note in reader.notes)


def test_mixed_support_uses_power_for_every_gpu() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(counter=False)])
    reader = NvmlReader((0, 1), nvml=nvml)
    assert reader.kind == "power"


def test_nothing_supported_is_a_typed_error_with_a_remedy() -> None:
    nvml = FakeNvml([FakeGpu(counter=False, instant=False, average=False)])
    with pytest.raises(ReaderUnavailable) as info:
        NvmlReader((0,), nvml=nvml)
    assert "reader='none'" in info.value.remedy
    assert nvml.shutdowns == 1  # released what it opened


def test_missing_gpu_index_and_dead_driver() -> None:
    with pytest.raises(ReaderUnavailable, match="GPU index 3 not present"):
        NvmlReader((3,), nvml=FakeNvml([FakeGpu()]))
    with pytest.raises(ReaderUnavailable, match="NVML would not start"):
        NvmlReader((0,), nvml=FakeNvml(init_error=NVML_ERROR_UNKNOWN))


def test_errors_mid_run_become_readings_never_exceptions() -> None:
    gpu = FakeGpu(energy_mj=10)
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    gpu.fail = NVML_ERROR_GPU_IS_LOST
    reading = reader.read()
    assert reading.error is not None and "GPU is lost" in reading.error and not reading.ok
    gpu.fail = None
    assert reader.read().ok


def test_mig_is_said_not_divided() -> None:
    reader = NvmlReader((0,), nvml=FakeNvml([FakeGpu(mig=True)]))
    assert any("MIG" in note for note in reader.notes)


def test_probe_lists_what_each_gpu_answers() -> None:
    probes = probe_nvml(FakeNvml([FakeGpu(), FakeGpu(counter=False, mig=True)]))
    assert [p.counter for p in probes] == [True, False]
    assert probes[1].mig is True and probes[0].name == "NVIDIA H100 80GB HBM3"


def test_real_pynvml_without_a_gpu_is_honest() -> None:
    """nvidia-ml-py is installed here but there is no driver: auto says so, nvml raises."""
    reader = make_reader(Node("nogpu"))
    assert isinstance(reader, NullReader) and "NVML" in reader.reason
    with pytest.raises(ReaderUnavailable):
        make_reader(Node("nogpu", reader="nvml"))
    assert probe_nvml() == []


def test_ledger_on_scripted_counter_with_a_reset() -> None:
    clock = VirtualClock()
    gpu = FakeGpu(energy_mj=5_000_000)
    ledger = Ledger(Node("n", idle_w=100.0), NvmlReader((0,), nvml=FakeNvml([gpu]), clock=clock))
    ledger.read_now()
    window = ledger.open()
    for _ in range(4):  # 300 W for 0.4 s: 200 W above idle
        clock.advance(0.1)
        gpu.energy_mj += 30_000
        ledger.read_now()
    ledger.close(window)
    clock.advance(0.1)
    gpu.energy_mj += 10_000
    ledger.read_now()
    e = ledger.energy(window)
    assert e.method == "measured" and e.settled
    # 200 W above idle for 0.4 s. These reads come every 100 ms exactly, so the ledger cannot
    # learn where inside each 100 ms the counter stepped, and the first interval after a
    # baseline is off by up to a step: within 10% here.
    assert e.joules == pytest.approx(80.0, rel=0.1)

    # A driver reload: the counter restarts from zero. That interval is unknown, never negative.
    second = ledger.open()
    clock.advance(0.1)
    gpu.energy_mj = 1_000
    ledger.read_now()
    clock.advance(0.1)
    gpu.energy_mj += 30_000
    ledger.close(second)
    clock.advance(0.05)
    ledger.read_now()
    e2 = ledger.energy(second)
    assert e2.joules is None and e2.method == "unknown"
    assert "reset" in (e2.error or "")
    totals = ledger.totals()
    assert totals.resets == 1
    assert totals.conservation_error_j == pytest.approx(0.0, abs=1e-9)


def test_ledger_power_reader_integrates_trapezoids() -> None:
    clock = VirtualClock()
    gpu = FakeGpu(counter=False, power_mw=100_000)
    ledger = Ledger(Node("p", idle_w=100.0), NvmlReader((0,), nvml=FakeNvml([gpu]), clock=clock))
    ledger.read_now()
    window = ledger.open()
    gpu.power_mw = 300_000
    clock.advance(1.0)
    ledger.read_now()  # ramp 100 -> 300 W: 200 J, 100 J above idle
    ledger.close(window)
    clock.advance(0.0001)
    ledger.read_now()
    e = ledger.energy(window)
    assert e.backend == "nvml_power" and e.joules == pytest.approx(100.0, rel=1e-3)


def test_ledgers_close_releases_nvml() -> None:
    from giul_asgi import Ledgers

    nvml = FakeNvml([FakeGpu()])
    node = Node("release", reader_factory=lambda n: NvmlReader(n.gpus, nvml=nvml))
    ledgers = Ledgers()
    ledgers.get(node)
    assert nvml.inits == 1 and nvml.shutdowns == 0
    ledgers.close()
    assert nvml.shutdowns == 1 and list(ledgers) == []
