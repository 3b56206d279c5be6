"""The Starlette gate (.ci/starlette_suite.py) judges a small suite of its own making correctly.

Why: a gate that wraps nothing, or that cannot tell a test broken by the wrapper from one broken
bare, passes forever. This runs the gate's real machinery (its pytest plugin, both runs and the
rerun of suspects) on a four-test suite in a temporary root, without downloading Starlette.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

GATE = Path(__file__).resolve().parent.parent / ".ci" / "starlette_suite.py"

SUITE = '''
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from giul_asgi import EnergyMiddleware


def hello(request):
    return PlainTextResponse("hello")


def test_passes_both():
    client = TestClient(Starlette(routes=[Route("/", hello)]))
    assert client.get("/").text == "hello"


def test_fails_bare():
    raise AssertionError("broken without any middleware")


def test_breaks_only_wrapped():
    client = TestClient(Starlette(routes=[Route("/", hello)]))
    assert not isinstance(client.app, EnergyMiddleware), "the app was wrapped"


class Asgi2:
    def __init__(self, scope):
        self.scope = scope

    async def __call__(self, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"asgi2"})


def test_asgi2_and_wrapped_apps_are_wrapped_once():
    assert TestClient(Asgi2).get("/").text == "asgi2"
    mine = EnergyMiddleware(Starlette(routes=[Route("/", hello)]))
    client = TestClient(mine)
    assert client.app is mine
    assert client.get("/").text == "hello"
'''


def load_gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("starlette_suite", GATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_gate_reports_exactly_what_fails_only_wrapped(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_suite.py").write_text(textwrap.dedent(SUITE))

    verdict = load_gate().gate(tmp_path, ["tests"], nodes="none")

    assert verdict.collected == 4
    assert verdict.passed_bare == [
        "tests/test_suite.py::test_asgi2_and_wrapped_apps_are_wrapped_once",
        "tests/test_suite.py::test_breaks_only_wrapped",
        "tests/test_suite.py::test_passes_both",
    ]
    assert list(verdict.failing_bare) == ["tests/test_suite.py::test_fails_bare"]
    assert "broken without any middleware" in verdict.failing_bare["tests/test_suite.py::test_fails_bare"]
    assert list(verdict.broken) == ["tests/test_suite.py::test_breaks_only_wrapped"]
    assert "the app was wrapped" in verdict.broken["tests/test_suite.py::test_breaks_only_wrapped"]
    # One wrap per TestClient built on an unwrapped app: passes_both, breaks_only_wrapped, Asgi2.
    assert verdict.wraps == 3
    assert not verdict.ok
    assert verdict.report().endswith("starlette suite: 3 passed bare, 1 of them fail wrapped")
