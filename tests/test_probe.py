"""`giul-asgi probe`'s report: a fake card on a virtual clock, real local servers, and this GPU-less host."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml, LiveGpu, skip_with_a_driver
from fixtures.agent_server import running_agent
from fixtures.metrics_server import Served, serving

from giul_asgi.agent import NvmlSource
from giul_asgi.probe import analyse, format_probe, main, probe_report

FIXTURES = Path(__file__).parent / "fixtures"


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_host_without_a_gpu_says_so() -> None:
    skip_with_a_driver()
    report = probe_report(sample_seconds=0.1)
    assert report["nvml"]["available"] is False and "NVML" in report["nvml"]["reason"]
    assert "suggested_config" not in report
    json.dumps(report)
    text = format_probe(report)
    assert "local NVML: not available" in text and "never invented" in text


def test_fake_card_update_period_counter_against_power_and_idle_floor() -> None:
    clock = Clock()
    gpu = LiveGpu(watts=200.0, step_s=0.1, clock=clock, processes=[1])
    nvml = FakeNvml([gpu, FakeGpu(counter=False, instant=False)])
    report = probe_report(nvml=nvml, gpus=(0,), sample_seconds=2.0, idle_seconds=1.0,
                          clock=clock, sleep=clock.sleep)
    json.dumps(report)
    section = report["nvml"]
    assert section["available"] and section["backend"] == "nvml_counter"
    g = section["gpus"][0]
    assert g["counter"] and g["instant_power"] and g["average_power_w"] is not None
    s = g["sampling"]
    assert s["update_period_s"] == pytest.approx(0.1, abs=0.005)
    assert s["counter_steps"] >= 15 and s["counter_resolution_j"] == pytest.approx(20.0, rel=0.05)
    assert s["counter_over_power"] == pytest.approx(1.0, rel=0.02)
    assert section["idle"]["idle_w"] == pytest.approx(200.0, rel=0.02)
    assert report["suggested_config"] == {"reader": "nvml", "idle_w": pytest.approx(200.0, rel=0.02),
                                          "gpus": [0]}
    assert section["processes"] == [{"pid": 1, "name": section["processes"][0]["name"]}]
    text = format_probe(report)
    assert "counter update period: median 100.0 ms" in text and "idle_w = " in text


def test_analyse_without_steps_leaves_figures_unknown() -> None:
    out = analyse([(0.0, 5.0, 100.0), (1.0, 5.0, 100.0)])
    assert out["counter_steps"] == 0 and out["update_period_s"] is None and "counter_j" not in out


def test_remote_sections_from_real_local_servers() -> None:
    dcgm = Served((FIXTURES / "dcgm_default_mj.prom").read_text())
    upstream = Served("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n")
    source = NvmlSource(nvml=FakeNvml([LiveGpu(watts=120.0, step_s=0.02)]))
    with running_agent(reader=source, cache_s=0.0) as url, serving(dcgm), serving(upstream):
        report = probe_report(local=False, agent_url=url, dcgm_url=dcgm.url, upstream_url=upstream.url,
                              gpus=(0,), sample_seconds=0.3)
    json.dumps(report)
    assert "nvml" not in report
    agent = report["agent"]
    assert agent["reachable"] and agent["method"] == "measured" and agent["round_trip_s"] is not None
    assert agent["gpus"][0]["index"] == 0 and agent["gpus"][0]["sampling"]["counter_steps"] >= 1
    assert report["dcgm"]["reading"]["joules"] == pytest.approx(8388118.461)
    assert report["upstream"]["server"] == "vllm" and report["upstream"]["running"] == 3
    text = format_probe(report)
    assert "agent http" in text and "dcgm-exporter http" in text and "upstream http" in text


def test_unreachable_sources_are_reported_not_raised() -> None:
    report = probe_report(local=False, agent_url="http://127.0.0.1:9/", dcgm_url="http://127.0.0.1:9/",
                          upstream_url="http://127.0.0.1:9/metrics", sample_seconds=0.1)
    assert report["dcgm"]["reading"]["error"] is not None
    assert report["upstream"]["reachable"] is False
    assert report["agent"]["first_reading"]["error"] is not None
    text = format_probe(report)
    assert "not read" in text and ": None" not in text  # a stranger's trial: "not reachable: None"
    upstream = next(line for line in text.splitlines() if line.startswith("upstream "))
    assert "ConnectError" in upstream or "refused" in upstream.lower(), upstream
    bad = probe_report(local=False, agent_url="ftp://nowhere", sample_seconds=0.1)
    assert bad["agent"]["reachable"] is False and "http" in bad["agent"]["reason"]


def test_main_prints_json_and_refuses_bad_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(Served("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n")) as up:
        assert main(["--no-local", "--json", "--upstream", up.url]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["upstream"]["server"] == "sglang" and printed["schema"] == "giul-probe/1"
    assert main(["--gpus", "x"]) == 2


def test_the_probe_counts_one_models_requests_as_a_nodes_upstream_model_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stranger's trial: with a server running models on two cards, the probe summed every
    model's requests and had no way to check a node's ``upstream_model`` before deploying."""
    text = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="ours"} 1\n'
            'vllm:num_requests_running{model_name="other"} 4\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="ours"} 2\n'
            'vllm:num_requests_waiting{model_name="other"} 0\n')
    with serving(Served(text)) as up:
        assert probe_report(local=False, upstream_url=up.url)["upstream"]["running"] == 5
        assert main(["--no-local", "--upstream", up.url, "--upstream-model", "ours"]) == 0
    said = capsys.readouterr().out
    assert "(model ours): vllm: running 1.0, waiting 2.0" in said, said


