"""The `giul-asgi` command: version, probe, argument checks and exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from giul_asgi import __version__
from giul_asgi.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"giul-asgi {__version__}"


def test_python_dash_m_is_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "giul_asgi", "--version"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"giul-asgi {__version__}"


def test_probe_json_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    # No GPU here: the report is still JSON on stdout, and the status says nothing answered.
    assert main(["probe", "--json", "--sample", "0.05"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert isinstance(report, dict) and report.get("schema")


@pytest.mark.parametrize("argv", [
    [],                                             # no command
    ["frobnicate"],
    ["probe", "--sample", "-1"],
    ["probe", "--sample", "0"],
    ["probe", "--sample", "nan"],
    ["probe", "--idle", "0"],
    ["probe", "--sample", "soon"],
    ["demo", "--port", "70000"],
    ["demo", "--port", "-1"],
    ["demo", "--upstream-port", "eighty"],
    ["demo", "--load", "-1"],
    ["demo", "--concurrency", "0"],
    ["demo", "--upstream", "localhost:8000"],
    ["demo", "--idle-w", "-5"],
])
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_a_missing_config_is_a_usage_error_with_a_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--config", "/nonexistent/gateway.toml", "--port", "0",
                 "--upstream-port", "0"]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "->" in err


def test_a_taken_port_is_a_runtime_failure(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--port", str(port), "--upstream-port", "0"]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(word in out for word in ("demo", "probe", "agent", "Exit status"))
    assert main(["agent", "--help"]) == 0
    assert "--token-file" in capsys.readouterr().out
