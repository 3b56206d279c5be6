from __future__ import annotations

import pytest

from giul_asgi.cli import main


def test_probe_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "NVML: not available" in out and "nothing is invented" in out


def test_probe_simulated_meters_a_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--simulate", "--seconds", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "method=simulated" in out and "settled=True" in out
    joules = float(out.split("joules=")[1].split()[0])
    uncertainty = float(out.split("uncertainty_joules=")[1].split()[0])
    truth = float(out.split("simulated truth: ")[1].split()[0])
    assert abs(joules - truth) <= uncertainty
    assert joules == pytest.approx(truth, rel=0.25)
