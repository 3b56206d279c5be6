"""A failed startup, as an operator sees it under a real uvicorn: one line with the reason
and its remedy, the server stopped, and no traceback to dig through (issue 16 item 5)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
    assert "giul-asgi: node 'gpu': NVML" in out and "reader='none'" in out  # whose, why, the remedy
    assert "Application startup failed" in out
    assert "Traceback" not in out and "CancelledError" not in out, out
    # One line: the reader thread's own "unavailable" line said it a second time (a
    # stranger's boundary="host" without RAPL printed both).
    assert out.count("reader='none'") == 1 and "unavailable" not in out, out


# -- a bad setting stops the startup, however the middleware is added (issue 21 item 1) ---------
#
# Starlette and FastAPI build the middleware stack at the first ASGI call, the lifespan's: a
# ConfigError raised there made uvicorn (lifespan "auto") log "ASGI 'lifespan' protocol
# appears unsupported.", start, and answer every request 500 with a traceback. Each case is a
# real server over an app module as a user writes it; the server must stop, non-zero, with
# one line that names the setting and its remedy, and no traceback.

BLOCK_PROMETHEUS = textwrap.dedent("""
    # Makes prometheus-client unimportable in this process, as on a host without the extra.
    import sys

    class _Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "prometheus_client":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Blocked())
""")

HEAD = {
    "starlette": "from starlette.applications import Starlette\napp = Starlette()\n",
    "fastapi": "from fastapi import FastAPI\napp = FastAPI()\n\n@app.get('/x')\ndef x():\n    return {}\n",
}
NODE = "nodes=[Node('sim', reader='simulated')]"
#: setting -> what the one line must say (the setting, then its remedy)
CASES = {
    "typo": ("energy_in_usgae=True", ["energy_in_usgae=", "energy_in_usage="]),
    "negative": ("settle_timeout=-1", ["settle_timeout=-1", "settle_timeout=0.5"]),
    "undeclared": ("routes=[Route('/v1/*', node='gpu2')]", ["node 'gpu2'", "nodes=[...]"]),
    "prometheus": ("metrics_path='/metrics'", ["prometheus-client", "giul-asgi[prometheus]"]),
    "token": ("token='x' * 32", ["token=", "endpoint_token="]),
    "budget": ("budgets=[Budget(joules=5e6, hard=True)]", ["counts per tenant", "tenant='x-api-key'"]),
    # A stranger's trial: settings of the wrong shape started the server and answered every
    # request 500; a bad Node, Tier or Route was a 40-line traceback at import, and under
    # ``uvicorn --workers`` a crash loop that never exited.
    "not a list": ("nodes=Node('sim', reader='simulated')", ["nodes= takes a list", "nodes=[Node("]),
    "dicts": ("nodes=[{'name': 'sim', 'reader': 'simulated'}]", ["nodes[0] is dict", "load_config"]),
    "sinks": ("sinks=print", ["sinks= takes a list", "sinks=[JsonLinesSink"]),
    "node typo": ("nodes=[Node('sim', reader='simulated', idle_ww=140.0)]", ["idle_ww=", "idle_w=?"]),
    "node value": ("nodes=[Node('sim', reader='simulated', idle_w=-140.0)]",
                   ["idle_w must be >= 0", "giul-asgi probe"]),
    "route typo": ("routes=[Route('/v1/*', teir='70b')]", ["teir=", "tier=?"]),
    "tier value": ("tiers=[Tier('70b', joules_per_1k_hint='4100')]", ["joules_per_1k_hint", "a number"]),
    "budget typo": ("tenant='x-api-key', budgets=[Budget(jouls=5.0)]", ["jouls=", "joules=?"]),
    "toml typo": ("nodes=load_config({'node': [{'name': 'sim', 'idle_ww': 1.0}]}).nodes",
                  ["unknown key 'idle_ww'", "did you mean 'idle_w'?"]),
    # A re-trial: a Node subclass declared with @dataclass writes its own __init__, which
    # raised at import (a traceback; a crash loop under --workers).
    "node subclass": ("nodes=[RackNode('sim', reader='simulated', idle_w=-1.0, rack='r1')]",
                      ["idle_w must be >= 0", "giul-asgi probe"]),
    "node subclass typo": ("nodes=[RackNode('sim', reader='simulated', rakc='r1')]", ["rakc=", "rack=?"]),
    # A stranger's trial: no "did you mean" for a reader's name.
    "reader typo": ("nodes=[Node('sim', reader='simulatd')]", ["reader='simulatd'", "reader='simulated'?"]),
    # A stranger's trial: an upstream with no parser for its metrics was never read, and said
    # nothing while two replicas each charged the card whole.
    "upstream": ("nodes=[Node('sim', reader='simulated', upstream='http://127.0.0.1:9/metrics')]",
                 ["upstream needs prometheus-client", "giul-asgi[prometheus]"]),
}
#: What a case's module declares before adding the middleware.
PREAMBLE = ("from dataclasses import dataclass\n\n@dataclass(frozen=True)\n"
            "class RackNode(Node):\n    rack: str = ''\n")


def app_module(tmp_path: Path, framework: str, way: str, setting: str) -> Path:
    """``app.py`` in ``tmp_path``: the framework's app with the middleware added ``way``."""
    text = HEAD[framework] + ("from giul_asgi import Budget, EnergyMiddleware, Node, Route, Tier, "
                              "load_config\n")
    settings = setting if setting.startswith("nodes=") else f"{NODE}, {setting}"
    if "RackNode" in setting:
        text += PREAMBLE
    if way == "add_middleware":
        text += f"app.add_middleware(EnergyMiddleware, {settings})\n"
    else:
        text += f"app = EnergyMiddleware(app, {settings})\n"
    (tmp_path / "app.py").write_text(text)
    if "metrics_path" in setting or "upstream=" in setting:
        (tmp_path / "sitecustomize.py").write_text(BLOCK_PROMETHEUS)
    return tmp_path


