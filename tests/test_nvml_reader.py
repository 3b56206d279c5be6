"""The NVML reader against a scripted pynvml, and the real pynvml on a host with no GPU."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fake_nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_UNKNOWN,
    FakeGpu,
    FakeNvml,
    LiveGpu,
    skip_with_a_driver,
)

from giul_asgi.errors import ConfigError, ReaderUnavailable
from giul_asgi.readers.base import Process, ProcessLister, Reader, ReaderSpec
from giul_asgi.readers.nvml import POLL_HINT_S, GpuReading, NvmlReader, probe_nvml, read_gpu


def test_counter_is_preferred_and_summed_over_the_nodes_gpus() -> None:
    nvml = FakeNvml([FakeGpu(energy_mj=1_500), FakeGpu(energy_mj=2_501)])
    reader = NvmlReader((0, 1), nvml=nvml)
    assert (reader.kind, reader.backend, reader.period) == ("counter", "nvml_counter", POLL_HINT_S)
    assert reader.read().joules == pytest.approx(4.001)
    assert isinstance(reader, Reader) and isinstance(reader, ProcessLister)
    assert not hasattr(reader, "blocking")


def test_built_from_a_spec_with_its_period_hint_and_clock() -> None:
    nvml = FakeNvml([FakeGpu(energy_mj=7), FakeGpu(energy_mj=9)])
    spec = ReaderSpec(gpus=(1,), period=0.02, clock=lambda: 42.0)
    reader = NvmlReader(spec, nvml=nvml)
    assert reader.period == 0.02 and reader.gpus == (1,)
    reading = reader.read()
    assert reading.t == 42.0 and reading.joules == pytest.approx(0.009)


def test_empty_gpu_list_means_every_gpu() -> None:
    reader = NvmlReader(ReaderSpec(gpus=()), nvml=FakeNvml([FakeGpu(), FakeGpu()]))
    assert reader.gpus == (0, 1)


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


def test_prefer_option_picks_a_gauge_even_where_the_counter_works() -> None:
    nvml = FakeNvml([FakeGpu(power_mw=123_000, average_mw=99_000)])
    assert NvmlReader((0,), nvml=nvml, options={"prefer": "instant"}).read().watts == pytest.approx(123.0)
    assert NvmlReader((0,), nvml=nvml, options={"prefer": "average"}).read().watts == pytest.approx(99.0)
    with pytest.raises(ReaderUnavailable, match="prefer='counter'"):
        NvmlReader((0,), nvml=FakeNvml([FakeGpu(counter=False)]), options={"prefer": "counter"})


@pytest.mark.parametrize(
    ("options", "match"),
    [({"bogus": 1}, "unknown option 'bogus'"), ({"prefer": "fastest"}, "'prefer' must be one of"),
     ({"mig_slices": ["a"]}, "'mig_slices' must be a list")],
)
def test_bad_options_are_config_errors_naming_the_key(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        NvmlReader((0,), nvml=FakeNvml(), options=options)


def test_a_misspelt_option_says_which_was_meant() -> None:
    with pytest.raises(ConfigError, match=r"unknown option 'prefr'\. did you mean 'prefer'"):
        NvmlReader((0,), nvml=FakeNvml(), options={"prefr": "counter"})


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
    with pytest.raises(ReaderUnavailable, match="no GPU"):
        NvmlReader(ReaderSpec(gpus=()), nvml=FakeNvml([]))


def test_errors_mid_run_become_readings_never_exceptions() -> None:
    gpu = FakeGpu(energy_mj=10)
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    gpu.fail = NVML_ERROR_GPU_IS_LOST
    reading = reader.read()
    assert reading.error is not None and "GPU is lost" in reading.error and not reading.ok
    gpu.fail = None
    assert reader.read().ok


def test_the_block_switch_stalls_every_call_like_a_wedged_driver() -> None:
    gpu = FakeGpu(energy_mj=5)
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    gpu.block_s = 0.2
    done = threading.Event()
    threading.Thread(target=lambda: (reader.read(), done.set()), daemon=True).start()
    assert not done.wait(0.05)  # still inside the driver call
    assert done.wait(5)


def test_mig_is_said_not_divided() -> None:
    reader = NvmlReader((0,), nvml=FakeNvml([FakeGpu(mig=True)]), options={"mig_slices": [1, 2]})
    assert reader.mig is True
    assert any("MIG" in note for note in reader.notes)
    assert reader.mig_slices == (1, 2) and any("board-level" in note for note in reader.notes)


def test_processes_with_names_from_proc(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tpython\nNSpid:\t4242\n")
    (tmp_path / "31").mkdir()
    (tmp_path / "31" / "comm").write_text("vllm\n")
    gpus = [FakeGpu(processes=[31, 77]), FakeGpu(processes=[31])]
    reader = NvmlReader((0, 1), nvml=FakeNvml(gpus), options={"proc_root": str(tmp_path)})
    assert reader.processes() == [Process(31, "vllm"), Process(77, None)]


def test_processes_names_withheld_in_a_nested_pid_namespace(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("NSpid:\t90210\t12\n")
    (tmp_path / "31").mkdir()
    (tmp_path / "31" / "comm").write_text("not-the-right-one\n")
    reader = NvmlReader((0,), nvml=FakeNvml([FakeGpu(processes=[31])]), options={"proc_root": str(tmp_path)})
    assert reader.processes() == [Process(31, None)]


def test_processes_under_mig_come_from_every_slice_and_none_when_unsupported() -> None:
    mig = FakeGpu(mig=True, processes=[], mig_slices=[[5], [6, 7]])
    assert [p.pid for p in NvmlReader((0,), nvml=FakeNvml([mig])).processes() or []] == [5, 6, 7]
    assert NvmlReader((0,), nvml=FakeNvml([FakeGpu(processes=None)])).processes() is None
    gpu = FakeGpu(processes=[1])
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    gpu.fail = NVML_ERROR_GPU_IS_LOST
    assert reader.processes() is None  # nobody could look: not "no process"


def test_counters_are_whole_millijoules() -> None:
    reader = NvmlReader((0,), nvml=FakeNvml([FakeGpu(energy_mj=1_234_567)]))
    assert reader.read().joules == 1234.567


def test_live_gpu_counter_steps_on_its_clock() -> None:
    now = [100.0]
    gpu = LiveGpu(watts=200.0, step_s=0.1, clock=lambda: now[0])
    reader = NvmlReader((0,), nvml=FakeNvml([gpu]))
    first = reader.read().joules
    now[0] += 0.05
    assert reader.read().joules == first  # not stepped yet
    now[0] += 0.1
    stepped = reader.read().joules
    assert stepped is not None and first is not None and stepped > first
    now[0] += 1.0
    gpu.watts = 400.0
    assert NvmlReader((0,), nvml=FakeNvml([gpu]), options={"prefer": "instant"}).read().watts == 400.0


def test_probe_lists_what_each_gpu_answers() -> None:
    probes = probe_nvml(FakeNvml([FakeGpu(), FakeGpu(counter=False, mig=True, processes=None)]))
    assert [p.counter for p in probes] == [True, False]
    assert probes[1].mig is True and probes[0].name == "NVIDIA H100 80GB HBM3"
    assert probes[0].uuid.startswith("GPU-fake-0000-") and probes[1].processes is False


def test_real_pynvml_without_a_gpu_is_honest() -> None:
    """nvidia-ml-py is installed here but there is no driver: the reader raises, probe is empty."""
    skip_with_a_driver()
    with pytest.raises(ReaderUnavailable, match="NVML would not start"):
        NvmlReader(ReaderSpec())
    assert probe_nvml() == []



def test_auto_on_a_host_without_a_gpu_says_the_remedy_and_how_to_try_it() -> None:
    """A stranger's trial: the README's tour copied as is on a GPU-less host warned "no
    reading: NVML unavailable: ..." with no remedy (the README promises one)."""
    skip_with_a_driver()
    from giul_asgi.readers.registry import READERS

    reader = READERS["auto"](ReaderSpec())
    assert reader.read().error is not None and "NVML unavailable" in reader.read().error
    remedy = getattr(reader, "remedy", None)
    assert remedy is not None and "nvidia-smi" in remedy and remedy.count("reader='simulated'") == 1, remedy


