"""A failed startup, as an operator sees it under a real uvicorn: one line with the reason
and its remedy, the server stopped, and no traceback to dig through (issue 16 item 5)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

APP = textwrap.dedent("""
    from starlette.applications import Starlette
    from giul_asgi import EnergyMiddleware, Node

    app = Starlette()
    # A reader asked for by name that cannot work here: no NVML on a machine without a GPU.
    app.add_middleware(EnergyMiddleware, nodes=[Node("gpu", reader="nvml", gpus=(0,), idle_w=100.0)])
""")


def test_a_reader_that_cannot_work_stops_uvicorn_with_its_remedy_and_no_traceback(
    tmp_path: Path,
) -> None:
    (tmp_path / "failing_app.py").write_text(APP)
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "failing_app:app", "--port", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "giul-asgi: NVML" in out and "reader='none'" in out  # the reason and the remedy
    assert "Application startup failed" in out
    assert "Traceback" not in out and "CancelledError" not in out, out
