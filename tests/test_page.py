"""The page in headless Chromium: plots drawn, and the numbers shown are /energy's.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skips without it.
``python tests/test_page.py docs/energy-page.png`` writes the screenshot in the docs.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server import serve
from test_endpoint import Clock, FakeLedger

from giul_asgi.energy import Energy
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1300", "--virtual-time-budget=4000"]


def busy_endpoint() -> EnergyEndpoint:
    """Twenty minutes of traffic on two nodes, then a frozen clock: every read is the same."""
    clock = Clock()
    stats = EnergyStats(clock=clock)
    ledgers = [FakeLedger("gpu0"), FakeLedger("gpu1")]
    rng = random.Random(5)
    routes = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    for i in range(4000):
        clock.t += 0.3
        node = i % 2
        route = routes[i % 3]
        joules = rng.lognormvariate(4 if route != "/v1/embeddings" else 1.5, 0.6)
        method = "measured" if i % 9 else "estimated"
        stats.record(Energy(joules if i % 25 else None, method if i % 25 else "unknown",  # type: ignore[arg-type]
                            node=f"gpu{node}", tier=["llama-8b", "llama-70b"][node], route=route,
                            seconds=rng.uniform(0.1, 2.0), tokens=rng.randint(20, 400)),
                     outcome="ok" if i % 17 else "error", status=200 if i % 17 else 500)
        if i % 30 == 0:
            for k, ledger in enumerate(ledgers):
                t = ledger.t
                t.measured_j += 9.0 * 30 * (1 + k) * rng.uniform(0.8, 1.2)
                t.charged_j = t.measured_j * 0.85
                t.unattributed_j = t.measured_j * 0.15
                t.reads += 90
            stats.observe_nodes([ledger.totals() for ledger in ledgers])
    return EnergyEndpoint(stats=stats, ledgers=ledgers)


class Cells(HTMLParser):
    """``data-k`` cells and the plots' ``data-points``/``data-ink``."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, str] = {}
        self.plots: dict[str, tuple[int, int]] = {}
        self._key: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("data-k"):
            self._key = a["data-k"]
            self.cells[self._key or ""] = ""
        if (a.get("class") or "") == "plot":
            self.plots[a.get("id") or ""] = (int(a.get("data-points") or -1), int(a.get("data-ink") or -1))

    def handle_data(self, data: str) -> None:
        if self._key is not None:
            self.cells[self._key] += data

    def handle_endtag(self, tag: str) -> None:
        self._key = None


def chromium(args: list[str]) -> str:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=90, check=True)
    return done.stdout


def expected(data: dict, key: str) -> str:
    section, rest = key.split(".", 1)
    if section == "totals":
        value = data["totals"]
        path = rest.split(".")
    else:
        name, path_s = None, rest
        for candidate in data[section]:
            if rest.startswith(candidate + "."):
                name, path_s = candidate, rest[len(candidate) + 1:]
        assert name is not None, key
        value = data[section][name]
        path = path_s.split(".")
    if path == ["failed"]:
        o = value["outcomes"]
        return str(o["error"] + o["disconnect"] + o["cancelled"] + o["incomplete"])
    for part in path:
        value = value[part]
    return value


def shown(value: object, key: str) -> str:
    if value is None:
        return "\u2013"  # the page's dash for unknown
    if "method_shares" in key:
        return f"{100 * float(value):.1f}%"  # type: ignore[arg-type]
    if isinstance(value, str):
        return value
    return _js_number(float(value))  # type: ignore[arg-type]


def _js_number(x: float) -> str:
    if x == 0:
        return "0"
    v = float(f"{x:.4g}")
    return str(int(v)) if v == int(v) and abs(v) < 1e21 else repr(v)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install -y chromium")
def test_the_page_draws_its_plots_from_the_numbers_of_the_json() -> None:
    with serve(busy_endpoint()) as base:
        data = httpx.get(f"{base}/energy", params={"window": "all"}).json()
        dom = chromium(["--dump-dom", f"{base}/energy/ui?window=all"])
    parser = Cells()
    parser.feed(dom)
    assert set(parser.plots) == {"plot-routes", "plot-power", "plot-methods", "plot-tiers"}
    for plot, (points, ink) in parser.plots.items():
        assert points > 0 and ink > 0, (plot, points, ink)
    assert len(parser.cells) > 50
    for key, text in parser.cells.items():
        value = expected(data, key)
        if key.endswith("last_reading_age_s"):
            text = re.sub(r" s ago$", "", text)
        assert text == shown(value, key), key
    assert parser.cells["totals.requests"] == "4000"


def main(out: str) -> None:
    with serve(busy_endpoint()) as base:
        chromium([f"--screenshot={Path(out).resolve()}", f"{base}/energy/ui?window=all"])


if __name__ == "__main__":
    main(sys.argv[1])
