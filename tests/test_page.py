"""The page in headless Chromium: plots drawn, and the numbers shown are /energy's; and the
power series it draws, from the ledgers' own samples, one a step whether or not anyone reads.

The Chromium tests need Debian's ``chromium`` (``apt-get install -y chromium``) and skip
without it. ``python tests/test_page.py docs/energy-page.png`` writes the screenshot in the
docs.
"""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))  # truecard, run as a script
from server import serve
from test_endpoint import Clock, FakeLedger, Totals
from truecard import TrueCard, TrueReader

from giul_asgi.config import Node
from giul_asgi.energy import Energy
from giul_asgi.ledger import Ledger
from giul_asgi.ledger.history import STEP_S, History
from giul_asgi.meter import Meter
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats
from giul_asgi.stats.merge import merge_samples as _merge_samples
from giul_asgi.stats.nodes import Sample

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1900", "--virtual-time-budget=4000"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="needs Debian's chromium: apt-get install -y chromium")
PLOTS = {"plot-routes", "plot-power", "plot-shares", "plot-tiers", "plot-tenants", "plot-carbon"}
TENANTS = ["team-search", "team-chat", "key:3f1a9c0e5b7d2a41", "batch-eval", None]
GRID_G_PER_KWH, PUE = 380.0, 1.2


class CardLedger(FakeLedger):
    """A ledger-like object whose books grow at a known above-idle power, with the real
    :class:`History` taking its samples on the given clock (as the reader thread does)."""

    def __init__(self, name: str, clock: Clock, watts: Any, carbon: dict[str, Any] | None = None) -> None:
        super().__init__(name)
        self.clock, self.watts = clock, watts
        self.history = History(clock=clock)
        self.carbon_health = carbon

    def run(self, dt: float) -> None:
        """The card draws ``watts(t)`` above idle for ``dt`` seconds: 85% charged to windows."""
        joules = self.watts(self.clock.t) * dt
        self.t.measured_j += joules
        self.t.charged_j += 0.85 * joules
        self.t.unattributed_j += 0.15 * joules
        self.t.reads += int(10 * dt)
        self.history.sample(self.totals)


def power_of(k: int) -> Any:
    return lambda t: 150.0 * (1 + k) * (1 + 0.3 * math.sin(t / 120.0))


def grams(joules: float) -> float:
    return joules * PUE * GRID_G_PER_KWH / 3.6e6


def busy_endpoint() -> EnergyEndpoint:
    """Twenty minutes of traffic on two nodes (tenants, carbon on one node), /energy never
    read meanwhile, then a frozen clock: every read is the same."""
    clock = Clock()
    stats = EnergyStats(clock=clock)
    carbon = {"source": "static", "target": None, "state": "static", "g_per_kwh": GRID_G_PER_KWH,
              "signal": "average", "pue": PUE, "age_s": None, "reason": None}
    ledgers = [CardLedger("gpu0", clock, power_of(0), carbon), CardLedger("gpu1", clock, power_of(1))]
    rng = random.Random(5)
    routes = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
    for i in range(4000):
        clock.t += 0.3
        for ledger in ledgers:
            ledger.run(0.3)
        node = i % 2
        route = routes[i % 3]
        tenant = TENANTS[min(int(rng.expovariate(0.9)), len(TENANTS) - 1)]
        joules = rng.lognormvariate(4 if route != "/v1/embeddings" else 1.5, 0.6) * (1 + node)
        known = i % 25 != 0
        method = ("measured" if i % 11 else "estimated") if known else "unknown"
        stats.record(Energy(joules if known else None, method,  # type: ignore[arg-type]
                            node=f"gpu{node}", tier=["llama-8b", "llama-70b"][node], route=route,
                            seconds=rng.uniform(0.1, 2.0), tokens=rng.randint(20, 400),
                            tenant=tenant, contended=node == 1 and i % 7 == 0,
                            carbon_grams=grams(joules) if known and node == 0 else None),
                     outcome="ok" if i % 17 else "error", status=200 if i % 17 else 500)
    return EnergyEndpoint(stats=stats, ledgers=ledgers)


