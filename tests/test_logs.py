"""Our log lines under a plain server, with no logging configured (issue 21 item 5).

"At startup each node logs one line": under ``uvicorn app:app`` nothing appeared unless the
app configured logging, and warnings came out through Python's last resort with no time or
level. Each test runs a real server over an app module as a user writes it and reads what
it prints: the startup line and a reader's failure, each once, in the server's own format;
and once only where the app configured logging itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

APP = textwrap.dedent("""
    import logging
    import time

    from fastapi import FastAPI

    from giul_asgi import EnergyMiddleware, Node
    from giul_asgi.readers import Reading

    {configure}

    class FallenOff:
        "A card that never answers: its node's startup line says why."
        backend, source, method, kind, period, blocking = (
            "nvml_counter", "local", "measured", "counter", 0.05, True)
        clock = staticmethod(time.monotonic)

        def read(self):
            return Reading(t=time.monotonic(), error="GPU has fallen off the bus")

        def close(self):
            return None

    app = FastAPI()
    app.add_middleware(EnergyMiddleware, nodes=[
        Node("sim", reader="simulated"),
        Node("broken", idle_w=60.0, reader_factory=lambda node: FallenOff()),
    ])
""")
READY = re.compile(r"node 'sim': reader simulated .*: ready, backend simulated")
FAILED = re.compile(r"node 'broken': reader .*: no reading: GPU has fallen off the bus")
SERVERS = {
    "uvicorn": ["-m", "uvicorn", "app:app", "--port", "0"],
    "gunicorn": ["-m", "gunicorn", "app:app", "-b", "127.0.0.1:0", "-w", "1",
                 "-k", "uvicorn_worker.UvicornWorker"],
    "hypercorn": ["-m", "hypercorn", "app:app", "-b", "127.0.0.1:0"],
    "uvicorn-warning": ["-m", "uvicorn", "app:app", "--port", "0", "--log-level", "warning"],
}


def output_of(tmp_path: Path, server: str, configure: str = "",
              until: tuple[re.Pattern[str], ...] = (READY, FAILED)) -> str:
    """What ``server`` prints over the app until ``until`` is out (or 60 s), then stopped."""
    (tmp_path / "app.py").write_text(APP.format(configure=configure))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    process = subprocess.Popen([sys.executable, *SERVERS[server]], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    deadline = time.monotonic() + 60.0
    try:
        while time.monotonic() < deadline and process.poll() is None:
            text = "".join(lines)
            if all(pattern.search(text) for pattern in until):
                time.sleep(1.0)  # a second copy, or the other node's line, would come right behind
                break
            time.sleep(0.05)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):  # a worker its master left behind
            os.killpg(process.pid, signal.SIGKILL)
        reader.join(10)
        if process.stdout is not None:
            process.stdout.close()
    return "".join(lines)


def the_line(out: str, pattern: re.Pattern[str]) -> str:
    found = [line for line in out.splitlines() if pattern.search(line)]
    assert len(found) == 1, out
    return found[0]


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn", "hypercorn"])
def test_the_startup_line_and_a_reader_failure_show_under_a_plain_server(
    tmp_path: Path, server: str,
) -> None:
    if server == "hypercorn":
        pytest.importorskip("hypercorn")
    out = output_of(tmp_path, server)
    ready, failed = the_line(out, READY), the_line(out, FAILED)
    if server == "uvicorn":  # uvicorn's own format: the level, then the message
        assert ready.startswith("INFO:     giul-asgi: ") and failed.startswith("WARNING:  giul-asgi: ")
    else:  # gunicorn's and hypercorn's: [time] [pid] [LEVEL]
        assert re.match(r"\[[^]]+\] \[\d+\] \[INFO\] giul-asgi: ", ready), ready
        assert re.match(r"\[[^]]+\] \[\d+\] \[WARNING\] giul-asgi: ", failed), failed
    assert "Traceback" not in out, out


def test_where_the_app_configured_logging_each_line_shows_once_its_way(tmp_path: Path) -> None:
    out = output_of(tmp_path, "uvicorn", configure=(
        "logging.basicConfig(level=logging.INFO, format='APP %(levelname)s %(name)s %(message)s')"))
    assert the_line(out, READY).startswith("APP INFO giul_asgi.poller node 'sim'"), out
    assert the_line(out, FAILED).startswith("APP WARNING giul_asgi.poller"), out
    assert "giul-asgi: node" not in out, out  # no second copy in the server's format


def test_a_quieter_server_hides_our_info_lines_too(tmp_path: Path) -> None:
    out = output_of(tmp_path, "uvicorn-warning", until=(FAILED,))
    assert not READY.search(out), out
    assert the_line(out, FAILED).startswith("WARNING:  giul-asgi: "), out