def serve(tmp_path: Path, server: str, **environ: str) -> tuple[int, str]:
    """Run ``server`` over ``app:app`` until it exits; its status and everything it said."""
    command = {
        "uvicorn": [sys.executable, "-m", "uvicorn", "app:app", "--port", "0"],
        "uvicorn-lifespan-on": [sys.executable, "-m", "uvicorn", "app:app", "--port", "0",
                                "--lifespan", "on"],
        "gunicorn": [sys.executable, "-m", "gunicorn", "app:app", "-b", "127.0.0.1:0",
                     "-k", "uvicorn_worker.UvicornWorker", "-w", "1"],
        "hypercorn": [sys.executable, "-m", "hypercorn", "app:app", "-b", "127.0.0.1:0"],
        "uvicorn-workers": [sys.executable, "-m", "uvicorn", "app:app", "--port", "0", "--workers", "2"],
    }[server]
    env = dict(os.environ) | environ
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    # A session of its own: a server that keeps serving is stopped with all its workers.
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as process:
        try:
            out, _ = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:  # it kept serving: the startup did not stop
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            raise AssertionError(f"{server} kept serving a bad setting:\n{out}") from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # a worker its master left behind
    return process.returncode, out


def assert_one_line(out: str, words: list[str]) -> None:
    lines = [line for line in out.splitlines() if "giul-asgi: " in line]
    assert len(lines) == 1, out
    position = [lines[0].find(word) for word in words]
    assert all(p >= 0 for p in position) and position == sorted(position), out  # setting, remedy