class Page(HTMLParser):
    """``data-k`` cells, the plots' self-checks (``data-points``, ``-lines``, ``-ink``,
    ``-yrange``), each plot's text (its legend), and the body's ``data-error``."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, str] = {}
        self.plots: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self.error: str | None = None
        self.raw = ""
        self._key: str | None = None
        self._plot: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.error = a.get("data-error")
        if a.get("data-k"):
            self._key = a["data-k"]
            self.cells[self._key] = ""
        if self._plot is not None:
            self._depth += 1
        elif a.get("class") == "plot":
            self._plot, self._depth = a["id"], 0
            self.plots[a["id"]] = {k[5:]: v for k, v in a.items() if k.startswith("data-")}
            self.text[a["id"]] = ""

    def handle_data(self, data: str) -> None:
        if self._key is not None:
            self.cells[self._key] += data
        if self._plot is not None:
            self.text[self._plot] += data + " "

    def handle_endtag(self, tag: str) -> None:
        self._key = None
        if self._plot is not None:
            if self._depth == 0:
                self._plot = None
            else:
                self._depth -= 1


def chromium(args: list[str]) -> str:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=90, check=True)
    return done.stdout


def render(url: str) -> Page:
    page = Page()
    page.raw = chromium(["--dump-dom", url])
    page.feed(page.raw)
    return page


def expected(data: dict, key: str) -> Any:
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


@needs_chromium
def test_the_page_draws_its_plots_from_the_numbers_of_the_json() -> None:
    with serve(busy_endpoint()) as base:
        data = httpx.get(f"{base}/energy").json()
        page = render(f"{base}/energy/ui")
    assert page.error is None, page.error  # no script error
    assert set(page.plots) == PLOTS
    for plot, checks in page.plots.items():
        assert min(int(checks[k]) for k in ("points", "lines", "ink")) > 0, (plot, checks)
    assert page.plots["plot-shares"]["yrange"] == "0,1"  # shares on a 0 to 1 axis, whatever the data
    # the legends say what each quantile rests on, and show the latest slot's values
    assert re.search(r"/v1/chat/completions p50 [\d.]+ J \(n=\d+\)", page.text["plot-routes"])
    assert re.search(r"measured [\d.]+% \(n=\d+\)", page.text["plot-shares"])
    assert "contended" in page.text["plot-shares"]
    assert "Carbon by tenant" in page.raw
    assert len(page.cells) > 100
    for key, text in page.cells.items():
        value = expected(data, key)
        if key.endswith("last_reading_age_s"):
            text = re.sub(r" s ago$", "", text)
        if key.endswith("ledger.carbon") and value is not None:  # the node's grid intensity
            assert text.startswith(f"{_js_number(value['g_per_kwh'])} g/kWh ({value['source']}"), text
            continue
        assert text == shown(value, key), key
    assert page.cells["totals.requests"] == str(data["totals"]["requests"])
    # n beside the quantiles, per route and per tenant; every tenant has its row
    embeddings = data["routes"]["/v1/embeddings"]
    assert page.cells["routes./v1/embeddings.joules.known"] == str(embeddings["joules"]["known"])
    assert {k.split(".")[1] for k in page.cells if k.startswith("tenants.")} >= {"team-search", "<none>"}
    assert page.cells["tenants.team-search.carbon.grams"] not in ("\u2013", "0")


def test_node_power_comes_from_the_ledgers_samples_a_point_every_slot_unread() -> None:
    """/energy was never read during the traffic: every slot of the window still has the
    card's watts (the ledger sampled its books a step), near the power it drew."""
    endpoint = busy_endpoint()
    data = endpoint.snapshot()
    series = data["series"]
    for k, name in enumerate(("gpu0", "gpu1")):
        power = series["power"][name]
        assert power["t"] == series["t"]
        rows = list(zip(power["t"], power["measured_w"], power["charged_w"], power["unattributed_w"],
                        strict=True))
        assert len(rows) == 30
        for i, (t0, measured, charged, unattributed) in enumerate(rows):
            truth = power_of(k)(t0 + series["slot_s"] / 2)
            near = 0.02 if i < len(rows) - 1 else 0.06  # the open slot is covered up to now only
            assert measured is not None and abs(measured - truth) < near * truth, (name, t0, measured, truth)
            assert charged == pytest.approx(0.85 * measured, rel=1e-3)
            assert unattributed == pytest.approx(0.15 * measured, rel=1e-3)
        now = endpoint.stats.clock()
        assert data["nodes"][name]["ledger"]["power_w"] == pytest.approx(power_of(k)(now), rel=0.02)


def test_a_young_process_draws_a_line_within_its_first_minute() -> None:
    """The worst start for the default 15m window: just after a 30 s slot begins. By 45 s
    every series has two slots with a value (a line, not a lone point), power included."""
    clock = Clock()
    clock.t += 0.5
    stats = EnergyStats(clock=clock)
    ledger = CardLedger("gpu0", clock, power_of(0))
    for i in range(90):
        clock.t += 0.5
        ledger.run(0.5)
        if i % 4 == 0:
            stats.record(Energy(20.0 + i, "measured", node="gpu0", tier="8b", route="/v1/chat", seconds=0.4,
                                tokens=50, tenant="team-a", carbon_grams=0.002), outcome="ok", status=200)
    endpoint = EnergyEndpoint(stats=stats, ledgers=[ledger])
    data = endpoint.snapshot()
    assert data["window"] == "15m" and data["series"]["slot_s"] == 30.0
    series = data["series"]
    for col in (series["routes"]["/v1/chat"]["p50"], series["tenants"]["team-a"]["joules"],
                series["tiers"]["8b"]["jpt_p50"], series["routes"]["/v1/chat"]["carbon_g"],
                series["power"]["gpu0"]["measured_w"]):
        assert sum(v is not None for v in col) >= 2, col
    if CHROMIUM is not None:
        with serve(endpoint) as base:
            page = render(f"{base}/energy/ui")
        assert page.error is None, page.error
        for plot in PLOTS:
            assert int(page.plots[plot]["lines"]) >= 1, (plot, page.plots[plot])


