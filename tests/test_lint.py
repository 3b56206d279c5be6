"""The project stays ruff-clean and its type hints check: CI runs this with the rest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings it)")
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    """The type hints are checked, not decoration (settings in pyproject.toml)."""
    mypy = shutil.which("mypy") or str(Path(sys.executable).parent / "mypy")
    if not Path(mypy).exists():
        pytest.skip("mypy is not installed (pip install -e '.[test]' brings it)")
    result = subprocess.run([mypy], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