@pytest.mark.parametrize(("case", "framework", "way"), [
    ("typo", "starlette", "add_middleware"),
    ("negative", "fastapi", "add_middleware"),
    ("undeclared", "fastapi", "wrapped"),
    ("prometheus", "fastapi", "add_middleware"),
    ("token", "starlette", "wrapped"),
    ("budget", "fastapi", "add_middleware"),
    ("not a list", "fastapi", "add_middleware"),
    ("dicts", "starlette", "wrapped"),
    ("sinks", "fastapi", "add_middleware"),
    ("node typo", "fastapi", "add_middleware"),
    ("node value", "starlette", "wrapped"),
    ("route typo", "fastapi", "add_middleware"),
    ("tier value", "fastapi", "wrapped"),
    ("budget typo", "fastapi", "add_middleware"),
    ("toml typo", "starlette", "wrapped"),
    ("node subclass", "fastapi", "add_middleware"),
    ("node subclass typo", "starlette", "wrapped"),
    ("reader typo", "fastapi", "add_middleware"),
    ("upstream", "starlette", "add_middleware"),
])
def test_a_bad_setting_stops_uvicorn_with_one_line_and_its_remedy(
    tmp_path: Path, case: str, framework: str, way: str,
) -> None:
    setting, words = CASES[case]
    status, out = serve(app_module(tmp_path, framework, way, setting), "uvicorn")
    assert status != 0, out
    assert "Application startup failed" in out and "lifespan' protocol appears unsupported" not in out
    assert "Traceback" not in out, out
    assert_one_line(out, words)


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("GIUL_ASGI_LOAD_DIR", "offf", ["GIUL_ASGI_LOAD_DIR='offf'", "did you mean GIUL_ASGI_LOAD_DIR=off?"]),
    ("GIUL_ASGI_SWITCH_INTERVAL", "fast", ["GIUL_ASGI_SWITCH_INTERVAL='fast'", "seconds such as 0.002"]),
    ("GIUL_ASGI_SWITCH_INTERVAL", "offf", ["did you mean GIUL_ASGI_SWITCH_INTERVAL=off?"]),
    # A stranger's trial: a misspelt name was silently ignored (the setting not applied).
    ("GIUL_ASGI_LOADDIR", "off", ["GIUL_ASGI_LOADDIR is not a giul-asgi variable",
                                  "did you mean GIUL_ASGI_LOAD_DIR?"]),
    ("GIUL_ASGI_SWITCH_INTERVALL", "off", ["did you mean GIUL_ASGI_SWITCH_INTERVAL?"]),
])
def test_a_misspelt_environment_variable_stops_uvicorn_with_one_line(
    tmp_path: Path, variable: str, value: str, words: list[str],
) -> None:
    """A stranger's trial: GIUL_ASGI_LOAD_DIR=offf was a warning, and the server served with
    each worker's figures its own; an environment variable is a setting too."""
    status, out = serve(app_module(tmp_path, "fastapi", "add_middleware", "tenant='x-team'"), "uvicorn",
                        **{variable: value})
    assert status != 0, out
    assert "Traceback" not in out, out
    assert_one_line(out, words)
    assert not (tmp_path / value).exists()


@pytest.mark.parametrize("way", ["add_middleware", "wrapped"])
@pytest.mark.parametrize("server", ["uvicorn-lifespan-on", "gunicorn"])
def test_a_bad_setting_stops_uvicorn_lifespan_on_and_gunicorn(tmp_path: Path, server: str, way: str) -> None:
    setting, words = CASES["typo"]
    status, out = serve(app_module(tmp_path, "fastapi", way, setting), server)
    assert status != 0, out
    assert "Traceback" not in out, out
    assert_one_line(out, words)
    if server == "gunicorn":
        assert "Worker failed to boot" in out, out


@pytest.mark.parametrize("case", ["node value", "node typo", "node subclass"])
def test_a_bad_node_stops_uvicorn_workers_instead_of_a_crash_loop(tmp_path: Path, case: str) -> None:
    """A stranger's trial: ``Node(..., idle_w=-140.0)`` under ``uvicorn --workers 2`` raised at
    each worker's import; uvicorn respawned them for ever (28 times and 1,572 lines in 30 s).
    Now each worker fails its startup with the one line and the server exits (status 0 is
    uvicorn's own for a multi-worker startup failure)."""
    setting, words = CASES[case]
    _, out = serve(app_module(tmp_path, "fastapi", "add_middleware", setting), "uvicorn-workers")
    assert "Traceback" not in out, out
    lines = {line.split("giul-asgi: ", 1)[1] for line in out.splitlines() if "giul-asgi: " in line}
    assert len(lines) == 1, out  # the same line from each worker
    assert_one_line("giul-asgi: " + lines.pop(), words)