def test_the_gpu_check_runs_against_the_fake_card(tmp_path: Path) -> None:
    """benchmarks/gpu_check.py cannot run here for real; --fake runs its code on tests/fake_nvml."""
    import json
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"
    out, raw = tmp_path / "check.md", tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(script), "--fake", "--quick", "--out", str(out),
                           "--json", str(raw)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(raw.read_text())
    assert report["fake"] is True and "FAKE card" in out.read_text()
    assert report["update_period_idle"]["counter_steps"] >= 1
    assert set(report["latency"]) == {"counter", "instant_field", "averaged", "processes"}
    assert "instant_before_w" in report["power_step"]
    assert "windows" in report["ledger"] or "skipped" in report["ledger"]


def test_one_board_read_on_its_own_in_joules_and_watts_never_raises() -> None:
    """What the probe and the agent read of a board: through readers/, never NVML itself."""
    gpus = [FakeGpu(energy_mj=2_500, power_mw=150_000, average_mw=120_000),
            FakeGpu(counter=False), FakeGpu(counter=False, instant=False, average=False)]
    reader = NvmlReader((0, 1), nvml=FakeNvml(gpus), options={"prefer": "instant"})
    try:
        assert reader.read_gpu(0) == GpuReading(energy_j=2.5, power_w=150.0)
        assert reader.read_gpu(0, average=True).average_w == 120.0
        assert reader.read_gpu(1) == GpuReading(power_w=100.0)
        gpus[0].fail = 15  # the board fell off the bus: the reading says so, nothing raises
        failed = reader.read_gpu(0)
        assert failed.energy_j is None and failed.power_w is None and "NVMLError" in (failed.error or "")
    finally:
        reader.close()
    nvml = FakeNvml(gpus)
    nvml.nvmlInit()
    mute = read_gpu(nvml, probe_nvml(FakeNvml(gpus))[2], nvml.nvmlDeviceGetHandleByIndex(2))
    assert mute.error is not None and "neither" in mute.error and mute.power_w is None