def test_an_agents_cards_are_timed_one_by_one_and_its_idle_floor_measured() -> None:
    """Two 100 ms cards whose steps fall half a period apart, summed, step every 50 ms: the
    probe once reported that (56 ms) as the counter period. Each card is timed on its own."""
    first = LiveGpu(watts=120.0, step_s=0.1)
    second = LiveGpu(watts=80.0, step_s=0.1, clock=lambda: time.monotonic() + 0.05)
    source = NvmlSource(nvml=FakeNvml([first, second]))
    with running_agent(reader=source, cache_s=0.0) as url:
        report = probe_report(local=False, agent_url=url, sample_seconds=1.5, idle_seconds=1.5)
    json.dumps(report)
    agent = report["agent"]
    assert [g["index"] for g in agent["gpus"]] == [0, 1]  # no --gpus: every card the agent serves
    for g in agent["gpus"]:
        sampling = g["sampling"]
        assert sampling["counter_steps"] >= 3
        assert 0.08 <= sampling["update_period_s"] <= 0.25, sampling  # a card's period, not the sum's 50 ms
    idle = agent["idle"]
    assert idle["idle_w"] == pytest.approx(200.0, rel=0.15)  # the node's floor: both cards
    assert report["suggested_config"]["reader"] == "agent" and report["suggested_config"]["url"] == url
    text = format_probe(report)
    assert "  gpu 1:" in text and "idle floor over 1.5 s: " in text and "measured through agent" in text
    # Two cards' floor is one node's of both (a stranger pasted it into a node of one card).
    assert "GPUs 0, 1 together: the floor of a node of these GPUs" in text


def test_idle_says_why_where_it_cannot_be_measured() -> None:
    clock = Clock()
    no_gpu = FakeNvml(init_error=9)
    report = probe_report(nvml=no_gpu, idle_seconds=2.0, sample_seconds=0.1, clock=clock, sleep=clock.sleep,
                          agent_url="http://127.0.0.1:9/")
    assert report["nvml"]["idle"]["idle_w"] is None
    assert report["nvml"]["idle"]["reason"].startswith("no local NVML (NVML would not start")
    assert report["agent"]["idle"]["reason"].startswith("the agent gave no reading (")
    assert "suggested_config" not in report
    text = format_probe(report)
    assert "  idle floor: not measured: no local NVML" in text
    assert "  idle floor: not measured: the agent gave no reading" in text
    nothing = probe_report(local=False, idle_seconds=2.0)
    assert "drop --no-local" in nothing["idle"]["reason"]
    assert "idle floor: not measured: no reader to measure it through" in format_probe(nothing)
    dcgm = Served((FIXTURES / "dcgm_default_mj.prom").read_text())
    with serving(dcgm):
        short = probe_report(local=False, dcgm_url=dcgm.url, idle_seconds=5.0)
    assert "collects every 30 s: give --idle 60 or more" in short["dcgm"]["idle"]["reason"]


def test_cli_idle_without_a_reader_prints_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    from giul_asgi.cli import main as cli_main

    assert cli_main(["probe", "--no-local", "--idle", "1"]) == 1  # a check that found nothing failed
    out, err = capsys.readouterr()
    assert "idle floor: not measured: no reader to measure it through" in out and "nothing answered" in err


def _fake_dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "dcgmi"
    fake = Path(__file__).with_name("fake_dcgmi.py")
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_DCGMI_MODE", mode)


def test_probe_through_dcgmi_times_its_stream_and_measures_the_idle_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_dcgmi(tmp_path, monkeypatch, "ok")
    report = probe_report(local=False, dcgmi=True, gpus=(0,), sample_seconds=1.0, idle_seconds=1.0)
    json.dumps(report)
    dmon = report["dcgmi"]
    assert dmon["reachable"] and dmon["kind"] == "counter"
    assert "dmon -e 155,156 -d 100 -i 0" in dmon["command"]
    assert dmon["sampling"]["counter_steps"] >= 3
    assert 0.08 <= dmon["sampling"]["update_period_s"] <= 0.3  # dmon's 100 ms interval
    assert dmon["idle"]["idle_w"] == pytest.approx(61.0, rel=0.1)  # the fake GPU 0 draws 60-62 W
    assert report["suggested_config"]["reader"] == "dcgmi"
    assert "dcgmi dmon: `" in format_probe(report)


def test_probe_through_dcgmi_says_why_it_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dcgmi(tmp_path, monkeypatch, "hostengine")
    report = probe_report(local=False, dcgmi=True, sample_seconds=0.2, idle_seconds=1.0)
    dmon = report["dcgmi"]
    assert not dmon["reachable"] and dmon["error"] == "HostEngineUnavailable"
    assert "nvidia-dcgm" in dmon["remedy"]
    assert dmon["idle"]["reason"].startswith("dcgmi gave no sample (dcgmi could not reach the DCGM host")
    text = format_probe(report)
    assert "dcgmi dmon: not available: dcgmi could not reach" in text and "  remedy: start it" in text