@pytest.mark.parametrize("way", ["add_middleware", "wrapped"])
def test_a_bad_setting_stops_hypercorn(tmp_path: Path, way: str) -> None:
    """Hypercorn stops too, with our line last. It prints a traceback for any app whose
    startup fails, and with its default single worker exits 0 (hypercorn 0.18's ``run``
    drops the worker's status): neither is ours to change, so neither is asserted."""
    pytest.importorskip("hypercorn")
    setting = CASES["token"][0]
    _, out = serve(app_module(tmp_path, "starlette", way, setting), "hypercorn")
    assert "giul-asgi: token= is not a middleware setting" in out.strip().splitlines()[-1], out
    assert "Running on" not in out, out  # it never served


def test_a_bad_setting_built_by_a_person_still_raises() -> None:
    """A test, a script or a REPL that builds the middleware gets the ConfigError itself."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from giul_asgi import ConfigError, EnergyMiddleware

    with pytest.raises(ConfigError, match="did you mean endpoint_token="):
        EnergyMiddleware(Starlette(), token="x" * 32)
    app = Starlette()
    app.add_middleware(EnergyMiddleware, energy_in_usgae=True)
    with pytest.raises(ConfigError, match="energy_in_usage="), TestClient(app):
        pass  # the lifespan startup fails, and the test client raises the error
    with pytest.raises(ConfigError, match="energy_in_usage="):
        EnergyMiddleware(Starlette(), energy_in_usgae=True)  # a person building it: raised


def test_a_listener_given_as_stats_is_refused_with_its_remedy() -> None:
    """``stats=`` is what /energy and /metrics answer from: a mere listener of settled
    figures (a sink) would make each of their requests a 500, so it stops the startup."""
    from starlette.applications import Starlette

    from giul_asgi import ConfigError, EnergyMiddleware, Ledgers
    from giul_asgi.stats import EnergyStats

    class Sink:
        def settled(self, batch: object) -> None:
            pass

    with pytest.raises(ConfigError, match="is not statistics") as raised:
        EnergyMiddleware(Starlette(), stats=Sink())
    assert "sinks=[...]" in (raised.value.remedy or "")
    EnergyMiddleware(Starlette(), stats=EnergyStats(), ledgers=Ledgers())  # statistics: taken


def test_without_a_lifespan_a_bad_setting_is_one_error_line_and_the_app_serves_unmetered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``uvicorn --lifespan off`` (a stranger's trial): every request was a 500 under a
    traceback, /health included. There is no startup to stop, so the app serves, unmetered,
    and the one line is logged once."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route as StarletteRoute
    from starlette.testclient import TestClient

    from giul_asgi import EnergyMiddleware

    app = Starlette(routes=[StarletteRoute("/health", lambda request: JSONResponse({"ok": True}))])
    app.add_middleware(EnergyMiddleware, energy_in_usgae=True)
    client = TestClient(app)  # outside ``with``: no lifespan
    with caplog.at_level("ERROR", logger="giul_asgi"):
        answers = [client.get("/health") for _ in range(3)]
    assert [(a.status_code, a.json()) for a in answers] == [(200, {"ok": True})] * 3
    assert not any(k.startswith("x-energy") for k in answers[0].headers)
    lines = [r.getMessage() for r in caplog.records if "energy_in_usgae=" in r.getMessage()]
    assert len(lines) == 1 and "did you mean energy_in_usage=?" in lines[0], lines


def test_a_misspelt_node_in_a_factory_is_uvicorns_one_line(tmp_path: Path) -> None:
    """``uvicorn --factory``: a Node typo inside the factory was a 48-line traceback once it
    became a ConfigError (a hostile trial): uvicorn says a factory's TypeError in one line."""
    (tmp_path / "app.py").write_text(
        "from fastapi import FastAPI\nfrom giul_asgi import EnergyMiddleware, Node\n\n"
        "def make():\n    app = FastAPI()\n"
        "    app.add_middleware(EnergyMiddleware, nodes=[Node('sim', reader='simulated', idle_ww=1.0)])\n"
        "    return app\n")
    done = subprocess.run([sys.executable, "-m", "uvicorn", "app:make", "--factory", "--port", "0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in out, out
    assert "idle_ww= is not a Node setting. did you mean idle_w=?" in out, out