def test_a_real_ledgers_reader_thread_samples_its_books_with_nobody_reading() -> None:
    """The real ledger, its reader thread on the real clock, a card drawing 150 W above idle:
    the history fills without any read of /energy, and /energy then draws from it."""
    card = TrueCard(idle_w=60.0, seed=3)
    ledger = Ledger(Node("hist", idle_w=60.0), TrueReader(card))
    ledger.history = History(step_s=0.2)  # a short step, so the test waits a second, not ten
    ledger.ensure_started()
    meter = Meter(ledger)
    meter.open()  # a request in flight: the reader thread keeps its busy pace
    job = card.start_job(150.0)
    deadline = time.monotonic() + 20.0  # wide: a loaded machine
    while len(ledger.history.samples()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    card.stop_job(job)
    meter.close()
    ledger.stop()
    samples = ledger.history.samples()
    assert len(samples) >= 3
    steps = [int(t // 0.2) for t, *_ in samples]
    assert steps == sorted(set(steps))  # one a step at most
    stats = EnergyStats(windows=("1m", "all"), step_s=0.2)
    stats.clock = lambda: samples[-1][0] + 0.1
    data = EnergyEndpoint(stats=stats, ledgers=[ledger]).snapshot("1m")
    measured = [w for w in data["series"]["power"]["hist"]["measured_w"] if w is not None]
    assert measured and max(measured) > 50.0  # the card's draw, from the ledger's own samples


def test_the_ledgers_history_one_sample_a_step_bounded_and_bad_books_are_none() -> None:
    clock = Clock()
    history = History(step_s=5.0, samples=4, clock=clock)
    totals = Totals("gpu0")
    taken = 0
    for _ in range(100):  # a lap every 0.5 s: one sample a 5 s step
        clock.t += 0.5
        totals.measured_j += 10.0
        taken += history.sample(lambda: totals)
    assert taken == 11 and len(history.samples()) == 4  # steps 0 to 10 of 50 s; bounded
    ts = [s[0] for s in history.samples()]
    assert [int(t // 5.0) for t in ts] == list(range(int(ts[0] // 5.0), int(ts[0] // 5.0) + 4))

    class Broken:
        measured_j = float("nan")
        charged_j = "12"
        unattributed_j = True
        reads = None

    clock.t += STEP_S
    history.sample(Broken)
    assert history.samples()[-1][1:] == (None, None, None, None)


def test_bad_histories_and_books_that_go_backwards_never_draw_a_figure() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock, windows=("1m", "all"))
    t0 = clock.t - 60
    stats.observe_history({"gpu0": [(t0, 0.0, 0.0, 0.0, 0.0), (t0, 1.0)]})  # a sample cut short
    assert stats.dropped == 1 and stats.snapshot("1m")["series"]["power"] == {}
    # books that start again from 0 after the third sample (another ledger): measured goes
    # backwards there, charged does not
    stats.observe_history({"gpu0": [(t0 + 10 * k, 1000.0 * (k if k < 3 else k - 3), 800.0 * k, 200.0 * k,
                                     10.0 * k) for k in range(6)]})
    power = stats.snapshot("1m")["series"]["power"]["gpu0"]
    assert power["measured_w"] == [100.0, None, 100.0, 100.0, None, None]
    assert power["charged_w"] == [80.0, 80.0, 80.0, 80.0, None, None]  # the open slot: no sample yet


def test_several_workers_samples_merge_step_by_step() -> None:
    """Each worker folds in its own ledger's samples; the host view merges them by step
    (latest kept), so the series has every step either has."""
    clock = Clock()
    a, b = EnergyStats(clock=clock), EnergyStats(clock=clock)
    samples = [(clock.t - 300 + 10 * k, 100.0 * k, 80.0 * k, 20.0 * k, float(k)) for k in range(30)]
    a.observe_history({"gpu0": samples[0::2]})
    b.observe_history({"gpu0": samples[1::2]})
    merged = _merge_samples([a._nodes.copy(), b._nodes.copy()], a.step_s)
    assert [s.t for s in merged["gpu0"]] == [s[0] for s in samples]
    assert merged["gpu0"][-1] == Sample(*samples[-1])


def test_a_ledger_without_samples_yet_is_sampled_when_read() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    ledger = FakeLedger("gpu0")
    endpoint = EnergyEndpoint(stats=stats, ledgers=[ledger])
    for _ in range(4):
        endpoint.snapshot()
        clock.t += 10
        ledger.t.measured_j += 500.0
    assert endpoint.snapshot()["nodes"]["gpu0"]["ledger"]["power_w"] == 50.0


def main(out: str) -> None:
    with serve(busy_endpoint()) as base:
        chromium([f"--screenshot={Path(out).resolve()}", f"{base}/energy/ui"])


if __name__ == "__main__":
    main(sys.argv[1])
