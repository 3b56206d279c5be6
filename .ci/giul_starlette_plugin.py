"""pytest plugin that .ci/starlette_suite.py loads into Starlette's own test suite.

Why: the gate compares each of Starlette's tests run bare with the same test run with every app
its TestClient builds wrapped in ``EnergyMiddleware``. This plugin does the two things that needs
and nothing else:

- ``--giul-outcomes=PATH`` writes one JSON line per test phase as it ends (so a run killed half
  way still says what it reached);
- ``--giul-wrap`` wraps the app of every ``starlette.testclient.TestClient`` once, when the client
  is built (an app that already is an ``EnergyMiddleware`` is left alone), and counts the wraps, so
  a wrapped run that wrapped nothing cannot pass for one that did.

``--giul-nodes=none`` meters a node with no reader instead of the default local node (which says
``unknown`` where there is no GPU).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_wraps = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("giul", "giul-asgi's Starlette gate")
    group.addoption("--giul-wrap", action="store_true",
                    help="wrap every TestClient's app in EnergyMiddleware")
    group.addoption("--giul-nodes", choices=("default", "none"), default="default",
                    help="default: the middleware's own local node; none: Node('suite', reader='none')")
    group.addoption("--giul-outcomes", default=None, help="write one JSON line per test phase here")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("giul_wrap"):
        _wrap_test_clients(config.getoption("giul_nodes"))
    path = config.getoption("giul_outcomes")
    if path:
        config.pluginmanager.register(_Outcomes(Path(path)), "giul-outcomes")


def _wrap_test_clients(nodes: str) -> None:
    from starlette import testclient

    from giul_asgi import EnergyMiddleware, Node

    node_list = [Node("suite", reader="none")] if nodes == "none" else None
    built: Callable[..., None] = testclient.TestClient.__init__

    def wrap(app: Any) -> Any:
        global _wraps
        if isinstance(app, EnergyMiddleware):
            return app
        if not testclient._is_asgi3(app):  # an ASGI2 app: adapt it as TestClient would, then wrap
            app = testclient._WrapASGI2(app)
        _wraps += 1
        return EnergyMiddleware(app, nodes=node_list, inject_json=False)

    def __init__(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
        built(self, wrap(app), *args, **kwargs)

    testclient.TestClient.__init__ = __init__  # type: ignore[method-assign]


class _Outcomes:
    """One JSON line per test phase: nodeid, phase, outcome and the failure's one-line message."""

    def __init__(self, path: Path) -> None:
        self.out = path.open("w", encoding="utf-8")  # open for the session, closed at unconfigure

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        line: dict[str, Any] = {"id": report.nodeid, "when": report.when, "outcome": report.outcome}
        if hasattr(report, "wasxfail"):
            line["xfail"] = True
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            line["message"] = " | ".join(message.strip().splitlines()[:3])[:400]
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.out.write(json.dumps({"wraps": _wraps}) + "\n")
        self.out.flush()
        if _wraps:
            terminalreporter.write_line(f"giul-asgi: {_wraps} TestClient apps wrapped in EnergyMiddleware")

    def pytest_unconfigure(self) -> None:
        self.out.close()
